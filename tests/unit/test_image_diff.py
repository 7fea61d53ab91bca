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
    # no packages asked: the packaged components are named, with the reason, never a match
    assert listed["slurm"]["status"] == NOT_CHECKED and listed["slurm"]["note"] == "its packages were not read"
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
    # a component the image declares but whose packages were not read is never silently a match
    state = TrayFacts("t", "127.0.0.1", "ok", packages_error="dpkg-query is not on the tray (not a Debian-based OS)")
    tray = diff_tray("t", GB200, state, slurm_expected=True)
    unchecked = {c["component"]: c["note"] for c in tray.to_dict()["components"] if c["status"] == NOT_CHECKED}
    assert set(unchecked) == {"imex", "dcgm", "doca_ofed", "enroot", "pyxis"}
    assert set(unchecked.values()) == {"dpkg-query is not on the tray (not a Debian-based OS)"}


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


# --- every packaged component read from dpkg's database (issue 28) ---------------------------------

REAL_DPKG = REPO / "tests" / "fixtures" / "real" / "dpkg"


def _installed(image, **override):
    """dpkg's answer on a tray provisioned with *image*: every package at its pin (unpinned ones at 24.11.5-4
    for Slurm, 0.5.16-1 for MUNGE), less or other than that where *override* says (None: not installed)."""
    from mctl.facts.packages import split_pin

    out = {}
    for comp in image.components.values():
        for spec in comp.packages:
            name, pin = split_pin(spec)
            out[name] = pin or ("0.5.16-1" if name == "munge" else "24.11.5-4")
    out.update(override)
    return out


def test_every_packaged_component_is_compared_by_its_packages():
    facts = drift.version_facts("13", None, "570.148.08", "12.8", None, slurm_expected=False,
                                packages=_installed(LAB))
    rows = {r.component: r for r in compare(LAB, facts)}
    assert {n: (r.found, r.status) for n, r in rows.items() if n not in ("os", "nvidia_driver", "cuda")} == {
        "imex": ("570.148.08", MATCH), "dcgm": ("4.3.1", MATCH), "doca_ofed": ("2.9.1", MATCH),
        "slurm": ("24.11.5", MATCH), "munge": ("0.5.16", MATCH), "enroot": ("3.5.0", MATCH),
        "pyxis": ("0.20.0", MATCH), "nccl_tests": ("2.17.1", MATCH)}
    assert rows["dcgm"].check == "image.dcgm" and rows["dcgm"].label == "DCGM"
    assert not drift.not_compared(LAB, list(rows.values()))
    # the driver and CUDA stay read from nvidia-smi (what the GPUs run), Slurm from slurmd -V where the site runs it
    facts = drift.version_facts("13", None, "570.148.08", "12.8", "24.11.5", slurm_expected=True,
                                packages=_installed(LAB, **{"nvidia-utils-570": None}))
    rows = {r.component: r for r in compare(LAB, facts)}
    assert rows["nvidia_driver"].status == MATCH and rows["slurm"].check == "image.slurm"


def test_a_missing_or_unpinned_package_is_drift_with_its_name():
    packages = _installed(LAB, **{"datacenter-gpu-manager-4-core": None, "nvidia-imex-570": "570.172.08-1",
                                  "enroot": "3.5.0-2"})
    notes = {"datacenter-gpu-manager-4-core": "config files only"}
    facts = drift.version_facts("13", None, "570.148.08", "12.8", None, slurm_expected=False, packages=packages,
                                package_notes=notes)
    rows = {r.component: r for r in compare(LAB, facts)}
    assert (rows["dcgm"].found, rows["dcgm"].status) == (None, UNREPORTED)
    assert rows["dcgm"].note == "datacenter-gpu-manager-4-core: config files only"
    assert (rows["imex"].found, rows["imex"].status) == ("570.172.08-1", DRIFT)
    assert rows["imex"].note == "nvidia-imex-570 570.172.08-1 installed, the image pins 570.148.08-1"
    # the same upstream version at another Debian revision than the pin is drift too
    assert (rows["enroot"].found, rows["enroot"].status) == ("3.5.0-2", DRIFT)
    found = {f.check: f for f in image_drift(LAB, "t", facts)}
    assert set(found) == {"image.dcgm", "image.imex", "image.enroot"}
    assert "config files only" in found["image.dcgm"].message and found["image.imex"].severity is Severity.WARN
    audit = {f.check: f.severity for f in versions.check_tray("t", LAB, facts)}
    assert audit["image.pyxis"] is Severity.OK and audit["image.munge"] is Severity.OK


def test_the_probe_reads_packages_with_one_dpkg_query(tmp_path, processes):
    """The probe's section under /bin/sh with a stand-in dpkg-query that prints what this machine's real one
    printed (tests/fixtures/real/dpkg: a package installed, one known but not installed, two unknown; exit 1)."""
    out = REAL_DPKG / "dev-debian12-dpkg-query-stdout.txt"
    err = REAL_DPKG / "dev-debian12-dpkg-query-stderr.txt"
    calls = tmp_path / "calls"
    body = f'printf "%s|" "$@" >> {calls}; echo >> {calls}\ncat {out}\ncat {err} >&2\nexit 1\n'
    names = ["dpkg", "openssh-server", "munge", "no-such-package-mctl"]
    state = probe_here(tmp_path, smi=None, packages=names, dpkg_query=body)
    assert state.packages == {"dpkg": "1.21.22", "openssh-server": None, "munge": None,
                              "no-such-package-mctl": None}
    assert state.package_notes == {"openssh-server": "not installed", "munge": "not installed (dpkg knows no such "
                                   "package)", "no-such-package-mctl": "not installed (dpkg knows no such package)"}
    assert state.packages_error is None and not state.problems
    (call,) = calls.read_text().splitlines()                              # one dpkg-query for every package
    assert call.split("|")[2:6] == names


def test_no_dpkg_query_names_why_nothing_was_read(tmp_path, processes):
    state = probe_here(tmp_path, smi=None, packages=["munge"], dpkg_query="exit 127\n")
    assert state.packages is None and "dpkg-query is not on the tray" in state.packages_error
    tray = diff_tray("t", LAB, state, slurm_expected=False)
    listed = {c["component"]: c for c in tray.to_dict()["components"]}
    assert listed["munge"]["status"] == NOT_CHECKED and "dpkg-query is not on the tray" in listed["munge"]["note"]


def test_package_parsing_is_pure_and_refuses_shell_text():
    from mctl.facts import packages

    assert packages.upstream("1:4.3.1-1") == "4.3.1" and packages.upstream("570.148.08-0ubuntu1") == "570.148.08"
    assert packages.upstream("3.5.0") == "3.5.0" and packages.split_pin("enroot+caps=3.5.0-1") == ("enroot+caps",
                                                                                                   "3.5.0-1")
    found, why = packages.parse("aa\t1.0-1\tii \nbb\t2.0-1\trc \ncc\t3.0-1\thi \ngarbage line\n",
                                ["aa", "bb", "cc", "dd"])
    assert found == {"aa": "1.0-1", "bb": None, "cc": "3.0-1", "dd": None}
    assert why == {"bb": "config files only", "dd": "not installed (dpkg knows no such package)"}
    with pytest.raises(ValueError):
        packages.command(["munge; rm -rf /"])
    assert drift.package_names(GB200)[:2] == ["nvidia-driver-570-open", "nvidia-utils-570"]
    assert "enroot+caps" in drift.package_names(GB200)
