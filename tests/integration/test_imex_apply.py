"""`mctl imex apply` done safely on a virtual rack: backups beside the files, no restart of a domain with a frozen tray.

IMEX files are the playbooks' on the shared lab (docs/lab.md), so this module runs
its own small lab. Two inventories: the lab's own (no partition: one domain of the
whole rack) and one with two partitions (p0 = tray01-02, p1 = tray03-04). Every
fault is cleared in a finally block; every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import PARTITIONS, write_site
from tests.lab_fixture import TRAYS_ENV, LabHandle

NODES = "/etc/nvidia-imex/nodes_config.cfg"
CONFIG = "/etc/nvidia-imex/config.cfg"
# the daemon's pid on a tray: the process whose argv names /usr/bin/nvidia-imex (not nvidia-imex-ctl)
_PID = ("python3 -c \"import os; print(' '.join(sorted(p for p in os.listdir('/proc') if p.isdigit() and "
        "any(a.endswith(b'/nvidia-imex') for a in open('/proc/%s/cmdline' % p, 'rb').read().split(b'\\0')))))\"")


@dataclass
class Rack:
    lab: LabHandle
    whole: Path          # inventory folder: one domain of the whole rack
    split: Path          # inventory folder: p0 and p1

    def imex(self, site: Path, *args: str, timeout: float = 300):
        return self.lab.mctl("-i", str(site), "imex", *args, timeout=timeout)

    def addr(self, *trays: str) -> str:
        return "".join(self.lab.addresses[t] + "\n" for t in trays)


@pytest.fixture(scope="module")
def rack(own_lab, tmp_path_factory) -> Rack:
    if int(os.environ.get(TRAYS_ENV) or 4) < 4:
        pytest.skip("needs 4 trays")
    with own_lab(tmp_path_factory.mktemp("mctl-imex-state"), trays=4, label="imex lab") as lab:
        tmp = tmp_path_factory.mktemp("imex-sites")
        yield Rack(lab, lab.inventory.parent, write_site(lab, tmp / "split", PARTITIONS))


def _up(rack: Rack, site: Path) -> None:
    """Apply *site* and wait (bounded) for every domain to be UP, read through both -N forms."""
    proc = rack.imex(site, "apply", rack.lab.rack, "--imex-wait", "90")
    assert proc.returncode == 0, f"{proc.stderr}\n{proc.stdout}"
    status = rack.imex(site, "status", rack.lab.rack, "--json")
    assert status.returncode == 0, f"{status.stderr}\n{status.stdout}"
    assert {d["state"] for d in json.loads(status.stdout)["domains"]} == {"UP"}


def _cat(rack: Rack, tray: str, path: str) -> str:
    return rack.lab.run(tray, f"cat {path}").stdout


def test_apply_keeps_the_previous_files_beside_them_and_status_reads_both_forms(rack):
    lab = rack.lab
    _up(rack, rack.whole)
    whole = {t: (_cat(rack, t, NODES), _cat(rack, t, CONFIG)) for t in lab.trays}
    _up(rack, rack.split)
    for t in lab.trays:
        mine = ("lab-r1-tray01", "lab-r1-tray02") if t in ("lab-r1-tray01", "lab-r1-tray02") else \
            ("lab-r1-tray03", "lab-r1-tray04")
        assert _cat(rack, t, NODES) == rack.addr(*mine)
        assert _cat(rack, t, NODES + ".mctl-bak") == whole[t][0] == rack.addr(*lab.trays)
        assert _cat(rack, t, CONFIG + ".mctl-bak") == whole[t][1]
    # nothing to change: nothing rewritten, the backups stay the previous version
    proc = rack.imex(rack.split, "apply", lab.rack)
    assert proc.returncode == 0 and "match the partitions" in proc.stdout, proc.stderr
    assert _cat(rack, "lab-r1-tray01", NODES + ".mctl-bak") == rack.addr(*lab.trays)
    # -N -j and the text -N of the lab's daemons agree (a disagreement would be a reason, and exit 1)
    status = rack.imex(rack.split, "status", lab.rack)
    assert status.returncode == 0 and "disagree" not in status.stdout, status.stdout


def _pid(rack: Rack, tray: str) -> str:
    pid = rack.lab.run(tray, _PID).stdout.strip()
    assert pid, f"no nvidia-imex daemon on {tray}"
    return pid


def _wait_reachable(lab: LabHandle, tray: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while lab.run(tray, "true", check=False, timeout=15, connect_timeout=3).returncode != 0:
        assert time.monotonic() < deadline, f"{tray} did not answer SSH again within {within:.0f}s"
        time.sleep(1)


def test_apply_leaves_a_domain_with_a_frozen_tray_unchanged_and_names_it(rack):
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    lab = rack.lab
    _up(rack, rack.whole)
    before = {t: _pid(rack, t) for t in ("lab-r1-tray01", "lab-r1-tray03")}
    backup = lab.run("lab-r1-tray01", f"cat {NODES}.mctl-bak", check=False).stdout
    control.fault(lab.dir, "lab-r1-tray02", FaultRequest(unreachable=True))
    try:
        started = time.monotonic()
        proc = rack.imex(rack.split, "apply", lab.rack, "--reach-wait", "3", timeout=240)
        took = time.monotonic() - started
        assert proc.returncode == 3, f"exit {proc.returncode}\n{proc.stderr}\n{proc.stdout}"
        assert "IMEX domain p0 is left unchanged" in proc.stderr and "lab-r1-tray02" in proc.stderr
        assert "lab-r1/p0 (lab-r1-tray02 unreachable)" in proc.stderr
        assert took < 180, f"apply took {took:.0f}s with --reach-wait 3"
        # p0: tray01 kept its files and its daemon; p1 was applied
        assert _cat(rack, "lab-r1-tray01", NODES) == rack.addr(*lab.trays)
        assert lab.run("lab-r1-tray01", f"cat {NODES}.mctl-bak", check=False).stdout == backup
        assert _pid(rack, "lab-r1-tray01") == before["lab-r1-tray01"]
        assert _cat(rack, "lab-r1-tray03", NODES) == rack.addr("lab-r1-tray03", "lab-r1-tray04")
        assert _pid(rack, "lab-r1-tray03") != before["lab-r1-tray03"]
    finally:
        control.fault(lab.dir, "lab-r1-tray02", FaultRequest(clear=True))
    _wait_reachable(lab, "lab-r1-tray02")
    _up(rack, rack.split)             # the tray is back: the held domain is applied now
    assert _cat(rack, "lab-r1-tray01", NODES) == rack.addr("lab-r1-tray01", "lab-r1-tray02")


def test_apply_waits_for_a_tray_that_comes_back_within_reach_wait(rack):
    import subprocess
    import threading

    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    lab = rack.lab
    _up(rack, rack.whole)
    control.fault(lab.dir, "lab-r1-tray02", FaultRequest(unreachable=True))
    proc = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(rack.split), "imex", "apply", lab.rack,
                             "--reach-wait", "120"], env=lab._env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            said.append(line)
            if "asking again for up to" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # the state to act on: apply says it is waiting for tray02 (bounded wait for that line)
        assert waiting.wait(timeout=120), f"apply did not say it waits: {''.join(said)}"
        assert "lab-r1-tray02 cannot be reached" in "".join(said) and "domain p0" in "".join(said)
        assert _cat(rack, "lab-r1-tray01", NODES) == rack.addr(*lab.trays)     # nothing written meanwhile
    finally:
        control.fault(lab.dir, "lab-r1-tray02", FaultRequest(clear=True))
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=30)
        reader.join(timeout=30)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{''.join(said)}\n{out}"
    for t in ("lab-r1-tray01", "lab-r1-tray02"):
        assert _cat(rack, t, NODES) == rack.addr("lab-r1-tray01", "lab-r1-tray02")
    _up(rack, rack.split)
