"""mctl image diff on the lab: real sshd, the emulated nvidia-smi, a driver that drifts, a tray that hangs.

The lab trays run image lab-debian13 (Debian 13, driver 570.148.08, CUDA 12.8
from the emulator, Slurm 24.11; the other components read from dpkg's database). A lab fault (--driver-branch 580) changes what one
tray's nvidia-smi reports; another tray hangs on every command, and must not hold up the others.
"""

from __future__ import annotations

import json

from mctl.lab import control
from mctl.lab.faults import FaultRequest


def _diff(lab, *args: str, timeout: float = 120):
    proc = lab.mctl("--json", "image", "diff", *args, timeout=timeout)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    return proc, data


def test_clean_lab_matches_its_image(lab):
    proc, data = _diff(lab, lab.rack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [t["host"] for t in data["trays"]] == lab.trays
    for tray in data["trays"]:
        comps = {c["component"]: c for c in tray["components"]}
        assert tray["status"] == "match" and tray["image"] == "lab-debian13"
        assert comps["nvidia_driver"]["found"] == "570.148.08" and comps["nvidia_driver"]["status"] == "match"
        assert comps["os"]["found"] == "13"
        # every component the image declares is read: the packaged ones from dpkg's database (one dpkg-query;
        # the shared lab is pre-tooled: the GPU tools' packages installed), none left not-checked
        assert {c["status"] for c in comps.values()} == {"match"}
        assert (comps["munge"]["found"], comps["imex"]["found"], comps["dcgm"]["found"]) == (
            "0.5.16", "570.148.08", "4.3.1")
        # firmware from the tray's BMC (the lab serves the capture the image was written from)
        assert comps["firmware:FW_BMC_0"]["found"] == "GB200Nvl-24.12-8"
        assert {c["status"] for name, c in comps.items() if name.startswith("firmware:")} == {"match"}


def test_drift_and_a_hung_tray(lab):
    if len(lab.trays) < 3:
        import pytest

        pytest.skip("needs 3 trays")
    drifted, hung = lab.trays[1], lab.trays[2]
    control.fault(lab.dir, drifted, FaultRequest(driver_branch="580"))
    control.fault(lab.dir, hung, FaultRequest(hang=True))
    try:
        proc, data = _diff(lab, lab.rack, "--timeout", "8")
        plain = lab.mctl("image", "diff", drifted)
    finally:
        lab.clear_faults(drifted)
        lab.clear_faults(hung)
    assert proc.returncode == 3, proc.stdout + proc.stderr       # a tray could not be read: the others reported
    trays = {t["host"]: t for t in data["trays"]}
    assert trays[hung]["status"] == "unreadable" and trays[hung]["error"]
    comps = {c["component"]: c for c in trays[drifted]["components"]}
    assert trays[drifted]["status"] == "drift"
    assert (comps["nvidia_driver"]["wanted"], comps["nvidia_driver"]["found"], comps["nvidia_driver"]["status"]) == (
        "570.148.08", "580.105.08", "drift")
    assert (comps["cuda"]["found"], comps["cuda"]["status"]) == ("13.0", "drift")
    assert trays[lab.trays[0]]["status"] == "match"
    assert data["summary"]["drift"] == drifted and data["summary"]["unreadable"] == hung
    # off a terminal: a plain table, one row per component, and exit 1 for drift alone
    assert plain.returncode == 1, plain.stdout + plain.stderr
    row = next(l for l in plain.stdout.splitlines() if l.startswith(drifted) and "nvidia_driver" in l)
    assert row.split() == [drifted, "lab-debian13", "nvidia_driver", "570.148.08", "580.105.08", "drift"]


def test_bad_node_set_is_exit_2_and_head_nodes_are_named(lab):
    proc = lab.mctl("image", "diff", "no-such-tray")
    assert proc.returncode == 2 and "unknown host no-such-tray" in proc.stderr and "Traceback" not in proc.stderr
    proc = lab.mctl("image", "diff", lab.head)
    assert proc.returncode == 2 and "names no compute trays" in proc.stderr
    proc, data = _diff(lab, f"{lab.head},{lab.trays[0]}")
    assert proc.returncode == 0 and [t["host"] for t in data["trays"]] == [lab.trays[0]]
    assert f"not compared (not compute trays): {lab.head}" in proc.stderr
