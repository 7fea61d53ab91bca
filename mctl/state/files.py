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


STATE_DIR_MODE = 0o750
DAMAGED_HINT = "move the damaged file aside (mctl writes a new one on the next run), or restore it from a backup"


def ensure_dir(path: str | Path, mode: int = STATE_DIR_MODE) -> Path:
    """Create *path* with *mode* and each missing parent with at most 0750, level by level and exactly
    (the umask neither widens nor narrows it), or explain why it cannot be, naming the override.
    Folders that exist are left as they are."""
    p = Path(path)
    missing: list[Path] = []
    probe = p
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    parent_mode = (mode & STATE_DIR_MODE) | 0o700
    try:
        for folder in reversed(missing):
            want = mode if folder == p else parent_mode
            try:
                os.mkdir(folder, want)
            except FileExistsError:
                if not folder.is_dir():
                    raise
                continue
            os.chmod(folder, want)     # mkdir's mode is masked by the umask; set it exactly
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create directory {p}: {exc.strerror or exc}",
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


class DamagedState(EnvironmentProblem):
    """A file mctl wrote and reads back is damaged: not UTF-8, not JSON, or JSON of the wrong shape (exit 2)."""

    def __init__(self, path: str | Path, what: str, hint: str | None = None):
        self.path = Path(path)
        super().__init__(f"cannot read {self.path}: damaged state file: {what}", hint=hint or DAMAGED_HINT)


def read_text(path: str | Path) -> str:
    """A state file's text; a file that is not UTF-8 or cannot be read is named, never a traceback."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise DamagedState(p, "is a directory, not a file") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read {p}: {exc.strerror or exc}",
                                 hint="check the state directory's permissions (--state-dir)") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedState(p, f"not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path, *, expect: type | tuple[type, ...] | None = None, what: str = "") -> Any:
    """Load a JSON file mctl wrote; a damaged one is an operator-facing error, not a traceback.

    *expect* is the type the top level must have (dict, list); *what* names the file's role in the message.
    """
    p = Path(path)
    text = read_text(p)
    try:
        data = json.loads(text)
    except RecursionError:
        raise DamagedState(p, "JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise DamagedState(p, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if expect is not None and not isinstance(data, expect):
        raise DamagedState(p, f"{what or 'the file'} must be {_a(_json_kind(expect))} (JSON), "
                              f"found {_a(_json_kind(type(data)))}")
    return data


def _json_kind(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(_json_kind(x) for x in t)
    return {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(t, t.__name__)


def _a(kind: str) -> str:
    return kind if kind == "null" else ("an " if kind[0] in "aeiou" else "a ") + kind


def check_shape(path: str | Path, value: Any, expect: type | tuple[type, ...], field: str) -> Any:
    """*value* (at *field* of the file *path*) has type *expect*, else DamagedState naming the field.
    bool is not a number here."""
    types = expect if isinstance(expect, tuple) else (expect,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise DamagedState(path, f"{field} must be {_a(_json_kind(expect))}, found {_a(_json_kind(type(value)))}")
    return value
