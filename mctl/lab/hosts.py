"""One lab host on the machine: its folder, its private root, its processes.

A host is a PID + mount + UTS + IPC namespace started by `unshare`, whose first
process (nsinit.py) mounts an overlay (lower: the shared image, upper: this
host's folder) and execs the host's own init inside it. The machine's mount
table never sees the overlay, so nothing is left mounted once the namespace's
processes are gone.

Files are placed into the upper folder before the host starts (the overlay is
not mounted yet, so that is safe). Once it runs, the only safe way in is
through the host's own root, `/proc/<init pid>/root/...`: writing into the
upper folder of a mounted overlay is undefined (readers inside may keep seeing
the old file). :func:`host_path` gives that path; the NMX-M emulator and
`lab fault` use it. :func:`run_inside` runs a command in the host's namespaces
without SSH (a host with a fault on its sshd must still be put right).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mctl.errors import EnvironmentProblem
from mctl.lab import fleet, procs
from mctl.lab.layout import LabLayout

NSINIT = Path(__file__).resolve().parent / "nsinit.py"
HOSTINIT = Path(__file__).resolve().parent / "hostinit.py"
INIT_IN_HOST = "/usr/lib/mctl-lab/init"
HANG_IN_HOST = "/usr/lib/mctl-lab/hang"
STATE_IN_HOST = fleet.STATE_IN_HOST       # "/var/lib/mctl-lab"
GPUS_FILE = STATE_IN_HOST + "/gpus.json"
FAULTS_FILE = STATE_IN_HOST + "/faults.json"
SERVICES_FILE = STATE_IN_HOST + "/services.json"
KERN_LOG = fleet.KERN_LOG                 # "/var/log/kern.log"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/00-mctl-lab.conf"
SSHD_FAULT_DROPIN = "/etc/ssh/sshd_config.d/01-mctl-lab-fault.conf"
BOOT_UNITS_FILE = STATE_IN_HOST + "/boot-units.json"   # written by `lab fault --reboot`; read by the host's init
BOOT_ID_FILE = "boot_id"        # hosts/<name>/boot_id: the boot id this boot of the host reads in /proc
FAULT_EXEC_LOG = "fault-exec.log"   # hosts/<name>/fault-exec.log: commands the lab ran inside the host
# `systemctl reboot` in a lab host (LAB_SYSTEMCTL) leaves this file; the tray's BMC emulator takes it and
# restarts the host (a lab host cannot restart its own namespaces). In /run: gone with the boot it asked in.
REBOOT_REQUEST = "/run/mctl-lab/reboot-requested"
SYSTEMCTL_IN_HOST = "/usr/local/sbin/systemctl"     # before the image's /usr/bin/systemctl on root's PATH
LAB_SYSTEMCTL = """#!/bin/sh
# The lab's systemctl (mctl/lab/hosts.py): the image's docker-systemctl-replacement for every verb but
# `reboot`, which it lacks. A lab host cannot restart its own namespaces, so a reboot is asked of the
# machine side, where the tray's BMC emulator restarts the host as a reboot does (every process ends, a
# new boot id, the enabled units started). Like systemd's, it returns once the reboot is taken; where no
# BMC takes it (a head node has none) it fails, named, instead of doing nothing.
verb=
for a in "$@"; do case "$a" in -*) ;; *) verb=$a; break ;; esac; done
if [ "$verb" = reboot ]; then
    mkdir -p /run/mctl-lab && : > @REQUEST@ || exit 1
    i=0
    while [ -e @REQUEST@ ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if [ -e @REQUEST@ ]; then
        rm -f @REQUEST@
        echo "systemctl reboot: the lab's machine side did not take the request within 10 s (in the lab a host" \
             "reboots through its BMC emulator; this host has none running)" >&2
        exit 1
    fi
    exit 0
fi
exec /usr/bin/systemctl "$@"
""".replace("@REQUEST@", REBOOT_REQUEST)


@dataclass(frozen=True)
class HostPaths:
    lab_dir: Path
    name: str

    @property
    def dir(self) -> Path:
        return self.lab_dir / "hosts" / self.name

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def spec(self) -> Path:
        return self.dir / "host.json"

    @property
    def pidfile(self) -> Path:
        return self.dir / "init.pid"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"


class UpperWriter:
    """Writes files into a host's upper folder, giving new folders the image's owner and mode.

    A folder created in the upper layer shadows the image's attributes, so
    /root must stay 0700 and /var/log keep its group, as on a real host.
    """

    def __init__(self, lower: Path, upper: Path):
        self.lower = lower
        self.upper = upper
        upper.mkdir(parents=True, exist_ok=True)

    def _dirs(self, rel: Path, new_mode: int = 0o755) -> None:
        cur = Path()
        for part in rel.parts:
            cur = cur / part
            target = self.upper / cur
            if target.is_dir():
                continue
            src = self.lower / cur
            try:
                st = src.stat()
                mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
            except FileNotFoundError:
                mode, uid, gid = new_mode, 0, 0
            target.mkdir(mode=mode)
            os.chown(target, uid, gid)
            os.chmod(target, mode)

    def put(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        rel = Path(path.lstrip("/"))
        self._dirs(rel.parent)
        target = self.upper / rel
        payload = data.encode() if isinstance(data, str) else data
        with open(target, "wb") as fh:
            fh.write(payload)
        os.chmod(target, mode)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        """*mode* applies to folders the image does not have."""
        self._dirs(Path(path.lstrip("/")), mode)


def sshd_config(address: str) -> str:
    return (
        "# Written by `mctl lab up`: how the lab reaches this host. Not part of the image.\n"
        f"ListenAddress {address}:22\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "UseDNS no\n"
        "PidFile /run/sshd.pid\n"
        "MaxStartups 64:30:256\n"
    )


HANG_SCRIPT = (
    "#!/bin/sh\n"
    "# mctl lab fault --hang: sshd runs this (through /etc/ssh/sshrc) before every session's command,\n"
    "# which then never starts, as on a host whose processes are stuck. `mctl lab fault clear HOST` ends it.\n"
    "while :; do sleep 3600; done\n"
)


# The character devices a tray's NVIDIA driver registers that mctl's tools and Slurm look up by name in
# /proc/devices (the emulated GPUs' 195 is fixed and needs no line): nsinit adds them to the tray's view.
TRAY_CHAR_DEVICES = ("nvidia-caps-imex-channels",)
PROC_DEVICES_FILE = "proc_devices"


def spawn(paths: HostPaths, lower: Path, *, fresh_clock: bool = False, char_devices: tuple[str, ...] = ()) -> None:
    """Start the host detached from the caller (setsid -f): it outlives `mctl lab up`.

    Each start is a boot: the host reads a new boot id in /proc/sys/kernel/random/boot_id.
    *fresh_clock* (a reboot): the host's own time namespace starts its uptime (CLOCK_BOOTTIME,
    /proc/uptime) and CLOCK_MONOTONIC near zero, as after a real boot. At `lab up` the offsets
    are zero: a tray's uptime is the machine's, as before.
    """
    import json

    for d in (paths.upper, paths.work, paths.root):
        d.mkdir(parents=True, exist_ok=True)
    spec = {"hostname": paths.name, "lower": str(lower), "upper": str(paths.upper), "work": str(paths.work),
            "root": str(paths.root), "pidfile": str(paths.pidfile), "boot_id_file": str(paths.dir / BOOT_ID_FILE),
            "init": [INIT_IN_HOST]}
    if char_devices:
        spec["proc_devices"] = {"file": str(paths.dir / PROC_DEVICES_FILE), "char": list(char_devices)}
    paths.spec.write_text(json.dumps(spec, indent=2) + "\n")
    try:
        paths.pidfile.unlink()
    except FileNotFoundError:
        pass
    with open(paths.console, "ab") as console:
        proc = subprocess.Popen(
            ["setsid", "-f", "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child",
             *_time_namespace(fresh_clock),
             "--propagation", "private", "--", sys.executable, "-I", "-S", str(NSINIT), str(paths.spec)],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, close_fds=True)
    proc.wait()


def init_proc(paths: HostPaths, table: dict[int, procs.Proc] | None = None) -> procs.Proc | None:
    """The host's init as the machine sees it, or None when the host is not running.

    The pid file alone could name a recycled pid; the parent must be the
    `unshare` started for this very host.
    """
    try:
        pid = int(paths.pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    get = table.get if table is not None else procs.read
    proc = get(pid)
    if proc is None or proc.state == "Z":
        return None
    parent = get(proc.ppid)
    if parent is None or parent.comm != "unshare" or str(paths.spec) not in parent.cmdline:
        return None
    return proc


def fleet_rack_host(lab_dir: Path, name: str) -> str | None:
    """In a fleet-mode lab (mctl/lab/fleet.py), the rack host that serves host *name*; else None."""
    import json

    try:
        record = json.loads((Path(lab_dir) / "lab.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not record.get("fleet"):
        return None
    host = LabLayout(record["name"], record["racks"], record["trays"], record.get("net", 77)).host(name)
    return fleet.rack_host(host.rack) if host is not None else None


def host_path(lab_dir: Path, name: str, inner: str) -> Path:
    """Path on the machine of *inner* as the running host *name* sees it (in fleet mode: as *name*'s
    sessions see it, in its rack host's root)."""
    rack = fleet_rack_host(lab_dir, name)
    if rack is not None:
        name, inner = rack, fleet.inner_path(name, inner)
    init = init_proc(HostPaths(Path(lab_dir), name))
    if init is None:
        raise EnvironmentProblem(f"lab host {name} is not running",
                                 hint="see 'mctl lab status'; 'mctl lab down' then 'mctl lab up' restarts the lab")
    return Path(f"/proc/{init.pid}/root") / inner.lstrip("/")


def members(paths: HostPaths) -> tuple[procs.Proc, list[procs.Proc]]:
    """The running host's init and every process in its PID namespace."""
    table = procs.scan()
    init = init_proc(paths, table)
    if init is None:
        raise EnvironmentProblem(f"lab host {paths.name} is not running", hint="see 'mctl lab status'")
    return init, procs.in_namespace(table, init)


def run_inside(paths: HostPaths, argv: list[str], *, timeout: float) -> tuple[int, str]:
    """Run a command inside the host's namespaces and root (as its init would), output to FAULT_EXEC_LOG;
    its exit status and the last line it said (an error line if there was one).

    Not over SSH: a host with --hang or --slow must still be put right by a clear.
    """
    init, _members = members(paths)
    enter = ["nsenter", "-t", str(init.pid), "-m", "-u", "-i", "-p"]
    try:
        if os.readlink(f"/proc/{init.pid}/ns/time") != os.readlink("/proc/self/ns/time"):
            enter.append("-T")
    except OSError:
        pass
    enter += ["-r", "-w", "--", "/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME=/root", "LANG=C.UTF-8", *argv]
    log_path = paths.dir / FAULT_EXEC_LOG
    with open(log_path, "ab") as log:
        start = log.tell()
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        # A pipe would be held open by the daemon the command starts; a file is not waited for.
        proc = subprocess.Popen(enter, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
    with open(log_path, "rb") as fh:
        fh.seek(start)
        said = [l.strip() for l in fh.read().decode(errors="replace").splitlines()[1:] if l.strip()]
    errors = [l for l in said if "ERROR" in l or "error" in l]
    return rc, ((errors or said)[-1][:200] if said else "no output")


def boot_id(paths: HostPaths) -> str | None:
    """The boot id the host's current boot reads in /proc (None before its first boot)."""
    try:
        return (paths.dir / BOOT_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def wait_ready(lab_dir: Path, want: dict[str, list[tuple[str, int]]], timeout: float) -> None:
    """Until every host's listening services (*want*: host -> (address, port), mctl.lab.services.listeners)
    accept connections (each host's own sockets, not another lab's on the same address); fail fast on a
    dead host."""
    deadline = time.monotonic() + timeout
    pending = set(want)
    next_dead_check = time.monotonic() + 2
    while pending:
        listening = procs.listening_sockets()
        maybe = {n for n in pending if all(w in listening for w in want[n])}
        if maybe:
            table = procs.scan()
            pending -= {n for n in maybe
                        if _owns_sockets(HostPaths(lab_dir, n), table, {listening[w] for w in want[n]})}
        if not pending:
            return
        now = time.monotonic()
        if now >= next_dead_check:
            table = procs.scan()
            dead = [n for n in sorted(pending)
                    if HostPaths(lab_dir, n).pidfile.exists() and init_proc(HostPaths(lab_dir, n), table) is None]
            if dead:
                raise EnvironmentProblem(f"lab host {dead[0]} stopped while starting"
                                         + (f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""),
                                         hint=console_hint(HostPaths(lab_dir, dead[0])))
            next_dead_check = now + 2
        if now >= deadline:
            first = sorted(pending)[0]
            raise EnvironmentProblem(f"{len(pending)} lab host(s) did not start within {timeout:.0f} s "
                                     f"(first: {first})", hint=console_hint(HostPaths(lab_dir, first)))
        time.sleep(0.1)


def _owns_sockets(paths: HostPaths, table: dict[int, procs.Proc], inodes: set[int]) -> bool:
    """Whether the listening sockets are this host's own (and not another lab's on the same address)."""
    init = init_proc(paths, table)
    if init is None:
        return False
    held: set[int] = set()
    for p in procs.in_namespace(table, init):
        held |= procs.socket_inodes(p.pid)
    return inodes <= held


def console_hint(paths: HostPaths) -> str:
    try:
        tail = paths.console.read_text().strip().splitlines()[-3:]
    except OSError:
        tail = []
    return f"its console log {paths.console} ends: {' | '.join(tail)}" if tail else f"see {paths.console}"


def _time_namespace(fresh: bool) -> list[str]:
    """unshare's options for the host's own time namespace ([] where the kernel has none)."""
    if not os.path.exists("/proc/self/ns/time"):
        return []
    if not fresh:
        return ["--time"]
    boot = float(Path("/proc/uptime").read_text().split()[0])
    mono = time.clock_gettime(time.CLOCK_MONOTONIC)
    # Offsets in whole seconds; the clocks in the namespace must not go below zero.
    return ["--time", "--boottime", str(-(int(boot) - 1)), "--monotonic", str(-(int(mono) - 1))]


def host_uptime(lab_dir: Path, name: str, when: float | None = None) -> float:
    """The host's seconds since boot (what its /proc/uptime reads) at epoch *when* (default now).

    A rebooted host has its own boot time (time namespace offsets): kernel-log lines the lab writes
    for it must carry its uptime, not the machine's.
    """
    init = init_proc(HostPaths(Path(lab_dir), name))
    offset = 0.0
    if init is not None:
        try:
            for line in Path(f"/proc/{init.pid}/timens_offsets").read_text().splitlines():
                parts = line.split()
                if parts and parts[0] == "boottime":
                    offset = int(parts[1]) + int(parts[2]) / 1e9
        except (OSError, ValueError, IndexError):
            offset = 0.0
    boot = float(Path("/proc/uptime").read_text().split()[0])
    now = time.time()
    return max(0.0, boot + offset - (now - (now if when is None else float(when))))
