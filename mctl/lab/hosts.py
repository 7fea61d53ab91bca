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
`lab fault` use it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mctl.errors import EnvironmentProblem
from mctl.lab import procs

NSINIT = Path(__file__).resolve().parent / "nsinit.py"
HOSTINIT = Path(__file__).resolve().parent / "hostinit.py"
INIT_IN_HOST = "/usr/lib/mctl-lab/init"
HANG_IN_HOST = "/usr/lib/mctl-lab/hang"
STATE_IN_HOST = "/var/lib/mctl-lab"
GPUS_FILE = STATE_IN_HOST + "/gpus.json"
FAULTS_FILE = STATE_IN_HOST + "/faults.json"
SERVICES_FILE = STATE_IN_HOST + "/services.json"
KERN_LOG = "/var/log/kern.log"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/00-mctl-lab.conf"
SSHD_FAULT_DROPIN = "/etc/ssh/sshd_config.d/01-mctl-lab-fault.conf"


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
    "# mctl lab fault --hang: every SSH command runs this instead and never returns,\n"
    "# as on a host whose processes are stuck. Cleared by `mctl lab fault TRAY --clear`.\n"
    "while :; do sleep 3600; done\n"
)


def spawn(paths: HostPaths, lower: Path) -> None:
    """Start the host detached from the caller (setsid -f): it outlives `mctl lab up`."""
    import json

    for d in (paths.upper, paths.work, paths.root):
        d.mkdir(parents=True, exist_ok=True)
    spec = {"hostname": paths.name, "lower": str(lower), "upper": str(paths.upper), "work": str(paths.work),
            "root": str(paths.root), "pidfile": str(paths.pidfile),
            "init": [INIT_IN_HOST]}
    paths.spec.write_text(json.dumps(spec, indent=2) + "\n")
    try:
        paths.pidfile.unlink()
    except FileNotFoundError:
        pass
    with open(paths.console, "ab") as console:
        proc = subprocess.Popen(
            ["setsid", "-f", "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child",
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


def host_path(lab_dir: Path, name: str, inner: str) -> Path:
    """Path on the machine of *inner* as the running host *name* sees it."""
    init = init_proc(HostPaths(Path(lab_dir), name))
    if init is None:
        raise EnvironmentProblem(f"lab host {name} is not running",
                                 hint="see 'mctl lab status'; 'mctl lab down' then 'mctl lab up' restarts the lab")
    return Path(f"/proc/{init.pid}/root") / inner.lstrip("/")

