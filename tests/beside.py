"""The own-lab tests in a second pytest, beside the shared lab's tier (`--own-labs beside`, scripts/test).

The slow tier's own-lab modules (fixture `own_lab`: a lab of their own, on its own address block) share
nothing with the session's lab, and the shared lab's tier leaves most of the CPU idle: its tests wait for
states (Slurm, reboots, Ansible's SSH round trips, sweeps): about 1100-1200 CPU-seconds against CI's 25
minutes of wall time, under one core of the two on average (measured: docs/testing.md). So with `--own-labs beside` this session takes them out of its own run and, when its
first test on a lab starts, starts a second `pytest` with the same arguments and `--own-labs only`, which
runs just those. Modules of the shared lab's tier marked `beside` (`pytestmark = pytest.mark.beside`: the
provisioning modules, minutes of Ansible that leave the lab as they found it) go there too: the second
pytest's session starts a shared lab of its own for them (the `lab` fixture, as every session does). Its output
goes to a log that this session prints at its end (a section "own labs, beside"), its tiers are added to
this session's summary (with its own wall time and how long this session waited for it), and its failure fails this session. `--own-labs inline` (the default for plain
`pytest`) runs them in place, in the slow tier, as before.

    inline   the own-lab and `beside` tests in this session, in their tier's order (the default)
    beside   the own-lab and `beside` tests in a second pytest started beside the shared lab's tier; this session waits
             for it at its end (MCTL_BESIDE_WAIT seconds at most, default 3600)
    only     the own-lab and `beside` tests only (what the second pytest runs); its tiers are written as JSON to
             $MCTL_TIERS_JSON for the first
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

OPTION = "--own-labs"
MODES = ("inline", "beside", "only")
TIERS_JSON_ENV = "MCTL_TIERS_JSON"       # where the second pytest writes its tiers (TierReport.as_json)
WAIT_ENV = "MCTL_BESIDE_WAIT"            # seconds the first session waits for the second at its end


def addoption(parser) -> None:
    parser.addoption(OPTION, choices=MODES, default="inline", dest="own_labs",
                     help="run the own-lab tests (fixture own_lab) and the modules marked beside in place (inline, the "
                          "default), in a second pytest beside the shared lab's tier (beside: scripts/test), or "
                          "only them (only)")


MARK = "beside"     # a module of the shared lab's tier that the second pytest runs, on a shared lab of its own


def own_lab_test(item) -> bool:
    """A test for the second pytest: it has a lab of its own (`own_lab`) or is marked `beside`."""
    marked = getattr(item, "get_closest_marker", lambda name: None)(MARK) is not None
    return marked or "own_lab" in getattr(item, "fixturenames", ())


def configure(config) -> None:
    """The second pytest answers SIGINT as after Ctrl-C (KeyboardInterrupt: its labs torn down), also when it
    inherited SIGINT ignored (a session started in the background by a non-interactive shell ignores it, and
    Python then keeps it ignored): that is how the first session stops it (Beside.stop)."""
    if config.getoption("own_labs", "inline") == "only":
        signal.signal(signal.SIGINT, signal.default_int_handler)


def split(config, items: list, tier_of_item) -> None:
    """After the tiers' ordering: `only` keeps the own-lab tests alone; `beside` hands them to a Beside run
    when there is something to overlap them with (a test on the shared lab), else leaves them in place."""
    mode = config.getoption("own_labs", "inline")
    if mode == "only":
        others = [i for i in items if not own_lab_test(i)]
        if others:
            config.hook.pytest_deselected(items=others)
        items[:] = [i for i in items if own_lab_test(i)]
    elif mode == "beside":
        mine = [i for i in items if own_lab_test(i)]
        overlap = [i for i in items if not own_lab_test(i) and tier_of_item(i) in ("lab", "slow")]
        if mine and overlap:
            items[:] = [i for i in items if not own_lab_test(i)]
            config.pluginmanager.register(Beside(config, [i.nodeid for i in mine], tier_of_item), "mctl-beside")


class Beside:
    """The second pytest: started before this session's first test on a lab, waited for at the session's end."""

    def __init__(self, config, nodeids: list[str], tier_of_item):
        self.config, self.nodeids, self.tier_of_item = config, nodeids, tier_of_item
        self.proc: subprocess.Popen | None = None
        self.started = self.waited = 0.0         # monotonic; seconds this session waited for it at its end
        self.rc: int | None = None
        self.stopped = ""                 # why this session stopped it before it ended, if it did
        root = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir())
        fd, log = tempfile.mkstemp(prefix="mctl-own-labs-", suffix=".log", dir=root)
        os.close(fd)
        self.log = Path(log)
        self.json = self.log.with_suffix(".json")
        self.tiers: dict = {}

    def argv(self) -> list[str]:
        """This session's arguments with `--own-labs only` in place of its own mode."""
        args, skip = [], False
        for a in self.config.invocation_params.args:
            if skip:
                skip = False
            elif a == OPTION:
                skip = True
            elif not a.startswith(OPTION + "="):
                args.append(a)
        return [sys.executable, "-m", "pytest", *args, f"{OPTION}=only"]

    def start(self) -> None:
        if self.proc is not None:
            return
        env = dict(os.environ, **{TIERS_JSON_ENV: str(self.json)})
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.config.invocation_params.dir, start_new_session=True)
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"\n== {len(self.nodeids)} tests (own labs, `beside` modules) started beside the shared lab's "
                          f"tier, in a second pytest (pid {self.proc.pid}; log: {self.log})")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.tier_of_item(item) in ("lab", "slow"):
            self.start()
        yield

    def stop(self, why: str) -> None:
        """SIGINT first (the second pytest then tears its labs down as after Ctrl-C), SIGKILL to its group
        if it has not ended 180 s later."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.stopped = why
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        early = session.shouldstop or session.shouldfail or (exitstatus == pytest.ExitCode.INTERRUPTED and
                                                             "interrupted")
        if early:
            self.stop(f"this session stopped early ({early})")
            if self.proc is None:
                self.stopped = f"not started: this session stopped early ({early})"
                return
        self.start()                     # no test on a lab ran (none selected after all): they run now
        waiting = time.monotonic()
        try:
            self.rc = self.proc.wait(float(os.environ.get(WAIT_ENV) or 3600))
        except subprocess.TimeoutExpired:
            self.stop(f"it ran past {WAIT_ENV}")
            self.rc = self.proc.returncode
        self.waited = time.monotonic() - waiting
        try:
            self.tiers = json.loads(self.json.read_text())
        except (OSError, ValueError):
            self.tiers = {}
        if self.rc not in (0, None) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED if self.rc == 1 else self.rc

    def report(self, tr) -> None:
        """The second pytest's output, as a section of this session's summary."""
        tr.section(f"own labs, beside the shared lab's tier (a second pytest, exit {self.rc}"
                   f"{'; stopped: ' + self.stopped if self.stopped else ''})", sep="=")
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            text = f"(its log {self.log} could not be read: {exc})\n"
        for line in text.rstrip("\n").splitlines():
            tr.write_line(line)
