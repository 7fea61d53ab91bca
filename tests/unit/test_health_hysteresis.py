"""Hysteresis for flapping findings (mctl.health.hysteresis) and the policy built on it: pure logic."""

from __future__ import annotations

import json
from dataclasses import replace

from mctl.health.hysteresis import step
from mctl.model.settings import HysteresisSettings
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import DRAIN, RESUME
from mctl.model.settings import HealthSettings
from mctl.model.findings import Finding, Severity
from mctl.model.settings import HealthSettings, HysteresisSettings
from tests.helpers import PolicySite

S = HealthSettings()
H = HysteresisSettings()
HOST = "r1-tray01"
LINK_DOWN = Finding(Severity.CRITICAL, HOST, "nvlink.links", "NVLinks not up: gpu0 link5", None, {"gpu": 0})
LINK_OK = Finding(Severity.OK, HOST, "nvlink.links", "72 NVLinks active (4 GPUs x 18)")
XID = Finding(Severity.CRITICAL, HOST, "gpu.xid", "XID 149 on gpu0: NETIR_LINK_EVT Fatal", None,
              {"short": "xid 149 gpu0"})


def run(pattern: str, settings: HysteresisSettings = H, finding: Finding = LINK_DOWN, ok: Finding = LINK_OK):
    """Sweep by sweep ('D' down, 'u' up, '-' unreached): the severity each sweep reports for the check."""
    latches = None
    out = []
    for c in pattern:
        seen = [finding] if c == "D" else [ok]
        findings, latches = step(latches, seen if c != "-" else [], settings, reached=c != "-")
        json.dumps({k: v.to_dict() for k, v in latches.items()})    # the state is kept as JSON
        mine = [f for f in findings if f.check == finding.check]
        out.append("C" if any(f.severity is Severity.CRITICAL for f in mine) else ("." if c != "-" else "-"))
    return "".join(out), latches


def test_a_steady_fault_is_released_on_its_first_clear_sweep_by_default():
    # clear_sweeps 1: exactly the behaviour without hysteresis
    assert run("DDDuuu")[0] == "CCC..."


def test_a_flapping_link_stays_critical_while_it_flaps():
    shown, latches = run("DuDuDuDuDuDu")
    assert shown == "C.CCCCCCCCCC"                 # the first return cannot be told from a new fault
    assert latches["nvlink.links"].flaps == 5


def test_each_return_doubles_the_hold_then_it_clears_once():
    s = HysteresisSettings(window_sweeps=2)
    assert [s.hold(n) for n in range(4)] == [1, 2, 4, 8]
    # came back twice: held for 4 clear sweeps, then released, then forgotten after the window
    shown, latches = run("DuDuD" + "u" * 6, s)
    assert shown == "C.CCC" + "CCC..."
    assert latches == {}


def test_hold_is_capped():
    s = HysteresisSettings(clear_sweeps=2, max_hold_sweeps=5)
    assert [s.hold(n) for n in range(5)] == [2, 5, 5, 5, 5]
    shown, _ = run("DuDuDuD" + "u" * 6, s)
    assert shown == "CCCCCCC" + "CCCC.."


def test_clear_sweeps_holds_even_a_steady_fault():
    assert run("DDuuuu", HysteresisSettings(clear_sweeps=3))[0] == "CCCC" + ".."


def test_sweeps_that_did_not_reach_the_tray_change_nothing():
    assert run("DuD-u-u")[0] == "C.C-C-C"         # unreached sweeps neither clear nor flap it
    assert run("D---u")[0] == "C---."


def test_the_held_finding_says_why_and_replaces_the_ok_one():
    _, latches = step(None, [LINK_DOWN], H)
    _, latches = step(latches, [LINK_OK], H)
    findings, latches = step(latches, [LINK_DOWN], H)
    findings, latches = step(latches, [LINK_OK], H)
    (held,) = [f for f in findings if f.check == "nvlink.links"]
    assert held.severity is Severity.CRITICAL and held.details["held"] is True
    assert "held: seen critical in 2 sweeps, came back 1 time(s); clears after 10 clear sweeps in a row, 1 so far" \
        in held.message


def test_only_the_configured_checks_are_held():
    other = Finding(Severity.CRITICAL, HOST, "gpu.count", "3 of 4 GPUs")
    other_ok = Finding(Severity.OK, HOST, "gpu.count", "4 GPUs")
    assert run("DuDu", finding=other, ok=other_ok)[0] == "C.C."
    assert run("DuDu", HysteresisSettings(checks=frozenset({"gpu.count"})), other, other_ok)[0] == "C.CC"


# --- the policy: one drain, one resume per flapping episode -------------------------------------------

def verdict(findings):
    worst = max((f.severity for f in findings), default=Severity.OK)
    return TrayVerdict(HOST, "r1", "ok", worst, tuple(findings))


def cycles(pattern: str, settings: HealthSettings = S):
    site = PolicySite([HOST] + [f"r1-tray{i:02d}" for i in range(2, 9)], settings)
    acts = []
    for c in pattern:
        out = site.sweep([verdict([LINK_DOWN] if c == "D" else [LINK_OK])])
        acts += [d.action for d in out.actions]
    return acts, site


def test_flapping_link_is_drained_once_and_resumed_once_after_it_settles():
    acts, site = cycles("DuDuuDuuDuDu" + "u" * 80)
    assert acts == [DRAIN, RESUME]
    assert not site.records[HOST].latches                 # forgotten once it stayed up


def test_without_hysteresis_the_same_flapping_oscillates():
    no_hold = replace(S, hysteresis_checks=())
    acts, _ = cycles("DuuuuDuuuuDuuuu", no_hold)
    assert acts == [DRAIN, RESUME] * 3
    # with it: one more cycle at most (the first return looks like a new fault), then held until it settles
    acts, _ = cycles("DuuuuDuuuuDuuuuDuuuu" + "u" * 70)
    assert acts == [DRAIN, RESUME, DRAIN, RESUME]


def test_an_xid_storm_that_a_bounded_tail_sometimes_misses_does_not_oscillate():
    site = PolicySite([HOST] + [f"r1-tray{i:02d}" for i in range(2, 9)])
    acts = []
    for c in "DuuuDuuuDuuuD" + "u" * 70:        # the fatal line sometimes pushed out of the tail by the storm
        out = site.sweep([verdict([XID] if c == "D" else [])])
        acts += [d.action for d in out.actions]
    assert acts == [DRAIN, RESUME, DRAIN, RESUME]


def test_latches_survive_a_restart_of_the_watch():
    _, site = cycles("DuD")
    rec = site.records[HOST]
    assert rec.latches and TrayRecord.from_dict(json.loads(json.dumps(rec.to_dict()))).latches == rec.latches


def test_settings_round_trip_and_come_from_the_inventory():
    s = replace(S, hysteresis_clear_sweeps=2, hysteresis_checks=("nvlink.links",))
    assert HealthSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.hysteresis == HysteresisSettings(2, 64, frozenset({"nvlink.links"}))
    from mctl.inventory.convert import health_settings
    from mctl.inventory.schema import HealthSpec

    spec = HealthSpec.from_dict({"hysteresis": {"clear_sweeps": 3, "checks": ["gpu.xid"]}}) \
        if hasattr(HealthSpec, "from_dict") else None
    if spec is not None:
        assert health_settings(spec).hysteresis == HysteresisSettings(3, 64, frozenset({"gpu.xid"}))
