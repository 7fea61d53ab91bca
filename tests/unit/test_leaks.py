"""Leaks and power out of band: parsing the real GB200 capture's leak and power documents, the checks, and the
leak policy (drain at once, power off after the timeout, once per episode, flapping held) with injected time."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mctl import checks
from mctl.bmc.client import BMCError
from mctl.checks import leak
from mctl.checks.leak import BmcHealth, parse_detector, parse_power_subsystem, parse_supply
from mctl.health import leaks, oob
from mctl.health.breaker import BreakerState
from mctl.health.policy import decide
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import NodeView
from mctl.model.findings import Severity, worst
from mctl.model.settings import HealthSettings
from mctl.model.tray import TrayExpectation, TrayFacts
from tests.helpers import BMC_CASES, CAPTURE_DETECTORS, GB200_SWITCH_REDFISH, CaptureClient, capture_doc, detector_path

# --- parsing the real capture ------------------------------------------------------------------------

def test_the_real_capture_lists_four_moisture_detectors_one_critical():
    """The captured tray's BMC reported 1_ColdPlate Critical (Status Critical/Degraded) while that detector's
    twin voltage sensor read 1.7353 V, above its LowerCritical 1.617 V: a real Critical reading."""
    coll = capture_doc(leak.LEAK_DETECTORS)
    assert [m["@odata.id"].rsplit("/", 1)[-1] for m in coll["Members"]] == list(CAPTURE_DETECTORS)
    parsed = [parse_detector(capture_doc(m["@odata.id"])) for m in coll["Members"]]
    assert [(d.id, d.state, d.kind, d.health, d.enabled) for d in parsed] == [
        (i, "Critical", "Moisture", "Critical", "Degraded") if i.endswith("1_ColdPlate") else
        (i, "OK", "Moisture", "OK", "Enabled") for i in CAPTURE_DETECTORS]
    assert parsed[0].short == "0_ColdPlate" and parsed[3].short == "1_Manifold"


def test_the_real_capture_power_subsystem_is_ok_and_lists_no_supply():
    health, link = parse_power_subsystem(capture_doc(leak.POWER_SUBSYSTEM))
    assert (health, link) == ("OK", "/redfish/v1/Chassis/Chassis_0/PowerSubsystem/PowerSupplies")
    assert capture_doc(link)["Members"] == []


def test_the_capture_policy_names_the_same_detectors_as_critical_triggers():
    """The BMC's own LeakDetectionPolicy (off in the capture) reacts to these four DetectorState = Critical."""
    policy = capture_doc("/redfish/v1/Chassis/Chassis_0/Oem/Nvidia/Policies/LeakDetectionPolicy")
    props = [c["Property"] for c in policy["PolicyConditions"]]
    assert props == [f"{detector_path(d)}/#DetectorState" for d in CAPTURE_DETECTORS]
    assert {c["PropertyStringValue"] for c in policy["PolicyConditions"]} == {"Critical"}
    assert policy["PolicyEnabled"] is False


def test_read_tray_on_the_capture():
    client = CaptureClient()
    paths = oob.discover_leaks(client)
    client.paths.clear()
    bmc = oob.read_tray(client, paths)
    assert bmc.answered and bmc.power_health == "OK" and bmc.supplies == ()
    assert [d.id for d in bmc.detectors] == list(CAPTURE_DETECTORS)
    assert [d.state for d in bmc.detectors] == ["OK", "OK", "Critical", "OK"]
    assert {d.chassis for d in bmc.detectors} == {"Chassis_0"}
    assert len(client.paths) == 7          # collection + 4 detectors, power subsystem, supplies (once found)


def test_the_leak_detectors_are_found_in_the_compute_trays_tree():
    """Issue 27.4: not a fixed path: every chassis of the GB200 capture is walked (Chassis -> ThermalSubsystem
    -> LeakDetection -> LeakDetectors); only Chassis_0's ThermalSubsystem links a LeakDetection. The copied
    subset holds the tray chassis' ThermalSubsystem only: the others answer 404 here and are noted."""
    client = CaptureClient()
    paths = oob.discover_leaks(client, now=5.0)
    assert paths.collections == (("Chassis_0", leak.LEAK_DETECTORS),) and paths.at == 5.0
    assert paths.walked == len(capture_doc("/redfish/v1/Chassis")["Members"]) == 42
    assert paths.unread and all(u.split(":")[0].endswith("/ThermalSubsystem") for u in paths.unread)
    assert not any("/Chassis/Chassis_0/" in u for u in paths.unread)


def test_the_leak_detectors_are_found_in_the_switch_trays_tree():
    """The NVLink switch tray keeps its seven detectors on the BMC board's chassis, MGX_BMC_0; SYS_eeprom's
    ThermalSubsystem links a LeakDetection too, which the capture does not hold: noted, not fatal."""
    client = CaptureClient(capture=GB200_SWITCH_REDFISH)
    paths = oob.discover_leaks(client)
    coll = "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors"
    assert paths.collections == (("MGX_BMC_0", coll),)
    assert any(u.startswith("/redfish/v1/Chassis/SYS_eeprom/ThermalSubsystem/LeakDetection:") for u in paths.unread)
    bmc = oob.read_tray(client, paths, power=False)
    assert bmc.answered and not bmc.power_asked and bmc.power_health is None
    assert sorted(d.id for d in bmc.detectors) == [f"leakage{i}" for i in range(1, 7)] + ["leakage_aggr"]
    assert {d.chassis for d in bmc.detectors} == {"MGX_BMC_0"} and {d.state for d in bmc.detectors} == {"OK"}
    found = {f.check: f for f in leak.judge("lab-r1-sw01", bmc, rack="lab-r1", role="switch")}
    assert set(found) == {leak.BMC, leak.LEAK}                      # no power check for a switch tray
    assert found[leak.LEAK].message == "7 leak detectors OK" and found[leak.LEAK].details["rack"] == "lab-r1"


def test_a_read_that_answers_404_is_found_again_and_a_long_while_walks_again():
    """The cached places are walked again when a read of them answers 404 (the tree changed, a firmware
    update) and after REDISCOVER_S; otherwise a read costs no walk."""
    client = CaptureClient()
    kept: list = []
    old = oob.LeakPaths((("Chassis_0", leak.LEAK_DETECTORS + "_gone"),), at=100.0)
    bmc = oob.read_tray(client, old, now=101.0, keep=kept.append)
    assert [d.id for d in bmc.detectors] == list(CAPTURE_DETECTORS) and kept[-1].collections[0][1] == leak.LEAK_DETECTORS
    assert "/redfish/v1/Chassis" in client.paths                    # walked again
    client.paths.clear()
    oob.read_tray(client, kept[-1], now=101.0 + oob.REDISCOVER_S / 2)
    assert "/redfish/v1/Chassis" not in client.paths
    oob.read_tray(client, kept[-1], now=kept[-1].at + oob.REDISCOVER_S + 1)
    assert "/redfish/v1/Chassis" in client.paths


def test_read_tray_a_missing_leak_tree_is_said_not_guessed():
    bmc = oob.read_tray(CaptureClient(missing=(leak.LEAK_DETECTORS,)))
    assert bmc.answered and bmc.detectors is None and "404" in bmc.leak_error and bmc.power_health == "OK"


def test_read_tray_a_silent_bmc_raises():
    with pytest.raises(BMCError) as exc:
        oob.read_tray(CaptureClient(silent="timeout"))
    assert exc.value.kind == "timeout"


def test_a_supply_in_the_dmtf_shape_is_parsed():
    """No GB200 tray capture lists a PSU; this document is made here in DMTF's PowerSupply v1_6 shape."""
    s = parse_supply({"@odata.id": "/x", "Id": "PSU_3", "LineInputStatus": "LossOfInput",
                      "Status": {"Health": "Critical", "State": "Enabled"}})
    assert (s.id, s.health, s.line_input) == ("PSU_3", "Critical", "LossOfInput")
    with pytest.raises(ValueError):
        parse_supply({"Status": {}})
    with pytest.raises(ValueError):
        parse_detector({"DetectorState": "OK"})


def _facts(bmc: BmcHealth | None, **kw) -> TrayFacts:
    return TrayFacts(host="t01", bmc=bmc, **kw)


def _findings(name: str, **kw):
    return {f.check: f for f in leak.check(_facts(BMC_CASES[name], **kw), None, HealthSettings())}


# --- the checks ---------------------------------------------------------------------------------------

def test_the_capture_is_healthy_and_says_what_was_read():
    f = _findings("capture")
    assert {k: v.severity for k, v in f.items()} == {leak.BMC: Severity.OK, leak.LEAK: Severity.OK,
                                                     leak.POWER: Severity.OK}
    assert f[leak.LEAK].message == "4 leak detectors OK"
    assert "lists no power supply" in f[leak.POWER].message


def test_the_captures_critical_detector_is_a_critical_finding_with_a_short_reason():
    f = _findings("leak-critical")[leak.LEAK]
    assert f.severity is Severity.CRITICAL and f.message == "leak: Chassis_0_LeakDetector_1_ColdPlate Critical (Moisture)"
    assert f.details["short"] == "leak critical 1_ColdPlate"
    reason, full = checks.drain_reason([f])
    assert reason == "mctl: leak critical 1_ColdPlate" and len(reason) <= 40


def test_a_warning_detector_warns_and_a_silent_bmc_is_never_healthy():
    assert _findings("leak-warning")[leak.LEAK].severity is Severity.WARN
    assert _findings("leak-unavailable")[leak.LEAK].severity is Severity.WARN
    assert _findings("leak-unread")[leak.LEAK].severity is Severity.WARN
    silent = _findings("silent")
    assert {k: v.severity for k, v in silent.items()} == {k: Severity.WARN for k in (leak.BMC, leak.LEAK, leak.POWER)}
    assert "did not answer" in silent[leak.BMC].message


def test_a_psu_fault_warns_and_does_not_drain():
    f = _findings("psu-fail")[leak.POWER]
    assert f.severity is Severity.WARN and "PowerSubsystem Critical" in f.message


def test_no_bmc_facts_no_findings_and_a_leak_on_an_unreached_tray_is_still_seen():
    assert leak.check(_facts(None), None, HealthSettings()) == []
    fs = checks.run_tray(_facts(BMC_CASES["leak-critical"], reach="unreachable", error="no SSH"),
                         TrayExpectation(host="t01"), HealthSettings())
    assert {f.check for f in fs} >= {"tray.reachable", leak.LEAK}
    # the leak names the drain, before the unreachable tray
    assert checks.drain_reason(fs)[0] == "mctl: leak critical 1_ColdPlate +1"


# --- the leak episode (pure, time injected) --------------------------------------------------------

T0 = 1_800_000_000.0


def leak_findings(name: str):
    return [f for f in leak.check(_facts(BMC_CASES[name]), None, HealthSettings()) if f.check == leak.LEAK]


def test_an_episode_holds_the_leak_through_a_flap_and_ends_after_clear_readings():
    crit, ok = leak_findings("leak-critical"), leak_findings("capture")
    out, ep = leaks.step(None, crit, reached=True, now=T0, clear_sweeps=3)
    assert ep.since == T0 and not ep.sent
    out, ep = leaks.step(ep, ok, reached=True, now=T0 + 10, clear_sweeps=3)       # OK once: still held
    assert worst(out) is Severity.CRITICAL and out[0].details["held"] and "held: leak since" in out[0].message
    out, ep = leaks.step(ep, crit, reached=True, now=T0 + 20, clear_sweeps=3)     # back: a flap, same episode
    assert ep.since == T0 and ep.flaps == 1
    _, ep = leaks.step(ep, BMC_silent := [f for f in leak.check(_facts(BMC_CASES["silent"]), None, HealthSettings())
                                          if f.check == leak.LEAK], reached=True, now=T0 + 25, clear_sweeps=3)
    assert ep.clear == 0                                          # an unread BMC counts neither way
    assert BMC_silent[0].severity is Severity.WARN
    for i in range(2):
        out, ep = leaks.step(ep, ok, reached=True, now=T0 + 30 + i, clear_sweeps=3)
        assert ep is not None and worst(out) is Severity.CRITICAL
    out, ep = leaks.step(ep, ok, reached=True, now=T0 + 40, clear_sweeps=3)
    assert ep is None and worst(out) is Severity.OK


def test_power_off_is_due_once_after_the_timeout_and_only_for_mctls_drain():
    _, ep = leaks.step(None, leak_findings("leak-critical"), reached=True, now=T0, clear_sweeps=3)
    due = lambda e, now, **kw: leaks.power_off_due(e, **{"excluded": False,  # noqa: E731
                                                         "enabled": True, "after_s": 600.0, "now": now, **kw})
    assert due(ep, T0 + 599.9) is None
    assert "600s >= health.leak.power_off_after 600s" in due(ep, T0 + 600)
    assert due(ep, T0 + 600, excluded=True) is None                  # the inventory excludes it by name
    assert due(ep, T0 + 600, enabled=False) is None
    assert "health.leak.exclude" in leaks.blocked(ep, excluded=True, enabled=True)
    assert leaks.blocked(ep, excluded=False, enabled=True) is None     # whoever drained it, DOWN or not
    off = leaks.sent(ep, at=T0 + 600, result="ok", power_state="Off")
    assert due(off, T0 + 10_000) is None and leaks.powered_off_for_leak(off)
    # powered off: the episode outlives clear readings until SSH reaches the tray again (a person powered it on)
    for i in range(5):
        _, off = leaks.step(off, leak_findings("capture"), reached=False, now=T0 + 700 + i, clear_sweeps=3)
        assert off is not None and off.sent
    _, off = leaks.step(off, leak_findings("capture"), reached=True, now=T0 + 800, clear_sweeps=3)
    assert off is None


# --- through the policy ---------------------------------------------------------------------------------

def verdict(bmc: BmcHealth, *, reached: bool = True) -> TrayVerdict:
    facts = _facts(bmc) if reached else _facts(bmc, reach="unreachable", error="no SSH")
    fs = tuple(checks.run_tray(facts, TrayExpectation(host="t01"), HealthSettings()) if not reached
               else leak.check(facts, None, HealthSettings()))
    return TrayVerdict("t01", "rack-a", "ok" if reached else "unreachable", worst(fs), fs)


NODE = NodeView("t01", known=True, state="idle")
DRAINED = NodeView("t01", known=True, drained=True, reason="mctl: leak critical 1_ColdPlate", state="drained")


def sweep(records, v, node, s, now, breaker=None):
    out = decide(records, [v], {"t01": node}, s, breaker or BreakerState(), {"rack-a": 4}, now=now)
    return out.records, [d.action for d in out.decisions], out


def test_a_critical_leak_drains_at_once_whatever_confirm_sweeps_and_reachability():
    s = HealthSettings(confirm_sweeps=3, unreachable_sweeps_before_drain=5)
    for reached in (True, False):
        recs, acts, out = sweep({}, verdict(BMC_CASES["leak-critical"], reached=reached), NODE, s, T0)
        assert acts == ["drain"], reached
        assert out.decisions[0].reason.startswith("mctl: leak critical 1_ColdPlate")
        assert recs["t01"].drained and recs["t01"].leak.since == T0


def test_a_warning_leak_is_a_finding_not_a_drain():
    recs, acts, _ = sweep({}, verdict(BMC_CASES["leak-warning"]), NODE, HealthSettings(), T0)
    assert acts == [] and recs["t01"].leak is None


def test_a_flapping_leak_is_drained_once_held_and_never_resumed_while_open():
    s = HealthSettings(resume_after_healthy_sweeps=1, leak_clear_sweeps=3)
    recs, acts, _ = sweep({}, verdict(BMC_CASES["leak-critical"]), NODE, s, T0)
    assert acts == ["drain"]
    seen = []
    for i, name in enumerate(["capture", "leak-critical", "capture", "leak-critical", "capture"]):
        recs, acts, _ = sweep(recs, verdict(BMC_CASES[name]), DRAINED, s, T0 + 10 * (i + 1))
        seen += acts
    assert seen == [] and recs["t01"].drained and recs["t01"].leak.flaps == 2
    assert recs["t01"].leak.since == T0                     # the timeout runs from the first reading
    # clear for 3 readings: the episode ends; then the usual resume
    for i in range(3):
        recs, acts, _ = sweep(recs, verdict(BMC_CASES["capture"]), DRAINED, s, T0 + 100 + i)
    assert recs["t01"].leak is None and acts == ["resume"]


def test_a_leak_outranks_a_tripped_breaker():
    """Issue 27.4 turned this around: a tripped breaker used to refuse the leak's drain and its power-off;
    a leak now drains and powers off whatever the breaker says (the breaker counts it)."""
    tripped = BreakerState(tripped=True, tripped_at=T0 - 1, reason="test")
    recs, acts, out = sweep({}, verdict(BMC_CASES["leak-critical"]), NODE, HealthSettings(), T0, breaker=tripped)
    assert acts == ["drain"] and recs["t01"].drained and recs["t01"].leak is not None
    assert out.decisions[-1].outranks_budget and [d[1] for d in out.breaker.drains] == ["t01"]
    assert leaks.power_off_due(recs["t01"].leak, excluded=False, enabled=True, after_s=0, now=T0 + 1) is not None


def test_the_record_keeps_the_episode_across_a_restart():
    recs, _, _ = sweep({}, verdict(BMC_CASES["leak-critical"]), NODE, HealthSettings(), T0)
    again = TrayRecord.from_dict(json.loads(json.dumps(recs["t01"].to_dict())))
    assert again.leak == recs["t01"].leak and again == replace(recs["t01"])


def test_leak_settings_from_the_inventory():
    from mctl.inventory.convert import health_settings
    from mctl.inventory.schema import HealthSpec, LeakSpec

    default = health_settings(HealthSpec())
    assert (default.leak_power_off_after_s, default.leak_power_off, default.leak_clear_sweeps, default.bmc_checks) \
        == (600.0, True, 3, "auto")
    short = health_settings(HealthSpec(leak=LeakSpec(power_off_after="5s", clear_sweeps=2), bmc_checks="off"))
    assert (short.leak_power_off_after_s, short.leak_clear_sweeps, short.bmc_checks) == (5.0, 2, "off")
    assert HealthSettings.from_dict(short.to_dict()) == short


def test_a_damaged_leak_episode_in_the_state_file_is_refused_with_its_field(tmp_path):
    from mctl.health import store
    from mctl.state.files import DamagedState

    recs, _, _ = sweep({}, verdict(BMC_CASES["leak-critical"]), NODE, HealthSettings(), T0)
    store.save_state(tmp_path, store.HealthState("site", recs, BreakerState()))
    assert store.load_state(tmp_path).records["t01"].leak.since == T0
    path = store.state_path(tmp_path)
    data = json.loads(path.read_text())
    data["trays"]["t01"]["leak"]["since"] = "yesterday"
    path.write_text(json.dumps(data))
    with pytest.raises(DamagedState, match="trays.t01.leak.since"):
        store.load_state(tmp_path)


def test_the_watchs_bmc_reads_do_not_resume_tls(monkeypatch):
    """The watch reads every BMC every sweep; reading a socket's TLS session (for resumption) leaks native
    memory in Python's ssl module (~40 KiB a connection, 110-160 MiB over the 30-minute soak), so the
    sweep's clients are made without it; one-shot commands keep it (mctl.bmc.client.RESUME_TLS)."""
    import mctl.bmc.client as client_mod
    from types import SimpleNamespace

    made = []

    class Stand(client_mod.RedfishClient):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            raise BMCError("unreachable", "stand-in: no BMC here")

    monkeypatch.setattr(client_mod, "RedfishClient", Stand)
    settings = SimpleNamespace(deadline_s=2.0, scheme="https", port=443, credentials=None, verify_tls=True,
                               timeout_s=1.0, concurrency=4)
    host = SimpleNamespace(name="t01", bmc="127.0.0.1", role="compute")
    assert oob.read([host], settings, 2.0)["t01"].error_kind == "unreachable"
    assert not oob.power_off([host], settings, 2.0)["t01"].sent
    assert len(made) == 2 and all(kw.get("resume_tls") is False for kw in made), made
