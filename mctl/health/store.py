"""Where the health watch keeps what it must remember: tray records, the breaker, the action log.

Layout under the state directory:
  health/state.json     tray records and the breaker (atomic replace on every change)
  health/actions.jsonl  append-only action log: one JSON object per line, fsynced
  locks/health-watch.lock   held by the one watch (or `check --remediate`) acting on a site
  locks/health-state.lock   held for each read-modify-write of state.json

The watch re-reads state.json at the start of every sweep, so `mctl health
breaker reset` and `mctl health resume` from another terminal take effect on
its next sweep without restarting it.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from mctl.errors import EnvironmentProblem
from mctl.health.breaker import BreakerState
from mctl.health.policy import TrayRecord
from mctl.state.files import ensure_dir, write_json
from mctl.state.lock import file_lock

SCHEMA = 1


def health_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "health"


def actions_path(state_dir: Path) -> Path:
    return health_dir(state_dir) / "actions.jsonl"


def state_path(state_dir: Path) -> Path:
    return health_dir(state_dir) / "state.json"


@dataclass
class HealthState:
    site: str | None = None
    records: dict[str, TrayRecord] = field(default_factory=dict)
    breaker: BreakerState = field(default_factory=BreakerState)
    updated: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "site": self.site, "updated": self.updated,
                "breaker": self.breaker.to_dict(), "trays": {h: r.to_dict() for h, r in sorted(self.records.items())}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HealthState":
        return cls(site=data.get("site"), updated=data.get("updated"),
                   breaker=BreakerState.from_dict(data.get("breaker")),
                   records={h: TrayRecord.from_dict(r) for h, r in (data.get("trays") or {}).items()})


def load_state(state_dir: Path) -> HealthState:
    path = state_path(state_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return HealthState()
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"cannot read {path}: {exc}",
                                 hint="move the damaged file aside; mctl starts with empty health state "
                                      "(drains it made stay in the scheduler, with their mctl: reason)") from None
    if data.get("schema") != SCHEMA:
        raise EnvironmentProblem(f"{path} has schema {data.get('schema')!r}, this mctl reads {SCHEMA}",
                                 hint="use the mctl that wrote it, or move the file aside")
    return HealthState.from_dict(data)


def save_state(state_dir: Path, state: HealthState) -> None:
    state.updated = time.time()
    write_json(state_path(state_dir), state.to_dict())


@contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    with file_lock(Path(state_dir) / "locks" / "health-state.lock", purpose="health state update", timeout=30,
                   label="the health state"):
        yield


@contextmanager
def watch_lock(state_dir: Path, purpose: str) -> Iterator[None]:
    """One acting watcher per state directory: two would count streaks and breaker drains twice."""
    with file_lock(Path(state_dir) / "locks" / "health-watch.lock", purpose=purpose, label="health remediation"):
        yield


def actor() -> str:
    """Who acts, for the action log: the command, the user and the machine."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    command = " ".join(["mctl", *sys.argv[1:]])[:200]
    return f"{user}@{socket.gethostname()} pid {os.getpid()} ({command})"


def append_actions(state_dir: Path, entries: list[dict[str, Any]]) -> None:
    """Append entries to the action log under an exclusive lock, then fsync: one line each, never rewritten."""
    if not entries:
        return
    path = actions_path(state_dir)
    ensure_dir(path.parent)
    payload = "".join(json.dumps(e, sort_keys=False, default=str) + "\n" for e in entries).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def action_entry(action: str, host: str | None, reason: str | None, *, who: str, full: str | None = None,
                 result: str = "ok", dry_run: bool = False, at: float | None = None, **extra: Any) -> dict[str, Any]:
    when = datetime.fromtimestamp(at if at is not None else time.time(), timezone.utc)
    entry: dict[str, Any] = {"time": when.isoformat(timespec="milliseconds"), "tray": host, "action": action,
                             "reason": reason, "full_reason": full, "result": result, "who": who}
    if dry_run:
        entry["dry_run"] = True
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def read_actions(state_dir: Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    path = actions_path(state_dir)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines[-limit:] if limit else lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue          # a torn last line after a crash: the rest is still good
    return out
