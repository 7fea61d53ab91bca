"""Shared test settings: pinned terminal width so rich output is stable; the session's labs; the tiers.

Every test is in one of four tiers, marked here from the fixtures it uses (its fixture closure, so a
fixture that needs a process passes its tier on to every test using it), never from its folder:

    pure        no process, no socket, no lab: the default, and enforced (see _pure_tier_guard)
    emulators   local processes or servers: `processes`, `sockets` (the emulators, sushy-tools, the
                real kube-apiserver, a throwaway sshd, ... each request one of these)
    lab         the session's shared lab: `lab` (and `slurm_lab`, which needs it)
    slow        a lab of its own (`own_lab`) or minutes on the shared one (`long_run`)

A test is in the highest tier any of its fixtures asks for. The run goes tier by tier in that order
(the end-to-end bring-up and then the chaos run last of all, as before), and the terminal summary ends
with each tier's count and wall time. docs/testing.md says how to run one tier or the fast two.
"""

import json
import os
import socket
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

os.environ.setdefault("COLUMNS", "160")
os.environ.setdefault("NO_COLOR", "1")

from tests.lab_fixture import lab, own_lab, slurm_deployed, slurm_lab  # noqa: E402,F401 - the labs of a session
from tests.kube_apiserver import kube_apiserver  # noqa: E402,F401 - one real kube-apiserver per session (k8s tests)
from tests import beside  # noqa: E402 - the own-lab tests in a second pytest beside the lab tier (--own-labs)

TIERS = ("pure", "emulators", "lab", "slow")

#: The fixtures that lift a test out of the pure tier, and where to. Other fixtures reach a tier by
#: requesting one of these (kube_apiserver requests `processes`, slurm_lab requests `lab`).
TIER_OF_FIXTURE = {
    "processes": "emulators",
    "sockets": "emulators",
    "lab": "lab",
    "own_lab": "slow",
    "long_run": "slow",
}

E2E = Path(__file__).resolve().parent / "e2e"


@pytest.fixture(scope="session")
def processes():
    """Requested by a test (or a fixture) that starts local processes: it runs in the emulators tier,
    where the pure tier's guard lets it. What it starts it stops itself (each fixture says how)."""


@pytest.fixture(scope="session")
def sockets():
    """Requested by a test (or a fixture) that opens sockets (a server on loopback, a client of one): it
    runs in the emulators tier, where the pure tier's guard lets it."""


@pytest.fixture(scope="session")
def long_run():
    """Requested by a test (or a fixture) that takes minutes on the shared lab (the bring-up, the chaos
    soak, the recovery ladder): it runs in the slow tier, after the quicker lab tests."""


@pytest.fixture
def held_lock(processes):
    """held_lock(path, purpose=""): a context manager in which another process holds the lock file *path*,
    as another mctl command would; it gives that process's pid (tests.helpers.held_lock)."""
    from tests.helpers import held_lock as holding

    return holding


def tier_of(item) -> str:
    """The highest tier any fixture in *item*'s closure asks for ("pure" when none does)."""
    names = getattr(item, "fixturenames", ())
    return max((TIER_OF_FIXTURE.get(n, "pure") for n in names), key=TIERS.index, default="pure")


TIER_HELP = {
    "pure": "no process, no socket, no lab (the default; guarded)",
    "emulators": "starts local processes or servers (fixtures `processes`, `sockets`)",
    "lab": "runs on the session's shared lab (fixture `lab`)",
    "slow": "a lab of its own or minutes on the shared one (fixtures `own_lab`, `long_run`)",
}


def pytest_addoption(parser):
    beside.addoption(parser)


def pytest_configure(config):
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: {TIER_HELP[tier]}; set by tests/conftest.py from the fixtures")
    beside.configure(config)
    config.addinivalue_line("markers", f"{beside.MARK}: with --own-labs beside (scripts/test), run in the second "
                                       "pytest, on its own shared lab (tests/beside.py); in place otherwise")
    if not config.option.collectonly:
        config.pluginmanager.register(TierReport(), "mctl-tiers")


def pytest_collection_modifyitems(config, items):
    """Each test marked with its tier; the run ordered pure, emulators, lab, slow. Inside a tier the
    collection order is kept, except that the real kube-apiserver's emulator tests go after the other
    emulator tests, and the end-to-end tests after the other slow ones (they bring the shared lab's rack
    fully up, which no other test expects), the chaos run last of all (it faults the shared lab at
    random). A tier marker written on a test that its fixtures contradict is an error: the tier is what
    the fixtures say."""
    wrong = []
    for item in items:
        tier = tier_of(item)
        written = {m.name for m in item.iter_markers() if m.name in TIERS}
        if written - {tier}:
            wrong.append(f"{item.nodeid}: marked {', '.join(sorted(written))}, its fixtures say {tier}")
        item.add_marker(getattr(pytest.mark, tier))
        item.stash[_TIER] = tier
    if wrong:
        raise pytest.UsageError("tier markers come from the fixtures a test uses (tests/conftest.py); remove "
                                "these or give the test the fixture:\n  " + "\n  ".join(wrong))

    def last(item) -> int:
        if Path(str(item.fspath)).name == "test_chaos.py":
            return 3
        if E2E in Path(str(item.fspath)).resolve().parents:
            return 2
        # the real kube-apiserver's emulator tests after the others: a cold build of it, started by
        # scripts/test beside the tests, has the pure tier and the rest of this one to end before they
        # wait for it (in the lab tier they keep their place: test_health_k8s expects NMX-M as the lab
        # modules before test_partition_jobs leave it)
        return 1 if item.stash[_TIER] == "emulators" and "kube_apiserver" in item.fixturenames else 0

    items[:] = sorted(items, key=lambda i: (TIERS.index(i.stash[_TIER]), last(i)))    # stable: order kept
    beside.split(config, items, lambda i: i.stash[_TIER])


# ------------------------------------------------------------------ the pure tier's guard

class NotPure(AssertionError):
    """A test in the pure tier started a process or used a socket."""


def _spawned(args, *rest, **kw) -> str:
    argv = args if isinstance(args, (list, tuple)) else [args]
    return "started a process: " + " ".join(os.fsdecode(a) for a in argv)[:200]


def _spawned_path(path, argv=(), *rest, **kw) -> str:
    return "started a process: " + " ".join(os.fsdecode(a) for a in (argv or [path]))[:200]


def _socket_call(verb: str):
    return lambda sock, address=None, *rest: f"used a socket: {verb} {address!r}"


#: (owner, attribute, what the call means). The lowest Python-level doors: every subprocess (asyncio's
#: and multiprocessing's too) goes through fork_exec, posix_spawn or fork; every client and server socket
#: through connect, bind or sendto. A socketpair (asyncio's own event loop) is left alone.
def _doors():
    import _posixsubprocess

    return [
        (subprocess, "_fork_exec", _spawned), (_posixsubprocess, "fork_exec", _spawned),
        (os, "posix_spawn", _spawned_path), (os, "posix_spawnp", _spawned_path),
        (os, "fork", lambda *a: "started a process: os.fork()"),
        (os, "forkpty", lambda *a: "started a process: os.forkpty()"),
        (os, "system", lambda cmd, *a: f"started a process: os.system({cmd!r})"),
        (socket.socket, "connect", _socket_call("connect")), (socket.socket, "connect_ex", _socket_call("connect")),
        (socket.socket, "bind", _socket_call("bind")), (socket.socket, "sendto", _socket_call("sendto")),
    ]


class PureGuard:
    """While started, every door of _doors() raises NotPure and is noted in `seen` (what it was asked to do)."""

    def __init__(self):
        self.seen: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def _blocked(self, describe):
        def door(*args, **kw):
            what = describe(*args, **kw)
            self.seen.append(what)
            raise NotPure(f"a test in the pure tier {what}")
        return door

    def start(self) -> None:
        for owner, name, describe in _doors():
            if hasattr(owner, name):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, self._blocked(describe))

    def stop(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


@pytest.fixture(autouse=True)
def _pure_tier_guard(request):
    """A test in the pure tier that starts a process or uses a socket fails, naming what it did and the
    fixture that would put it where it belongs, so a mis-tiered test is found, not hidden (also when the
    code under test swallowed the error: the test fails at its teardown)."""
    if request.node.stash.get(_TIER, "pure") != "pure":
        yield
        return
    guard = PureGuard()
    guard.start()
    try:
        yield
    finally:
        guard.stop()
    if guard.seen:
        more = f" (and {len(guard.seen) - 1} more)" if len(guard.seen) > 1 else ""
        pytest.fail(f"{request.node.nodeid} is in the pure tier but {guard.seen[0]}{more}: request the "
                    "`processes` or `sockets` fixture (tests/conftest.py) so that it runs in the emulators tier",
                    pytrace=False)


# ------------------------------------------------------------------ each tier's count and time

_TIER = pytest.StashKey[str]()
_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2, "error": 3}


class TierReport:
    """Per tier: the tests run, their outcomes and their wall time, each test from the start of its setup to
    the end of its teardown (so a session fixture's start counts in the tier of the first test needing it);
    printed at the end of the terminal summary."""

    def __init__(self):
        self.began = time.monotonic()
        self.tests: Counter = Counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.deselected: Counter = Counter()
        self.worst: dict[str, str] = {}

    def pytest_deselected(self, items):
        for item in items:
            self.deselected[item.stash.get(_TIER, None) or tier_of(item)] += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        started = time.monotonic()
        yield
        tier = item.stash.get(_TIER, "pure")
        self.seconds[tier] += time.monotonic() - started
        self.tests[tier] += 1
        self.outcomes[tier][self.worst.pop(item.nodeid, "passed")] += 1

    def pytest_runtest_logreport(self, report):
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
        elif report.skipped:
            outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        elif report.when == "call":
            outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
        else:
            return
        old = self.worst.get(report.nodeid)
        if old is None or _RANK[outcome] > _RANK[old]:
            self.worst[report.nodeid] = outcome

    def as_json(self) -> dict:
        return {tier: {"tests": self.tests[tier], "seconds": round(self.seconds[tier], 1),
                       "outcomes": dict(self.outcomes[tier])} for tier in TIERS if self.tests[tier]}

    def add(self, tiers: dict) -> None:
        """Another session's tiers (as_json) counted in this one's (the second pytest of tests/beside.py)."""
        for tier, t in tiers.items():
            self.tests[tier] += t["tests"]
            self.seconds[tier] += t["seconds"]
            self.outcomes[tier].update(t["outcomes"])

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        second = tr.config.pluginmanager.get_plugin("mctl-beside")
        if second is not None:
            second.report(tr)
            self.add(second.tiers.get("tiers", {}))
        if os.environ.get(beside.TIERS_JSON_ENV):
            Path(os.environ[beside.TIERS_JSON_ENV]).write_text(json.dumps(
                {"tiers": self.as_json(), "session_s": round(time.monotonic() - self.began, 1)}))
        tr.section("tiers", sep="=")
        for tier in TIERS:
            done = ", ".join(f"{n} {o}" for o, n in sorted(self.outcomes[tier].items(), key=lambda kv: _RANK[kv[0]]))
            left = f"  ({self.deselected[tier]} deselected)" if self.deselected[tier] else ""
            tr.write_line(f"{tier:<10} {self.tests[tier]:>5} tests {_clock(self.seconds[tier]):>9}"
                          f"{'  ' + done if done else ''}{left}")
        if second is not None:
            n = sum(t["tests"] for t in second.tiers.get("tiers", {}).values())
            wall = second.tiers.get("session_s")
            tr.write_line(f"{'':<10} {n:>5} of them (own labs, `beside` modules) in a second pytest beside the shared lab's tier: "
                          f"{_clock(wall) if wall is not None else '?'} (exit {second.rc}), waited for "
                          f"{_clock(second.waited)} at the end")
        tr.write_line(f"{'all':<10} {sum(self.tests.values()):>5} tests {_clock(sum(self.seconds.values())):>9}"
                      f"  (the session, with collection: {_clock(time.monotonic() - self.began)})")
        install = os.environ.get(INSTALL_ENV)
        if install:
            tr.write_line(f"{'install':<10} {'':>11} {_clock(float(install)):>9}  (scripts/install before the "
                          "tests: system packages, .venv)")
        from tests.kube_apiserver import BUILD_WAITED
        from tests.lab_fixture import REDEPLOYS

        for why in REDEPLOYS:
            tr.write_line(f"{'':<10} slurm_lab deployed Slurm again: {why}")

        for waited in BUILD_WAITED:
            tr.write_line(f"{'':<10} {'':>11} {_clock(waited):>9}  (the Kubernetes tests waited for the "
                          "kube-apiserver build running beside the tests)")


INSTALL_ENV = "MCTL_TEST_INSTALL_S"      # set by scripts/test: the seconds its install step took


def _clock(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{int(seconds // 60)}:{int(seconds % 60):02d} min"
