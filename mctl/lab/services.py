"""The lab's registry of what runs where: per-host services, per-host files, per-rack services.

Adding an emulator to the lab is one entry here, nothing else:

* ``HostFile``: a file installed into every host of the given kinds at `lab up`
  (the GPU emulator becomes /usr/bin/nvidia-smi on each tray this way; an IMEX
  daemon emulator and its unit file would be installed the same way and started
  by the playbooks like the real ``nvidia-imex`` unit).
* ``HostService``: a long-running program inside each host's namespaces, started
  and restarted by the host's init (sshd is the first).
* ``RackService``: a program on the machine itself, one per rack, in its own
  PID namespace so `lab down` stops it and everything it started (the NMX-M
  emulator, listening on the rack's service address, 127.77.R.200). It reaches
  tray files through :func:`mctl.lab.hosts.host_path`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mctl.lab.layout import Kind, LabHost, LabLayout

EMULATORS = Path(__file__).resolve().parent / "emulators"


@dataclass(frozen=True)
class HostContext:
    layout: LabLayout
    host: LabHost
    lab_dir: Path


@dataclass(frozen=True)
class RackContext:
    layout: LabLayout
    rack: str
    rack_index: int
    address: str            # the rack's service address (127.77.R.200)
    lab_dir: Path
    log_dir: Path


@dataclass(frozen=True)
class HostFile:
    dest: str                                        # path inside the host
    kinds: tuple[Kind, ...]
    content: Callable[[HostContext], bytes | None]   # None: not available (yet); `lab up` says so
    mode: int = 0o644


@dataclass(frozen=True)
class HostService:
    name: str
    kinds: tuple[Kind, ...]
    argv: Callable[[HostContext], list[str]]
    dirs: tuple[str, ...] = ()       # created before each start (e.g. tmpfs /run entries)
    port: int | None = None          # TCP port it listens on at the host's address, for `lab status`
    restart: bool = True


@dataclass(frozen=True)
class RackService:
    name: str
    argv: Callable[[RackContext], list[str]]
    port: int | None = None          # TCP port on the rack's service address
    # Run on the machine before the service starts, once the hosts are up (write a config
    # naming the trays' files through mctl.lab.hosts.host_path, credentials, ...).
    prepare: Callable[[RackContext], None] | None = None
    # Keys merged into the rack's entry of the lab inventory (e.g. an NMX-M emulator's
    # `nmx: {url, credentials_file}`), so the lab stays an ordinary site.
    inventory: Callable[[RackContext], dict] | None = None


def python_script(path: Path) -> Callable[[HostContext], bytes | None]:
    """A stdlib-only script from this package, run by the host's own /usr/bin/python3."""

    def read(_ctx: HostContext) -> bytes | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        if text.startswith("#!"):
            text = text[text.index("\n") + 1:]
        return ("#!/usr/bin/python3\n" + text).encode()

    return read


HOST_FILES: tuple[HostFile, ...] = (
    HostFile("/usr/bin/nvidia-smi", ("tray",), python_script(EMULATORS / "nvidia_smi.py"), 0o755),
)

HOST_SERVICES: tuple[HostService, ...] = (
    HostService("sshd", ("tray", "head"), lambda ctx: ["/usr/sbin/sshd", "-D", "-e"], dirs=("/run/sshd",), port=22),
)

RACK_SERVICES: tuple[RackService, ...] = ()


def host_files(kind: Kind) -> list[HostFile]:
    return [f for f in HOST_FILES if kind in f.kinds]


def host_services(kind: Kind) -> list[HostService]:
    return [s for s in HOST_SERVICES if kind in s.kinds]
