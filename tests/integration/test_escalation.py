"""Rack escalation on the Slurm lab (issue 30.6): the same critical fault on most trays of the rack gives one
rack hold — one reason on every tray of the rack, one `rack-escalation` line — not a drain per tray until the
breaker trips; `mctl health escalation lift` restores every tray and the safety budget holds no grant after."""

from __future__ import annotations

import json

import pytest

from tests.helpers import HEALTH, actions, fault, sinfo, wait_for, write_health_site

# --own-labs beside (scripts/test): in the second pytest, on its shared lab (balances the two sessions;
# tests/beside.py, D125)
pytestmark = pytest.mark.beside

REASON = "mctl: rack escalated: 3 of 4 trays failed"


def _runner(lab, tmp_path):
    """mctl against the lab's inventory as it is now, with rack escalation on and this test's own state."""
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "escalation": {"enabled": True, "rack_share": 0.5,
                                                                               "window": "10m"}})
    state = tmp_path / "state"

    def mctl(*args: str, timeout: float = 180):
        return lab.mctl("-i", str(site), "--state-dir", str(state), *args, timeout=timeout)

    mctl.state = state
    return mctl


def _as_found(lab) -> None:
    lab.clear_faults()
    for node, (st, reason) in sinfo(lab).items():
        if ("drain" in st and reason.startswith("mctl:")) or st.startswith("down"):
            lab.run(lab.head, f"scontrol update NodeName={node} State=RESUME", check=False)
    wait_for("every tray idle again after the test",
             lambda: all(st.rstrip("*") in ("idle", "allocated", "mixed") and not st.endswith("*")
                         for st, _ in sinfo(lab).values()), 60, every=0.5)


@pytest.fixture
def escalating(lab, slurm_lab, tmp_path):
    """mctl with rack escalation on; the lab as found after."""
    try:
        yield _runner(lab, tmp_path)
    finally:
        _as_found(lab)


@pytest.fixture
def escalating_with_switch_trays(lab, slurm_lab, switch_trays, tmp_path):
    """The same, on the lab with its 2 switch trays (their BMCs) in the inventory."""
    try:
        yield _runner(lab, tmp_path), switch_trays
    finally:
        _as_found(lab)


def test_most_of_a_rack_failing_takes_one_rack_hold_lifted_by_one_command(lab, escalating):
    mctl = escalating
    failing = lab.trays[:3]
    try:
        for i, tray in enumerate(failing):
            fault(lab, tray, nvlink_down=f"{i}:1")
        proc = mctl("--json", "health", "check", "--remediate")
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
        states = sinfo(lab)
        assert {t: states[t] for t in lab.trays} == {t: ("drained", REASON) for t in lab.trays}, states
        logged = actions(mctl.state)
        holds = [e for e in logged if e["action"] == "rack-escalation"]
        assert len(holds) == 1 and holds[0]["result"] == "ok" and holds[0]["rack"] == "lab-r1"
        assert holds[0]["failed"] == sorted(failing) and holds[0]["held"] == lab.trays
        assert "3 of 4 compute trays failed" in holds[0]["why"]
        # at most the first tray to answer was drained on its own (as its answer came), then taken into the hold
        assert len([e for e in logged if e["action"] == "drain"]) <= 1
        assert "breaker-trip" not in [e["action"] for e in logged]
        budget = json.loads(mctl("--json", "health", "breaker", "status").stdout)["budget"]
        # counted where it fits (the lab's 4-tray rack: 1 grant), never held back, never tripped (D99)
        rack = budget["racks"]["lab-r1"]
        assert budget["tripped"] is None and len(rack["held"]) == rack["limit"]
        status = json.loads(mctl("--json", "health", "escalation", "status").stdout)
        assert list(status["held"]) == ["lab-r1"] and status["held"]["lab-r1"]["reason"] == REASON

        # a second sweep: still held, nothing new
        assert mctl("health", "check", "--remediate").returncode == 1
        assert [e["action"] for e in actions(mctl.state)].count("rack-escalation") == 1
        assert all(sinfo(lab)[t] == ("drained", REASON) for t in lab.trays)
    finally:
        lab.clear_faults()
    dry = mctl("--json", "health", "escalation", "lift", "lab-r1", "--dry-run")
    assert dry.returncode == 0 and json.loads(dry.stdout)["trays"] == lab.trays
    assert all(sinfo(lab)[t][0] == "drained" for t in lab.trays)          # a dry run changes nothing
    lift = mctl("--json", "health", "escalation", "lift", "lab-r1")
    assert lift.returncode == 0, lift.stdout + lift.stderr
    assert json.loads(lift.stdout)["lifted"] == lab.trays
    wait_for("every tray of the rack idle after the lift",
             lambda: all(sinfo(lab)[t] == ("idle", "") for t in lab.trays), 30, every=0.3)
    assert [e["action"] for e in actions(mctl.state)].count("rack-escalation-lift") == 1
    assert json.loads(mctl("--json", "health", "escalation", "status").stdout)["held"] == {}
    budget = json.loads(mctl("--json", "health", "breaker", "status").stdout)["budget"]
    assert budget["tripped"] is None and budget["site"]["held"] == []   # every grant back, the budget never tripped
    again = mctl("--json", "health", "escalation", "lift", "lab-r1")
    assert again.returncode == 0 and json.loads(again.stdout)["result"] == "not held"     # idempotent


def test_a_failed_switch_tray_holds_its_rack(lab, escalating_with_switch_trays):
    from mctl.lab import bmc_faults

    mctl, switches = escalating_with_switch_trays
    leaking = switches[0]
    reason = f"mctl: rack escalated: switch tray {leaking} failed"
    bmc_faults.apply(lab.dir, leaking, leak="critical", detector="leakage3")
    try:
        proc = mctl("--json", "health", "check", "--remediate")
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
        states = sinfo(lab)
        assert {t: states[t] for t in lab.trays} == {t: ("drained", reason) for t in lab.trays}, states
        (hold,) = [e for e in actions(mctl.state) if e["action"] == "rack-escalation"]
        assert hold["cause"] == "switch-tray" and hold["failed"] == [leaking] and hold["result"] == "ok"
        assert "leak.detectors" in hold["why"]
        assert [e for e in actions(mctl.state) if e["action"] == "drain"] == []    # the trays themselves are healthy
    finally:
        bmc_faults.apply(lab.dir, leaking, clear=True)
    assert mctl("health", "escalation", "lift", lab.rack).returncode == 0
    wait_for("every tray of the rack idle after the lift",
             lambda: all(sinfo(lab)[t] == ("idle", "") for t in lab.trays), 30, every=0.3)
