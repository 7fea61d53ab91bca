"""The SSH pool against real SSH servers (asyncssh, in-process, on 127.0.0.1).

The servers (tests.helpers.FakeTray) speak the real protocol, so host-key checking, authentication,
timeouts, retries and connection reuse are exercised as they are against sshd;
the integration tests repeat the important cases against the lab's OpenSSH.
"""

from __future__ import annotations

import asyncio
import socket
import time

import asyncssh

from mctl.transport import HostStatus, SSHPool, SSHTarget, run_sync
from mctl.transport.known_hosts import KnownHosts
from mctl.transport.trust import ADDED, REFUSED, REPLACED, UNCHANGED, UNREACHABLE, trust_hosts
from tests.helpers import FakeTray, fake_trays, ssh_config, trust_trays


def _target(t: FakeTray) -> SSHTarget:
    return SSHTarget(t.name, "127.0.0.1", t.port, "root")


def test_trusted_hosts_run_and_report_exit_codes(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 3)
        trust_trays(tmp_path, trays)
        async with SSHPool(ssh_config(tmp_path, client_key)) as pool:
            ok = await pool.run([_target(t) for t in trays], "hostname")
            bad = await pool.run_one(_target(trays[0]), "fail 3")
        for t in trays:
            await t.stop()
        return trays, ok, bad

    trays, ok, bad = asyncio.run(main())
    assert [r.status for r in ok] == [HostStatus.OK] * 3
    assert [r.stdout for r in ok] == ["tray01\n", "tray02\n", "tray03\n"]
    assert bad.status is HostStatus.FAILED and bad.exit_code == 3 and bad.stderr == "something broke\n"
    assert bad.summary() == "exit 3: something broke"
    # one connection per host, reused by the second command
    assert [t.connections for t in trays] == [1, 1, 1]


def test_untrusted_host_is_refused_with_its_fingerprint(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 1)
        r = (await SSHPool(ssh_config(tmp_path, client_key)).run([_target(trays[0])], "hostname"))[0]
        await trays[0].stop()
        return trays[0], r

    tray, r = asyncio.run(main())
    assert r.status is HostStatus.HOST_KEY_MISMATCH
    assert r.host_key is not None and r.host_key.recorded == ()
    assert r.host_key.presented == tray.public().describe()
    assert tray.public().fingerprint in r.error and "mctl ssh trust tray01" in r.error


def test_changed_host_key_is_refused_naming_both_fingerprints(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 1)
        trust_trays(tmp_path, trays)
        old = trays[0].public()
        await trays[0].stop()
        await trays[0].start(asyncssh.generate_private_key("ssh-ed25519"))  # "reinstalled" on the same port
        r = await SSHPool(ssh_config(tmp_path, client_key)).run_one(_target(trays[0]), "hostname")
        await trays[0].stop()
        return old, trays[0].public(), r

    old, new, r = asyncio.run(main())
    assert r.status is HostStatus.HOST_KEY_MISMATCH and r.phase == "connect"
    assert r.host_key.presented == new.describe()
    assert r.host_key.recorded == (old.describe(),)
    assert "HOST KEY CHANGED" in r.error and new.fingerprint in r.error and old.fingerprint in r.error
    assert "--replace" in r.error


def test_command_timeout_keeps_partial_output_and_connection(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 1)
        trust_trays(tmp_path, trays)
        async with SSHPool(ssh_config(tmp_path, client_key)) as pool:
            slow = await pool.run_one(_target(trays[0]), "sleep 5", timeout=0.5)
            after = await pool.run_one(_target(trays[0]), "echo still here")
        await trays[0].stop()
        return trays[0], slow, after

    tray, slow, after = asyncio.run(main())
    assert slow.status is HostStatus.TIMEOUT and slow.phase == "command"
    assert slow.stdout == "started\n" and "0.5s" in slow.error
    assert after.ok and after.stdout == "still here\n"
    assert tray.connections == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connection_is_unreachable_after_connect_retries(tmp_path, client_key, sockets):
    port = _free_port()
    results = run_sync(ssh_config(tmp_path, client_key, connect_attempts=3),
                       [SSHTarget("gone", "127.0.0.1", port, "root")], "hostname")
    r = results[0]
    assert r.status is HostStatus.UNREACHABLE and r.phase == "connect"
    assert r.attempts == 3 and "refused" in r.error.lower()


def test_silent_listener_is_unreachable_after_connect_timeout_without_retries(tmp_path, client_key, sockets):
    # Accepts TCP but never speaks SSH: what a hung sshd looks like.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        start = time.monotonic()
        r = run_sync(ssh_config(tmp_path, client_key, connect_timeout=0.6),
                     [SSHTarget("hung", "127.0.0.1", sock.getsockname()[1], "root")], "hostname")[0]
        took = time.monotonic() - start
    finally:
        sock.close()
    assert r.status is HostStatus.UNREACHABLE and r.phase == "connect" and r.attempts == 1
    assert r.error == "no SSH answer within 0.6s"
    assert took < 2.5


def test_concurrency_is_bounded(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 6)
        trust_trays(tmp_path, trays)
        async with SSHPool(ssh_config(tmp_path, client_key, concurrency=2)) as pool:
            start = time.monotonic()
            results = await pool.run([_target(t) for t in trays], "sleep 0.2")
            took = time.monotonic() - start
        for t in trays:
            await t.stop()
        return trays, results, took

    trays, results, took = asyncio.run(main())
    assert all(r.ok for r in results)
    assert trays[0].site_busy["peak"] == 2      # never more than two hosts busy at once
    assert took >= 0.6 - 0.05                   # so three waves of 0.2 s


def test_dead_cached_connection_is_reopened(tmp_path, client_key, sockets):
    async def main():
        trays = await fake_trays(client_key, 1)
        trust_trays(tmp_path, trays)
        async with SSHPool(ssh_config(tmp_path, client_key)) as pool:
            first = await pool.run_one(_target(trays[0]), "echo one")
            for conn in trays[0].conns:
                conn.close()
            await asyncio.sleep(0.2)
            second = await pool.run_one(_target(trays[0]), "echo two")
        await trays[0].stop()
        return trays[0], first, second

    tray, first, second = asyncio.run(main())
    assert first.ok and second.ok and second.stdout == "two\n"
    assert tray.connections == 2


def test_trust_records_refuses_changed_and_replaces_on_request(tmp_path, client_key, sockets):
    cfg = ssh_config(tmp_path, client_key)

    async def start():
        return await fake_trays(client_key, 2)

    loop = asyncio.new_event_loop()
    trays = loop.run_until_complete(start())
    # trust_hosts runs its own event loop; serve the fake trays from a thread meanwhile
    import threading
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        targets = [_target(t) for t in trays]
        dead = SSHTarget("gone", "127.0.0.1", _free_port(), "root")
        first = trust_hosts(cfg, targets + [dead])
        assert [o.action for o in first] == [ADDED, ADDED, UNREACHABLE]
        assert first[0].key == trays[0].public()
        again = trust_hosts(cfg, targets)
        assert [o.action for o in again] == [UNCHANGED, UNCHANGED]

        old = trays[1].public()
        asyncio.run_coroutine_threadsafe(trays[1].stop(), loop).result()
        asyncio.run_coroutine_threadsafe(trays[1].start(asyncssh.generate_private_key("ssh-ed25519")), loop).result()
        refused = trust_hosts(cfg, targets)
        assert [o.action for o in refused] == [UNCHANGED, REFUSED]
        assert refused[1].previous == (old,) and old.fingerprint in refused[1].error
        assert KnownHosts.load(cfg.known_hosts).keys_for("tray02", "127.0.0.1", trays[1].port) == [old]

        dry = trust_hosts(cfg, targets, replace=True, dry_run=True)
        assert dry[1].action == REPLACED
        assert KnownHosts.load(cfg.known_hosts).keys_for("tray02", "127.0.0.1", trays[1].port) == [old]

        replaced = trust_hosts(cfg, targets, replace=True)
        assert replaced[1].action == REPLACED
        assert KnownHosts.load(cfg.known_hosts).keys_for("tray02", "127.0.0.1", trays[1].port) == [trays[1].public()]
        # and now the pool accepts it
        r = run_sync(cfg, [targets[1]], "hostname")[0]
        assert r.ok and r.stdout == "tray02\n"
    finally:
        for t in trays:
            asyncio.run_coroutine_threadsafe(t.stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
