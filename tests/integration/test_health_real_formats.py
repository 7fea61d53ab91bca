"""Real kernel-log forms through the whole health path on the lab (issue 16).

Lines from real captures (tests/fixtures/real/) are appended to a lab tray's /var/log/kern.log
the way rsyslog writes kernel messages (a current stamp, the host, `kernel:` and the uptime
prefix), with the tray's own GPU address in place of the capture's. The health probe then
reads them over SSH with its own grep, and `mctl health check --remediate --dry-run` says
whether the tray would be drained. The kernel log is put back as it was after each test.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers import HEALTH, fault, write_health_site

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
_DMESG_PREFIX = re.compile(r"^\s*(?:\[\s*\d+\.\d+\]\s*)?")


def _tray_gpu(lab, tray: str, index: int = 0) -> tuple[str, Path]:
    """(the kernel's form of GPU *index*'s PCI address, the tray's kern.log on this machine)."""
    from mctl.lab import hosts
    from mctl.lab.emulators.nvidia_smi import kernel_pci

    state = json.loads(hosts.host_path(lab.dir, tray, hosts.GPUS_FILE).read_text())
    pci = next(g["pci_bus_id"] for g in state["gpus"] if g["index"] == index)
    return kernel_pci(pci), hosts.host_path(lab.dir, tray, hosts.KERN_LOG)


def _as_rsyslog(lab, tray: str, messages: list[str]) -> str:
    """Kernel messages (the text from `NVRM:` on) as rsyslog writes them now on the tray: the uptime stamp is the
    tray's own (its time namespace; a tray powered off and on by an earlier test has booted since the lab began)."""
    now = time.time()
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(now))
    stamp = stamp[:4] + ("%2d" % int(stamp[4:6])) + stamp[6:]
    uptime = float(lab.run(tray, "cat /proc/uptime").stdout.split()[0])
    return "".join(f"{stamp} {tray} kernel: [{uptime:12.6f}] {m}\n" for m in messages)


@pytest.fixture(scope="module")
def health_site(slurm_lab, tmp_path_factory) -> Path:
    """The health site (tests/integration/conftest.py; the `health` runner uses this one here) with a 10 min
    XID window: a loaded machine may take a while between writing a line and the probe reading it, and each
    test restores the log it wrote to."""
    return write_health_site(slurm_lab.lab, tmp_path_factory.mktemp("health-real-site"),
                             {**HEALTH, "xid_window": "10m"})


@pytest.fixture(autouse=True)
def _clean_kernel_logs(lab, health_site):
    """Each test starts from empty kernel logs: XIDs other tests left on the shared lab must not count here."""
    for tray in lab.trays:
        lab.run(tray, ": > /var/log/kern.log")


@pytest.fixture
def kern_log(lab):
    """Append to a tray's kern.log; the file is restored after the test."""
    saved: dict[Path, bytes] = {}

    def append(tray: str, messages: list[str]) -> str:
        pci, path = _tray_gpu(lab, tray)
        if path not in saved:
            saved[path] = path.read_bytes()
        with open(path, "a") as fh:
            fh.write(_as_rsyslog(lab, tray, [m.replace("@PCI@", pci) for m in messages]))
        return pci

    try:
        yield append
    finally:
        for path, data in saved.items():
            path.write_bytes(data)


def _check(health, tray: str) -> tuple[list[dict], list[dict]]:
    proc = health("--json", "health", "check", "--remediate", "--dry-run")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    xids = [f for f in data["findings"] if f["check"] == "gpu.xid" and f["host"] == tray]
    drains = [d for d in data["decisions"] if d["action"] == "drain" and d["host"] == tray]
    return xids, drains


def _real_line(name: str, unit: str) -> str:
    """The NVRM part of the real line in *name* that names *unit*, its PCI address left as @PCI@."""
    line = next(l for l in (REAL / name).read_text().splitlines() if f" {unit} " in l)
    line = line[line.index("NVRM: "):]
    return re.sub(r"\(PCI:[0-9a-fA-F:.]+\)", "(PCI:@PCI@)", line)


def test_fallen_off_the_bus_without_xid_drains(lab, health, kern_log):
    tray = lab.trays[2]
    sample = (REAL / "issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt").read_text().splitlines()[:3]
    messages = [_DMESG_PREFIX.sub("", l) for l in sample]
    messages[0] = messages[0].replace("0000:b3:00.0", "@PCI@.0")
    pci = kern_log(tray, messages)
    xids, drains = _check(health, tray)
    assert [(f["severity"], f.get("details", {}).get("code"), f.get("details", {}).get("drains")) for f in xids] == [
        ("critical", 79, True)], xids
    assert "no Xid line" in xids[0]["message"]
    assert len(drains) == 1 and "fell off bus (no xid)" in drains[0]["reason"], drains
    assert pci in xids[0]["message"] or xids[0]["details"]["gpu"] == "gpu0"


def test_nonfatal_nvlink5_xid_does_not_drain_and_fatal_does(lab, health, kern_log):
    tray = lab.trays[3]
    kern_log(tray, [_real_line("issue-gpud-pr1174-nvlink5-kmsg-lines.txt", "RLW_RXPIPE")])
    xids, drains = _check(health, tray)
    assert [(f["severity"], f["details"]["code"], f["details"]["drains"]) for f in xids] == [("warn", 145, False)]
    assert drains == []
    kern_log(tray, [_real_line("issue-gpud-pr1174-nvlink5-kmsg-lines.txt", "NETIR_LINK_EVT")])
    xids, drains = _check(health, tray)
    by_code = {f["details"]["code"]: (f["severity"], f["details"]["drains"]) for f in xids}
    assert by_code[149] == ("critical", True) and by_code[145][1] is False
    assert len(drains) == 1 and "xid 149 fatal" in drains[0]["reason"], drains


# --- the same forms as the lab itself emits them (mctl lab fault), end to end --------------------

def _sweep(health, tray: str) -> dict:
    proc = health("--json", "health", "check", tray, "--passed", "--remediate", "--dry-run")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_all_links_down_is_critical_naming_the_gpu_and_drains(lab, health):
    tray = lab.trays[1]
    fault(lab, tray, nvlink_down="1:all")
    data = _sweep(health, tray)
    (links,) = [f for f in data["findings"] if f["check"] == "nvlink.links" and f["host"] == tray]
    assert links["severity"] == "critical" and "gpu1 all 18 links down" in links["message"], links
    drains = [d for d in data["decisions"] if d["action"] == "drain" and d["host"] == tray]
    assert len(drains) == 1 and "nvlink gpu1 all links down" in drains[0]["reason"], data["decisions"]


def test_lab_nvlink5_lines_nonfatal_warns_and_fell_off_bus_drains(lab, health):
    tray = lab.trays[0]
    fault(lab, tray, xid=145, gpu=0, nonfatal=True)
    data = _sweep(health, tray)
    xids = [f for f in data["findings"] if f["check"] == "gpu.xid" and f["host"] == tray]
    assert [(f["severity"], f["details"]["code"]) for f in xids] == [("warn", 145)], xids
    assert not [d for d in data["decisions"] if d["action"] == "drain" and d["host"] == tray]
    fault(lab, tray, fell_off_bus=True, gpu=2)
    data = _sweep(health, tray)
    crit = [f for f in data["findings"] if f["check"] == "gpu.xid" and f["host"] == tray and f["severity"] == "critical"]
    assert [f["details"]["code"] for f in crit] == [79] and "no Xid line" in crit[0]["message"], crit
    assert [d for d in data["decisions"] if d["action"] == "drain" and d["host"] == tray]


@pytest.mark.parametrize("branch", ["535", "580"])
def test_driver_branch_shapes_are_read_and_the_power_check_runs(lab, health, branch):
    tray = lab.trays[2]
    fault(lab, tray, driver_branch=branch)
    data = _sweep(health, tray)
    (power,) = [f for f in data["findings"] if f["check"] == "gpu.power" and f["host"] == tray]
    assert power["severity"] == "ok" and "(4 of 4 GPUs report it)" in power["message"], power
    assert not [f for f in data["findings"] if f["host"] == tray and f["check"] == "gpu.facts"
                and f["severity"] != "ok"], data["findings"]
