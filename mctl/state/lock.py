"""Advisory locks that say who holds them.

Two operators (or a cron audit and a bring-up) must not change one rack at the
same time. The lock is an fcntl lock on a file under <state>/locks/, so the
kernel releases it when the holder dies, and the file records pid, command,
purpose and start time so a refused operator learns who to talk to.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from mctl.errors import MctlError
from mctl.state.files import ensure_dir


class LockBusy(MctlError):
    """Someone else holds the lock; nothing was changed."""

    def __init__(self, name: str, holder: dict | None):
        self.name = name
        self.holder = holder or {}
        who = ""
        if self.holder:
            who = (f" by pid {self.holder.get('pid')} ({self.holder.get('purpose') or self.holder.get('command')})"
                   f" since {self.holder.get('since')}")
        super().__init__(f"{name} is locked{who}",
                         hint="wait for that command to finish; the lock goes away when its process ends")


@contextmanager
def file_lock(path: str | Path, *, purpose: str = "", timeout: float = 0.0, label: str | None = None) -> Iterator[Path]:
    """Hold an exclusive lock on *path* for the duration of the block.

    timeout 0 fails at once when busy; a positive timeout waits that many seconds.
    """
    lock_path = Path(path)
    ensure_dir(lock_path.parent)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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
        holder = {"pid": os.getpid(), "command": " ".join(["mctl", *sys.argv[1:]])[:300], "purpose": purpose,
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        try:
            yield lock_path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None


@contextmanager
def rack_lock(state_dir: str | Path, rack: str, *, purpose: str = "", timeout: float = 0.0) -> Iterator[Path]:
    """The per-rack lock every mutating command takes (bring-up, partition, drain, deploy)."""
    with file_lock(Path(state_dir) / "locks" / f"rack-{rack}.lock", purpose=purpose, timeout=timeout,
                   label=f"rack {rack}") as path:
        yield path
