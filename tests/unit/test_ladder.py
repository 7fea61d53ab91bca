"""The recovery ladder's state machine (mctl.health.ladder): time injected, no sleeps, no lab.

Each test drives one tray's recovery sweep by sweep with `decide` (the breaker included) and checks
the rungs it asks for, the phase it is in and the events it logs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from mctl.health import ladder
from mctl.health.breaker import BreakerState
from mctl.health.policy import decide_tray
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import NodeView
from mctl.model.findings import Finding, Severity
from mctl.model.settings import HealthSettings, LadderSettings

T = "r1-t01"
SIZES = {"r1": 4}


def settings(**ladder_kw) -> HealthSettings:
    base = dict(gpu_reset=True, reboot=True, power_cycle=True, fail_after_sweeps=2, max_failures=3,
                failure_window_s=3600.0, reboot_deadline_s=300.0, power_cycle_deadline_s=600.0,
                verify_deadline_s=120.0, gpu_reset_deadline_s=60.0, retry_after_s=0.0)
    base.update(ladder_kw)
    return HealthSettings(resume_after_healthy_sweeps=2, breaker_max_share=0.5, ladder=LadderSettings(**base))


def obs(**kw) -> ladder.Observation:
    base = dict(host=T, rack="r1", drained=True, reach="ok", critical=True, healthy_streak=0, boot_id="boot-a",
                idle=True, reset_gpus=(), fixable=True, has_bmc=True, why="gpu.count: 3/4")
    base.update(kw)
    return ladder.Observation(**base)


class Tray:
    """One tray's record and the breaker, stepped by `decide` as the engine does."""

    def __init__(self, hs: HealthSettings, rec: TrayRecord | None = None, breaker: BreakerState | None = None):
        self.hs = hs
        self.rec = rec or TrayRecord(T, "r1", drained=True, reason="mctl: gpu count 3/4", drained_at=0.0)
        self.breaker = breaker or BreakerState()
        self.events: list[ladder.Event] = []

    def sweep(self, now: float, burn_in: str | None = None, **kw):
        o = obs(**kw)
        self.rec = replace(self.rec, drained=o.drained, healthy_streak=o.healthy_streak)
        out = ladder.decide({T: self.rec}, [o], self.hs, self.breaker, SIZES, now=now,
                            burn_ins={T: burn_in} if burn_in else None)
        self.rec, self.breaker = out.records[T], out.breaker
        self.events += out.events
        return out

    @property
    def state(self) -> ladder.LadderState:
        return ladder.state_of(self.rec)

    def send(self, out, sent=True):
        """The engine's send of every rung of *out*, with the given result."""
        records = {T: self.rec}
        for r in out.rungs:
            ladder.settle(records, r, sent)
        self.rec = records[T]


def rungs(out) -> list[str]:
    return [r.rung for r in out.rungs]


# --- the ladder's order -------------------------------------------------------------------------

def test_every_rung_is_off_by_default_and_the_ladder_does_nothing():
    hs = HealthSettings()
    assert not hs.ladder.enabled
    out = ladder.decide({T: TrayRecord(T, "r1", drained=True)}, [obs()], hs, BreakerState(), SIZES, now=10.0)
    assert out.rungs == [] and all(e.action == "ladder-wait" for e in out.events)


def test_a_frozen_tray_is_power_cycled_then_verified_then_passed_with_the_time_of_each_phase():
    t = Tray(settings())
    assert t.sweep(0.0, reach="ok", critical=False, boot_id="boot-a").rungs == []     # healthy: no rung
    out = t.sweep(10.0, reach="unreachable", critical=True, boot_id=None)
    assert rungs(out) == ["power-cycle"]              # no SSH: neither a reset nor a reboot fits
    t.send(out)
    assert t.state.phase == "power-cycle" and t.state.boot == "boot-a" and t.state.sent is True
    out = t.sweep(15.0, reach="unreachable", boot_id=None)                 # still booting: nothing new
    assert out.rungs == [] and t.state.phase == "power-cycle"
    out = t.sweep(40.0, reach="ok", critical=False, healthy_streak=1, boot_id="boot-b")
    assert t.state.phase == "verify" and t.state.times["power-cycle"] == 30.0
    out = t.sweep(41.0, reach="ok", critical=False, healthy_streak=2, boot_id="boot-b")
    assert t.state.phase == "passed" and t.state.times["verify"] == 1.0
    assert ladder.holds_resume(t.rec) is None         # the policy may resume it now
    out = t.sweep(42.0, drained=False, reach="ok", critical=False, healthy_streak=3, boot_id="boot-b")
    (done,) = [e for e in out.events if e.action == "recovered"]
    assert done.extra["tried"] == ["power-cycle"] and done.extra["times"] == {"power-cycle": 30.0, "verify": 1.0}
    assert t.state.phase is None and t.state.times == {"power-cycle": 30.0, "verify": 1.0}


def test_services_still_starting_after_a_boot_count_against_the_verify_deadline_only():
    t = Tray(settings(gpu_reset=False, reboot=False))
    t.send(t.sweep(0.0, reach="unreachable", boot_id=None))
    for now in (5.0, 6.0, 7.0, 8.0):                   # back, slurmd not up yet: not a failed power cycle
        out = t.sweep(now, boot_id="boot-b", settling=True, why="slurm.slurmd: slurmd is not running")
        assert t.state.phase == "verify" and t.state.bad == 0 and out.rungs == []
    t.sweep(9.0, critical=False, healthy_streak=1, boot_id="boot-b")
    t.sweep(10.0, critical=False, healthy_streak=2, boot_id="boot-b")
    assert t.state.phase == "passed"
    t2 = Tray(settings(gpu_reset=False, reboot=False, verify_deadline_s=30.0))
    t2.send(t2.sweep(0.0, reach="unreachable", boot_id=None))
    t2.sweep(5.0, boot_id="boot-b", settling=True)
    t2.sweep(40.0, boot_id="boot-b", settling=True)    # never came up: the verify deadline fails it
    assert [e.action for e in t2.events if e.action == "recovery-failed"]


def test_reset_first_when_idle_and_the_xids_say_reset_then_reboot_then_power_cycle():
    t = Tray(settings())
    out = t.sweep(0.0, reset_gpus=("0008:01:00",))
    assert rungs(out) == ["gpu-reset"] and out.rungs[0].gpus == ("0008:01:00",)
    t.send(out)
    t.sweep(5.0, reset_gpus=("0008:01:00",))                              # back at once (no reboot): verify, bad 1
    assert t.state.phase == "verify" and t.state.bad == 1
    out = t.sweep(6.0, reset_gpus=("0008:01:00",))                        # critical again: the reset did not fix it
    assert rungs(out) == ["reboot"] and t.state.tried == ("gpu-reset", "reboot")
    t.send(out)
    out = t.sweep(7.0, boot_id="boot-a")                                  # same boot: not back yet
    assert t.state.phase == "reboot"
    out = t.sweep(320.0, boot_id="boot-a")                                # the reboot's 300 s deadline passed
    assert rungs(out) == ["power-cycle"]
    failed = [e for e in out.events if e.action == "ladder" and e.result == "failed"]
    assert failed and failed[0].phase == "reboot" and failed[0].seconds == 314.0


def test_no_reset_while_jobs_run_the_ladder_waits_and_says_so_once():
    t = Tray(settings())
    out = t.sweep(0.0, idle=False, reset_gpus=("0008:01:00",))
    assert out.rungs == [] and [e.action for e in out.events] == ["ladder-wait"]
    assert "jobs" in out.events[0].why
    out = t.sweep(1.0, idle=False, reset_gpus=("0008:01:00",))
    assert out.rungs == [] and out.events == []                          # said once
    out = t.sweep(2.0, idle=True, reset_gpus=("0008:01:00",))
    assert rungs(out) == ["gpu-reset"]


def test_a_reset_does_not_fit_an_xid_whose_action_is_not_reset_nor_an_unreachable_tray():
    t = Tray(settings(reboot=False, power_cycle=False))
    out = t.sweep(0.0, reset_gpus=())
    assert out.rungs == [] and "no rung" in t.state.note


def test_power_cycle_of_an_answering_tray_only_when_asked_for():
    t = Tray(settings(gpu_reset=False, reboot=False))
    out = t.sweep(0.0)
    assert out.rungs == []                               # unanswered (default): the OS answers, no power cycle
    t = Tray(settings(gpu_reset=False, reboot=False, power_cycle_when="unfixed"))
    assert rungs(t.sweep(0.0)) == ["power-cycle"]


def test_a_hung_tray_is_rebooted_through_the_os_first_and_a_tray_without_bmc_waits():
    t = Tray(settings())
    assert rungs(t.sweep(0.0, reach="timeout", boot_id=None)) == ["reboot"]
    t = Tray(settings(reboot=False))
    out = t.sweep(0.0, reach="unreachable", boot_id=None, has_bmc=False)
    assert out.rungs == [] and "BMC" in t.state.note


def test_findings_no_rung_can_fix_take_no_rung():
    t = Tray(settings())
    out = t.sweep(0.0, fixable=False, why="host.disk: / 99% full")
    assert out.rungs == [] and t.state.note == "no rung fixes host.disk: / 99% full"


def test_a_rung_that_could_not_be_sent_climbs_on_the_next_sweep():
    t = Tray(settings(gpu_reset=False))
    out = t.sweep(0.0)
    assert rungs(out) == ["reboot"]
    t.send(out, sent=False)                              # e.g. systemctl refused
    out = t.sweep(1.0)
    assert rungs(out) == ["power-cycle"]                 # a reboot that failed: the OS did not help


# --- failures, repair, never a fourth ------------------------------------------------------------

def test_three_failed_recoveries_mark_the_tray_for_repair_and_no_fourth_attempt():
    hook_hs = settings(gpu_reset=False, reboot=False, power_cycle_when="unfixed")
    t = Tray(hook_hs)
    now = 0.0
    sent = 0
    out = t.sweep(now)
    for attempt in range(3):
        assert rungs(out) == ["power-cycle"], (attempt, t.state)
        t.send(out)
        sent += 1
        now += 30
        t.sweep(now, boot_id=f"boot-{attempt}")                           # back with a new boot, critical: bad 1
        assert t.state.phase == "verify"
        now += 1
        out = t.sweep(now, boot_id=f"boot-{attempt}")                     # bad 2 = fail_after_sweeps: failed
    assert t.state.phase == "repair" and out.rungs == []
    assert [e.action for e in t.events].count("recovery-failed") == 3
    (mark,) = [e for e in t.events if e.action == "repair"]
    assert "3 failed recoveries within 1h" in mark.why
    assert ladder.holds_resume(t.rec).startswith("marked for repair")
    # never retried: healthy or not, drained or resumed by hand elsewhere, no more rungs
    for i in range(5):
        now += 60
        out = t.sweep(now, critical=bool(i % 2), healthy_streak=i)
        assert out.rungs == []
    assert sent == 3 and t.state.phase == "repair"


def test_the_next_recovery_waits_retry_after_once_one_failed():
    t = Tray(settings(gpu_reset=False, reboot=False, power_cycle_when="unfixed", retry_after_s=60.0))
    t.send(t.sweep(0.0))
    t.sweep(30.0, boot_id="boot-1")
    out = t.sweep(31.0, boot_id="boot-1")                    # failed: no power cycle right away
    assert [e.action for e in out.events if e.action == "recovery-failed"] and out.rungs == []
    assert t.sweep(60.0, boot_id="boot-1").rungs == []
    out = t.sweep(92.0, boot_id="boot-1")
    assert rungs(out) == ["power-cycle"] and out.rungs[0].why.startswith("recovery 2 of at most 3")


def test_failures_outside_the_window_do_not_count():
    t = Tray(settings(gpu_reset=False, reboot=False, power_cycle_when="unfixed", failure_window_s=100.0))
    now = 0.0
    out = t.sweep(now)
    for attempt in range(4):
        assert rungs(out) == ["power-cycle"], attempt
        t.send(out)
        now += 70                                      # each recovery takes 71 s: at most 2 within 100 s
        t.sweep(now, boot_id=f"boot-{attempt}")
        now += 1
        out = t.sweep(now, boot_id=f"boot-{attempt}")
    assert t.state.phase != "repair" and len(t.state.failures) == 2


def test_the_breaker_counts_each_rung_and_a_tripped_one_stops_them():
    tripped = BreakerState(True, 100.0, "too many drains")
    t = Tray(settings(gpu_reset=False, reboot=False), breaker=tripped)
    out = t.sweep(0.0, reach="unreachable", boot_id=None)
    assert out.rungs == [] and "circuit breaker" in t.state.note and t.state.phase is None
    out = t.sweep(1.0, reach="unreachable", boot_id=None)
    assert out.rungs == [] and out.events == []       # said once
    t = Tray(settings(gpu_reset=False, reboot=False))
    out = t.sweep(0.0, reach="unreachable", boot_id=None)
    assert rungs(out) == ["power-cycle"] and [d[1] for d in t.breaker.drains] == [T]


def test_burn_in_must_pass_before_the_resume():
    t = Tray(settings(gpu_reset=False, reboot=False, burn_in="quick", burn_in_deadline_s=100.0))
    t.send(t.sweep(0.0, reach="unreachable", boot_id=None))
    t.sweep(10.0, critical=False, healthy_streak=1, boot_id="boot-b")
    t.sweep(11.0, critical=False, healthy_streak=2, boot_id="boot-b")
    assert t.state.phase == "burn-in" and ladder.holds_resume(t.rec)
    t.sweep(12.0, burn_in="running", critical=False, healthy_streak=3, boot_id="boot-b")
    assert t.state.phase == "burn-in"
    t.sweep(13.0, burn_in="ok", critical=False, healthy_streak=4, boot_id="boot-b")
    assert t.state.phase == "passed" and t.state.times["burn-in"] == 2.0
    t2 = Tray(settings(gpu_reset=False, reboot=False, burn_in="quick"))
    t2.send(t2.sweep(0.0, reach="unreachable", boot_id=None))
    t2.sweep(10.0, critical=False, healthy_streak=1, boot_id="boot-b")
    t2.sweep(11.0, critical=False, healthy_streak=2, boot_id="boot-b")
    t2.sweep(12.0, burn_in="failed: dcgmi: Fail", critical=False, healthy_streak=3, boot_id="boot-b")
    assert [e.action for e in t2.events if e.action == "recovery-failed"]


def test_the_state_survives_a_restart_and_an_unknown_send_is_never_sent_again():
    t = Tray(settings(gpu_reset=False, reboot=False))
    out = t.sweep(0.0, reach="unreachable", boot_id=None)
    assert rungs(out) == ["power-cycle"]
    # killed before the result: the record on disk says the rung was being sent (sent None)
    disk = TrayRecord.from_dict(t.rec.to_dict())
    assert ladder.state_of(disk).phase == "power-cycle" and ladder.state_of(disk).sent is None
    t2 = Tray(settings(gpu_reset=False, reboot=False), rec=disk, breaker=t.breaker)
    for now in (5.0, 10.0, 100.0):
        assert t2.sweep(now, reach="unreachable", boot_id=None).rungs == []
    out = t2.sweep(700.0, reach="unreachable", boot_id=None)            # its 600 s deadline: failed, no rung left
    assert [e.action for e in out.events if e.action == "recovery-failed"]


def test_a_damaged_ladder_state_is_refused_with_the_field():
    with pytest.raises(ValueError, match="ladder.phase"):
        ladder.LadderState.from_dict({"phase": "launch"})


# --- the policy's side --------------------------------------------------------------------------

def _verdict(critical: bool) -> TrayVerdict:
    fs = (Finding(Severity.CRITICAL, T, "gpu.count", "3/4"),) if critical else ()
    return TrayVerdict(T, "r1", "ok", Severity.CRITICAL if critical else Severity.OK, fs)


def test_the_policy_holds_the_resume_while_a_recovery_runs_and_resumes_a_down_node_after_its_own_reboot():
    hs = settings()
    st = ladder.LadderState(phase="verify", rung="power-cycle", tried=("power-cycle",), since=0.0)
    rec = TrayRecord(T, "r1", drained=True, reason="mctl: unreachable 2 sweeps", healthy_streak=5, ladder=st)
    down = NodeView(T, drained=True, down=True, reason="mctl: unreachable 2 sweeps", state="DOWN+DRAIN")
    step = decide_tray(rec, _verdict(False), down, hs, answered=True, now=10.0)
    assert not [d for d in step.decisions if d.action == "resume"]
    assert any("recovery ladder" in d.why for d in step.decisions)
    passed = replace(rec, ladder=replace(st, phase="passed"))
    step = decide_tray(passed, _verdict(False), down, hs, answered=True, now=11.0)
    (resume,) = [d for d in step.decisions if d.action == "resume"]
    assert resume.after_reboot and "rebooted" in resume.why
    # Slurm's own reason for the reboot is mctl's too, in this recovery
    slurm_said = replace(down, reason=ladder.SLURM_REBOOTED)
    step = decide_tray(passed, _verdict(False), slurm_said, hs, answered=True, now=12.0)
    assert [d.action for d in step.decisions] == ["resume"]
    # ... but not without a reboot of mctl's: a DOWN node is never touched
    no_reboot = replace(rec, ladder=ladder.LadderState(phase="passed", tried=("gpu-reset",)))
    step = decide_tray(no_reboot, _verdict(False), down, hs, answered=True, now=13.0)
    assert not [d for d in step.decisions if d.action == "resume"]


def test_the_resume_script_after_a_reboot_allows_down_and_checks_the_reason():
    from mctl.model.drain import RESUME, Decision
    from mctl.sched.slurm.drain import apply_script

    plain = apply_script([Decision(T, RESUME, "healthy", reason="mctl: x")])
    after = apply_script([Decision(T, RESUME, "healthy", reason=ladder.SLURM_REBOOTED, after_reboot=True)])
    assert "*DOWN*" in plain and "*DOWN*" not in after
    assert "Node unexpectedly rebooted" in after


def test_a_marked_tray_is_never_resumed_by_the_watch():
    hs = settings()
    st = ladder.LadderState(phase="repair", repair_why="3 failed recoveries within 1h")
    rec = TrayRecord(T, "r1", drained=True, reason="mctl: gpu count 3/4", healthy_streak=9, ladder=st)
    node = NodeView(T, drained=True, reason="mctl: gpu count 3/4", state="IDLE+DRAIN")
    step = decide_tray(rec, _verdict(False), node, hs, answered=True, now=1.0)
    assert not [d for d in step.decisions if d.action == "resume"]
    assert "marked for repair" in step.notes[0].why


def test_reset_targets_read_the_xid_catalogue_and_xid_154():
    from mctl.model.tray import TrayFacts, XidEvent, XidObservation

    def facts(*events):
        return TrayFacts(T, xids=tuple(XidObservation(e, 5.0, True) for e in events))

    hs = HealthSettings()
    x95 = XidEvent("0008:01:00", 95, "Uncontained: FBHUB. RST: Yes, D-RST: No")
    x79 = XidEvent("0009:01:00", 79, "GPU has fallen off the bus.")
    x154 = XidEvent("0018:01:00", 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    assert ladder.reset_targets(facts(x95), hs) == ("0008:01:00",)
    assert ladder.reset_targets(facts(x154), hs) == ("0018:01:00",)
    assert ladder.reset_targets(facts(x95, x79), hs) == ()         # 79 says reboot: a reset does not fit


def test_the_repair_hook_gets_its_arguments_filled_one_by_one_never_through_a_shell():
    ls = LadderSettings(repair_hook=("/usr/local/bin/ticket", "--tray", "{tray}", "--why={reason}"))
    argv = ladder.repair_argv(ls, T, "r1", "3 failed; rm -rf / $(x)", 3)
    assert argv == ["/usr/local/bin/ticket", "--tray", T, "--why=3 failed; rm -rf / $(x)"]


def test_metrics_series_appear_once_the_ladder_has_a_record():
    from mctl.health.ladder import metric_samples

    assert metric_samples({T: TrayRecord(T, "r1")}, "s") == []
    st = ladder.LadderState(phase="repair", times={"power-cycle": 31.5})
    series = {name: samples for name, _k, _h, samples in metric_samples({T: TrayRecord(T, "r1", ladder=st)}, "s")}
    assert series["mctl_health_marked_for_repair"][0][1] == 1
    assert series["mctl_health_ladder_phase_seconds"][0] == ({"site": "s", "rack": "r1", "tray": T,
                                                               "phase": "power-cycle"}, 31.5)


# --- the settings -------------------------------------------------------------------------------

def test_the_ladder_settings_reach_the_model_and_survive_the_json_form():
    from mctl.inventory.convert import health_settings
    from mctl.inventory.schema import HealthSpec

    spec = HealthSpec.model_validate({"ladder": {"power_cycle": True, "reboot": True, "burn_in": "quick",
                                            "failure_window": "2h", "power_cycle_deadline": "5m",
                                            "repair_hook": ["/usr/bin/ticket", "{tray}"]}})
    s = health_settings(spec)
    assert s.ladder.power_cycle and s.ladder.reboot and not s.ladder.gpu_reset and s.ladder.enabled
    assert (s.ladder.failure_window_s, s.ladder.power_cycle_deadline_s, s.ladder.burn_in) == (7200.0, 300.0, "quick")
    assert s.ladder.repair_hook == ("/usr/bin/ticket", "{tray}")
    assert HealthSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown ladder setting"):
        LadderSettings.from_dict({"power_cylce": True})


def test_a_rung_that_cannot_work_is_refused_when_the_inventory_loads(tmp_path):
    import shutil

    import yaml

    from mctl.errors import MctlError
    from mctl.inventory.loader import load_site

    src = __import__("pathlib").Path(__file__).resolve().parents[2] / "inventories" / "example-gb200"
    site = tmp_path / "site"
    shutil.copytree(src, site)
    doc = yaml.safe_load((site / "mctl.yml").read_text())
    doc["images_dir"] = str(src.parents[1] / "images")
    doc.setdefault("health", {})["ladder"] = {"power_cycle": True}
    doc.pop("bmc", None)
    (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(MctlError) as err:
        load_site(site)
    assert "power-cycle rung needs the BMCs" in str(err.value.message) + str(getattr(err.value, "problems", ""))


def test_a_marked_tray_is_a_critical_tray_repair_finding_in_every_sweep():
    from mctl.health.responders.ladder import LadderResponder
    from mctl.checks.catalogue import CHECKS

    st = ladder.LadderState(phase="repair", repair_why="3 failed recoveries within 1h", failures=(1.0, 2.0, 3.0))
    records = {T: TrayRecord(T, "r1", ladder=st), "r1-t02": TrayRecord("r1-t02", "r1")}
    (f,) = LadderResponder.findings(None, records)
    assert (f.host, f.check, f.severity) == (T, "tray.repair", Severity.CRITICAL) and "3 failed" in f.message
    assert CHECKS["tray.repair"].allows(f.severity)


def test_a_tray_in_a_leak_episode_gets_no_rung_and_one_powered_off_for_its_leak_is_never_power_cycled():
    from mctl.health.leaks import powered_off_for_leak
    from mctl.health.record import LeakEpisode

    hs = settings()
    held = Finding(Severity.CRITICAL, T, "leak.detectors", "leak critical 0_ColdPlate")
    for episode in (LeakEpisode(0.0, held, sent=False), LeakEpisode(0.0, held, sent=True)):
        rec = TrayRecord(T, "r1", drained=True, reason="mctl: leak critical 0_ColdPlate", drained_at=0.0, leak=episode)
        out = ladder.decide({T: rec}, [obs(reach="unreachable", critical=True, boot_id=None)], hs, BreakerState(),
                            SIZES, now=100.0)
        assert out.rungs == [] and out.records[T] == rec, episode
        assert powered_off_for_leak(episode) is episode.sent
    assert "leak.detectors" in ladder.NOT_FIXED_BY_A_RUNG
