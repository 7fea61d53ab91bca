"""Every wait has a deadline, on the lab: a frozen tray (sshd and every session stopped with
SIGSTOP, `mctl lab fault --unreachable`) during a watch and during `health check`; a resume
by bring-up leaves no hold reason in real Slurm; a hung BMC and a frozen tray never lengthen a
watch's sweeps at `--interval 2` (issue 27.5: BMCs read beside the sweep, a frozen tray answered
at once while it is reconnected in the background).

The watch runs with remediation on the health site of test_health (real Slurm), with the
breaker opened to half the rack so the frozen tray and a faulted one can both be drained.
What is asserted is what the watch reports (its SWEEP and event lines, Slurm's node states),
waited for with deadlines; the duration bound is generous (a loaded machine passes) while
the failure it catches is a sweep stuck for the SSH keepalive, 100-120 s.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import Watch, actions, fault, settled, sinfo, wait_for

# --own-labs beside (scripts/test): in the second pytest, on its shared lab (balances the two sessions;
# tests/beside.py, D125)
pytestmark = pytest.mark.beside

INTERVAL = 5.0
# A sweep is its tray deadline (the interval here) plus, when it acts, the scheduler's actions
# (engine.ACT_DEADLINE_MIN); the rest is slack for a loaded machine.
SWEEP_BOUND = INTERVAL + 5.0 + 6.0
_SWEEP = re.compile(r" SWEEP   #(\d+): .* (\d+\.\d+)s$")


@pytest.fixture(scope="module")
def roomy_site(health_site, tmp_path_factory) -> Path:
    """The health site with a breaker that lets two of the four trays be drained."""
    doc = yaml.safe_load((health_site / "mctl.yml").read_text())
    doc["health"]["breaker"]["max_drained_share"] = 0.5
    folder = tmp_path_factory.mktemp("deadline-site")
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def sweeps_of(lines: list[str]) -> list[tuple[int, float]]:
    return [(int(m[1]), float(m[2])) for m in (_SWEEP.search(l) for l in lines) if m]


def sweep_of_line(lines: list[str], index: int) -> int:
    """Events print before their sweep's line: the sweep an event belongs to."""
    return sum(" SWEEP " in l for l in lines[:index]) + 1


def test_a_frozen_tray_during_a_watch_costs_one_deadline_per_sweep(lab, roomy_site, health):
    frozen, faulted = lab.trays[3], lab.trays[1]
    others = [t for t in lab.trays if t != frozen]
    watch = Watch(lab, roomy_site, health.state, "--interval", f"{INTERVAL:g}")
    try:
        wait_for("two sweeps over the healthy rack", lambda: watch.sweeps() >= 2, 90)
        fault(lab, frozen, unreachable=True)
        seen = watch.sweeps()
        # The kept connection to the frozen tray now opens no session: reported as unreachable ...
        wait_for(f"{frozen} reported", lambda: any(f" {frozen} healthy -> unreachable" in l for l in watch.read()),
                 4 * SWEEP_BOUND)
        line = next(i for i, l in enumerate(watch.lines) if f" {frozen} healthy -> unreachable" in l)
        # ... in the sweep running when it froze, or the next one: within two sweeps
        assert sweep_of_line(watch.lines, line) <= seen + 2, (seen, watch.lines)
        # The other trays are still checked, and a faulted one is drained meanwhile.
        fault(lab, faulted, xid=79, gpu=0)
        wait_for(f"{faulted} drained while {frozen} is frozen",
                 lambda: "drain" in sinfo(lab)[faulted][0], 6 * SWEEP_BOUND)
        # After health.unreachable_sweeps_before_drain (2) misses the frozen tray is drained too.
        wait_for(f"{frozen} drained as unreachable", lambda: sinfo(lab)[frozen] ==
                 ("drained", "mctl: unreachable 2 sweeps"), 6 * SWEEP_BOUND)
        during = sweeps_of(watch.read())
        checked = [l for l in watch.lines if " SWEEP " in l and "1 unreachable" in l]
        assert checked, watch.lines
        # Thawed: the connection reopened in the background works, the tray comes back healthy.
        fault(lab, frozen, clear=True)
        fault(lab, faulted, clear=True)
        wait_for(f"{frozen} and {faulted} resumed by the watch",
                 lambda: sinfo(lab)[frozen] == ("idle", "") and sinfo(lab)[faulted] == ("idle", ""), 180)
    finally:
        code = watch.stop()
    assert code == 0, watch.proc.stderr.read()
    durations = [d for _, d in sweeps_of(watch.lines)]
    frozen_sweeps = [d for n, d in during if n > seen]
    print(f"sweeps: {len(durations)}; while {frozen} was frozen: n={len(frozen_sweeps)} "
          f"max={max(frozen_sweeps):.2f}s mean={sum(frozen_sweeps) / len(frozen_sweeps):.2f}s; "
          f"all: max={max(durations):.2f}s")
    assert frozen_sweeps and max(frozen_sweeps) <= SWEEP_BOUND, during
    assert max(durations) <= SWEEP_BOUND, watch.lines
    for tray in (frozen, faulted):      # the watch's resume left no mctl: reason behind in Slurm
        show = lab.run(lab.head, f"scontrol show node -o {tray}").stdout
        assert "Reason=mctl:" not in show and "Reason=resumed by mctl" in show, show
    drains = {e["tray"]: e for e in actions(health.state) if e["action"] == "drain"}
    assert set(drains) == {frozen, faulted} and all(e["result"] == "ok" for e in drains.values())
    assert all(t in others or t == frozen for t in drains)


SHORT = 2.0                 # the operator's `--interval 2`: every sweep within SHORT + 1 s


def _sweeps_after(lines: list[str], index: int) -> list[float]:
    """The durations of the SWEEP lines after lines[index]."""
    return [d for _n, d in sweeps_of(lines[index + 1:])]


def test_a_hung_bmc_never_lengthens_a_watchs_sweep_and_is_stale_until_cleared(lab, health_site, health):
    from mctl.lab import bmc_faults

    tray = lab.trays[2]
    watch = Watch(lab, health_site, health.state, "--interval", f"{SHORT:g}", "--no-remediate")
    try:
        wait_for("two sweeps over the healthy rack", lambda: watch.sweeps() >= 2, 90)
        bmc_faults.apply(lab.dir, tray, hang=True)
        start = len(watch.read())
        # no answer: after health.bmc_stale_after (3) reads of 2 s its view is stale, named in the sweep
        line = wait_for(f"{tray} stale", lambda: next((i for i, l in enumerate(watch.read()) if i >= start and
                                                      f" {tray} healthy -> warn: bmc.stale: " in l), None), 60)
        # the reads in flight pass their 10 s deadline meanwhile; the sweeps keep their interval
        wait_for("six sweeps more", lambda: watch.sweeps() >= sweep_of_line(watch.lines, line) + 6, 60)
        hung = _sweeps_after(watch.lines, start)
        bmc_faults.apply(lab.dir, tray, clear=True)
        back = wait_for(f"{tray} healthy again", lambda: next((i for i, l in enumerate(watch.read()) if i > line and
                                                              f" {tray} warn -> healthy" in l), None), 60)
    finally:
        bmc_faults.apply(lab.dir, tray, clear=True)
        code = watch.stop()
    assert code == 0, watch.proc.stderr.read()
    print(f"hung BMC of {tray}: {len(hung)} sweeps, max {max(hung):.2f}s; stale at line {line}, back at {back}")
    assert len(hung) >= 6 and max(hung) <= SHORT + 1.0, hung
    assert " bmc.stale: the BMC's last answer " in watch.lines[line], watch.lines[line]


def test_a_frozen_tray_is_answered_at_once_while_it_is_reconnected(lab, health_site, health):
    tray = lab.trays[3]
    watch = Watch(lab, health_site, health.state, "--interval", f"{SHORT:g}", "--no-remediate")
    try:
        wait_for("two sweeps over the healthy rack", lambda: watch.sweeps() >= 2, 90)
        fault(lab, tray, unreachable=True)
        # the sweep running when it froze waits its deadline (the kept connection opens no session) ...
        line = wait_for(f"{tray} reported", lambda: next((i for i, l in enumerate(watch.read())
                                                          if f" {tray} healthy -> unreachable" in l), None), 60)
        # ... the next ones answer it at once from the failed connect while it is reconnected in the background
        first = sweep_of_line(watch.lines, line)
        wait_for("six sweeps more", lambda: watch.sweeps() >= first + 6, 60)
        after = [d for n, d in sweeps_of(watch.read()) if n > first]
        unreachable = [l for l in watch.lines if " SWEEP " in l and "1 unreachable" in l]
        fault(lab, tray, clear=True)
        wait_for(f"{tray} back through the background reconnect",
                 lambda: any(f" {tray} unreachable -> " in l for l in watch.read()[line:]), 90)
    finally:
        code = watch.stop()
    assert code == 0, watch.proc.stderr.read()
    print(f"frozen {tray}: {len(after)} sweeps after the first, max {max(after):.2f}s")
    assert len(after) >= 6 and max(after) <= SHORT + 1.0, (after, watch.lines)
    assert len(unreachable) >= 6, watch.lines          # still counted unreachable in every sweep (a miss each)


def test_health_check_with_a_frozen_tray_ends_at_the_tray_deadline(lab, health):
    tray = lab.trays[3]
    fault(lab, tray, unreachable=True)
    try:
        t0 = time.monotonic()
        proc = health("--json", "health", "check", "--timeout", "3")
        took = time.monotonic() - t0
    finally:
        fault(lab, tray, clear=True)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    status = {t["host"]: t["status"] for t in data["trays"]}
    assert status[tray] == "unreachable" and all(status[t] == "healthy" for t in lab.trays if t != tray), status
    (mine,) = [t for t in data["trays"] if t["host"] == tray]
    assert mine["elapsed"] < 3.0 + 1.0, mine           # the deadline decided, not ssh.connect_timeout (10 s)
    print(f"health check with {tray} frozen: {took:.2f}s wall, sweep {data['elapsed']:.2f}s")
    assert data["elapsed"] < 3.0 + 5.0


def test_bring_up_resume_clears_its_hold_reason_in_slurm(lab, health):
    from mctl.sched.slurm import holds

    tray = lab.trays[2]
    lab.run(lab.head, f"scontrol update NodeName={tray} State=DRAIN Reason={holds.bringup_reason('RUN1')!r}")
    assert sinfo(lab)[tray][0] == "drained"
    out = lab.run(lab.head, holds.release_script(holds.BRING_UP, [tray])).stdout
    assert holds.parse_actions(out, [tray])[tray][0] == "done", out
    settled(lab, tray)
    show = lab.run(lab.head, f"scontrol show node -o {tray}").stdout
    assert "Reason=mctl:" not in show and f"Reason={holds.REASON_OPENED}" in show, show
    proc = health("--json", "health", "check", tray)
    (row,) = json.loads(proc.stdout)["trays"]
    assert row["status"] == "healthy" and row["scheduler_state"] == "IDLE" and row["scheduler_reason"] is None, row
    # A second run of the open phase finds nothing of bring-up's to resume.
    nodes = holds.classify(lab.run(lab.head, holds.show_command([tray])).stdout, [tray])
    assert nodes.open == [tray] and not nodes.held
