"""`mctl lab fault --leak/--psu-fail` (mctl/lab/bmc_faults.py): what the lab tray's BMC serves with each, and that
mctl's own reader and checks see it (the integration test sees it over HTTPS: tests/integration/test_leaks.py)."""

from __future__ import annotations

import pytest

from mctl.checks import leak
from mctl.errors import UsageError
from mctl.health import oob
from mctl.lab import bmc_emulator as emu
from mctl.lab import bmc_faults
from mctl.model.findings import Severity
from mctl.model.settings import HealthSettings
from mctl.model.tray import TrayFacts

TREE = emu.load_tree()
emu.add_missing(TREE)


class LabBMC:
    """The emulator's documents (personalised, faults laid over), without HTTP."""

    def __init__(self, faults: dict):
        self.faults = faults

    def get(self, path: str) -> dict:
        doc = emu.personalize(TREE[path], tray_id="lab/t", tray_index=0, slot=1, power="On")
        return bmc_faults.overlay(path, doc, self.faults)

    def members(self, path: str) -> list[str]:
        return [m["@odata.id"] for m in self.get(path)["Members"]]


def judged(faults: dict) -> dict:
    bmc = oob.read_tray(LabBMC(faults))
    return {f.check: f for f in leak.check(TrayFacts(host="t", bmc=bmc), None, HealthSettings())}


def test_a_healthy_lab_tray_is_dry():
    f = judged({})
    assert [f[c].severity for c in (leak.BMC, leak.LEAK, leak.POWER)] == [Severity.OK] * 3


@pytest.mark.parametrize("level,severity", [("warning", Severity.WARN), ("critical", Severity.CRITICAL)])
def test_a_leak_fault_changes_one_detector_and_the_rollups(level, severity):
    faults = {"leak": level, "detector": "Chassis_0_LeakDetector_1_Manifold"}
    f = judged(faults)[leak.LEAK]
    assert f.severity is severity and "Chassis_0_LeakDetector_1_Manifold" in f.message
    chassis = LabBMC(faults).get("/redfish/v1/Chassis/Chassis_0")
    assert chassis["Status"]["HealthRollup"] == level.capitalize()


def test_psu_fail_is_the_power_subsystems_health():
    f = judged({"psu_fail": True})
    assert f[leak.POWER].severity is Severity.WARN and "PowerSubsystem Critical" in f[leak.POWER].message
    assert f[leak.LEAK].severity is Severity.OK


def test_watched_file_is_reread_when_it_changes(tmp_path):
    path = tmp_path / bmc_faults.FAULTS_NAME
    w = bmc_faults.Watched(path)
    assert w.get() == {}
    path.write_text('{"leak": "critical"}')
    assert w.get() == {"leak": "critical"}
    path.unlink()
    assert w.get() == {}


def test_apply_refuses_bad_input_without_a_lab(tmp_path):
    with pytest.raises(UsageError, match="no lab"):
        bmc_faults.apply(tmp_path, "t", leak="critical")


def test_the_cli_refuses_bmc_faults_mixed_with_others_or_clear(capsys, tmp_path):
    from tests.unit.cli_helpers import run_cli

    for extra in (["--xid", "79", "--gpu", "0"], ["--hang"], ["--slow", "2"]):
        r = run_cli(capsys, "lab", "fault", "lab-r1-tray01", "--leak", "critical", *extra, "--dir", str(tmp_path))
        assert r.code == 2 and "act on the tray's BMC" in r.err + r.out, (extra, r)
    r = run_cli(capsys, "lab", "fault", "lab-r1-tray01", "--psu-fail", "--dir", str(tmp_path))
    assert r.code == 2 and "no lab" in r.err + r.out and "Traceback" not in r.err
