"""Timestamped JSON snapshots under <state>/snapshots/<kind>/<key>/.

Inventory, audit and health keep a history of what they saw so a later run can
say what changed (a swapped GPU, a moved partition). File names are UTC
timestamps, so lexical order is time order and `ls` reads like a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mctl.errors import UsageError
from mctl.state.files import ensure_dir, read_json, write_json

RACK_INVENTORY = "inventory"        # the kind `mctl rack inventory` writes and the Slurm deployment reads

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_STAMP = "%Y%m%dT%H%M%S.%fZ"


@dataclass(frozen=True)
class Snapshot:
    path: Path
    taken_at: datetime
    data: Any


def _folder(state_dir: str | Path, kind: str, key: str) -> Path:
    for part, what in ((kind, "snapshot kind"), (key, "snapshot key")):
        if not _SAFE.fullmatch(part):
            raise UsageError(f"{what} {part!r} cannot be used as a file name")
    return Path(state_dir) / "snapshots" / kind / key


def save_snapshot(state_dir: str | Path, kind: str, key: str, data: Any, *,
                  taken_at: datetime | None = None, keep: int | None = 200) -> Path:
    """Write *data* as the newest snapshot and prune the oldest beyond *keep*."""
    folder = ensure_dir(_folder(state_dir, kind, key))
    when = (taken_at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    path = folder / f"{when.strftime(_STAMP)}.json"
    n = 1
    while path.exists():
        path = folder / f"{when.strftime(_STAMP)}-{n}.json"
        n += 1
    write_json(path, data)
    if keep is not None:
        for old in list_snapshots(state_dir, kind, key)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def list_snapshots(state_dir: str | Path, kind: str, key: str) -> list[Path]:
    """Oldest first."""
    folder = _folder(state_dir, kind, key)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("*.json") if not p.name.startswith(".")), key=_order)


def _order(path: Path) -> tuple[str, int]:
    stamp, _, n = path.stem.partition("-")
    return stamp, int(n) if n.isdigit() else 0


def _taken_at(path: Path) -> datetime:
    stem = path.stem.split("-")[0]
    try:
        return datetime.strptime(stem, _STAMP).replace(tzinfo=timezone.utc)
    except ValueError:
        try:
            return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
        except OSError:
            return datetime.fromtimestamp(0, timezone.utc)


def load_snapshot(path: str | Path) -> Snapshot:
    """A snapshot is a JSON object; anything else (an array, text, bytes that are not UTF-8) is named."""
    p = Path(path)
    return Snapshot(p, _taken_at(p), read_json(p, expect=dict, what="a snapshot"))


def latest_snapshot(state_dir: str | Path, kind: str, key: str) -> Snapshot | None:
    found = list_snapshots(state_dir, kind, key)
    return load_snapshot(found[-1]) if found else None
