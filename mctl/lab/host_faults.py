"""`mctl lab fault host HOST --freeze|--hang|--slow S|--sshd-restart|--reboot`, and a host's power.

What each stands for is in docs/lab.md ("Faults"). A freeze, a hang and a slow host are state (in the
host's faults.json while they last, mctl/lab/faults.py); an sshd restart and a reboot are events that
change the running host. The host's power (`power_off`, `power_on`) is here too: a reboot is one, and
the tray's BMC emulator (mctl/lab/bmc_emulator.py) powers the host through the same two functions.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from mctl.errors import EnvironmentProblem, UsageError
from mctl.lab import daemon_faults, hosts, procs, services
from mctl.lab import faults as faultlib
from mctl.lab.labdir import LabFiles, rack_context, send_signal
from mctl.lab.layout import LabHost, LabLayout
from mctl.state.files import atomic_write, write_json

SSHRC = "/etc/ssh/sshrc"
SSHRC_MARK = "# mctl lab fault"
FROZEN_RECORD = "frozen.json"            # hosts/<name>/frozen.json: the pids --freeze stopped
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Units a rebooted host starts when they are enabled, in order (the lab's init starts sshd itself).
BOOT_UNITS = {"tray": ["munge.service", "nvidia-imex.service", "slurmd.service"],
              "head": ["munge.service", "slurmctld.service"]}


def actions(host: LabHost, current: dict, new: dict, req: faultlib.FaultRequest) -> list[str]:
    acts = []
    if req.reboot:
        down = faultlib.REBOOT_DOWN_S if req.down_for is None else req.down_for
        acts = [f"reboot {host.name}: process faults cleared, every process stopped, off for {down:g}s, "
                "started again with a new boot id (kern.log kept); enabled units among "
                f"{', '.join(BOOT_UNITS[host.kind])} started as at boot"]
    if req.sshd_restart:
        acts = [f"reset every open SSH connection of {host.name} and kill sshd; its init starts it again"]
    if not req.events():
        if new["unreachable"] and not current["unreachable"]:
            acts.append("freeze every process of the host (SIGSTOP): open and new connections get no answer, "
                        "no reset")
        if current["unreachable"] and not new["unreachable"]:
            acts.append("resume the processes the freeze stopped (SIGCONT)")
        if new["hang"] and not current["hang"]:
            acts.append(f"install {SSHRC} ({hosts.HANG_IN_HOST}): logins work, every command on any connection, "
                        "open or new, never starts")
        if current["hang"] and not new["hang"]:
            acts.append(f"remove {SSHRC} and end the waits of hung sessions (their commands then run)")
    if new.get("slow") is not None and new.get("slow") != current.get("slow") and not new["hang"]:
        acts.append(f"install {SSHRC}: every command on any connection, open or new, starts {new['slow']:g}s late")
    if current.get("slow") is not None and new.get("slow") is None and not current["hang"]:
        acts.append(f"remove {SSHRC}: commands run at once again")
    return acts


# --- --freeze ------------------------------------------------------------------------------------

def freeze(files: LabFiles, host: LabHost, on: bool) -> None:
    """Stop (or continue) every process of the host: power loss or a panic as the network sees it.

    The kernel still accepts TCP connections and data on the host's address, but no process
    answers: no SSH banner on a new connection, no reply to a channel open or a running
    command's output on an open one, no reset either. Only the pids stopped here are continued.
    """
    record = files.host(host.name).dir / FROZEN_RECORD
    if on:
        stopped: set[int] = set()
        deadline = time.monotonic() + 15
        pidns = None
        while True:
            init, members = hosts.members(files.host(host.name))
            pidns = init.pidns
            # Done only when a scan shows every process stopped: a signalled process stops when it next runs (on a
            # loaded machine, later), and may fork before it does; such a child is caught by the next pass, and a
            # process not yet stopped is signalled again (harmless).
            todo = [p for p in members if p.state not in ("T", "t", "Z", "X")]
            if not todo:
                break
            for p in todo:
                send_signal(p.pid, signal.SIGSTOP)
                stopped.add(p.pid)
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"{host.name}: processes kept appearing while freezing the host",
                                         hint=f"mctl lab fault clear {host.name} continues what was stopped")
            time.sleep(0.02)
        write_json(record, {"pidns": pidns, "pids": sorted(stopped)})
        return
    try:
        data = json.loads(record.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    table = procs.scan()
    for pid in data.get("pids", []):
        p = table.get(pid)
        if p is not None and p.pidns == data.get("pidns"):
            send_signal(pid, signal.SIGCONT)
    init = hosts.init_proc(files.host(host.name), table)
    if init is not None:            # sshd stopped by an older mctl's --unreachable
        for p in procs.in_namespace(table, init):
            if p.comm.startswith("sshd") and p.state in ("T", "t"):
                send_signal(p.pid, signal.SIGCONT)
    try:
        record.unlink()
    except FileNotFoundError:
        pass


def host_frozen(files: LabFiles, host: LabHost) -> bool:
    return (files.host(host.name).dir / FROZEN_RECORD).exists()


# --- --hang and --slow ---------------------------------------------------------------------------

def set_hang(files: LabFiles, host: LabHost, doc: dict) -> None:
    """--hang and --slow: sshd runs /etc/ssh/sshrc before every session's command (sshd(8), SSHRC).

    sshd-session checks for the file each time a channel starts a command, so the fault reaches
    connections that were open before it as well as new ones; logins and channel opens still work.
    """
    if Path(hosts.host_path(files.dir, host.name, hosts.SSHD_FAULT_DROPIN)).exists():
        _remove_forcecommand_hang(files, host)          # a hang injected by an older mctl
    text = sshrc_text(doc)
    sshrc = hosts.host_path(files.dir, host.name, SSHRC)
    if text is not None:
        check_sshrc_free(files, host)
        atomic_write(sshrc, text)
        return
    _remove_sshrc(files, host)
    _end_hang_waits(files, host)


def _remove_sshrc(files: LabFiles, host: LabHost) -> None:
    sshrc = hosts.host_path(files.dir, host.name, SSHRC)
    try:
        if sshrc.read_text().startswith(SSHRC_MARK):
            sshrc.unlink()
    except FileNotFoundError:
        pass


def check_sshrc_free(files: LabFiles, host: LabHost) -> None:
    """The host's own sshrc is not replaced, and a ~/.ssh/rc (which sshd runs instead) would make the fault a no-op."""
    try:
        old = hosts.host_path(files.dir, host.name, SSHRC).read_text()
    except FileNotFoundError:
        old = None
    if old is not None and not old.startswith(SSHRC_MARK):
        raise EnvironmentProblem(f"{host.name} has an {SSHRC} of its own; the lab will not replace it",
                                 hint="remove it from the host to use --hang or --slow")
    if hosts.host_path(files.dir, host.name, "/root/.ssh/rc").exists():
        raise EnvironmentProblem(f"{host.name} has /root/.ssh/rc, which sshd runs instead of {SSHRC}",
                                 hint="remove it from the host to use --hang or --slow")


def sshrc_text(doc: dict) -> str | None:
    if doc.get("hang"):
        return (f"{SSHRC_MARK} host --hang (removed by mctl lab fault clear). sshd runs this before every "
                f"session's command:\nexec {hosts.HANG_IN_HOST}\n")
    slow = doc.get("slow")
    if isinstance(slow, (int, float)):
        return (f"{SSHRC_MARK} host --slow {slow:g} (removed by mctl lab fault clear). Runs before every "
                f"session's command.\nsleep {slow:g}\n")
    return None


def _end_hang_waits(files: LabFiles, host: LabHost) -> None:
    """Kill the hang helpers (and their sleep): the sessions waiting on them go on with their commands."""
    _init, members = hosts.members(files.host(host.name))
    waits = {p.pid for p in members if hosts.HANG_IN_HOST in " ".join(p.cmdline[:2])}
    for p in members:
        if p.pid in waits or p.ppid in waits:
            send_signal(p.pid, signal.SIGKILL)


def _new_listener(where: tuple[str, int], before: object, seconds: float) -> bool:
    """Whether a listening socket other than *before* appears on *where* within *seconds* (sshd came back)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = procs.listening_sockets().get(where)
        if now is not None and now != before:
            return True
        time.sleep(0.05)
    return False


def _remove_forcecommand_hang(files: LabFiles, host: LabHost) -> None:
    """The hang of earlier versions (an sshd ForceCommand, new logins only): only ever removed now."""
    dropin = hosts.host_path(files.dir, host.name, hosts.SSHD_FAULT_DROPIN)
    try:
        dropin.unlink()
    except FileNotFoundError:
        pass
    init, members = hosts.members(files.host(host.name))
    where = (host.address, 22)
    before = procs.listening_sockets().get(where)
    frozen = False
    for p in members:
        if p.ppid == init.pid and p.comm == "sshd":
            send_signal(p.pid, signal.SIGHUP)       # sshd re-execs itself and re-reads its configuration
            frozen = p.state == "T"             # --unreachable: it reloads once continued
        if hosts.HANG_IN_HOST in p.cmdline:
            send_signal(p.pid, signal.SIGKILL)
    if frozen:
        return
    # The re-exec closes the listening socket and opens a new one; return once the new one is there.
    if _new_listener(where, before, 10):
        return
    raise EnvironmentProblem(f"sshd on {host.name} did not come back after reloading its configuration",
                             hint=f"see /var/log/mctl-lab/sshd.log on the host ({files.host(host.name).dir})")


# --- --sshd-restart ------------------------------------------------------------------------------

def sshd_restart(files: LabFiles, host: LabHost) -> None:
    """Reset every open SSH connection, kill sshd and its sessions; the host's init starts sshd again."""
    import shutil
    import subprocess

    if host_frozen(files, host):
        raise UsageError(f"{host.name} is frozen: nothing on it restarts", hint=f"mctl lab fault clear {host.name}")
    init, members = hosts.members(files.host(host.name))
    where = (host.address, 22)
    before = procs.listening_sockets().get(where)
    if shutil.which("ss"):
        # The kernel aborts the host's established sshd sockets: each client gets a TCP reset.
        subprocess.run(["ss", "-K", "-t", "-n", "state", "established", "( sport = :22 )", "src", host.address],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
    for p in members:
        if p.comm.startswith("sshd"):
            send_signal(p.pid, signal.SIGKILL)
    # hostinit restarts a service after 1 s, doubling (up to 30 s) when it ran less than 10 s.
    if _new_listener(where, before, 45):
        return
    raise EnvironmentProblem(f"sshd on {host.name} did not come back after the restart",
                             hint=f"see {files.host(host.name).console} and /var/log/mctl-lab/sshd.log on the host")


# --- --reboot and power --------------------------------------------------------------------------

def reboot(files: LabFiles, layout: LabLayout, record: dict, host: LabHost, current: dict,
           down_for: float | None) -> None:
    """The host goes away (every process ends, SSH refused) and boots again: new boot id, uptime from 0,
    /run and /tmp empty, kern.log kept (it is on disk), enabled units started as at boot."""
    power_off(files, host, current)
    time.sleep(faultlib.REBOOT_DOWN_S if down_for is None else down_for)
    power_on(files, layout, record, host)


def power_off(files: LabFiles, host: LabHost, current: dict | None = None, *, force: bool = False) -> None:
    """The host loses power: its process faults end with it (a freeze, hung or slow commands, daemons kept
    down; GPU faults are hardware: they stay), every process ends, SSH is refused. Used by --reboot and by
    the tray's BMC (mctl.lab.bmc_emulator); *force* kills at once instead of SIGTERM first."""
    if current is None:
        try:
            current = faultlib.normalize(json.loads(
                hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE).read_text()))
        except (OSError, ValueError):
            current = faultlib.empty()
    if current["unreachable"] or host_frozen(files, host):
        freeze(files, host, False)
    _remove_sshrc(files, host)
    daemon_faults.forget(files, host)
    write_json(hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE), faultlib.without_host_faults(current))
    gpus = 0
    if host.kind == "tray":
        try:
            gpus = len(json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())["gpus"])
        except (OSError, ValueError, KeyError, TypeError):
            gpus = 0
    atomic_write(hosts.host_path(files.dir, host.name, hosts.BOOT_UNITS_FILE),
                 json.dumps({"units": BOOT_UNITS[host.kind], "gpus": gpus}) + "\n")
    _stop_host(files, host, force=force)


def power_on(files: LabFiles, layout: LabLayout, record: dict, host: LabHost) -> None:
    """The host boots (new boot id, uptime from 0, enabled units started) and waits until it listens."""
    paths = files.host(host.name)
    if hosts.init_proc(paths) is not None:
        return
    rootfs = Path((record.get("image") or {}).get("dir", "")) / "rootfs"
    if not rootfs.is_dir():
        raise EnvironmentProblem(f"cannot boot {host.name} again: its image {rootfs} is gone",
                                 hint="mctl lab down, then mctl lab up")
    hosts.spawn(paths, rootfs, fresh_clock=True,
                char_devices=hosts.TRAY_CHAR_DEVICES if host.kind == "tray" else ())
    hosts.wait_ready(files.dir, services.listeners(layout, [host.name]), 60.0)
    if host.kind == "tray" and any(s.get("name") == services.NMX_SERVICE.name
                                   for s in record.get("rack_services", [])):
        services.refresh_nmx(rack_context(files, layout, host.rack))      # its files moved to a new /proc/<pid>


def host_running(files: LabFiles, host: LabHost) -> bool:
    return hosts.init_proc(files.host(host.name)) is not None


def _stop_host(files: LabFiles, host: LabHost, *, force: bool = False) -> None:
    """Every process of one host ends (init first, as at shutdown), and with them its namespaces and mounts."""
    paths = files.host(host.name)
    table = procs.scan()
    init = hosts.init_proc(paths, table)
    if init is None:
        return
    launcher = init.ppid
    # The host's processes are those of its pid namespace, but only while its init lives: once the namespace
    # is gone the kernel may hand its inode number (what /proc/PID/ns/pid names) to a new one, and a host
    # booting meanwhile (trays of a rack rebooting together) would be taken for this one and killed. So
    # after its init is gone only the processes already seen as its own are waited for.
    members: set[int] = set()

    def alive() -> list[procs.Proc]:
        t = procs.scan()
        now = t.get(init.pid)
        if now is not None and now.pidns == init.pidns and now.state != "Z":
            members.update(p.pid for p in t.values() if p.pidns == init.pidns)
        out = [p for p in t.values() if p.pid in members and p.pidns == init.pidns and p.state != "Z"]
        lp = t.get(launcher)
        return out + ([lp] if lp is not None and lp.comm == "unshare" and lp.state != "Z" else [])

    alive()
    if not force:
        send_signal(init.pid, signal.SIGTERM)
        send_signal(init.pid, signal.SIGCONT)
    for wait, sig in ((0.0 if force else 8.0, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive():
            time.sleep(0.05)
        left = alive()
        if not left:
            return
        if sig is None:
            raise EnvironmentProblem(f"{len(left)} process(es) of {host.name} did not stop "
                                     f"(e.g. pid {left[0].pid} {left[0].comm})",
                                     hint="a process in uninterruptible sleep; retry shortly")
        for p in left:
            if p.pid != launcher:
                send_signal(p.pid, sig)
