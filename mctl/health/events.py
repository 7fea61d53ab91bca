"""Events out: every finding change and every action as one JSON line, to the sinks of `health.events`.

Two kinds of event (docs/events.md has every field, an example of each and the compatibility promise):

- `finding`: a tray's findings changed between two sweeps (a check appeared, cleared, or changed
  severity), built by `finding_events` from the sweep's verdicts and what the last sweep saw;
- `action`: one result line of the action log (a drain, a resume, a rung, a power-off, a repair mark,
  a breaker trip, ...), built by `action_event` from its `ActionEntry`. Intent lines (the write-ahead
  half of an act) are not events; the act's result line is.

Where they come from: the engine (mctl/health/engine.py) emits the finding changes of every sweep, the
actuator (mctl/health/actuator.py) every result line it writes, the service functions (resume by hand,
breaker reset, evidence) theirs; the watch and `health check [--remediate]` both pass through the engine.

Delivery (`Bus`): one worker thread per sink with a bounded queue. `Bus.emit` never blocks and never
raises: an event a full queue cannot take is dropped (the newest; counted) and handed to the worker's
dead-letter file on its next turn. The webhook retries with doubling backoff under a per-attempt
timeout; what it cannot deliver goes to the dead-letter file with the error. `Bus.close` lets the
workers finish within a deadline and dead-letters what is left. Exec sinks (the repair hook) are not
run here: the ladder runs them as its repair-hook act (mctl/health/responders/ladder.py).

Standard library only, like the rest of what the tray-side node check could carry; the node check
emits no events (docs/events.md, "The node check").
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.health.store import ActionEntry
    from mctl.health.sweep import SweepResult
    from mctl.model.settings import EventSink

SCHEMA_VERSION = 1
KINDS = ("finding", "action")
# Every event has these keys (null where they do not apply: a breaker trip has no tray).
COMMON = ("schema_version", "id", "time", "site", "kind", "tray", "rack", "who")
FINDING_KEYS = ("sweep", "status", "status_before", "added", "cleared", "findings")
ACTION_KEYS = ("action", "result", "ok", "reason", "why", "intent_id", "dry_run", "details")
OK_RESULTS = ("ok", "noted", "tripped")
_RANK = {"ok": 0, "info": 1, "warn": 2, "critical": 3}
MEMORY_FILE = "events-last.json"        # what the last sweep saw per tray, under <state>/health/
CLOSE_DEADLINE_S = 5.0                  # what `close` gives the workers by default
MAX_BACKOFF_S = 60.0
OVERFLOW_KEPT = 1000                    # dropped events kept for the dead-letter file between the worker's turns
SYSLOG_FACILITY = {"kern": 0, "user": 1, "daemon": 3, "auth": 4, "syslog": 5, **{f"local{i}": 16 + i for i in range(8)}}


def stamp(at: float | None = None) -> str:
    return datetime.fromtimestamp(at if at is not None else time.time(), timezone.utc).isoformat(
        timespec="milliseconds")


def _base(kind: str, site: str, tray: str | None, rack: str | None, who: str, at: str) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "id": uuid.uuid4().hex, "time": at, "site": site, "kind": kind,
            "tray": tray, "rack": rack, "who": who}


# ------------------------------------------------------------------ building (pure)

def action_event(entry: "ActionEntry", *, site: str) -> dict[str, Any]:
    """One action-log result line as an event: the documented keys on top, the line's other keys in details."""
    d = entry.to_dict()
    out = _base("action", site, entry.tray, d.get("rack"), entry.who, entry.time)
    out.update({"action": entry.action, "result": entry.result, "ok": entry.result in OK_RESULTS,
                "reason": entry.reason, "why": d.get("why"), "intent_id": d.get("intent_id"),
                "dry_run": bool(entry.dry_run)})
    skip = {"time", "tray", "rack", "who", "action", "result", "reason", "why", "intent_id", "dry_run"}
    out["details"] = {k: v for k, v in d.items() if k not in skip and v is not None}
    return out


def action_events(entries: Iterable["ActionEntry"], *, site: str) -> list[dict[str, Any]]:
    """The events of action-log lines: every line but the intents."""
    return [action_event(e, site=site) for e in entries if e.action != "intent"]


def seen_of(result: "SweepResult") -> dict[str, dict[str, Any]]:
    """What a sweep saw per tray, in the form the next sweep compares with: status and each non-ok finding."""
    out: dict[str, dict[str, Any]] = {}
    for v in result.verdicts:
        found: dict[str, dict[str, str]] = {}
        for f in v.findings:                # one entry per check: its worst finding (the first of those)
            if f.severity.value == "ok":
                continue
            had = found.get(f.check)
            if had is None or _RANK.get(f.severity.value, 0) > _RANK.get(had["severity"], 0):
                found[f.check] = {"check": f.check, "severity": f.severity.value, "message": f.message}
        out[v.host] = {"status": v.status, "findings": found}
    return out


def finding_events(seen: Mapping[str, Mapping[str, Any]], before: Mapping[str, Mapping[str, Any]], *, site: str,
                   who: str, sweep: int, at: float, racks: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """One event per tray whose findings changed since *before* (a tray not in *before* counts as having had
    none: its first sweep is an event only when it is not healthy)."""
    out = []
    when = stamp(at)
    for host in sorted(seen):
        now = seen[host]
        old = before.get(host) or {"status": None, "findings": {}}
        nf, of = now.get("findings") or {}, old.get("findings") or {}
        added = []
        for k, f in nf.items():
            if k not in of or of[k].get("severity") != f.get("severity"):
                added.append({**f, "severity_before": of[k].get("severity") if k in of else None})
        cleared = [{"check": f["check"], "severity": f.get("severity")} for k, f in of.items() if k not in nf]
        if not added and not cleared:
            continue
        e = _base("finding", site, host, racks.get(host), who, when)
        e.update({"sweep": sweep, "status": now.get("status"), "status_before": old.get("status"),
                  "added": added, "cleared": cleared, "findings": [dict(f) for f in nf.values()]})
        out.append(e)
    return out


def schema_problems(event: Any) -> list[str]:
    """Why *event* is not a valid event of this schema version (empty: it is). For tests and receivers."""
    if not isinstance(event, dict):
        return ["an event is a JSON object"]
    out = []
    for key in COMMON + (FINDING_KEYS if event.get("kind") == "finding" else ACTION_KEYS):
        if key not in event:
            out.append(f"missing {key}")
    if event.get("schema_version") != SCHEMA_VERSION:
        out.append(f"schema_version is {event.get('schema_version')!r}, not {SCHEMA_VERSION}")
    if event.get("kind") not in KINDS:
        out.append(f"kind {event.get('kind')!r} is not one of {', '.join(KINDS)}")
    for key in ("id", "time", "site", "who"):
        if not isinstance(event.get(key), str) or not event.get(key):
            out.append(f"{key} is not a non-empty string")
    for key in ("tray", "rack"):
        if event.get(key) is not None and not isinstance(event.get(key), str):
            out.append(f"{key} is neither a string nor null")
    if event.get("kind") == "finding":
        for key in ("added", "cleared", "findings"):
            items = event.get(key)
            if not isinstance(items, list) or not all(isinstance(f, dict) and isinstance(f.get("check"), str)
                                                      for f in items):
                out.append(f"{key} is not a list of findings")
        if not isinstance(event.get("sweep"), int):
            out.append("sweep is not an integer")
    elif event.get("kind") == "action":
        if not isinstance(event.get("action"), str) or not isinstance(event.get("result"), str):
            out.append("action and result are strings")
        if not isinstance(event.get("ok"), bool) or not isinstance(event.get("dry_run"), bool):
            out.append("ok and dry_run are booleans")
        if not isinstance(event.get("details"), dict):
            out.append("details is not an object")
    try:
        datetime.fromisoformat(str(event.get("time")))
    except ValueError:
        out.append("time is not ISO 8601")
    return out


def line_of(event: Mapping[str, Any]) -> str:
    """The event as one line of JSON (ASCII, no newline inside)."""
    return json.dumps(event, ensure_ascii=True, sort_keys=False, default=str, separators=(",", ":"))


# ------------------------------------------------------------------ the finding memory between sweeps

def load_seen(state_dir: Path) -> dict[str, dict[str, Any]]:
    """What the last sweep saw (a damaged or missing file is a fresh start: every unhealthy tray is told again)."""
    try:
        data = json.loads((Path(state_dir) / "health" / MEMORY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    trays = data.get("trays") if isinstance(data, dict) else None
    if not isinstance(trays, dict):
        return {}
    return {h: v for h, v in trays.items() if isinstance(v, dict) and isinstance(v.get("findings"), dict)}


def save_seen(state_dir: Path, seen: Mapping[str, Any]) -> None:
    from mctl.state.files import write_json

    write_json(Path(state_dir) / "health" / MEMORY_FILE, {"schema_version": SCHEMA_VERSION, "trays": dict(seen)})


# ------------------------------------------------------------------ delivery

class DeliveryError(Exception):
    """One attempt failed; *retry*: another attempt may succeed."""

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


def read_headers(path: str) -> dict[str, str]:
    """A webhook's headers file: `Name: value` lines (blank and # lines skipped). Problems name the file and
    the line, never the value (it holds a secret)."""
    from mctl.errors import UsageError

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read the webhook headers file {path}: {exc.strerror or exc}",
                         hint="health.events[].headers_file names a file of 'Name: value' lines") from None
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not all(c.isalnum() or c in "-_" for c in name) or \
                any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise UsageError(f"{path}:{n}: not a 'Name: value' header line (the value is not shown)",
                             hint="one header per line, e.g. Authorization: Bearer ...")
        out[name] = value
    return out


class Sink:
    """One sink's queue, worker thread and counters. `deliver` is one attempt at one event."""

    def __init__(self, spec: "EventSink", label: str, dead_letter: Path):
        self.spec = spec
        self.label = label
        self.dead_letter = dead_letter
        self.queue: queue.Queue = queue.Queue(maxsize=spec.queue)
        self.overflow: deque = deque(maxlen=OVERFLOW_KEPT)
        self.counts = {"delivered": 0, "dropped": 0, "dead_lettered": 0, "retried": 0}
        self._stop = threading.Event()
        self._close_by: float | None = None
        self._inflight: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name=f"mctl-events-{label}", daemon=True)

    def start(self) -> "Sink":
        self.thread.start()
        return self

    def offer(self, event: dict[str, Any]) -> bool:
        """Queue *event*; never blocks. False: the queue was full and the event is dropped (counted)."""
        try:
            self.queue.put_nowait(event)
            return True
        except queue.Full:
            with self._lock:
                self.counts["dropped"] += 1
            self.overflow.append(event)
            return False

    # -- the worker

    def _work(self) -> None:
        while True:
            self._write_overflow()
            try:
                event = self.queue.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            self._inflight = event
            try:
                self._send(event)
            except Exception as exc:  # noqa: BLE001 - a sink's bug never ends its worker
                self._dead(event, f"{type(exc).__name__}: {exc}", 1)
            finally:
                self._inflight = None

    def _left(self) -> float | None:
        return None if self._close_by is None else self._close_by - time.monotonic()

    def _send(self, event: dict[str, Any]) -> None:
        attempts = 1 + max(0, self.retries())
        wait = self.spec.backoff_s
        error = ""
        for n in range(1, attempts + 1):
            left = self._left()
            if left is not None and left <= 0:
                self._dead(event, f"not delivered before shutdown; last error: {error or 'none'}", n - 1)
                return
            try:
                self.deliver(event, self.spec.timeout_s if left is None else max(0.1, min(self.spec.timeout_s,
                                                                                          left)))
            except DeliveryError as exc:
                error = str(exc)
                if not exc.retry or n == attempts:
                    self._dead(event, error, n)
                    return
                with self._lock:
                    self.counts["retried"] += 1
                left = self._left()
                if left is not None and left < wait:
                    self._dead(event, f"not delivered before shutdown; last error: {error}", n)
                    return
                time.sleep(wait)
                wait = min(wait * 2, MAX_BACKOFF_S)
                continue
            with self._lock:
                self.counts["delivered"] += 1
            return

    def retries(self) -> int:
        return 0

    def deliver(self, event: dict[str, Any], timeout: float) -> None:
        raise NotImplementedError

    def _write_overflow(self) -> None:
        while self.overflow:
            try:
                event = self.overflow.popleft()
            except IndexError:
                return
            self._dead(event, f"dropped: the queue of {self.spec.queue} events was full", 0)

    def _dead(self, event: dict[str, Any], error: str, attempts: int) -> None:
        line = json.dumps({"time": stamp(), "sink": self.label, "error": error[:500], "attempts": attempts,
                           "event": event}, ensure_ascii=True, default=str) + "\n"
        try:
            append_line(self.dead_letter, line)
        except OSError:
            return                                   # nowhere to put it: counted as dropped, never raised
        with self._lock:
            self.counts["dead_lettered"] += 1

    # -- shutdown

    def stop(self, close_by: float) -> None:
        self._close_by = close_by
        self._stop.set()

    def leftovers(self) -> None:
        """After the deadline: what is still queued or in flight goes to the dead-letter file."""
        self._write_overflow()
        event = self._inflight
        if event is not None:
            self._dead(event, "shutdown during delivery (it may have arrived)", 1)
        while True:
            try:
                self._dead(self.queue.get_nowait(), "not delivered before shutdown", 0)
            except queue.Empty:
                return


def append_line(path: Path, line: str) -> None:
    """Append one whole line (one write with O_APPEND) and fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        data = line.encode()
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


class FileSink(Sink):
    def __init__(self, spec, label, dead_letter, path: Path):
        super().__init__(spec, label, dead_letter)
        self.path = path

    def deliver(self, event, timeout):
        try:
            append_line(self.path, line_of(event) + "\n")
        except OSError as exc:
            raise DeliveryError(f"cannot append to {self.path}: {exc.strerror or exc}", retry=False) from None


class SyslogSink(Sink):
    """RFC 5424 messages (`<PRI>1 TIMESTAMP HOST mctl PID KIND - JSON`) as datagrams, over a unix socket
    (unix:/dev/log, as rsyslog and journald listen) or UDP."""

    def __init__(self, spec, label, dead_letter):
        super().__init__(spec, label, dead_letter)
        self.sock: socket.socket | None = None
        self.hostname = (socket.gethostname() or "-").split(".")[0][:255] or "-"

    def _target(self) -> tuple[int, Any]:
        address = self.spec.address or ""
        if address.startswith("unix:"):
            return socket.AF_UNIX, address[len("unix:"):]
        host, _, port = address[len("udp:"):].rpartition(":")
        host = host[1:-1] if host.startswith("[") else host
        family, _, _, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0]
        return family, addr

    def message(self, event: Mapping[str, Any]) -> bytes:
        pri = SYSLOG_FACILITY.get(self.spec.facility, 3) * 8 + severity_of(event)
        msgid = str(event.get("kind") or "-")
        return (f"<{pri}>1 {event.get('time') or stamp()} {self.hostname} mctl {os.getpid()} {msgid} - "
                + line_of(event)).encode()

    def deliver(self, event, timeout):
        try:
            family, addr = self._target()
            if self.sock is None:
                self.sock = socket.socket(family, socket.SOCK_DGRAM)
            self.sock.settimeout(timeout)
            self.sock.sendto(self.message(event), addr)
        except OSError as exc:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            raise DeliveryError(f"syslog {self.spec.address}: {exc.strerror or exc}") from None

    def retries(self) -> int:
        return 1                                      # one more try on a fresh socket (the daemon restarted)


def severity_of(event: Mapping[str, Any]) -> int:
    """The syslog severity: 2 crit (a critical finding), 3 err (an action that failed), 4 warning, 5 notice."""
    if event.get("kind") == "finding":
        return {"critical": 2, "unreachable": 2, "warn": 4}.get(str(event.get("status")), 5)
    return 5 if event.get("ok") else 3


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a new address: the headers (a secret) never follow it elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect())


class WebhookSink(Sink):
    """One HTTP POST of one event (application/json) per delivery; 2xx delivers. A timeout, a refused or
    dropped connection, 408, 429 and 5xx are tried again after the backoff; any other answer is final (a
    redirect too: it is never followed)."""

    def __init__(self, spec, label, dead_letter, headers: Mapping[str, str]):
        super().__init__(spec, label, dead_letter)
        self.headers = dict(headers)

    def retries(self) -> int:
        return self.spec.retries

    def deliver(self, event, timeout):
        body = line_of(event).encode()
        req = urllib.request.Request(self.spec.url or "", data=body, method="POST",
                                     headers={**self.headers, "Content-Type": "application/json",
                                              "User-Agent": "mctl-events/1", "X-Mctl-Event-Id": event["id"]})
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            raise DeliveryError(f"HTTP {exc.code}", retry=exc.code in (408, 429) or exc.code >= 500) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = getattr(exc, "reason", None) or exc
            raise DeliveryError(f"{type(why).__name__}: {why}"[:300]) from None


def _resolve(path: str, root: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or root is None else root / p


class Bus:
    """The sinks of one mctl process and their workers; `emit` is the only door in."""

    def __init__(self, site: str, sinks: Sequence[Sink]):
        self.site = site
        self.sinks = list(sinks)
        self.closed = False

    @classmethod
    def for_settings(cls, site: str, specs: Sequence["EventSink"], state_dir: Path,
                     root: Path | None = None) -> "Bus":
        """The bus of a site's `health.events` (exec sinks are the ladder's). A headers file that cannot be
        read is a UsageError (exit 2) naming it."""
        sinks: list[Sink] = []
        for i, spec in enumerate(specs):
            if spec.type == "exec":
                continue
            label = spec.label(i)
            dead = _resolve(spec.dead_letter, root) if spec.dead_letter else \
                Path(state_dir) / "health" / f"events-dead-{label.replace('[', '-').replace(']', '')}.jsonl"
            if spec.type == "file":
                sinks.append(FileSink(spec, label, dead, _resolve(spec.path or "", root)))
            elif spec.type == "syslog":
                sinks.append(SyslogSink(spec, label, dead))
            elif spec.type == "webhook":
                headers = read_headers(str(_resolve(spec.headers_file, root))) if spec.headers_file else {}
                sinks.append(WebhookSink(spec, label, dead, headers))
        return cls(site, [s.start() for s in sinks])

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def emit(self, events: Iterable[dict[str, Any]]) -> None:
        """Hand *events* to every sink whose filters take them. Never blocks, never raises."""
        if self.closed:
            return
        try:
            for e in events:
                for s in self.sinks:
                    if s.spec.takes(e.get("kind", ""), e.get("action")):
                        s.offer(e)
        except Exception:  # noqa: BLE001 - the event stream never breaks a sweep
            pass

    def actions(self, entries: Iterable["ActionEntry"]) -> None:
        """The events of action-log lines, emitted (never raises)."""
        if not self.sinks:
            return
        try:
            built = action_events(entries, site=self.site)
        except Exception:  # noqa: BLE001 - the event stream never breaks an act
            return
        self.emit(built)

    def close(self, deadline: float = CLOSE_DEADLINE_S) -> dict[str, dict[str, int]]:
        """Let every worker finish what is queued within *deadline* seconds; what is left is dead-lettered."""
        if self.closed:
            return self.counts()
        self.closed = True
        close_by = time.monotonic() + deadline
        for s in self.sinks:
            s.stop(close_by)
        for s in self.sinks:
            s.thread.join(max(0.0, close_by - time.monotonic()))
        for s in self.sinks:
            if s.thread.is_alive():
                s.leftovers()
        return self.counts()

    def counts(self) -> dict[str, dict[str, int]]:
        return {s.label: dict(s.counts) for s in self.sinks}


def outbox(site, state_dir: Path):
    """For a command outside the engine (resume by hand, breaker reset, evidence): a function that sends the
    action-log lines it wrote to the site's sinks and waits for them (at most CLOSE_DEADLINE_S). Made before
    the command acts, so a headers file that cannot be read stops it (exit 2) before anything changed."""
    specs = site.health.events                   # all of them: a sink's default label is its place in the list
    root = getattr(site, "root", None)
    for spec in specs:
        if spec.type == "webhook" and spec.headers_file:
            read_headers(str(_resolve(spec.headers_file, root)))

    def send(entries: Sequence["ActionEntry"]) -> None:
        if not any(s.type != "exec" for s in specs) or not action_events(entries, site=site.name):
            return
        try:
            bus = Bus.for_settings(site.name, specs, state_dir, root)
        except Exception:  # noqa: BLE001 - the action is done and logged; the events never undo it
            return
        try:
            bus.actions(entries)
        finally:
            bus.close()
    return send
