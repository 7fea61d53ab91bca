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
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from mctl.errors import EnvironmentProblem
from mctl.health.breaker import BreakerState
from mctl.health.record import RackHold, RackWatch
from mctl.health.record import LeakEpisode, RackLeak, TrayRecord
from mctl.model.drain import QUEUE, ActResult, Decision
from mctl.state.files import DamagedState, check_shape, ensure_dir, read_json, write_json
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
    budget_trip: str | None = None      # the safety budget's trip the watch last logged (said once per trip)
    budget_drift: str | None = None     # where the scheduler's caps differ from the inventory's (said once)
    switch_leaks: dict[str, LeakEpisode] = field(default_factory=dict)   # switch tray -> its open leak episode
    rack_leaks: dict[str, RackLeak] = field(default_factory=dict)        # rack -> its rack-wide leak response
    escalations: dict[str, RackHold] = field(default_factory=dict)       # rack -> its rack hold (escalation)
    rack_watch: dict[str, RackWatch] = field(default_factory=dict)       # rack -> its failing trays (escalation)

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": SCHEMA, "site": self.site, "updated": self.updated,
               "breaker": self.breaker.to_dict(), "trays": {h: r.to_dict() for h, r in sorted(self.records.items())}}
        if self.budget_trip is not None:
            out["budget_trip"] = self.budget_trip
        if self.budget_drift is not None:
            out["budget_drift"] = self.budget_drift
        if self.switch_leaks:
            out["switch_leaks"] = {t: e.to_dict() for t, e in sorted(self.switch_leaks.items())}
        if self.rack_leaks:
            out["rack_leaks"] = {r: x.to_dict() for r, x in sorted(self.rack_leaks.items())}
        if self.escalations:
            out["escalations"] = {r: x.to_dict() for r, x in sorted(self.escalations.items())}
        if self.rack_watch:
            out["rack_watch"] = {r: x.to_dict() for r, x in sorted(self.rack_watch.items())}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HealthState":
        return cls(site=data.get("site"), updated=data.get("updated"),
                   breaker=BreakerState.from_dict(data.get("breaker")),
                   records={h: TrayRecord.from_dict(r) for h, r in (data.get("trays") or {}).items()},
                   budget_trip=data.get("budget_trip"), budget_drift=data.get("budget_drift"),
                   switch_leaks={t: LeakEpisode.from_dict(e) for t, e in (data.get("switch_leaks") or {}).items()},
                   rack_leaks={r: RackLeak.from_dict(x) for r, x in (data.get("rack_leaks") or {}).items()},
                   escalations={r: RackHold.from_dict(x) for r, x in (data.get("escalations") or {}).items()},
                   rack_watch={r: RackWatch.from_dict(x) for r, x in (data.get("rack_watch") or {}).items()})


STATE_HINT = ("move the damaged file aside; mctl starts with empty health state "
              "(drains it made stay in the scheduler, with their mctl: reason)")

# Field of a tray record -> the JSON types it may hold (None always allowed for the optional ones).
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,), "rack": (str, type(None)), "status": (str,), "misses": (int,), "bad_streak": (int,),
    "healthy_streak": (int,), "drained": (bool,), "reason": (str, type(None)), "full_reason": (str, type(None)),
    "drained_at": (int, float, type(None)), "pending": (dict, type(None)), "note": (str, type(None)),
    "xid_ack": (int, float, type(None)), "leak": (dict, type(None)), "ladder": (dict, type(None)),
    "isolation": (dict, type(None)), "latches": (dict, type(None)), "resumed": (dict, type(None)),
    "drain_stamp": (str, type(None)),
}


def load_state(state_dir: Path) -> HealthState:
    path = state_path(state_dir)
    if not path.exists() and not path.is_symlink():
        return HealthState()
    try:
        data = read_json(path, expect=dict, what="the health state")
    except FileNotFoundError:
        return HealthState()
    except DamagedState as exc:
        exc.hint = STATE_HINT
        raise
    if data.get("schema") != SCHEMA:
        raise EnvironmentProblem(f"{path} has schema {data.get('schema')!r}, this mctl reads {SCHEMA}",
                                 hint="use the mctl that wrote it, or move the file aside")
    check_state_shape(path, data)
    return HealthState.from_dict(data)


def check_state_shape(path: Path, data: dict[str, Any]) -> None:
    """Every field load_state reads has the type mctl writes; else DamagedState naming the field."""
    try:
        check_shape(path, data.get("site"), (str, type(None)), "site")
        check_shape(path, data.get("updated"), (int, float, type(None)), "updated")
        check_shape(path, data.get("budget_trip"), (str, type(None)), "budget_trip")
        check_shape(path, data.get("budget_drift"), (str, type(None)), "budget_drift")
        for key, read in (("switch_leaks", LeakEpisode.from_dict), ("rack_leaks", RackLeak.from_dict),
                          ("escalations", RackHold.from_dict), ("rack_watch", RackWatch.from_dict)):
            for name, value in (check_shape(path, data.get(key), (dict, type(None)), key) or {}).items():
                try:
                    read(value)
                except (TypeError, ValueError) as exc:
                    raise DamagedState(path, f"{key}.{name}: {exc}") from None
        check_breaker_shape(path, data.get("breaker"))
        trays = check_shape(path, data.get("trays"), (dict, type(None)), "trays") or {}
        for host, rec in trays.items():
            check_shape(path, rec, dict, f"trays.{host}")
            for key, types in _RECORD_TYPES.items():
                if key in rec:
                    check_shape(path, rec[key], types, f"trays.{host}.{key}")
            if not isinstance(rec.get("host"), str):
                raise DamagedState(path, f"trays.{host}.host is missing")
            leak = rec.get("leak") or {}              # a leak episode (mctl.health.leaks)
            for key, types in (("since", (int, float)), ("clear", (int,)), ("flaps", (int,)), ("sent", (bool,)),
                               ("finding", (dict,))):
                if key in leak:
                    check_shape(path, leak[key], types, f"trays.{host}.leak.{key}")
            pending = rec.get("pending") or {}
            for key, types in (("action", (str,)), ("reason", (str, type(None))), ("full", (str, type(None))),
                               ("since", (int, float))):
                if key in pending:
                    check_shape(path, pending[key], types, f"trays.{host}.pending.{key}")
            try:                                      # every typed section (mctl.health.record) reads back
                TrayRecord.from_dict(rec)
            except (TypeError, ValueError) as exc:
                raise DamagedState(path, f"trays.{host}.{exc}") from None
    except DamagedState as exc:
        exc.hint = STATE_HINT
        raise


def check_breaker_shape(path: Path, breaker: Any) -> None:
    check_shape(path, breaker, (dict, type(None)), "breaker")
    if not breaker:
        return
    check_shape(path, breaker.get("tripped", False), bool, "breaker.tripped")
    check_shape(path, breaker.get("tripped_at"), (int, float, type(None)), "breaker.tripped_at")
    check_shape(path, breaker.get("reason"), (str, type(None)), "breaker.reason")
    drains = check_shape(path, breaker.get("drains"), (list, type(None)), "breaker.drains") or []
    for i, d in enumerate(drains):
        check_shape(path, d, dict, f"breaker.drains[{i}]")
        check_shape(path, d.get("time"), (int, float), f"breaker.drains[{i}].time")
        check_shape(path, d.get("host"), str, f"breaker.drains[{i}].host")
        check_shape(path, d.get("rack"), (str, type(None)), f"breaker.drains[{i}].rack")


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


def append_actions(state_dir: Path, entries: "list[ActionEntry]") -> None:
    """Append entries to the action log under an exclusive lock, then fsync: one line each, never rewritten.

    Whole or not at all: all entries go in one write() of whole lines with O_APPEND; if the file does not
    end in a newline (a crash tore the last line), a newline goes first so the torn line stays alone and
    the new entries do not merge into it. A write the kernel cut short is completed or, failing that,
    reported.
    """
    if not entries:
        return
    path = actions_path(state_dir)
    ensure_dir(path.parent)
    payload = "".join(json.dumps(e.to_dict(), sort_keys=False, default=str, ensure_ascii=True) + "\n"
                      for e in entries).encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot append to the action log {path}: {exc.strerror or exc}",
                                 hint="it must be a regular file (not a link) the mctl user can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                payload = b"\n" + payload
            view = memoryview(payload)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot append to the action log {path}: {exc.strerror or exc}",
                                 hint="check the disk and the state directory") from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ActionEntry:
    """One line of the action log. On disk a JSON object with these keys; the optional ones only when
    set (the format of every mctl so far: older lines read back the same, unknown keys are kept)."""

    time: str                              # ISO 8601, UTC, milliseconds
    tray: str | None
    action: str                            # drain resume skip forget queue intent breaker-trip breaker-reset
    reason: str | None = None
    full_reason: str | None = None
    result: str = "ok"                     # ok | noted | tripped | refused: ... | failed: ...
    who: str = ""
    dry_run: bool = False
    why: str | None = None
    rack: str | None = None
    scheduler: str | None = None
    findings: list[dict[str, Any]] | None = None
    manual: bool | None = None
    scope: str | None = None
    was_tripped: bool | None = None
    cleared_drains: int | None = None
    intent: str | None = None              # on an intent line: the drain or resume about to be sent
    intent_id: str | None = None           # an intent and the line of its result share it
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result in ("ok", "noted", "tripped")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time": self.time, "tray": self.tray, "action": self.action, "reason": self.reason,
                               "full_reason": self.full_reason, "result": self.result, "who": self.who}
        if self.dry_run:
            out["dry_run"] = True
        for f in fields(self)[8:-1]:
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        out.update({k: v for k, v in self.extra.items() if v is not None and k not in out})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ActionEntry":
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{"time": str(data.get("time", "")), "tray": data.get("tray"),
                      "action": str(data.get("action", "")), "who": str(data.get("who", "")),
                      **{k: v for k, v in data.items() if k in known - {"time", "tray", "action", "who"}},
                      "extra": {k: v for k, v in data.items() if k not in known}})


def _stamp(at: float | None) -> str:
    return datetime.fromtimestamp(at if at is not None else time.time(), timezone.utc).isoformat(
        timespec="milliseconds")


def action_entry(action: str, host: str | None, reason: str | None, *, who: str, full: str | None = None,
                 result: str = "ok", dry_run: bool = False, at: float | None = None, **extra: Any) -> ActionEntry:
    known = {f.name for f in fields(ActionEntry)}
    typed = {k: v for k, v in extra.items() if k in known and k != "extra"}
    rest = {k: v for k, v in extra.items() if k not in known}
    return ActionEntry(_stamp(at), host, action, reason, full, result, who, dry_run, **typed, extra=rest)


def result_entry(r: "ActResult", *, who: str, scheduler: str | None = None,
                 findings: list[dict[str, Any]] | None = None, manual: bool | None = None,
                 intent_id: str | None = None) -> ActionEntry:
    """The action-log line of an executed drain or resume (queued when the scheduler did not answer)."""
    d = r.decision
    result = "ok" if r.ok else ("refused: " if r.refused else "failed: ") + (r.error or "")
    return action_entry(d.action if r.ok or not r.unreachable else QUEUE, d.host, d.reason, who=who, full=d.full,
                        at=d.at, result=result, why=d.why, rack=d.rack, scheduler=scheduler, findings=findings,
                        manual=manual, intent_id=intent_id)


def intent_entry(d: "Decision", *, who: str, intent_id: str, scheduler: str | None = None) -> ActionEntry:
    """The line written (and fsynced) before a drain or resume is sent: if mctl dies before it logs the
    result, the next start finds the intent without a result and reconciles it with the scheduler."""
    return action_entry("intent", d.host, d.reason, who=who, full=d.full, at=d.at, result="pending", why=d.why,
                        rack=d.rack, scheduler=scheduler, intent=d.action, intent_id=intent_id)


INTENT_SCAN = 20000        # the action-log lines a start looks through for intents left without a result


def unresolved_intents(state_dir: Path, *, limit: int = INTENT_SCAN) -> list[ActionEntry]:
    """Intent lines whose drain or resume has no result line (mctl was killed between the two)."""
    intents: dict[str, ActionEntry] = {}
    settled: set[str] = set()
    for e in read_actions(state_dir, limit=limit):
        if not e.intent_id:
            continue
        if e.action == "intent":
            intents[e.intent_id] = e
        else:
            settled.add(e.intent_id)
    return [e for i, e in intents.items() if i not in settled]


def note_entry(n: "Decision", *, who: str) -> ActionEntry:
    """The action-log line of a skip, queue or forget that is new this sweep."""
    return action_entry(n.action, n.host, n.reason, who=who, full=n.full, at=n.at, result="noted", why=n.why,
                        rack=n.rack)


def read_actions(state_dir: Path, *, limit: int | None = None,
                 damaged: list[str] | None = None) -> list[ActionEntry]:
    """The action log's entries, oldest first (the last *limit*).

    A line that is not a JSON object (a torn last line after a crash, a line that is not UTF-8) is
    skipped and, when *damaged* is given, named there as "FILE:LINE: why" so the caller can warn.
    """
    path = actions_path(state_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except IsADirectoryError:
        raise DamagedState(path, "is a directory, not a file") from None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read the action log {path}: {exc.strerror or exc}") from None
    lines = raw.split(b"\n")
    torn_last = bool(lines) and lines[-1] != b""
    if not torn_last:
        lines = lines[:-1]
    numbered = list(enumerate(lines, start=1))
    out = []
    for number, line in numbered[-limit:] if limit else numbered:
        if not line.strip():
            continue
        why = None
        try:
            entry = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            why = "not UTF-8"
        except (ValueError, RecursionError):
            why = "torn last line (no newline)" if torn_last and number == len(lines) else "not JSON"
        else:
            if isinstance(entry, dict):
                out.append(ActionEntry.from_dict(entry))
                continue
            why = "not a JSON object"
        if damaged is not None:
            damaged.append(f"{path}:{number}: {why}; skipped")
    return out
