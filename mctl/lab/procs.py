"""What is really running: the machine's /proc and /proc/net/tcp, read directly.

`lab status` and `lab down` trust these, not a flag written at `lab up`, so a
tray that crashed shows as down and a leftover process is found and stopped
even when the lab's own records are gone.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str          # R, S, D, T (stopped), Z ...
    comm: str
    cmdline: tuple[str, ...]
    pidns: str          # "pid:[4026531836]"
    rss_kb: int


def _read_proc(pid: int) -> Proc | None:
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        with open(f"{base}/cmdline", "rb") as fh:
            raw = fh.read()
        pidns = os.readlink(f"{base}/ns/pid")
        with open(f"{base}/statm") as fh:
            rss_pages = int(fh.read().split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        return None
    # comm is in parentheses and may itself contain spaces or ')'.
    lpar, rpar = stat.index("("), stat.rindex(")")
    fields = stat[rpar + 2:].split()
    return Proc(pid=pid, ppid=int(fields[1]), state=fields[0], comm=stat[lpar + 1:rpar],
                cmdline=tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a),
                pidns=pidns, rss_kb=rss_pages * (os.sysconf("SC_PAGE_SIZE") // 1024))


def scan() -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = _read_proc(int(name))
            if p is not None:
                out[p.pid] = p
    return out


def read(pid: int) -> Proc | None:
    return _read_proc(pid)


def children(procs: dict[int, Proc], pid: int) -> list[Proc]:
    return [p for p in procs.values() if p.ppid == pid]


def descendants(procs: dict[int, Proc], root: Proc) -> list[Proc]:
    """*root* and every process below it."""
    out, todo = [root], [root.pid]
    while todo:
        pid = todo.pop()
        for c in children(procs, pid):
            out.append(c)
            todo.append(c.pid)
    return out


def in_namespace(procs: dict[int, Proc], init: Proc) -> list[Proc]:
    """Every process in *init*'s PID namespace (the whole lab host), init first."""
    return sorted((p for p in procs.values() if p.pidns == init.pidns), key=lambda p: (p.pid != init.pid, p.pid))


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process *pid* holds open."""
    out: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def listening_sockets() -> dict[tuple[str, int], int]:
    """(address, port) -> socket inode of every IPv4 TCP socket in LISTEN state on this machine."""
    out: dict[tuple[str, int], int] = {}
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 10 or parts[3] != "0A":
            continue
        hexaddr, hexport = parts[1].split(":")
        addr = socket.inet_ntoa(struct.pack("<I", int(hexaddr, 16)))
        out[(addr, int(hexport, 16))] = int(parts[9])
    return out


def listening_tcp() -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket in LISTEN state on this machine."""
    return set(listening_sockets())


def mounts_mentioning(path: str) -> list[str]:
    """Mount points anywhere on the machine (any process's namespace) under *path*."""
    found: set[str] = set()
    needle = path.rstrip("/") + "/"
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/mountinfo") as fh:
                for line in fh:
                    fields = line.split()
                    if needle in line and len(fields) > 4:
                        found.add(fields[4] if fields[4].startswith(needle) else line.strip())
        except OSError:         # gone, or a zombie (EINVAL): it holds no mounts
            continue
    return sorted(found)
