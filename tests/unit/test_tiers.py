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
