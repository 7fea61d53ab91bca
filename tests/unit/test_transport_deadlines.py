"""Every wait of the SSH pool has a deadline: stand-ins that never answer.

A frozen host (power lost, kernel panic, sshd stopped with SIGSTOP) keeps its TCP
connection open and answers nothing: a session request on a kept connection, a
command's output, a close. FrozenProxy stands between the pool and a real
(in-process) SSH server and, once frozen, forwards nothing in either direction
while keeping both sockets open: exactly what the pool sees from such a host.
The bounds asserted are generous multiples of the deadlines so a loaded machine
passes; what they catch is a wait that is not bounded at all (tens of seconds).
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from mctl.transport import HostStatus, SSHPool, SSHTarget
from mctl.transport import ssh as ssh_mod
from mctl.transport.ssh import per_tray_deadline

from tests.helpers import FakeTray, example_engine, fake_trays, ssh_config, trust_trays


class FrozenProxy:
    """TCP forwarder 127.0.0.1:port -> the tray; freeze() stops all traffic, keeps the sockets."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.frozen = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self.frozen.is_set():
                    await asyncio.Event().wait()       # a frozen host: the bytes go nowhere, forever
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        if self.frozen.is_set():
            await asyncio.Event().wait()                # accepts (the kernel would), never speaks
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.append(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        """New connections pass again (those taken while frozen stay dead, as a thawed host's timed-out ones)."""
        self.frozen.clear()

    async def stop(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self.server.close()


def _via(proxy: FrozenProxy, tray: FakeTray) -> SSHTarget:
    return SSHTarget(tray.name, "127.0.0.1", proxy.port, "root")


def _trust_proxy(tmp_path: Path, tray: FakeTray, proxy: FrozenProxy) -> None:
    from mctl.transport.known_hosts import KnownHosts

    known = KnownHosts.load(tmp_path / "known_hosts")
    known.add(tray.name, "127.0.0.1", proxy.port, tray.public())
    known.save()


async def _wait_for(predicate, within: float, what: str) -> None:
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


async def _frozen_setup(tmp_path, client_key, **config):
    (tray,) = await fake_trays(client_key, 1)
    proxy = FrozenProxy(tray.port)
    await proxy.start()
    _trust_proxy(tmp_path, tray, proxy)
    pool = SSHPool(ssh_config(tmp_path, client_key, **config))
    return tray, proxy, pool


def test_session_open_on_a_frozen_kept_connection_ends_at_the_deadline(tmp_path, client_key, sockets):
    async def main():
        tray, proxy, pool = await _frozen_setup(tmp_path, client_key, connect_timeout=30.0, command_timeout=30.0)
        first = await pool.run_one(_via(proxy, tray), "echo one", deadline=5.0)
        proxy.freeze()
        t0 = time.monotonic()
        frozen = await pool.run_one(_via(proxy, tray), "echo two", deadline=0.8)
        took = time.monotonic() - t0
        t1 = time.monotonic()
        await pool.close()
        closed_in = time.monotonic() - t1
        dropped = pool.dropped
        await proxy.stop()
        await tray.stop()
        return first, frozen, took, closed_in, dropped

    first, frozen, took, closed_in, dropped = asyncio.run(main())
    assert first.ok and first.stdout == "one\n"
    # Without a deadline this waited for SSH keepalive (30 s x 3); now it is the deadline's.
    assert frozen.status is HostStatus.UNREACHABLE and frozen.phase == "connect"
    assert "kept connection opened no session" in frozen.error and "0.8s deadline" in frozen.error
    assert 0.7 <= took < 5.0
    assert dropped == 1
    assert closed_in < ssh_mod.CLOSE_TIMEOUT * 2 + 2.0       # the close never completes: aborted


def test_a_frozen_host_costs_one_deadline_then_is_answered_at_once_until_it_is_back(tmp_path, client_key, sockets):
    """Issue 27.5: after the miss the host is away: reconnected in the background, and every command until it
    is back is answered at once from the failed connect (a sweep keeps its interval); once a reconnect
    succeeds the next command runs on that connection."""
    async def main():
        tray, proxy, pool = await _frozen_setup(tmp_path, client_key, connect_timeout=0.5, command_timeout=30.0)
        target = _via(proxy, tray)
        first = await pool.run_one(target, "echo one", deadline=5.0)
        proxy.freeze()
        missed = await pool.run_one(target, "echo two", deadline=0.8)
        times, skipped = [], []
        for _ in range(3):
            t0 = time.monotonic()
            skipped.append(await pool.run_one(target, "echo three", deadline=0.8))
            times.append(time.monotonic() - t0)
        await asyncio.sleep(1.2)                # a background reconnect or two fail meanwhile (no banner)
        later = await pool.run_one(target, "echo four", deadline=0.8)
        proxy.thaw()
        await _wait_for(lambda: not pool.away(tray.name), 10.0, "the host back through a background reconnect")
        back = await pool.run_one(target, "echo five", deadline=5.0)
        await pool.close()
        await proxy.stop()
        await tray.stop()
        return first, missed, skipped, times, later, back

    first, missed, skipped, times, later, back = asyncio.run(main())
    assert first.ok and missed.status is HostStatus.UNREACHABLE and "(frozen host?)" in missed.error
    assert all(r.status is HostStatus.UNREACHABLE and r.phase == "connect" for r in skipped + [later])
    assert all("reconnecting in the background, not waited for" in r.error for r in skipped + [later])
    assert max(times) < 0.3, times                          # not the 0.8 s deadline again
    assert "no SSH answer within 0.5s" in later.error, later.error       # the failed reconnect's own error
    assert back.ok and back.stdout == "five\n"


def test_a_refused_connection_is_not_away(tmp_path, client_key, sockets):
    """A host that refuses at once (sshd down, the host up) answered in time: it is asked again each time."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()

    async def main():
        async with SSHPool(ssh_config(tmp_path, client_key, connect_attempts=1)) as pool:
            target = SSHTarget("down", "127.0.0.1", number, "root")
            r = await pool.run_one(target, "hostname", deadline=2.0)
            return r, pool.away("down")

    r, away = asyncio.run(main())
    assert r.status is HostStatus.UNREACHABLE and not away


def test_session_open_is_bounded_without_a_caller_deadline(tmp_path, client_key, sockets):
    async def main():
        tray, proxy, pool = await _frozen_setup(tmp_path, client_key, connect_timeout=0.7, command_timeout=30.0)
        await pool.run_one(_via(proxy, tray), "echo one")
        proxy.freeze()
        t0 = time.monotonic()
        frozen = await pool.run_one(_via(proxy, tray), "echo two")    # exec-style call: no deadline given
        took = time.monotonic() - t0
        await pool.close()
        await proxy.stop()
        await tray.stop()
        return frozen, took

    frozen, took = asyncio.run(main())
    assert frozen.status is HostStatus.UNREACHABLE and "no session within 0.7s" in frozen.error
    assert took < 5.0           # bounded by connect_timeout, not by the 30 s command timeout or keepalive


def test_output_that_never_ends_is_a_timeout_and_the_connection_is_reopened(tmp_path, client_key, sockets):
    async def main():
        (tray,) = await fake_trays(client_key, 1)
        trust_trays(tmp_path, [tray])
        target = SSHTarget(tray.name, "127.0.0.1", tray.port, "root")
        async with SSHPool(ssh_config(tmp_path, client_key, command_timeout=30.0)) as pool:
            await pool.run_one(target, "echo warm", deadline=5.0)
            t0 = time.monotonic()
            hung = await pool.run_one(target, "sleep 60", deadline=0.8)
            took = time.monotonic() - t0
            # Reopened in the background: a second connection arrives without any command asking.
            await _wait_for(lambda: tray.connections == 2, 10.0, "a new connection opened in the background")
            after = await pool.run_one(target, "echo after", deadline=5.0)
            dropped = pool.dropped
        await tray.stop()
        return tray, hung, took, after, dropped

    tray, hung, took, after, dropped = asyncio.run(main())
    assert hung.status is HostStatus.TIMEOUT and hung.phase == "command"
    assert hung.stdout == "started\n" and "0.8s deadline" in hung.error
    assert 0.7 <= took < 5.0
    assert dropped == 1
    assert after.ok and after.stdout == "after\n"
    assert tray.connections == 2        # the command after used the connection opened in the background


def test_a_host_that_never_speaks_ssh_ends_at_the_deadline_not_the_connect_timeout(tmp_path, client_key, sockets):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    async def main():
        async with SSHPool(ssh_config(tmp_path, client_key, connect_timeout=20.0)) as pool:
            t0 = time.monotonic()
            r = await pool.run_one(SSHTarget("mute", "127.0.0.1", sock.getsockname()[1], "root"), "hostname",
                                   deadline=0.6)
            took = time.monotonic() - t0
            t1 = time.monotonic()
        return r, took, time.monotonic() - t1

    try:
        r, took, closed_in = asyncio.run(main())
    finally:
        sock.close()
    assert r.status is HostStatus.UNREACHABLE and r.phase == "connect"
    assert r.error == "no SSH answer within the 0.6s deadline"
    assert 0.5 <= took < 5.0
    assert closed_in < ssh_mod.CLOSE_TIMEOUT * 2 + 2.0      # the connect still going on is cancelled at close


def test_a_fan_out_with_frozen_and_hung_hosts_ends_within_its_deadline(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 3)
        trust_trays(tmp_path, trays[:2])
        frozen_tray = trays[2]
        proxy = FrozenProxy(frozen_tray.port)
        await proxy.start()
        _trust_proxy(tmp_path, frozen_tray, proxy)
        targets = [SSHTarget(t.name, "127.0.0.1", t.port, "root") for t in trays[:2]] + [_via(proxy, frozen_tray)]
        commands = {trays[0].name: "echo fine", trays[1].name: "sleep 60", frozen_tray.name: "echo frozen"}
        async with SSHPool(ssh_config(tmp_path, client_key, connect_timeout=30.0, command_timeout=30.0)) as pool:
            warm = await pool.run(targets, "echo warm", deadline=5.0)
            proxy.freeze()
            t0 = time.monotonic()
            results = await pool.run(targets, lambda t: commands[t.name], deadline=1.0)
            took = time.monotonic() - t0
        await proxy.stop()
        for t in trays:
            await t.stop()
        return warm, results, took

    warm, results, took = asyncio.run(main())
    assert all(r.ok for r in warm)
    assert [r.status for r in results] == [HostStatus.OK, HostStatus.TIMEOUT, HostStatus.UNREACHABLE]
    assert results[0].stdout == "fine\n"
    assert 0.9 <= took < 6.0


def test_hosts_waiting_for_a_slot_are_reported_at_the_deadline(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 3)
        trust_trays(tmp_path, trays)
        targets = [SSHTarget(t.name, "127.0.0.1", t.port, "root") for t in trays]
        async with SSHPool(ssh_config(tmp_path, client_key, concurrency=1, command_timeout=30.0)) as pool:
            t0 = time.monotonic()
            results = await pool.run(targets, "sleep 60", deadline=0.8)
            took = time.monotonic() - t0
        for t in trays:
            await t.stop()
        return results, took

    results, took = asyncio.run(main())
    assert results[0].status is HostStatus.TIMEOUT and results[0].phase == "command"
    assert all(r.status is HostStatus.TIMEOUT and "every SSH slot" in r.error for r in results[1:])
    assert took < 5.0


@pytest.mark.parametrize("kw, expected", [
    ({"interval": 60}, 15.0),                       # a long interval: the default cap
    ({"interval": 8}, 8.0),                         # the interval bounds the sweep
    ({"interval": 0.2}, 5.0),                       # never below MIN_TRAY_DEADLINE when derived
    ({"interval": 2, "command_timeout": 3}, 3.0),   # ... nor above ssh.command_timeout
    ({"interval": 60, "configured": 40}, 40.0),     # health.tray_deadline
    ({"interval": 60, "configured": 2}, 2.0),       # ... taken as set
    ({"interval": 60, "configured": 40, "command_timeout": 30}, 30.0),
    ({"interval": 60, "override": 90, "command_timeout": 30}, 90.0),   # --timeout is taken as given
    ({"interval": 60, "override": 1.5}, 1.5),
])
def test_per_tray_deadline(kw, expected):
    assert per_tray_deadline(**kw) == expected


# --- the health sweep: the deadline it gives each tray, and a scheduler that never answers --------

class _SilentScheduler:
    """A controller that takes the request and never answers (slurmctld's host frozen)."""

    kind = "slurm"
    where = "slurmctld on a frozen host"

    def __init__(self):
        self.asked = 0

    async def read(self, *, deadline=None):
        self.asked += 1
        await asyncio.Event().wait()

    async def apply(self, decisions, *, deadline=None):
        await asyncio.Event().wait()


def test_each_tray_of_a_sweep_gets_the_deadline_derived_from_the_interval(tmp_path):
    engine, pool = example_engine(tmp_path, interval=7)
    engine.scheduler = None
    result = asyncio.run(engine.sweep())
    assert pool.deadlines == [7.0]
    assert engine.act_deadline == 7.0
    assert {v.reach for v in result.verdicts} == {"unreachable"}
    engine, pool = example_engine(tmp_path)                   # health.interval of the example: 60 -> the 15 s cap
    assert engine.timeout == 15.0
    engine, pool = example_engine(tmp_path, interval=2, timeout=3)
    assert engine.timeout == 3.0 and engine.act_deadline == 5.0


def test_a_scheduler_that_never_answers_costs_one_deadline(tmp_path):
    engine, pool = example_engine(tmp_path, timeout=1.0)
    engine.scheduler = _SilentScheduler()
    t0 = time.monotonic()
    result = asyncio.run(engine.sweep())
    took = time.monotonic() - t0
    assert engine.scheduler.asked == 1
    assert result.scheduler_error == "slurmctld on a frozen host did not answer within the 1s deadline"
    assert any(f.check == "scheduler.reachable" for f in result.findings)
    assert 0.9 <= took < 5.0
