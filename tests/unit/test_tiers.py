"""The test tiers of tests/conftest.py: a test's tier from its fixtures, and the pure tier's guard."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest

from tests.conftest import NotPure, PureGuard, tier_of


@pytest.mark.parametrize("fixtures, tier", [
    ((), "pure"),
    (("tmp_path", "capsys", "monkeypatch"), "pure"),
    (("tmp_path", "sockets"), "emulators"),
    (("kube_apiserver", "processes", "tmp_path_factory"), "emulators"),
    (("health", "health_site", "slurm_lab", "slurm_deployed", "lab", "processes"), "lab"),
    (("audited", "own_lab", "processes"), "slow"),
    (("brought_up", "lab", "long_run"), "slow"),
])
def test_the_highest_tier_any_fixture_asks_for(fixtures, tier):
    assert tier_of(SimpleNamespace(fixturenames=list(fixtures))) == tier


def test_the_guard_refuses_processes_and_sockets_and_notes_each():
    guard = PureGuard()
    guard.start()           # inside this test's own guard: its doors are the ones called, the outer stays quiet
    try:
        with pytest.raises(NotPure, match="started a process: true"):
            subprocess.run(["true"], check=False)
        with pytest.raises(NotPure, match="started a process: os.system"):
            os.system("true")
        with pytest.raises(NotPure, match=r"used a socket: connect \('127.0.0.1', 9\)"):
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        with socket.socket() as s, pytest.raises(NotPure, match="used a socket: bind"):
            s.bind(("127.0.0.1", 0))
        asyncio.run(asyncio.sleep(0))       # an event loop's own socketpair is not a socket use
    finally:
        guard.stop()
    assert [what.split(":")[0] for what in guard.seen] == ["started a process"] * 2 + ["used a socket"] * 2


def test_a_stopped_guard_leaves_the_doors_as_they_were():
    before = (subprocess._fork_exec, os.fork, socket.socket.connect)      # this test's own guard's doors
    guard = PureGuard()
    guard.start()
    assert subprocess._fork_exec is not before[0]
    guard.stop()
    assert (subprocess._fork_exec, os.fork, socket.socket.connect) == before


def test_the_second_pytest_gets_this_sessions_arguments_with_only_its_own_labs(tmp_path, monkeypatch):
    from tests.beside import Beside

    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(tmp_path))
    for args, kept in [(("tests", "--own-labs", "beside", "-k", "x"), ["tests", "-k", "x"]),
                       (("tests", "-p", "no:cacheprovider", "--own-labs=beside", "-x"),
                        ["tests", "-p", "no:cacheprovider", "-x"])]:
        config = SimpleNamespace(invocation_params=SimpleNamespace(args=args, dir=tmp_path))
        run = Beside(config, ["t::a"], lambda item: "slow")
        argv = run.argv()
        assert argv[1:3] == ["-m", "pytest"] and argv[3:] == [*kept, "--own-labs=only"]
        assert run.log.parent == tmp_path and run.json.suffix == ".json"


def _items(*specs):
    return [SimpleNamespace(nodeid=name, fixturenames=list(fixtures), tier=tier) for name, tier, fixtures in specs]


class _Config:
    def __init__(self, mode):
        self.mode, self.deselected, self.registered = mode, [], {}
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))
        self.pluginmanager = SimpleNamespace(register=lambda plugin, name: self.registered.setdefault(name, plugin))
        self.invocation_params = SimpleNamespace(args=("tests",), dir=".")

    def getoption(self, name, default=None):
        return self.mode


@pytest.mark.parametrize("mode, left, beside, deselected", [
    ("inline", ["p", "l", "o1", "o2"], None, []),
    ("beside", ["p", "l"], ["o1", "o2"], []),
    ("only", ["o1", "o2"], None, ["p", "l"]),
])
def test_own_lab_tests_stay_go_beside_or_run_alone(mode, left, beside, deselected, tmp_path, monkeypatch):
    from tests.beside import split

    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(tmp_path))
    items = _items(("p", "pure", ()), ("l", "lab", ("lab",)), ("o1", "slow", ("own_lab",)), ("o2", "slow", ("own_lab",)))
    config = _Config(mode)
    split(config, items, lambda item: item.tier)
    assert [i.nodeid for i in items] == left
    assert [i.nodeid for i in config.deselected] == deselected
    run = config.registered.get("mctl-beside")
    assert (run.nodeids if run else None) == beside


def test_own_lab_tests_with_nothing_on_a_lab_beside_them_stay_in_place(tmp_path, monkeypatch):
    from tests.beside import split

    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(tmp_path))
    items = _items(("p", "pure", ()), ("o1", "slow", ("own_lab",)))
    config = _Config("beside")
    split(config, items, lambda item: item.tier)
    assert [i.nodeid for i in items] == ["p", "o1"] and not config.registered


def test_a_second_sessions_tiers_are_counted_in_the_first():
    from tests.conftest import TierReport

    first, second = TierReport(), TierReport()
    first.tests["lab"], first.seconds["lab"], first.outcomes["lab"]["passed"] = 3, 30.0, 3
    second.tests["slow"], second.seconds["slow"] = 2, 100.0
    second.outcomes["slow"].update({"passed": 1, "failed": 1})
    first.add(second.as_json())
    assert first.tests == {"lab": 3, "slow": 2} and first.seconds["slow"] == 100.0
    assert first.outcomes["slow"] == {"passed": 1, "failed": 1}
