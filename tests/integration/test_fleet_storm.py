"""No tray lost to a connection storm (issue 29.5, D124), on a fleet lab of 2 racks of 18 trays.

The storm is made as it happens: a rack's sshd stops answering for longer than ssh.connect_timeout while
the fan-out's other connects go on and succeed (SIGSTOP of its sshd processes, then SIGCONT: the kernel
still takes each TCP connection into the listen backlog, no banner comes until sshd runs again, exactly
what a saturated host or network looks like from the head node). Two trays are dead: the sshd that serves
their addresses stays stopped (a frozen host: TCP accepted, nothing ever said).

Every live tray must be reached, the stalled rack's included, by `rack inventory --all` and by `health check`;
the dead trays must be named as not reached, within the command's deadline. Before D124 the stalled
rack's 18 trays were reported unreachable after one connect_timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

RACKS, TRAYS = 2, 18
CONNECT_TIMEOUT = 2.0          # the inventory's ssh.connect_timeout for this module: the stall is longer
STALL = 3 * CONNECT_TIMEOUT    # how long the stalled rack's sshd answers nothing
DEADLINE = 20                  # --timeout: each tray's deadline


@pytest.fixture(scope="module")
def fleet(own_lab, tmp_path_factory):
    with own_lab(tmp_path_factory.mktemp("mctl-storm-state"), trays=TRAYS, racks=RACKS, fleet=True,
                 label="storm fleet lab") as lab:
        doc = yaml.safe_load(lab.inventory.read_text())
        doc.setdefault("ssh", {})["connect_timeout"] = CONNECT_TIMEOUT
        lab.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield lab


def _sshds(lab, rack: str) -> dict[int, set[str]]:
    """pid -> the host names that sshd answers as (by its -o ListenAddress= arguments), for *rack*'s rack host."""
    from mctl.lab import control

    by_address = {a: n for n, a in lab.addresses.items()}
    out: dict[int, set[str]] = {}
    for p in control.lab_processes(lab.dir):
        title = " ".join(p.cmdline)                 # sshd rewrites its title: "sshd: /usr/sbin/sshd -D ... [listener] ..."
        if "sshd" not in title or "[listener]" not in title:
            continue
        names = {by_address.get(a) for a in re.findall(r"ListenAddress=([0-9.]+):22", title)}
        if any(n and n.startswith(rack + "-") for n in names):
            out[p.pid] = {n for n in names if n}
    assert out, f"no sshd of {rack} found"
    return out


def _signal(pids, sig) -> None:
    for pid in pids:
        os.kill(pid, sig)


def _storm_run(lab, argv: list[str]) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """Run mctl *argv* with lab-r1's sshd stalled for STALL seconds from the start and the trays of lab-r2's
    second sshd dead throughout; (its result, its wall time, the dead trays)."""
    stalled = list(_sshds(lab, "lab-r1"))
    r2 = _sshds(lab, "lab-r2")
    dead_pid = next(pid for pid, names in r2.items() if not any(n.endswith("-tray01") for n in names))
    dead = {n for n in r2[dead_pid] if "-tray" in n}
    assert dead, r2
    _signal([dead_pid], signal.SIGSTOP)
    _signal(stalled, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "mctl", *argv], env=lab._env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            # the fault's own length: the stall outlasts connect_timeout, whatever the machine's speed
            proc.wait(timeout=STALL)
        except subprocess.TimeoutExpired:
            pass
        _signal(stalled, signal.SIGCONT)
        out, err = proc.communicate(timeout=DEADLINE * 3 + 60)
        took = time.monotonic() - t0
    finally:
        _signal(stalled, signal.SIGCONT)
        _signal([dead_pid], signal.SIGCONT)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), took, dead


def test_inventory_reaches_every_live_tray_through_a_stall_and_names_the_dead_ones_within_the_deadline(fleet):
    run, took, dead = _storm_run(fleet, ["rack", "inventory", "--all", "--json", "--timeout", str(DEADLINE)])
    assert run.stdout.strip(), run.stderr[-2000:]
    doc = json.loads(run.stdout)
    trays = {t["host"]: t for r in doc["racks"] for t in r["trays"]}
    assert len(trays) == RACKS * TRAYS
    missed = {n: t["error"] for n, t in trays.items() if t["reach"] != "ok"}
    assert set(missed) == dead, missed                       # every live tray, lab-r1's stalled ones too
    assert all(t["hostname"] == n for n, t in trays.items() if n not in dead)
    assert all(e and "SSH" in e for e in missed.values()), missed
    assert all(trays[n]["elapsed"] <= DEADLINE + 1 for n in dead), {n: trays[n]["elapsed"] for n in dead}
    assert took < DEADLINE + 30, took                         # the command ends within its deadline (+ start-up)


def test_health_check_reaches_every_live_tray_through_a_stall(fleet):
    run, took, dead = _storm_run(fleet, ["health", "check", "--json", "--timeout", str(DEADLINE)])
    assert run.returncode in (0, 1), run.stderr[-2000:]
    doc = json.loads(run.stdout)
    reach = {t["host"]: t["reach"] for t in doc["trays"]}
    assert len(reach) == RACKS * TRAYS
    assert {n for n, r in reach.items() if r != "ok"} == dead, reach
    unreachable = {f["host"] for f in doc["findings"] if f["check"] == "tray.reachable" and f["severity"] != "ok"}
    assert unreachable == dead
    assert took < DEADLINE + 60, took
