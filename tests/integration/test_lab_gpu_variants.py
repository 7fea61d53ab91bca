"""The lab emits the real GPU failure forms over SSH, after each fault, and stops after --clear.

What each form must look like is tested against real captures in tests/unit/test_gpu_emulator_variants.py;
here the whole path runs: `mctl lab fault` on a running tray, then the tray's own nvidia-smi and kern.log
read over real SSH.
"""

from __future__ import annotations

import re
import subprocess
import time
import xml.etree.ElementTree as ET
from functools import partial

import pytest

from mctl.facts.kernel_log import parse_xid_line
from mctl.lab.emulators import nvidia_smi as emu
from tests.helpers import fault, wait_for

NVLINK5 = re.compile(r"NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): (\d+), ([A-Z0-9_]+)\s+(Fatal|Nonfatal)"
                     r"\s+XC0 i0 Link \d\d \(0x[0-9a-f]{8}( 0x[0-9a-f]{8}){5}\)$")


def _kern_lines(lab, tray) -> list[str]:
    return lab.run(tray, "cat /var/log/kern.log").stdout.splitlines()


_wait = partial(wait_for, timeout=30.0, every=0.2)


def test_all_links_down_nonfatal_and_fatal_nvlink5_and_154(lab):
    tray = lab.trays[-1]
    try:
        cli = lab.mctl("lab", "fault", "gpu", tray, "--nvlink-down", "1:all", "--dir", str(lab.dir))
        assert cli.returncode == 0 and "nvlink gpu1:all links down" in cli.stdout, cli.stderr
        out = lab.run(tray, "nvidia-smi nvlink --status").stdout.splitlines()
        i = next(n for n, line in enumerate(out) if line.startswith("GPU 1: "))
        assert out[i + 1] == "NVML: Unable to retrieve NVLink information as all links are inActive"
        assert out[i + 2].startswith("GPU 2: ")

        before = len(_kern_lines(lab, tray))
        fault(lab, tray, xid=145, gpu=0, nonfatal=True)
        fault(lab, tray, xid=149, gpu=1)
        fault(lab, tray, xid=154, gpu=1)
        new = _kern_lines(lab, tray)[before:]
        assert len(new) == 3
        m145, m149 = NVLINK5.search(new[0]), NVLINK5.search(new[1])
        assert (m145.group(1), m145.group(2), m145.group(3)) == ("145", "RLW_RXPIPE", "Nonfatal")
        assert (m149.group(1), m149.group(2), m149.group(3)) == ("149", "NETIR_LINK_EVT", "Fatal")
        assert new[2].endswith("): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)")
        assert all(parse_xid_line(line).host == tray and parse_xid_line(line).pid is None for line in new)
        tree = ET.fromstring(lab.run(tray, "nvidia-smi -q -x").stdout)
        assert [g.findtext("gpu_recovery_action") for g in tree.findall("gpu")][:2] == ["None", "Drain and Reset"]
    finally:
        lab.clear_faults(tray)
    out = lab.run(tray, "nvidia-smi nvlink --status").stdout
    assert emu.NVLINK_ALL_INACTIVE_TEXT not in out and out.count("53.125 GB/s") == 4 * 18


def test_fell_off_the_bus_without_an_xid(lab):
    tray = lab.trays[-1]
    try:
        before = len(_kern_lines(lab, tray))
        cli = lab.mctl("lab", "fault", "gpu", tray, "--fell-off-bus", "--gpu", "2", "--dir", str(lab.dir))
        assert cli.returncode == 0, cli.stderr
        new = _kern_lines(lab, tray)[before:]
        texts = [line.split("] ", 1)[1] for line in new]
        assert texts[0].startswith("NVRM: The NVIDIA GPU 0") and re.fullmatch(
            r"NVRM: \(PCI ID: 10de:[0-9a-f]{4}\) installed in this system has", texts[1])
        assert texts[2] == "NVRM: fallen off the bus and is not responding to commands."
        assert not any("Xid" in line for line in new)
        proc = lab.run(tray, "nvidia-smi -L", check=False)
        assert len(proc.stdout.splitlines()) == 3 and "Unable to determine the device handle for GPU2" in proc.stderr
        assert ET.fromstring(lab.run(tray, "nvidia-smi -q -x").stdout).findtext("attached_gpus") == "4"
    finally:
        lab.clear_faults(tray)
    assert len(lab.run(tray, "nvidia-smi -L").stdout.splitlines()) == 4


def test_driver_branches_change_the_xml_shape(lab):
    tray = lab.trays[-1]
    try:
        cli = lab.mctl("lab", "fault", "gpu", tray, "--driver-branch", "535", "--dir", str(lab.dir))
        assert cli.returncode == 0 and "driver branch R535" in cli.stdout, cli.stderr
        tree = ET.fromstring(lab.run(tray, "nvidia-smi -q -x").stdout)
        assert tree.findtext("driver_version").startswith("535.")
        assert tree.find("gpu/gpu_power_readings/power_draw") is not None
        assert tree.find("gpu/gpu_power_readings/average_power_draw") is None
        fault(lab, tray, driver_branch="580")
        tree = ET.fromstring(lab.run(tray, "nvidia-smi -q -x").stdout)
        assert tree.findtext("driver_version").startswith("580.")
        assert [tree.find(f"gpu/ecc_errors/{tag}") is not None
                for tag in ("channel_repair_pending", "tpc_repair_pending", "unrepairable_memory")] == [True] * 3
    finally:
        lab.clear_faults(tray)
    tree = ET.fromstring(lab.run(tray, "nvidia-smi -q -x").stdout)
    assert tree.findtext("driver_version").startswith("570.")
    assert tree.find("gpu/gpu_power_readings/average_power_draw") is not None


def test_flapping_link_goes_down_and_up_then_stays_up_after_clear(lab):
    tray = lab.trays[-1]
    cmd = "nvidia-smi nvlink --status -i 0 | grep -c '<inactive>'; true"
    try:
        fault(lab, tray, nvlink_flap="0:5")
        _wait("link 0:5 seen down", lambda: lab.run(tray, cmd).stdout.strip() == "1")
        _wait("link 0:5 seen up again", lambda: lab.run(tray, cmd).stdout.strip() == "0")
        _wait("link 0:5 seen down again", lambda: lab.run(tray, cmd).stdout.strip() == "1")
        # the replayed sweep answer follows the clock too
        _wait("the full listing sees it down", lambda: "Link 5: <inactive>" in lab.run(tray, "nvidia-smi nvlink --status").stdout)
    finally:
        lab.clear_faults(tray)
    for _ in range(4):                        # a whole flap period: up every time
        assert lab.run(tray, cmd).stdout.strip() == "0"
        time.sleep(1.0)


def test_xid_storm_appends_hundreds_of_lines_and_stops_after_clear(lab):
    tray = lab.trays[-1]
    count = "wc -l < /var/log/kern.log"
    try:
        before = int(lab.run(tray, count).stdout)
        cli = lab.mctl("lab", "fault", "gpu", tray, "--xid-storm", "145", "--nonfatal", "--gpu", "3", "--dir", str(lab.dir))
        assert cli.returncode == 0 and "xid storm 145 nonfatal gpu3" in cli.stdout, cli.stderr
        burst = int(lab.run(tray, count).stdout)
        assert burst - before == emu.STORM_BURST
        tail = lab.run(tray, "tail -n 1 /var/log/kern.log").stdout.strip()
        assert parse_xid_line(tail).code == 145 and "RLW_RXPIPE Nonfatal" in tail
        # the storm goes on while set: each nvidia-smi call writes what it produced since the last one
        _wait("the storm grows", lambda: (lab.run(tray, "nvidia-smi -L >/dev/null; " + count).stdout.strip().isdigit()
                                          and int(lab.run(tray, count).stdout) > burst))
    finally:
        lab.clear_faults(tray)
    settled = int(lab.run(tray, "nvidia-smi -L >/dev/null; " + count).stdout)
    time.sleep(1.5)
    assert int(lab.run(tray, "nvidia-smi -q -x >/dev/null; nvidia-smi -L >/dev/null; " + count).stdout) == settled


def test_smi_hang_blocks_nvidia_smi_until_clear(lab):
    tray = lab.trays[-1]
    try:
        lab.run(tray, "nvidia-smi nvlink --status >/dev/null")      # an answer the launcher would replay
        cli = lab.mctl("lab", "fault", "gpu", tray, "--smi-hang", "--dir", str(lab.dir))
        assert cli.returncode == 0 and "nvidia-smi hangs" in cli.stdout, cli.stderr
        for cmd in ("nvidia-smi nvlink --status", "nvidia-smi -q -x", "nvidia-smi -L"):
            with pytest.raises(subprocess.TimeoutExpired):
                lab.run(tray, cmd, timeout=4)
        assert lab.run(tray, "hostname").stdout.strip() == tray      # the host itself answers
    finally:
        lab.clear_faults(tray)
    res = lab.run(tray, "nvidia-smi -L", timeout=30)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 4
    # the calls that were stuck ended with the wedge
    _wait("no stuck nvidia-smi left", lambda: lab.run(tray, "pgrep -f 'nvidia_smi.ru[n]' || true").stdout.strip() == "")
