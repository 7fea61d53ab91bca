"""Advisory locks that say who holds them.

Two operators (or a cron audit and a bring-up) must not change one rack at the
same time. The lock is an fcntl lock on a file under <state>/locks/, so the
kernel releases it when the holder dies, and the file records pid, command,
purpose and start time so a refused operator learns who to talk to.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import sys
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from mctl.errors import MctlError
from mctl.state.files import ensure_dir


class LockBusy(MctlError):
    """Someone else holds the lock; nothing was changed."""

    def __init__(self, name: str, holder: dict | None):
        self.name = name
        self.holder = holder or {}
        who = f" {describe_holder(self.holder)}" if self.holder else ""
        super().__init__(f"{name} is locked{who}",
                         hint="wait for that command to finish; the lock goes away when its process ends")


def describe_holder(holder: dict) -> str:
    """'by pid 123 (root, partition create) since ...: mctl partition create ...'"""
    user = f"{holder['user']}, " if holder.get("user") else ""
    text = (f"by pid {holder.get('pid')} ({user}{holder.get('purpose') or holder.get('command')})"
            f" since {holder.get('since')}")
    if holder.get("command"):
        text += f": {holder.get('command')}"
    return text


@contextmanager
def file_lock(path: str | Path, *, purpose: str = "", timeout: float = 0.0, label: str | None = None) -> Iterator[Path]:
    """Hold an exclusive lock on *path* for the duration of the block.

    timeout 0 fails at once when busy; a positive timeout waits that many seconds.
    """
    lock_path = Path(path)
    ensure_dir(lock_path.parent)
    _check_folder(lock_path.parent)
    fd = _open_lock(lock_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusy(label or str(lock_path), _read_holder(fd)) from None
                time.sleep(0.1)
        holder = {"pid": os.getpid(), "user": _user(), "command": " ".join(["mctl", *sys.argv[1:]])[:300],
                  "purpose": purpose, "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        try:
            yield lock_path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


LOCK_MODE = 0o640


def _check_folder(folder: Path) -> None:
    """A lock folder anyone may write into (without /tmp's sticky bit) lets anyone replace the locks."""
    try:
        st = os.stat(folder)
    except OSError:
        return                                   # _open_lock reports what is wrong
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise MctlError(f"lock folder {folder} is writable by everyone (mode {stat.S_IMODE(st.st_mode):04o})",
                        hint=f"chmod 750 {folder} (mctl creates its state folders 0750)")


def _open_lock(lock_path: Path) -> int:
    """Open (or create) the lock file without following a link: a symlink planted under locks/ must not make
    mctl truncate the file it points to. Anything but a regular file is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    hint = f"remove {lock_path} (no mctl command holds a lock file that is not a regular file) and run again"
    try:
        fd = os.open(lock_path, flags, LOCK_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP or lock_path.is_symlink():
            raise MctlError(f"lock file {lock_path} is a symbolic link; mctl does not follow links for locks",
                            hint=hint) from None
        raise MctlError(f"cannot open lock file {lock_path}: {exc.strerror or exc}",
                        hint="check the state directory's permissions (--state-dir)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise MctlError(f"lock file {lock_path} is not a regular file", hint=hint)
    return fd


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return str(os.getuid())


def _read_holder(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        data = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    # The file is anyone's to write: keep only the known fields, as short text or integers.
    out: dict = {}
    for key in ("pid", "user", "command", "purpose", "since"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
        elif isinstance(value, str):
            out[key] = value[:300]
    return out or None


_RACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def rack_lock_path(state_dir: str | Path, rack: str) -> Path:
    """<state>/locks/rack-RACK.lock; a rack name that is not a plain file name is refused (never a path)."""
    if not _RACK_NAME.fullmatch(rack) or ".." in rack:
        raise MctlError(f"rack name {rack!r} cannot be used in a lock file name",
                        hint="rack names are letters, digits, '-', '_' and '.'; fix the inventory")
    return Path(state_dir) / "locks" / f"rack-{rack}.lock"


@contextmanager
def rack_lock(state_dir: str | Path, rack: str, *, purpose: str = "", timeout: float = 0.0) -> Iterator[Path]:
    """The per-rack lock every mutating command takes (bring-up, partition, drain, deploy)."""
    with file_lock(rack_lock_path(state_dir, rack), purpose=purpose, timeout=timeout,
                   label=f"rack {rack}") as path:
        yield path


@contextmanager
def rack_locks(state_dir: str | Path, racks: Iterable[str], *, purpose: str = "") -> Iterator[list[str]]:
    """The locks of several racks, taken in name order (two commands on overlapping racks cannot deadlock);
    all or none: a busy rack releases the ones already taken."""
    names = sorted(set(racks))
    for name in names:
        rack_lock_path(state_dir, name)           # refuse a bad name before any lock is taken
    with ExitStack() as stack:
        for name in names:
            stack.enter_context(rack_lock(state_dir, name, purpose=purpose))
        yield names


def lock_holder(path: str | Path) -> dict | None:
    """Who holds the lock at *path* now, without taking it (for --dry-run): the recorded holder when its
    process is alive and is not this one, else None. Never creates, truncates or follows a link."""
    try:
        fd = os.open(Path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        holder = _read_holder(fd)
    finally:
        os.close(fd)
    pid = (holder or {}).get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None                             # died without releasing (kill -9): the kernel freed the lock
    except PermissionError:
        pass
    return holder

