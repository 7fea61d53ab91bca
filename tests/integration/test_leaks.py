"""Leaks out of band on the lab: a tray's BMC emulator reports a leak (`mctl lab fault --leak`), the health sweep
reads it over Redfish, drains the tray at once and powers it off through the BMC after the (shortened) timeout,
once; checked through Redfish and SSH. The tray is then cleared, powered on by hand and resumed by mctl, so the
shared lab is left as found.

The site is test_health's (short settings, real Slurm) with `health.leak.power_off_after: 3s`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from mctl.lab import bmc_faults
from tests.integration.test_health import HEALTH, actions, sinfo, wait_for
from tests.integration.test_lab_bmcs import power_state, redfish, ssh_ok

DETECTOR = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/Chassis_0_LeakDetector_0_ColdPlate"
AFTER_S = 3


@pytest.fixture(scope="module")
def leak_site(lab, tmp_path_factory) -> Path:
    if len(lab.trays) < 4:
        pytest.skip("needs a lab with 4 trays (MCTL_TEST_TRAYS)")
    folder = tmp_path_factory.mktemp("leak-site")
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["health"] = {**HEALTH, "leak": {"power_off_after": f"{AFTER_S}s", "clear_sweeps": 1}}
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        nodes = sinfo(lab)
    except AssertionError:
        nodes = {}
    if sorted(nodes) != lab.trays or any(s.startswith(("down", "unk")) for s, _ in nodes.values()):
        proc = lab.mctl("-i", str(folder), "deploy", "slurm", timeout=900)
        assert proc.returncode == 0, f"deploy slurm failed: {proc.stderr}\n{proc.stdout[-2000:]}"
    lab.settle_slurm()
    return folder


def _tray_findings(proc, tray: str) -> dict[str, dict]:
    data = json.loads(proc.stdout)
    return {f["check"]: f for f in data["findings"] if f["host"] == tray}


def test_critical_leak_drains_then_powers_off_after_the_timeout_once_and_is_restored(lab, leak_site, tmp_path):
    tray = lab.trays[-1]
    state = tmp_path / "state"

    def mctl(*args: str, timeout: float = 180):
        return lab.mctl("-i", str(leak_site), "--state-dir", str(state), *args, timeout=timeout)

    def check(*args: str):
        return mctl("--json", "health", "check", "--remediate", tray, *args)

    try:
        # a healthy tray: its BMC was read, the detectors are OK
        proc = check()
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
        f = _tray_findings(proc, tray)
        assert f["bmc.reachable"]["severity"] == "ok" and f["leak.detectors"]["message"] == "4 leak detectors OK"

        # a warning is a finding, not a drain
        bmc_faults.apply(lab.dir, tray, leak="warning")
        proc = check()
        assert _tray_findings(proc, tray)["leak.detectors"]["severity"] == "warn"
        assert sinfo(lab)[tray] == ("idle", "")

        # critical: mctl sees it only through Redfish, and drains at once
        bmc_faults.apply(lab.dir, tray, leak="critical")
        code, det = redfish(lab, tray, DETECTOR)
        assert code == 200 and det["DetectorState"] == "Critical"
        started = time.monotonic()
        proc = check()
        assert proc.returncode == 1
        assert _tray_findings(proc, tray)["leak.detectors"]["severity"] == "critical"
        assert sinfo(lab)[tray] == ("drained", "mctl: leak critical 0_ColdPlate")
        swept = time.monotonic() - started
        if swept < AFTER_S:                       # the timeout had not passed: still on
            assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)
            assert not [e for e in actions(state) if e["action"] == "power-off"]

        # after the timeout a sweep powers it off through the BMC
        def swept_off():
            check()
            return power_state(lab, tray) == "Off"

        wait_for(f"{tray} powered off for the leak", swept_off, 90, every=0.5)
        wait_for(f"{tray} gone from SSH", lambda: not ssh_ok(lab, tray), 60)
        (off,) = [e for e in actions(state) if e["action"] == "power-off"]
        assert off["tray"] == tray and off["result"] == "ok" and off["sent"] is True
        assert "critical leak since" in off["why"] and "power_off_after 3s" in off["why"]
        (drain,) = [e for e in actions(state) if e["action"] == "drain"]
        assert drain["reason"] == "mctl: leak critical 0_ColdPlate"

        # the leak flaps (OK, then Critical again): no second power-off, mctl never powers it on
        bmc_faults.apply(lab.dir, tray, clear=True)
        check()
        bmc_faults.apply(lab.dir, tray, leak="critical")
        proc = check()
        assert proc.returncode == 1 and power_state(lab, tray) == "Off"
        assert len([e for e in actions(state) if e["action"] == "power-off"]) == 1
        assert "drain" in sinfo(lab)[tray][0]

        # repaired: cleared, powered on by a person; mctl ends the episode and resumes its drain
        bmc_faults.apply(lab.dir, tray, clear=True)
        on = mctl("power", "on", tray, timeout=300)
        assert on.returncode == 0, on.stdout[-2000:] + on.stderr
        assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)
        wait_for(f"{tray} back in Slurm (not down)", lambda: not sinfo(lab)[tray][0].startswith("down"), 90)

        def resumed():
            check()
            return sinfo(lab)[tray] == ("idle", "")

        wait_for(f"{tray} resumed by mctl", resumed, 90, every=0.5)
        assert [e["action"] for e in actions(state) if e["action"] in ("drain", "resume", "power-off")] == [
            "drain", "power-off", "resume"]
    finally:
        bmc_faults.apply(lab.dir, tray, clear=True)
        if power_state(lab, tray) != "On":
            redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                    body={"ResetType": "On"})
        wait_for("SSH back", lambda: ssh_ok(lab, tray), 120)
        lab.settle_slurm()
