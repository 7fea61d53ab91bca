"""Crash-safe file writes.

A reader (another mctl, an operator's `cat`, Slurm reading a config) must see
either the old file or the new one, never half of it, even after a power cut:
write a temporary file in the same directory, fsync it, rename it over the
target, then fsync the directory so the rename itself is durable.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mctl.errors import EnvironmentProblem


def ensure_dir(path: str | Path, mode: int = 0o755) -> Path:
    """Create *path* (and parents) or explain why it cannot be, naming the override."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True, mode=mode)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create directory {p}: {exc.strerror}",
                                 hint="pass --state-dir DIR (or set MCTL_STATE_DIR) to a writable directory") from None
    return p


def atomic_write(path: str | Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Replace *path* with *data* atomically and durably.

    *mode* defaults to the existing file's permissions, else 0o644 (0o600 is the
    caller's choice for anything secret).
    """
    target = Path(path)
    ensure_dir(target.parent)
    payload = data.encode() if isinstance(data, str) else data
    if mode is None:
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | Path, data: Any, *, mode: int | None = None) -> Path:
    return atomic_write(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", mode=mode)


def read_json(path: str | Path) -> Any:
    """Load a JSON file mctl wrote; a damaged one is an operator-facing error, not a traceback."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise EnvironmentProblem(f"{p} is not valid JSON ({exc.msg} at line {exc.lineno})",
                                 hint="move the damaged file aside; mctl writes a new one on the next run") from None
