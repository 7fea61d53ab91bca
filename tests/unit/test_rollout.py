"""Provisioning under the jobs rule, and the journaled rollout: what runs where, the batches, the stops, --resume.

The service and the rollout are driven with stand-ins for what they reach (the scheduler, the
check pass, Ansible, the trays' reboots and checks); tests/integration/test_provision_rolling.py
runs the real ones on the lab.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mctl.ansible.runner import HostRecap, RunResult
from mctl.bringup import journal as jr
from mctl.errors import UsageError
from mctl.inventory import load_site
from mctl.model.change import RunningWork
from mctl.model.disruption import Change, DisruptionReport, TrayDisruption
from mctl.provision.service import ProvisionPlan
from mctl.rollout import run as ro
from mctl.rollout import service as svc
from mctl.rollout.request import ProvisionRequest, check_resume
from mctl.rollout.ui import RolloutUI
from mctl.state.files import DamagedState

REPO = Path(__file__).resolve().parents[2]
T = [f"rack-a-tray0{i}" for i in range(1, 5)]
DRIVER = Change("components: Image components installed or verified, pinned and held", ("nvidia_driver", "imex"),
                True, "nvidia_driver: installs nvidia-utils-580=580.105.08-0ubuntu1")
LIMITS = Change("base: Base files", (), False, "writes /etc/security/limits.d/90-mctl.conf")


@pytest.fixture(scope="module")
def site():
    return load_site(REPO / "inventories" / "example-gb200")


def _plan(hosts=T) -> ProvisionPlan:
    return ProvisionPlan(playbook="site", inventory="mctl.yml", hosts=list(hosts), tags=None, image="img-580",
                         images={h: "img-580" for h in hosts})


def _job(nodes, job="12") -> RunningWork:
    return RunningWork("slurm", job, "alice", "train", "R", tuple(nodes))


def _report(changes: dict) -> DisruptionReport:
    return DisruptionReport({h: TrayDisruption(h, tuple(changes.get(h, ()))) for h in T}, "/runs/check")


def _run_result(hosts, failed=()) -> RunResult:
    recaps = {h: HostRecap(h, ok=5, changed=1, failed=1 if h in failed else 0, failed_task="t" if h in failed else None,
                           message="broke" if h in failed else None) for h in hosts}
    return RunResult("r1", "/runs/r1", "failed" if failed else "successful", 2 if failed else 0, 0.0, 1.0, recaps)


# ------------------------------------------------------------------ the request

def test_consent_and_pace_go_together_or_are_refused():
    with pytest.raises(UsageError, match="--drain and --force exclude each other"):
        ProvisionRequest(drain=True, force=True)
    with pytest.raises(UsageError, match="--wait goes with --drain"):
        ProvisionRequest(wait=10)
    with pytest.raises(UsageError, match="--yes goes with --force"):
        ProvisionRequest(yes=True)
    with pytest.raises(UsageError, match="--rolling goes with --drain"):
        ProvisionRequest(rolling=2)
    with pytest.raises(UsageError, match="at least one tray"):
        ProvisionRequest(rolling=0, drain=True)
    assert ProvisionRequest(rolling=2, drain=True).seconds == 600.0
    with pytest.raises(UsageError, match=r"--resume takes no other option \(given: --image, --rolling\)"):
        check_resume(["--image", "--rolling"])


# ------------------------------------------------------------------ the service: where the check pass runs, the rule

@pytest.fixture()
def world(monkeypatch):
    """The scheduler's work, the check pass's answer, and what ran."""
    state = {"work": [], "work_error": None, "report": _report({}), "checked": None, "plain": None, "rollout": None}

    def discover(site, trays):
        return state["work"], state["work_error"]

    def check(plan, state_dir, *, reboot_after=False):
        state["checked"] = (list(plan.hosts), reboot_after)
        return DisruptionReport({h: state["report"].trays[h] for h in plan.hosts}, "/runs/check")

    def provision(plan, state_dir, on_event=None):
        state["plain"] = list(plan.hosts)
        return _run_result(plan.hosts)

    def start(site, spec, state_dir, ui=None):
        state["rollout"] = spec
        return "rollout"

    monkeypatch.setattr("mctl.sched.work.discover", discover)
    monkeypatch.setattr("mctl.provision.service.check_disruption", check)
    monkeypatch.setattr("mctl.provision.service.provision", provision)
    monkeypatch.setattr("mctl.rollout.run.start_rollout", start)
    monkeypatch.setattr(svc, "_rollout_result", lambda run: svc.ProvisionResult({"rollout": True}, rollout=run))
    return state


def test_no_work_anywhere_runs_as_before_without_a_check_pass(site, world, tmp_path):
    out = svc.execute(site, _plan(), ProvisionRequest(), tmp_path)
    assert world["checked"] is None and world["plain"] == T
    assert out.document == out.run.to_dict()


def test_harmless_changes_go_ahead_under_running_jobs_checked_on_the_busy_trays_only(site, world, tmp_path):
    world["work"] = [_job(T[:2])]
    world["report"] = _report({T[0]: [LIMITS], T[2]: [DRIVER]})
    out = svc.execute(site, _plan(), ProvisionRequest(), tmp_path)
    assert world["checked"] == (T[:2], False)
    assert world["plain"] == T and out.run is not None


def test_disruptive_changes_under_a_job_are_refused_naming_it(site, world, tmp_path):
    world["work"] = [_job(T[:2])]
    world["report"] = _report({h: [DRIVER] for h in T})
    with pytest.raises(svc.ProvisionRefused) as exc:
        svc.execute(site, _plan(), ProvisionRequest(), tmp_path)
    assert world["plain"] is None and world["rollout"] is None
    msg = exc.value.message
    assert msg == ("rack rack-a: provisioning would disrupt running work: rack-a-tray[01-02]: nvidia_driver, imex "
                   "(then a reboot) under job 12 user alice name 'train' R on rack-a-tray[01-02]; nothing was changed")
    assert exc.value.exit_code == 2 and "--drain" in exc.value.hint and "--force" in exc.value.hint
    view = exc.value.view
    assert view["verdict"] == "refuse" and view["breaking"] == T[:2]
    assert view["trays"][T[0]]["action"] == svc.REFUSED and view["trays"][T[2]]["action"] == svc.NOT_RUN
    assert view["trays"][T[0]]["work"][0]["id"] == "12"


def test_force_asks_and_without_a_yes_changes_nothing(site, world, tmp_path):
    world["work"] = [_job(T[:1])]
    world["report"] = _report({T[0]: [DRIVER]})
    warned: list[str] = []

    class Asked(RolloutUI):
        def __init__(self, answer):
            self.answer = answer

        def warn(self, text):
            warned.append(text)

        def confirm(self, breaks):
            return self.answer

    with pytest.raises(UsageError, match="not confirmed; nothing was changed"):
        svc.execute(site, _plan(), ProvisionRequest(force=True), tmp_path, Asked(False))
    assert world["plain"] is None and "breaks what runs on rack-a-tray01" in warned[0] and "job 12" in warned[0]
    svc.execute(site, _plan(), ProvisionRequest(force=True, yes=True), tmp_path, Asked(True))
    assert world["plain"] == T


def test_drain_rolls_the_disruptive_trays_and_provisions_the_harmless_ones_free(site, world, tmp_path):
    world["work"] = [_job(T[3:])]
    world["report"] = _report({T[0]: [DRIVER], T[1]: [LIMITS], T[3]: [DRIVER]})
    svc.execute(site, _plan(), ProvisionRequest(drain=True, rolling=1, wait=30), tmp_path)
    assert world["checked"] == (T, True)                   # every host, with the reboot after the run
    spec = world["rollout"]
    assert (spec.rack, spec.trays, spec.free, spec.unchanged, spec.reboot, spec.batch_size, spec.wait) == (
        "rack-a", (T[0], T[3]), (T[1],), (T[2],), (T[0], T[3]), 1, 30.0)
    assert world["plain"] is None


def test_a_dry_run_checks_every_host_and_shows_each_ones_changes_and_work(site, world, tmp_path):
    world["work"] = [_job(T[:1])]
    world["report"] = _report({T[0]: [DRIVER], T[1]: [LIMITS]})
    out = svc.execute(site, _plan(), ProvisionRequest(dry_run=True), tmp_path)
    assert world["checked"] == (T, False) and world["plain"] is None
    d = out.document
    assert d["dry_run"] is True and d["plan"]["hosts"] == T
    trays = d["disruption"]["trays"]
    assert trays[T[0]]["disruptive"] and trays[T[0]]["reboot"] and trays[T[0]]["action"] == svc.REFUSED
    assert trays[T[1]]["action"] == svc.NOT_RUN and trays[T[2]]["changes"] == []
    out = svc.execute(site, _plan(), ProvisionRequest(dry_run=True, drain=True), tmp_path)
    trays = out.document["disruption"]["trays"]
    assert trays[T[0]]["action"] == svc.HELD and trays[T[1]]["action"] == svc.GOES
    assert trays[T[2]]["action"] == svc.UNCHANGED


def test_work_that_cannot_be_read_counts_as_work(site, world, tmp_path):
    world["work_error"] = "cannot read the Slurm queue on rack-a-head: timed out"
    world["report"] = _report({T[2]: [DRIVER]})
    with pytest.raises(svc.ProvisionRefused) as exc:
        svc.execute(site, _plan(), ProvisionRequest(), tmp_path)
    assert world["checked"] == (T, False)
    assert "rack-a-tray03: nvidia_driver, imex (then a reboot) under work unknown" in exc.value.message
    assert exc.value.hint.startswith("fix the scheduler's answer")
    world["report"] = _report({T[2]: [LIMITS]})              # harmless everywhere: goes ahead all the same
    svc.execute(site, _plan(), ProvisionRequest(), tmp_path)
    assert world["plain"] == T


def test_pods_are_not_drained_by_drain(site, world, tmp_path):
    world["work"] = [RunningWork("k8s", "ml/train-0", None, "train-0", "Running", (T[0],), "4 nvidia.com/gpu")]
    world["report"] = _report({T[0]: [DRIVER]})
    with pytest.raises(svc.ProvisionRefused) as exc:
        svc.execute(site, _plan(), ProvisionRequest(drain=True), tmp_path)
    assert "pod ml/train-0" in exc.value.message and "holds trays in Slurm only" in exc.value.hint


def test_check_mode_takes_no_consent_and_a_rollout_is_one_racks(site, world, tmp_path):
    plan = _plan()
    plan.check = True
    with pytest.raises(UsageError, match="--check changes nothing"):
        svc.execute(site, plan, ProvisionRequest(drain=True), tmp_path)
    with pytest.raises(UsageError, match="provisions the trays of one rack at a time"):
        svc.one_rack(site, ["rack-a-tray01", "rack-b-tray01"], "--drain")


# ------------------------------------------------------------------ the rollout, with stand-ins for the trays

class Rack:
    """What the rollout reaches, played: Slurm's holds and jobs, the playbook runs, reboots, verification."""

    def __init__(self):
        self.held: set[str] = set()
        self.most_held = 0
        self.refuse: dict[str, str] = {}
        self.jobs: list[RunningWork] = []
        self.jobs_end = True
        self.fail_provision: set[str] = set()
        self.fail_verify: set[str] = set()
        self.boot = {t: "boot-1" for t in T}
        self.calls: list[tuple] = []

    def hold(self, site, trays, owner, reason):
        assert reason.startswith("mctl: provision ") and owner.prefix == "mctl: provision"
        held = [t for t in trays if t not in self.refuse]
        self.held |= set(held)
        self.most_held = max(self.most_held, len(self.held))
        self.calls.append(("hold", tuple(held)))
        return held, {t: self.refuse[t] for t in trays if t in self.refuse}

    def release(self, site, trays, owner):
        self.held -= set(trays)
        self.calls.append(("release", tuple(trays)))
        return {}

    def classify(self, text, trays, owner):
        from mctl.sched.slurm.holds import RackNodes
        return RackNodes([t for t in trays if t not in self.held], [t for t in trays if t in self.held], {}, {}, [], {})

    def wait(self, site, trays, wait, on_wait=None):
        self.calls.append(("wait", tuple(trays)))
        left = [w for w in self.jobs if set(w.nodes) & set(trays)]
        if self.jobs_end:
            self.jobs = [w for w in self.jobs if w not in left]
            return []
        return left

    def playbook(self, ctx, hosts, *, reboot_after):
        self.calls.append(("provision", tuple(hosts), reboot_after))
        failed = {h: "failed at task 'x': broke" for h in hosts if h in self.fail_provision}
        return _run_result(hosts, failed), failed, {h: False for h in hosts}

    def boot_ids(self, site, hosts):
        return {h.name: self.boot[h.name] for h in hosts}, {}

    def send_reboot(self, site, hosts):
        self.calls.append(("reboot", tuple(h.name for h in hosts)))
        for h in hosts:
            self.boot[h.name] = self.boot[h.name] + "+"
        return {}

    def wait_rebooted(self, site, hosts, before, seconds):
        return {h.name: "did not come back" for h in hosts if self.boot[h.name] == before[h.name]}

    def verify_until(self, site, hosts, images, seconds):
        assert set(images.values()) == {"img-580"}
        self.calls.append(("verify", tuple(h.name for h in hosts)))
        return {h.name: "image diff: nvidia_driver wants 580.105.08, found 570.148.08" for h in hosts
                if h.name in self.fail_verify}

    def steps(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture()
def rack(monkeypatch):
    r = Rack()
    monkeypatch.setattr(ro, "_slurm_why_not", lambda ctx: None)
    monkeypatch.setattr(ro, "_playbook", r.playbook)
    monkeypatch.setattr("mctl.sched.slurm.holds.hold", r.hold)
    monkeypatch.setattr("mctl.sched.slurm.holds.release", r.release)
    monkeypatch.setattr("mctl.sched.slurm.holds.classify", r.classify)
    monkeypatch.setattr("mctl.sched.slurm.control.controller_run", lambda site, cmd, **kw: type("R", (), {"stdout": ""})())
    monkeypatch.setattr("mctl.sched.work.slurm_jobs", lambda site, **kw: list(r.jobs))
    monkeypatch.setattr("mctl.sched.work.wait_for_jobs", r.wait)
    monkeypatch.setattr("mctl.rollout.tray.boot_ids", r.boot_ids)
    monkeypatch.setattr("mctl.rollout.tray.send_reboot", r.send_reboot)
    monkeypatch.setattr("mctl.rollout.tray.wait_rebooted", r.wait_rebooted)
    monkeypatch.setattr("mctl.rollout.tray.verify_until", r.verify_until)
    monkeypatch.setattr("mctl.images.ImageCatalog", lambda images_dir: type("C", (), {"get": lambda self, n: n})())
    return r


def _spec(trays=tuple(T), free=(), size=2, reboot=tuple(T)) -> ro.RolloutSpec:
    return ro.RolloutSpec("rack-a", ro.plan_fields(_plan(list(trays) + list(free))), tuple(trays), tuple(free), (),
                          tuple(reboot), size, 60.0)


def test_a_rollout_takes_n_trays_at_a_time_through_every_step(site, rack, tmp_path):
    rack.jobs = [_job([T[1]])]
    run = ro.start_rollout(site, _spec(free=("rack-a-head",), reboot=(T[0], T[2], T[3])), tmp_path)
    assert run.status == jr.RUN_SUCCEEDED and run.exit_code == 0 and run.error is None
    assert rack.calls == [
        ("provision", ("rack-a-head",), False),
        ("hold", (T[0], T[1])), ("wait", (T[0], T[1])), ("provision", (T[0], T[1]), True), ("reboot", (T[0],)),
        ("verify", (T[0], T[1])), ("release", (T[0], T[1])),
        ("hold", (T[2], T[3])), ("provision", (T[2], T[3]), True), ("reboot", (T[2], T[3])),
        ("verify", (T[2], T[3])), ("release", (T[2], T[3]))]
    assert rack.most_held == 2 and not rack.held
    doc = run.to_dict()
    assert {t: s["status"] for t, s in doc["trays"].items()} == {t: ro.DONE for t in T}
    assert [b["trays"] for b in doc["batches"]] == [[T[0], T[1]], [T[2], T[3]]]
    steps = {s["step"]: s for s in doc["steps"]}
    assert steps["batch-1:wait"]["details"] == [f"waited for job 12 user alice name 'train' R on {T[1]}"]
    assert steps["batch-2:wait"]["summary"] == f"no work on rack-a-tray[03-04]"
    assert steps["batch-1:reboot"]["summary"] == f"rebooted {T[0]}"
    data = json.loads(run.journal.path.read_text())
    assert data["kind"] == "provision-rollout" and run.journal.path.parent.parent == tmp_path / "provision-rollout" / "rack-a"
    assert data["rollout"]["state"][T[0]]["boot_id"] == "boot-1"


def test_a_tray_the_hold_refuses_is_not_taken_now_and_goes_last(site, rack, tmp_path):
    rack.refuse = {T[0]: "left alone: the node is DRAINED (safety budget: 2 of rack-a out of service)"}
    run = ro.start_rollout(site, _spec(size=2), tmp_path)
    batches = run.to_dict()["batches"]
    assert [b["asked"] for b in batches] == [[T[0], T[1]], [T[2], T[3]], [T[0]]]
    assert [b["trays"] for b in batches] == [[T[1]], [T[2], T[3]], []]
    assert batches[0]["refused"] == {T[0]: rack.refuse[T[0]]}
    # the last batch is the refused tray alone, refused again: the rollout stops, named, and resumes later
    assert run.status == jr.RUN_FAILED and run.exit_code == 3
    assert "no tray of batch 3 could be taken out of service now: rack-a-tray01: left alone" in run.error.message
    assert "'mctl provision rack-a --resume'" in run.error.hint
    assert run.trays()[T[0]]["status"] == ro.PENDING and T[0] not in rack.held
    rack.refuse = {}
    again = ro.resume_rollout(site, "rack-a", tmp_path)
    assert again.status == jr.RUN_SUCCEEDED and again.resumed
    assert rack.calls[-5:] == [("hold", (T[0],)), ("provision", (T[0],), True), ("reboot", (T[0],)),
                               ("verify", (T[0],)), ("release", (T[0],))]
    assert {t: s["status"] for t, s in again.trays().items()} == {t: ro.DONE for t in T}


def test_a_tray_that_fails_stays_held_its_batch_goes_on_and_the_rollout_stops_there(site, rack, tmp_path):
    rack.fail_provision = {T[1]}
    run = ro.start_rollout(site, _spec(size=2), tmp_path)
    assert run.status == jr.RUN_FAILED and run.exit_code == 3
    assert run.error.message.startswith("rack rack-a: batch 1 failed on rack-a-tray02 (rack-a-tray02: provisioning "
                                        "failed at task 'x': broke); rack-a-tray01 released, rack-a-tray02 stay held")
    assert rack.held == {T[1]} and ("verify", (T[0],)) in rack.calls
    assert not [c for c in rack.calls if c[0] == "hold" and T[2] in c[1]]        # batch 2 never started
    rack.fail_provision = set()
    rack.calls.clear()
    again = ro.resume_rollout(site, "rack-a", tmp_path)
    assert again.status == jr.RUN_SUCCEEDED, again.error
    assert rack.calls[0] == ("hold", (T[1], T[2]))                              # the failed tray first
    assert not rack.held and {s["status"] for s in again.trays().values()} == {ro.DONE}


def test_a_tray_that_fails_verification_stays_held(site, rack, tmp_path):
    rack.fail_verify = {T[0]}
    run = ro.start_rollout(site, _spec(size=4), tmp_path)
    assert run.status == jr.RUN_FAILED and rack.held == {T[0]}
    assert "rack-a-tray01: not verified: image diff: nvidia_driver wants 580.105.08" in run.error.message


def test_jobs_that_outlive_the_wait_stop_the_rollout_with_the_trays_held(site, rack, tmp_path):
    rack.jobs = [_job([T[0]])]
    rack.jobs_end = False
    run = ro.start_rollout(site, _spec(size=2), tmp_path)
    assert run.status == jr.RUN_FAILED and rack.held == {T[0], T[1]}
    assert "the provisioning rollout stopped at batch-1:wait: the jobs on rack-a-tray[01-02] did not end within 60s: " \
           "job 12" in run.error.message
    assert "provision" not in rack.steps()
    rack.jobs_end = True
    again = ro.resume_rollout(site, "rack-a", tmp_path)
    assert again.status == jr.RUN_SUCCEEDED and not rack.held


def _kill_at(run_journal: ro.RolloutJournal, phase: str) -> None:
    """The journal as a rollout killed with SIGKILL inside *phase* leaves it."""
    run_journal.data["status"] = jr.RUN_RUNNING
    run_journal.data["result"] = None
    p = run_journal.phase(phase)
    p.update(status=jr.RUNNING, ended=None)
    names = run_journal.phase_names()
    for later in names[names.index(phase) + 1:]:
        run_journal.phase(later).update(status=jr.PENDING)
    run_journal.data["attempts"][-1]["pid"] = 999999999
    run_journal.save()


def test_a_killed_rollout_resumes_holding_and_waiting_again_and_never_reboots_twice(site, rack, tmp_path):
    run = ro.start_rollout(site, _spec(size=2), tmp_path)
    journal = run.journal
    # killed inside batch 2's verify: its trays are provisioned and already rebooted (new boot ids)
    _kill_at(journal, "batch-2:verify")
    journal.data["rollout"]["state"][T[2]]["status"] = ro.REBOOTED
    journal.data["rollout"]["state"][T[3]]["status"] = ro.REBOOTED
    journal.save()
    rack.held |= {T[2], T[3]}
    rack.calls.clear()
    loaded = ro.last_rollout(tmp_path, "rack-a")
    assert loaded.status == jr.RUN_INTERRUPTED
    again = ro.resume_rollout(site, "rack-a", tmp_path)
    assert again.status == jr.RUN_SUCCEEDED and again.resumed
    assert rack.steps() == ["hold", "verify", "release"]                     # no second provision nor reboot
    assert [h["status"] for h in again.journal.phase("batch-2:wait")["history"]] == ["done", "done"]
    history = again.journal.phase("batch-2:verify")["history"]
    assert [h["status"] for h in history] == ["done", "killed", "done"]


def test_resume_refuses_what_it_cannot_finish(site, rack, tmp_path):
    with pytest.raises(UsageError, match="no provisioning rollout of rack rack-a to resume"):
        ro.resume_rollout(site, "rack-a", tmp_path)
    run = ro.start_rollout(site, _spec(size=4), tmp_path)
    with pytest.raises(UsageError, match=r"finished \(succeeded\); nothing to resume"):
        ro.resume_rollout(site, "rack-a", tmp_path)
    _kill_at(run.journal, "batch-1:verify")
    run.journal.data["attempts"][-1]["pid"] = __import__("os").getpid()        # its process is alive
    run.journal.save()
    with pytest.raises(UsageError, match="is still running"):
        ro.resume_rollout(site, "rack-a", tmp_path)
    data = json.loads(run.journal.path.read_text())
    data["rollout"]["spec"]["plan"]["hosts"] = "not a list"
    data["attempts"][-1]["pid"] = 999999999
    run.journal.path.write_text(json.dumps(data))
    with pytest.raises(DamagedState, match="the rollout it records cannot be read"):
        ro.resume_rollout(site, "rack-a", tmp_path)


def test_the_spec_survives_the_journal(tmp_path):
    spec = _spec(free=("rack-a-head",))
    again = ro.RolloutSpec.from_dict(tmp_path / "j.json", json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    plan = again.provision_plan()
    assert plan.reboot_after and plan.request().extravars == {"mctl_image": "img-580", "mctl_reboot_after": True}


# ------------------------------------------------------------------ a tray's reboot and verification

def test_the_wait_for_a_reboot_wants_a_new_boot_id(site, monkeypatch):
    from mctl.rollout import tray

    answers = iter([({T[0]: "old", T[1]: "old"}, {}), ({T[0]: "new"}, {T[1]: "unreachable: refused"}),
                    ({T[1]: "old"}, {})])
    monkeypatch.setattr(tray, "boot_ids", lambda site, hosts: next(answers))
    clock = iter([0.0, 1.0, 2.0, 5.0, 99.0, 200.0, 201.0])
    hosts = [site.host(T[0]), site.host(T[1])]
    late = tray.wait_rebooted(site, hosts, {T[0]: "old", T[1]: "old"}, 100.0, clock=lambda: next(clock),
                              sleep=lambda s: None)
    assert late == {T[1]: "did not come back within 100s: still boot old (no reboot yet)"}


def test_node_check_answers_read():
    from mctl.rollout.tray import node_check_failures
    from mctl.transport.results import HostResult, HostStatus

    crit = json.dumps({"findings": [{"severity": "critical", "check": "imex.domain", "message": "IMEX not ready"},
                                    {"severity": "warn", "check": "gpu.driver", "message": "driver 580"}]})
    results = [HostResult(T[0], "a", HostStatus.OK, 0), HostResult(T[1], "a", HostStatus.FAILED, 1, crit),
               HostResult(T[2], "a", HostStatus.FAILED, 127, "", "sh: mctl-node-check: not found")]
    assert node_check_failures(results) == {T[1]: "node check: imex.domain: IMEX not ready",
                                            T[2]: "node check: not installed on the tray (mctl node install-check)"}


def test_journal_times_are_kept(site, rack, tmp_path):
    run = ro.start_rollout(site, _spec(size=4), tmp_path)
    steps = run.to_dict()["steps"]
    assert all(s["seconds"] is not None and s["seconds"] >= 0 for s in steps if s["status"] != "skipped")
    assert run.journal.data["created"] <= time.time()
