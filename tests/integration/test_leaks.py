"""Leaks out of band on the lab: a tray's BMC emulator reports a leak (`mctl lab fault --leak`), the health sweep
reads it over Redfish, drains the tray at once and powers it off through the BMC after the (shortened) timeout,
once; checked through Redfish and SSH. The tray is then cleared, powered on by hand and resumed by mctl, so the
shared lab is left as found.

The site is the health site's (tests.helpers.HEALTH: short settings; real Slurm from `slurm_lab`) with
`health.leak.power_off_after: 3s`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mctl.lab import bmc_faults
from tests.helpers import HEALTH, Watch, power_state, redfish, sinfo, ssh_ok, wait_for, write_health_site

DETECTOR = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/Chassis_0_LeakDetector_0_ColdPlate"
AFTER_S = 3


def logged(state: Path, action: str | None) -> list[dict]:
    """The action log's lines of *action*, read while the watch writes it (tests.helpers.actions, which also
    checks that every intent has its result, is for a log at rest)."""
    path = state / "health" / "actions.jsonl"
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            entry = json.loads(line)
        except ValueError:                      # a line being written
            continue
        if entry.get("action") == action or (action is None and entry.get("action") != "intent"):
            out.append(entry)
    return out


@pytest.fixture(scope="module")
def leak_site(slurm_lab, tmp_path_factory) -> Path:
    return write_health_site(slurm_lab.lab, tmp_path_factory.mktemp("leak-site"), {
        **HEALTH, "resume_after_healthy_sweeps": 1, "leak": {"power_off_after": f"{AFTER_S}s", "clear_sweeps": 1}})


def test_critical_leak_drains_then_powers_off_after_the_timeout_once_and_is_restored(lab, leak_site, tmp_path):
    tray = lab.trays[-1]
    state = tmp_path / "state"
    metrics = tmp_path / "mctl.prom"
    # one watch process for the whole story (a CLI start per sweep costs seconds on a loaded machine)
    watch = Watch(lab, leak_site, state, tray, "--interval", "1", "--metrics-textfile", str(metrics))
    try:
        # a warning is a finding, not a drain (and the sweep reads the BMC from the first one on)
        bmc_faults.apply(lab.dir, tray, leak="warning")
        wait_for("a sweep with the warning", lambda: watch.sweeps() >= 1, 90, every=0.3)
        assert sinfo(lab)[tray] == ("idle", "")

        # critical: mctl sees it only through Redfish, and drains at once
        bmc_faults.apply(lab.dir, tray, leak="critical")
        code, det = redfish(lab, tray, DETECTOR)
        assert code == 200 and det["DetectorState"] == "Critical"
        wait_for(f"{tray} drained", lambda: "drain" in sinfo(lab)[tray][0], 60, every=0.3)
        assert sinfo(lab)[tray][1] == "mctl: leak critical 0_ColdPlate"
        (drain,) = wait_for("the drain in the action log", lambda: logged(state, "drain"), 30, every=0.3)
        assert drain["tray"] == tray and drain["result"] == "ok"

        # after the timeout the watch powers it off through the BMC: checked through Redfish and SSH
        wait_for(f"{tray} powered off for the leak", lambda: power_state(lab, tray) == "Off", 90, every=0.5)
        wait_for(f"{tray} gone from SSH", lambda: not ssh_ok(lab, tray), 60)
        # the watch logs the power-off once PowerState read Off (its sweep may still be polling now)
        (off,) = wait_for("the power-off in the action log", lambda: logged(state, "power-off"), 60, every=0.3)
        assert off["tray"] == tray and off["result"] == "ok" and off["sent"] is True
        assert "critical leak since" in off["why"] and f"power_off_after {AFTER_S}s" in off["why"]
        assert off["time"] >= drain["time"]
        wait_for("the POWER-OFF event", lambda: any(" POWER-OFF " in l and tray in l for l in watch.read()), 30)

        # still leaking, more sweeps: no second power-off, and mctl never powers it on
        seen = watch.sweeps()
        wait_for("two more sweeps", lambda: watch.sweeps() >= seen + 2, 60, every=0.3)
        assert len(logged(state, "power-off")) == 1
        assert power_state(lab, tray) == "Off" and "drain" in sinfo(lab)[tray][0]
        prom = metrics.read_text()
        assert 'state="powered_off"} 1' in prom and 'state="critical"} 0' in prom, prom
        assert 'action="power-off",result="ok"' in prom, prom

        # repaired: cleared and powered on by a person; mctl ends the episode and resumes its own drain
        bmc_faults.apply(lab.dir, tray, clear=True)
        code, _ = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                          body={"ResetType": "On"})
        assert code == 204
        wait_for("SSH back", lambda: ssh_ok(lab, tray), 120)
        wait_for(f"{tray} resumed by mctl", lambda: sinfo(lab)[tray] == ("idle", ""), 120, every=0.5)
        wait_for("the resume in the action log", lambda: logged(state, "resume"), 30, every=0.3)
        assert [e["action"] for e in logged(state, None) if e["action"] in ("drain", "resume", "power-off")] == [
            "drain", "power-off", "resume"]
    finally:
        code = watch.stop()
        bmc_faults.apply(lab.dir, tray, clear=True)
        if power_state(lab, tray) != "On":
            redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                    body={"ResetType": "On"})
        wait_for("SSH back", lambda: ssh_ok(lab, tray), 120)
        lab.settle_slurm()
    assert code == 0, watch.proc.stderr.read()


def test_a_switch_trays_leak_is_read_by_the_sweep_as_a_finding_of_its_own(lab, switch_trays):
    """Issues 27.4 and 20.6: the switch tray's detectors are found in its own BMC's tree (MGX_BMC_0, not the
    compute tray's Chassis_0) and shown in `health check --json` per rack and in the findings; what to do about
    them is the rack policy's (no drain or power-off follows from this sweep: there is no remediation here)."""
    leaking, dry = switch_trays[0], switch_trays[1]
    bmc_faults.apply(lab.dir, leaking, leak="critical", detector="leakage3")
    try:
        proc = lab.mctl("--json", "health", "check", lab.rack, timeout=180)
        data = json.loads(proc.stdout)
    finally:
        bmc_faults.apply(lab.dir, leaking, clear=True)
    rows = {t["host"]: t for t in data["switch_trays"]}
    assert sorted(rows) == sorted(switch_trays) and {r["rack"] for r in rows.values()} == {lab.rack}
    assert all(len(r["bmc"]["detectors"]) == 7 and not r["bmc"]["power_asked"] for r in rows.values())
    assert {d["chassis"] for r in rows.values() for d in r["bmc"]["detectors"]} == {"MGX_BMC_0"}
    by = {(f["host"], f["check"]): f for f in data["findings"] if f["host"] in rows}
    crit = by[(leaking, "leak.detectors")]
    assert crit["severity"] == "critical" and "leakage3 Critical" in crit["message"], crit
    assert crit["details"]["rack"] == lab.rack and crit["details"]["role"] == "switch"
    assert by[(dry, "leak.detectors")]["message"] == "7 leak detectors OK"
    assert by[(dry, "bmc.reachable")]["severity"] == "ok" and (dry, "power.supplies") not in by
    assert proc.returncode == 1                        # a critical finding (exit 1), whatever the trays say
    assert sorted(t["host"] for t in data["trays"]) == sorted(lab.trays)    # switch trays have no tray row
