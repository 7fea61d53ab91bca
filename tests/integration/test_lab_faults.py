"""Lab faults act as real ones, on connections that were open before the fault too.

Each test keeps an SSH connection open (an OpenSSH ControlMaster, and for --hang
also mctl's own asyncssh pool, as the health watch keeps one), injects the fault,
checks what the open connection and a new one see, clears it in `finally`, and
waits (with a deadline) until the kept connection works again. The daemon faults
need Slurm: `slurm_lab` (tests/lab_fixture.py), deployed once per session, and its site for
`imex apply`.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
from contextlib import contextmanager
from functools import partial

import pytest

from mctl.facts.kernel_log import parse_xid_events
from mctl.lab import control
from tests import helpers
from tests.helpers import fault, resume_if_rebooted, responding
from tests.unit.cli_helpers import run_cli

WAIT_S = 60.0          # deadline for every state a test waits for (a loaded machine is slow, not broken)
SHORT_S = 3.0          # a command that should finish at once is given this long to show that it does not
wait_for = partial(helpers.wait_for, timeout=WAIT_S, every=0.2)       # every wait here: WAIT_S, polled often


def _row(lab, host):
    return next(r for r in control.status(lab.dir)["hosts"] if r["name"] == host)


class Kept:
    """An OpenSSH connection kept open (ControlMaster); run() sends a new session over it."""

    def __init__(self, lab, host, path):
        self.lab, self.host, self.path = lab, host, path
        self.base = lab.ssh_argv(host, connect_timeout=5)
        self.base[1:1] = ["-o", f"ControlPath={path}"]

    def open(self):
        subprocess.run(self.base[:1] + ["-o", "ControlMaster=yes", "-o", "ControlPersist=300", "-N", "-f"]
                       + self.base[1:], check=True, timeout=30, stdin=subprocess.DEVNULL, capture_output=True)
        assert self.alive()

    def alive(self) -> bool:
        return subprocess.run(self.base[:1] + ["-O", "check"] + self.base[1:], capture_output=True, timeout=10,
                              stdin=subprocess.DEVNULL).returncode == 0

    def run(self, cmd: str, timeout: float) -> subprocess.CompletedProcess:
        """TimeoutExpired when nothing comes back in time (the client is killed, the connection stays)."""
        return subprocess.run(self.base + [cmd], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def answers(self) -> bool:
        try:
            return self.run("hostname", timeout=10).stdout.strip() == self.host
        except subprocess.TimeoutExpired:
            return False

    def close(self):
        subprocess.run(self.base[:1] + ["-O", "exit"] + self.base[1:], capture_output=True, timeout=10,
                       stdin=subprocess.DEVNULL)


@contextmanager
def kept(lab, host, tmp_path):
    k = Kept(lab, host, str(tmp_path / f"cm-{host}"))
    k.open()
    try:
        yield k
    finally:
        k.close()


def _times_out(k: Kept, cmd: str = "hostname") -> bool:
    try:
        k.run(cmd, timeout=SHORT_S)
    except subprocess.TimeoutExpired:
        return True
    return False


def test_freeze_silences_open_and_new_connections(lab, tmp_path):
    from mctl.lab import hosts

    tray = lab.trays[0]
    go = "/tmp/mctl-test-freeze-go"
    with kept(lab, tray, tmp_path) as k:
        assert k.answers()
        lab.run(tray, f"rm -f {go}")
        # A command running on the open connection when the host freezes: it waits for a file.
        running = subprocess.Popen(k.base + [f"while [ ! -e {go} ]; do sleep 0.1; done; echo late"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   stdin=subprocess.DEVNULL)
        try:
            # ([w]: the pattern must not match the shell that runs pgrep)
            wait_for("the waiting command", lambda: lab.run(tray, f"pgrep -f '[w]hile \\[ ! -e {go}'",
                                                            check=False).returncode == 0)
            cli = lab.mctl("lab", "fault", "host", tray, "--freeze", "--dir", str(lab.dir))
            assert cli.returncode == 0 and "unreachable" in cli.stdout, cli.stderr
            # Every process of the host is stopped, not just sshd.
            row = _row(lab, tray)
            assert row["ssh"] == "not answering" and row["faults"] == ["unreachable"]
            # (a child that exited just before its parent stopped stays a zombie: nothing runs to reap it)
            assert row["processes"] and all(p["state"] in ("T", "t", "Z") for p in row["processes"]), row["processes"]
            assert any(p["state"] in ("T", "t") for p in row["processes"]), row["processes"]
            # The open connection gets no answer to a new session (and no reset: it answers after --clear).
            assert _times_out(k)
            # A new connection: TCP connects, no banner ever comes.
            res = lab.run(tray, "hostname", check=False, connect_timeout=2, timeout=30)
            assert res.returncode == 255 and "timed out" in res.stderr
            # The running command is frozen too: the file it waits for appears, no output comes.
            hosts.host_path(lab.dir, tray, go).write_text("")
            with pytest.raises(subprocess.TimeoutExpired):
                running.wait(timeout=SHORT_S)
        finally:
            lab.clear_faults(tray)
            try:
                out, _err = running.communicate(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                running.kill()
                k.close()          # the master holds the session's pipes too: ended, they close (no wait unbounded)
                out, _err = running.communicate(timeout=WAIT_S)
        # Continued, it goes on where it stopped, on the same connection.
        assert out.strip() == "late" and running.returncode == 0
        wait_for("the kept connection to answer after --clear", k.answers)
        lab.run(tray, f"rm -f {go}")
    assert _row(lab, tray)["ssh"] == "ok"
    assert all(p["state"] not in ("T", "t") for p in _row(lab, tray)["processes"])


def test_freeze_silences_a_kept_asyncssh_connection(lab):
    """mctl's own transport, as the watch keeps it: no answer to a new channel, no reset, fine after --clear."""
    from mctl.inventory import load_site
    from mctl.transport import SSHPool, targets_for

    tray = lab.trays[0]
    site = load_site(lab.inventory)
    target = targets_for(site, [site.host(tray)])[0]

    async def scenario():
        async with SSHPool.from_site(site) as pool:
            first = await pool.run_one(target, "hostname", timeout=30)
            assert first.status.value == "ok" and first.stdout.strip() == tray, first
            try:
                fault(lab, tray, unreachable=True)
                with pytest.raises(asyncio.TimeoutError):
                    # bounded from outside: this test is about the host, not about the transport's deadlines
                    await asyncio.wait_for(pool.run_one(target, "hostname", timeout=None), SHORT_S)
            finally:
                lab.clear_faults(tray)
            again = await asyncio.wait_for(pool.run_one(target, "hostname", timeout=30), WAIT_S)
            assert again.status.value == "ok" and again.stdout.strip() == tray, again

    asyncio.run(scenario())


def test_hang_reaches_open_connections_and_logins_still_work(lab, tmp_path):
    from mctl.inventory import load_site
    from mctl.transport import SSHPool, targets_for

    tray = lab.trays[1 % len(lab.trays)]
    site = load_site(lab.inventory)
    targets = targets_for(site, [site.host(tray)])

    async def pool_run(pool, timeout):
        return (await pool.run(targets, "hostname", timeout=timeout))[0]

    async def scenario():
        async with SSHPool.from_site(site) as pool:
            first = await pool_run(pool, 30)
            assert first.status.value == "ok" and first.stdout.strip() == tray, first
            with kept(lab, tray, tmp_path) as k:
                try:
                    fault(lab, tray, hang=True)
                    assert _row(lab, tray)["ssh"] == "commands hang"
                    # mctl's kept asyncssh connection (as the watch keeps one): the command never finishes.
                    hung = await pool_run(pool, SHORT_S)
                    assert hung.status.value == "timeout", hung
                    assert _times_out(k)                          # the kept OpenSSH connection too
                    # Logins still work: a new connection authenticates; only its commands hang.
                    k2 = Kept(lab, tray, str(tmp_path / "cm-second"))
                    k2.open()
                    try:
                        assert _times_out(k2)
                    finally:
                        k2.close()
                finally:
                    lab.clear_faults(tray)
                wait_for("the kept connection to answer after --clear", k.answers)
            again = None
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                again = await pool_run(pool, 10)
                if again.status.value == "ok":
                    break
                await asyncio.sleep(0.5)
            assert again is not None and again.status.value == "ok" and again.stdout.strip() == tray, again

    asyncio.run(scenario())
    assert lab.run(tray, "pgrep -f /usr/lib/mctl-lab/hang", check=False).returncode == 1
    assert lab.run(tray, "test -e /etc/ssh/sshrc", check=False).returncode == 1


def test_slow_delays_every_command_on_an_open_connection(lab, tmp_path):
    tray = lab.trays[0]
    with kept(lab, tray, tmp_path) as k:
        try:
            fault(lab, tray, slow=2.0)
            assert _row(lab, tray)["ssh"] == "commands slow (2s)" and _row(lab, tray)["faults"] == ["slow 2s"]
            started = time.monotonic()
            res = k.run("hostname", timeout=WAIT_S)
            assert res.stdout.strip() == tray and time.monotonic() - started >= 2.0
        finally:
            lab.clear_faults(tray)
        assert _row(lab, tray)["ssh"] == "ok"
        wait_for("the kept connection to answer after --clear", k.answers)


def test_sshd_restart_drops_open_connections_and_comes_back(lab, tmp_path):
    tray = lab.trays[0]
    with kept(lab, tray, tmp_path) as k:
        before = {p["pid"] for p in _row(lab, tray)["processes"] if p["comm"].startswith("sshd")}
        cli = lab.mctl("lab", "fault", "host", tray, "--sshd-restart", "--dir", str(lab.dir))
        assert cli.returncode == 0, cli.stderr
        # The kept connection was reset: its master is gone.
        wait_for("the kept connection to be dropped", lambda: not k.alive())
    # sshd is back (a new process) and new connections work.
    assert lab.run(tray, "hostname").stdout.strip() == tray
    after = {p["pid"] for p in _row(lab, tray)["processes"] if p["comm"].startswith("sshd")}
    assert after and not (after & before)
    assert _row(lab, tray)["faults"] == []


def test_bad_host_fault_requests(lab, capsys):
    head_only = run_cli(capsys, "lab", "fault", "service", lab.trays[0], "--slurmctld-down", "--dir", str(lab.dir))
    assert head_only.code == 2 and "head node" in head_only.err
    tray_only = run_cli(capsys, "lab", "fault", "service", lab.head, "--slurmd-down", "--dir", str(lab.dir))
    assert tray_only.code == 2 and "compute tray" in tray_only.err
    event = run_cli(capsys, "lab", "fault", "host", lab.trays[0], "--reboot", "--hang", "--dir", str(lab.dir))
    assert event.code == 2 and "goes alone" in event.err
    slow = run_cli(capsys, "lab", "fault", "host", lab.trays[0], "--slow", "0", "--dir", str(lab.dir))
    assert slow.code == 2 and "--slow" in slow.err


# --- daemons: need Slurm (and IMEX for --imex-crash) ------------------------------------------------

def _running(lab, host, name) -> bool:
    return lab.run(host, f"pgrep -x {name}", check=False).returncode == 0


def test_slurmd_down_is_kept_down_until_clear(lab, slurm_site):
    tray = lab.trays[0]
    assert _running(lab, tray, "slurmd")
    try:
        fault(lab, tray, slurmd_down=True)
        wait_for("slurmd to be gone", lambda: not _running(lab, tray, "slurmd"))
        assert _row(lab, tray)["faults"] == ["slurmd down"]
        # It stays down: starting it fails, as a daemon that crashes at start would.
        start = lab.run(tray, "systemctl start slurmd", check=False, timeout=60)
        assert start.returncode != 0 and not _running(lab, tray, "slurmd")
    finally:
        lab.clear_faults(tray)
    wait_for("slurmd back after --clear", lambda: _running(lab, tray, "slurmd"))
    wait_for("slurmctld to hear from slurmd again", lambda: responding(lab, tray))


def test_slurmctld_down_on_the_head_node(lab, slurm_site):
    try:
        fault(lab, lab.head, slurmctld_down=True)
        wait_for("slurmctld to be gone", lambda: not _running(lab, lab.head, "slurmctld"))
        assert "DOWN" in lab.run(lab.head, "scontrol ping", check=False, timeout=60).stdout
    finally:
        lab.clear_faults(lab.head)
    wait_for("slurmctld answering again", lambda: "UP" in lab.run(lab.head, "scontrol ping", check=False,
                                                                   timeout=60).stdout)


def test_imex_crash_kills_the_daemon_and_clear_starts_it(lab, slurm_site):
    tray = lab.trays[0]
    applied = lab.mctl("-i", str(slurm_site), "imex", "apply", lab.rack, "--imex-wait", "30", timeout=300)
    assert applied.returncode == 0, applied.stderr + applied.stdout
    try:
        wait_for("the IMEX daemon", lambda: _running(lab, tray, "nvidia-imex"))
        fault(lab, tray, imex_crash=True)
        wait_for("the IMEX daemon to be gone", lambda: not _running(lab, tray, "nvidia-imex"))
        assert _row(lab, tray)["faults"] == ["imex crashed"]
        lab.clear_faults(tray)
        wait_for("the IMEX daemon back after --clear", lambda: _running(lab, tray, "nvidia-imex"))
    finally:
        lab.clear_faults(tray)
        for t in lab.trays:
            lab.run(t, "systemctl stop nvidia-imex", check=False, timeout=60)


def _boot_id(lab, host) -> str:
    return lab.run(host, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _health(lab, tray) -> dict:
    proc = lab.mctl("health", "check", tray, "--json", "--passed", timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _findings(report, tray, check):
    return [f for f in report["findings"] if f["host"] == tray and f["check"] == check]


def test_reboot_new_boot_id_kern_log_kept_services_back_health_sees_it(lab, slurm_site, tmp_path):
    tray = lab.trays[-1]
    assert _running(lab, tray, "slurmd") and _running(lab, tray, "munged")
    imex_before = _running(lab, tray, "nvidia-imex")       # enabled by `imex apply`, it comes back at boot
    old_boot = _boot_id(lab, tray)
    old_uptime = float(lab.run(tray, "cat /proc/uptime").stdout.split()[0])
    try:
        fault(lab, tray, xid=48, gpu=1)            # a drain XID (double-bit ECC), before the reboot
        before = _health(lab, tray)
        assert any(f["severity"] == "critical" and "XID 48" in f["message"] for f in _findings(before, tray, "gpu.xid"))
        with kept(lab, tray, tmp_path) as k:
            done: dict = {}

            def reboot():
                try:
                    done["result"] = fault(lab, tray, reboot=True, down_for=10)
                except BaseException as exc:      # noqa: BLE001 - reported by the main thread
                    done["error"] = exc

            thread = threading.Thread(target=reboot)
            thread.start()
            try:
                # The tray goes away: every process ends, the kept connection drops, SSH is refused.
                wait_for("the tray to go down", lambda: not _row(lab, tray)["running"])
                res = lab.run(tray, "hostname", check=False, connect_timeout=2, timeout=30)
                assert res.returncode == 255
                wait_for("the kept connection to drop", lambda: not k.alive())
            finally:
                thread.join(timeout=120)
            assert not thread.is_alive() and "error" not in done, done
        new_boot = _boot_id(lab, tray)
        assert new_boot != old_boot and _row(lab, tray)["boot_id"] == new_boot
        assert float(lab.run(tray, "cat /proc/uptime").stdout.split()[0]) < old_uptime
        # The enabled units came back as at boot (GPU device nodes first: slurmd's gres.conf names them).
        wait_for("munged and slurmd after the boot",
                 lambda: _running(lab, tray, "munged") and _running(lab, tray, "slurmd"))
        assert lab.run(tray, "test -c /dev/nvidia0 -a -c /dev/nvidia3", check=False).returncode == 0
        # kern.log is on disk: the line from before the boot is still there.
        assert [e.code for e in parse_xid_events(lab.run(tray, "cat /var/log/kern.log").stdout)][-1:] == [48]
        after = _health(lab, tray)
        boot = _findings(after, tray, "tray.boot")
        assert [f["severity"] for f in boot] == ["warn"] and "rebooted" in boot[0]["message"], boot
        xid = _findings(after, tray, "gpu.xid")
        assert [f["severity"] for f in xid] == ["ok"] and "earlier boot" in xid[0]["message"], xid
        # Just after the boot a start-up check that fails warns (the boot grace, default 2 min), judged once it
        # ends; which of the two this run sees follows from the uptime the same probe read.
        fault(lab, tray, slurmd_down=True)
        young = _health(lab, tray)
        (slurmd,) = [f for f in _findings(young, tray, "slurm.slurmd") if f["severity"] != "ok"]
        (boot,) = _findings(young, tray, "tray.boot")
        up = float(re.search(r"up (\d+)s", boot["message"])[1])
        if up < 118:
            assert slurmd["severity"] == "warn" and "boot grace" in slurmd["message"], slurmd
            assert slurmd["details"]["boot_grace"]["grace"] == 120.0
        elif up > 122:
            assert slurmd["severity"] == "critical" and "boot_grace" not in slurmd.get("details", {}), slurmd
    finally:
        lab.clear_faults(tray)
        resume_if_rebooted(lab, tray)
        if not imex_before:
            lab.run(tray, "systemctl stop nvidia-imex", check=False, timeout=60)
