"""`mctl image diff`: per tray, each component wanted against found, by the audit's own drift function.

The tray probe is the audit's, run for real under /bin/sh on this machine with a
stand-in nvidia-smi on PATH that prints a captured `nvidia-smi -q -x`
(tests/fixtures/real/netdata-rtx-4090-driver-535.xml, driver 535.86.05, CUDA 12.2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.model.tray import TrayFacts
from mctl.audit.rules import versions
from mctl.images import load_image
from mctl.audit.image_diff import build_report, diff_tray
from mctl.images.drift import DRIFT, MATCH, NOT_CHECKED, UNREPORTED, compare, image_drift
from mctl.images import drift
from mctl.model.findings import Severity
from mctl.model.site import Host
from tests.helpers import probe_here

REPO = Path(__file__).resolve().parents[2]
REAL_XML = REPO / "tests" / "fixtures" / "real" / "netdata-rtx-4090-driver-535.xml"
LAB = load_image(REPO / "images" / "lab-debian13.yml")
GB200 = load_image(REPO / "images" / "gb200-ubuntu24.04.yml")


def test_driver_drift_from_a_real_nvidia_smi_answer(tmp_path, processes):
    state = probe_here(tmp_path, smi=f"cat {REAL_XML}\n")
    assert state.gpus is not None and state.gpus.driver_version == "535.86.05"
    tray = diff_tray("lab-r1-tray01", LAB, state, slurm_expected=False)
    rows = {r.component: r for r in tray.rows}
    assert (rows["nvidia_driver"].wanted, rows["nvidia_driver"].found, rows["nvidia_driver"].status) == (
        "570.148.08", "535.86.05", DRIFT)
    assert (rows["cuda"].wanted, rows["cuda"].found, rows["cuda"].status) == ("12.8", "12.2", DRIFT)
    assert rows["os"].found == state.os.version_id
    assert tray.status == "drift"
    # the lab image's kernel is "host": not compared; Slurm not asked on a site without it
    assert "kernel" not in rows and "slurm" not in rows
    listed = {c["component"]: c for c in tray.to_dict()["components"]}
    assert listed["slurm"]["status"] == NOT_CHECKED and "no Slurm" in listed["slurm"]["note"]
    assert listed["munge"]["status"] == NOT_CHECKED and listed["munge"]["wanted"] == "0.5"


def test_no_nvidia_smi_is_unreported_drift_with_the_reason(tmp_path, processes):
    state = probe_here(tmp_path, smi=None)
    tray = diff_tray("lab-r1-tray01", LAB, state, slurm_expected=False)
    rows = {r.component: r for r in tray.rows}
    assert rows["nvidia_driver"].status == UNREPORTED and rows["nvidia_driver"].found is None
    assert tray.notes["nvidia_driver"] == "nvidia-smi is not installed (command not found)"
    assert tray.status == "drift"


def test_diff_and_audit_use_one_drift_function():
    facts = drift.version_facts("24.04", "6.8.0-1025-nvidia-64k", "570.172.08", "12.8", "24.11.5",
                                   slurm_expected=True)
    rows = compare(GB200, facts)
    by = {r.check: r for r in rows}
    assert by["image.driver"].status == DRIFT and by["image.driver"].severity is Severity.CRITICAL
    assert by["image.slurm"].status == MATCH          # 24.11 wanted, 24.11.5 found
    assert {r.check for r in rows if r.status in (DRIFT, UNREPORTED)} == {f.check for f in image_drift(
        GB200, "t", facts)} == {f.check for f in versions.check_tray("t", GB200, facts)
                                if f.severity is not Severity.OK} == {"image.driver"}
    # a component the image declares but mctl reads no version of is never silently a match
    state = TrayFacts("t", "127.0.0.1", "ok")
    tray = diff_tray("t", GB200, state, slurm_expected=True)
    unchecked = {c["component"] for c in tray.to_dict()["components"] if c["status"] == NOT_CHECKED}
    assert unchecked == {"imex", "dcgm", "doca_ofed", "enroot", "pyxis"}


def test_unreadable_tray_is_reported_beside_the_others():
    hosts = [Host("t1", "127.0.0.1", "compute", "r"), Host("t2", "127.0.0.2", "compute", "r"),
             Host("t3", "127.0.0.3", "compute", "r")]
    ok = TrayFacts("t1", "127.0.0.1", "ok")
    down = TrayFacts("t2", "127.0.0.2", "timeout", error="no answer within 5s")
    report = build_report(hosts, {"t1": LAB, "t2": LAB}, {"t1": ok, "t2": down}, slurm_expected=False, timeout=5)
    assert [t.status for t in report.trays] == ["drift", "unreadable", "no-image"]
    assert report.unreadable == ["t2"] and report.drifted == ["t1"]
    d = report.to_dict()
    assert d["trays"][1]["error"] == "no answer within 5s" and d["summary"]["no_image"] == "t3"


@pytest.mark.parametrize("found,status", [("13", MATCH), ("13.1", MATCH), ("12", DRIFT), (None, UNREPORTED)])
def test_os_release_statuses(found, status):
    (os_row,) = [r for r in compare(LAB, {"os_version_id": found}) if r.component == "os"]
    assert os_row.status == status


@pytest.mark.parametrize("nodeset,said", [("rack-a-head", "names no compute trays (rack-a-head only)"),
                                          ("rack-a-tray99", "unknown host rack-a-tray99"),
                                          ("rack-a-tray[01-", "bad node set")])
def test_bad_input_is_exit_2_before_any_tray_is_asked(capsys, nodeset, said):
    from tests.unit.cli_helpers import run_cli

    r = run_cli(capsys, "-i", str(REPO / "inventories" / "example-gb200"), "image", "diff", nodeset)
    assert r.code == 2 and said in r.err and "Traceback" not in r.err, r.err
