"""DCGM health (issue 30.3) on the shared lab, end to end: the trays' dcgmi (the lab's stand-in, which needs its
health watches set and follows the GPU faults), the probe's dcgm section over SSH under its own deadline, and
the check dcgm.health in `mctl health check`.

Needs only the lab (no Slurm deploy): the checks run whatever the scheduler read says.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import HEALTH, fault, write_health_site

DEADLINE = 15            # health.tray_deadline here: DCGM's section gets a third of nvidia-smi's, 4 s


@pytest.fixture(autouse=True)
def _faults_cleared(lab):
    """The shared lab as the next test expects it: these tests' GPU and tool faults cleared, whatever they asserted."""
    yield
    lab.clear_faults()


def _check(lab, site, state, tray):
    proc = lab.mctl("-i", str(site), "--state-dir", str(state), "--json", "health", "check", tray, timeout=120)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _dcgm(doc, tray):
    (f,) = [f for f in doc["findings"] if f["host"] == tray and f["check"] == "dcgm.health"]
    return f


def test_a_dcgm_failure_is_critical_with_dcgms_incident(lab, tmp_path):
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "tray_deadline": DEADLINE})
    tray = lab.trays[2]
    healthy = _dcgm(_check(lab, site, tmp_path / "state", tray), tray)
    assert healthy["severity"] == "ok" and healthy["message"].startswith("DCGM health watches: Healthy")
    fault(lab, tray, ecc_uncorrectable=2, gpu=1)
    failed = _dcgm(_check(lab, site, tmp_path / "state", tray), tray)
    assert failed["severity"] == "critical"
    assert "gpu1 Memory system Failure: Detected 2 volatile double-bit ECC error(s) in GPU 1." in failed["message"]
    assert failed["details"]["incidents"][0]["system"] == "Memory system"
    off = write_health_site(lab, tmp_path / "off", {**HEALTH, "tray_deadline": DEADLINE, "dcgm": "off"})
    assert not [f for f in _check(lab, off, tmp_path / "state-off", tray)["findings"] if f["check"] == "dcgm.health"]


def test_a_hung_dcgmi_is_a_finding_within_the_sweeps_deadline(lab, tmp_path):
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "tray_deadline": DEADLINE})
    tray = lab.trays[3]
    fault(lab, tray, tool_fault="dcgmi:hang")
    doc = _check(lab, site, tmp_path / "state", tray)
    f = _dcgm(doc, tray)
    assert f["severity"] == "warn" and "did not answer within 4s" in f["message"], f
    (row,) = [t for t in doc["trays"] if t["host"] == tray]
    assert row["reach"] == "ok" and row["elapsed"] < DEADLINE          # the tray answered: DCGM's hang is its own
    assert doc["elapsed"] < DEADLINE + 5
    assert not [x for x in doc["findings"] if x["check"] == "tray.reachable" and x["severity"] != "ok"]
