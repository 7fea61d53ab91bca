"""Audit history in SQLite (<state>/audit/history.sqlite): every run, and each finding's life.

Tables:
  runs      one row per audit run (time, racks, exit code, counts, coverage, gaps)
  findings  the problems each run found (OK results are not stored)
  status    one row per fingerprint: first seen, last seen, resolved at (NULL while open)
  validations  one row per rack-scale NVLink validation (`mctl rack validate`, bring-up's validate phase):
            time, rack, status, the dragging trays, the whole report as JSON (mctl.bringup.validate)

A finding is *resolved* by a run that looked at its family on its host (the
run's coverage) and did not find it. A run that could not look (the tray was
unreachable, another rack was audited) leaves it open, so an outage never
reads as a fix. A resolved finding that comes back starts a new life.

SQLite's own locking serialises two audits that finish together (cron
overlapping a manual run); nothing here takes an mctl lock, so an audit never
waits for or blocks `mctl health watch` or a mutating command. Runs older than
RETENTION_DAYS are pruned when a run is recorded.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from mctl.errors import EnvironmentProblem
from mctl.model.findings import Severity

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport, Entry

SCHEMA = 1
RETENTION_DAYS = 90
FILE = "history.sqlite"

_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    elapsed REAL NOT NULL,
    site TEXT NOT NULL,
    racks TEXT NOT NULL,
    complete INTEGER NOT NULL,
    exit_code INTEGER NOT NULL,
    fail_on TEXT NOT NULL,
    critical INTEGER NOT NULL,
    warn INTEGER NOT NULL,
    coverage TEXT NOT NULL,
    gaps TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started);
CREATE TABLE IF NOT EXISTS findings (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    fingerprint TEXT NOT NULL,
    family TEXT NOT NULL,
    check_id TEXT NOT NULL,
    host TEXT,
    rack TEXT,
    subject TEXT NOT NULL,
    severity TEXT NOT NULL,
    message TEXT NOT NULL,
    action TEXT,
    PRIMARY KEY (run_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS status (
    fingerprint TEXT PRIMARY KEY,
    family TEXT NOT NULL,
    check_id TEXT NOT NULL,
    host TEXT,
    rack TEXT,
    subject TEXT NOT NULL,
    severity TEXT NOT NULL,
    message TEXT NOT NULL,
    action TEXT,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    resolved_at REAL
);
"""
# Added after schema 1 shipped: created on open when missing, so an older history gains it unchanged.
_VALIDATIONS_DDL = """
CREATE TABLE IF NOT EXISTS validations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    elapsed REAL NOT NULL,
    site TEXT NOT NULL,
    rack TEXT NOT NULL,
    status TEXT NOT NULL,
    dragging TEXT NOT NULL,
    report TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS validations_started ON validations(started);
"""


def history_path(state_dir: Path) -> Path:
    return Path(state_dir) / "audit" / FILE


@dataclass(frozen=True)
class Lifecycle:
    """One finding as history tells it."""

    status: str                  # new | persisting | resolved
    fingerprint: str
    family: str
    check: str
    host: str | None
    rack: str | None
    subject: str
    severity: str
    message: str
    action: str | None
    first_seen: float
    last_seen: float
    resolved_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "fingerprint": self.fingerprint, "family": self.family, "check": self.check,
                "host": self.host, "rack": self.rack, "subject": self.subject, "severity": self.severity,
                "message": self.message, "action": self.action, "first_seen": iso_time(self.first_seen),
                "last_seen": iso_time(self.last_seen), "resolved_at": iso_time(self.resolved_at)}


def iso_time(t: float | None) -> str | None:
    if t is None:
        return None
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _merge(entries: Iterable["Entry"]) -> dict[str, "Entry"]:
    """One entry per fingerprint (the worst; equal ones' messages joined), problems only."""
    from mctl.audit.model import Entry
    from mctl.model.findings import Finding

    out: dict[str, Entry] = {}
    for e in entries:
        if e.severity is Severity.OK:
            continue
        have = out.get(e.fingerprint)
        if have is None or e.severity.rank > have.severity.rank:
            out[e.fingerprint] = e
        elif e.severity is have.severity and e.finding.message not in have.finding.message:
            f = have.finding
            out[e.fingerprint] = Entry(have.family, Finding(f.severity, f.host, f.check,
                                                            f"{f.message}; {e.finding.message}", f.action,
                                                            f.details), have.subject, have.rack)
    return out


def _covered(coverage: dict[str, list[str]]) -> set[tuple[str, str]]:
    return {(fam, host) for fam, hosts in coverage.items() for host in hosts}


def _fold_coverage(coverage: dict[str, list[str]]) -> str:
    """Stored folded (rack-a-tray[01-18]) so a year of hourly runs stays small."""
    from mctl.model.site import fold

    out: dict[str, Any] = {}
    for fam, hosts in sorted(coverage.items()):
        try:
            out[fam] = fold(hosts) if all(hosts) else hosts
        except Exception:  # noqa: BLE001 - a name NodeSet cannot fold is kept as a list
            out[fam] = hosts
    return json.dumps(out)


class History:
    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.conn = conn
        self.path = path

    @classmethod
    def open(cls, state_dir: Path, *, create: bool = True) -> "History":
        from mctl.state.files import ensure_dir

        path = history_path(state_dir)
        if create:
            ensure_dir(path.parent, mode=0o750)
        elif not path.exists():
            raise EnvironmentProblem(f"no audit history at {path}",
                                     hint="run 'mctl audit' first (it records every run), or check --state-dir")
        try:
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA journal_mode = WAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA):
                raise EnvironmentProblem(f"{path} has schema {version}, this mctl reads {SCHEMA}",
                                         hint="use the mctl that wrote it, or move the file aside")
            if version == 0:
                conn.executescript(_DDL + f"PRAGMA user_version = {SCHEMA};")
            if create:
                conn.executescript(_VALIDATIONS_DDL)
        except sqlite3.Error as exc:
            raise EnvironmentProblem(f"cannot open the audit history {path}: {exc}",
                                     hint="check the state directory (--state-dir) is writable, or move a damaged "
                                          "file aside") from None
        return cls(conn, path)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ writing

    def record(self, report: "AuditReport", *, now: float | None = None) -> dict[str, Any]:
        """Store the run; returns what changed since the previous runs (new, persisting, resolved)."""
        at = report.started
        current = _merge(report.entries)
        covered = _covered(report.coverage)
        counts = report.counts()
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
            cur = c.execute(
                "INSERT INTO runs (started, elapsed, site, racks, complete, exit_code, fail_on, critical, warn, "
                "coverage, gaps) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (at, report.elapsed, report.site, json.dumps(report.racks), int(report.complete), report.exit_code,
                 report.fail_on, counts["critical"], counts["warn"], _fold_coverage(report.coverage),
                 json.dumps([g.to_dict() for g in report.gaps])))
            run_id = cur.lastrowid
            open_rows = {row[0]: row for row in c.execute(
                "SELECT fingerprint, family, host FROM status WHERE resolved_at IS NULL")}
            new: list[str] = []
            persisting: list[str] = []
            for fp, e in current.items():
                f = e.finding
                c.execute("INSERT INTO findings (run_id, fingerprint, family, check_id, host, rack, subject, "
                          "severity, message, action) VALUES (?,?,?,?,?,?,?,?,?,?)",
                          (run_id, fp, e.family, f.check, f.host, e.rack, e.subject, f.severity.value, f.message,
                           f.action))
                if fp in open_rows:
                    persisting.append(fp)
                    c.execute("UPDATE status SET severity=?, message=?, action=?, rack=?, last_seen=? "
                              "WHERE fingerprint=?", (f.severity.value, f.message, f.action, e.rack, at, fp))
                else:
                    new.append(fp)
                    c.execute("INSERT OR REPLACE INTO status (fingerprint, family, check_id, host, rack, subject, "
                              "severity, message, action, first_seen, last_seen, resolved_at) "
                              "VALUES (?,?,?,?,?,?,?,?,?,?,?,NULL)",
                              (fp, e.family, f.check, f.host, e.rack, e.subject, f.severity.value, f.message,
                               f.action, at, at))
            resolved = [fp for fp, (_, family, host) in open_rows.items()
                        if fp not in current and (family, host or "") in covered]
            c.executemany("UPDATE status SET resolved_at=? WHERE fingerprint=?", [(at, fp) for fp in resolved])
            cutoff = (now if now is not None else time.time()) - RETENTION_DAYS * 86400
            c.execute("DELETE FROM runs WHERE started < ?", (cutoff,))
            c.execute("DELETE FROM status WHERE resolved_at IS NOT NULL AND resolved_at < ?", (cutoff,))
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise EnvironmentProblem(f"cannot record the audit in {self.path}: {exc}",
                                     hint="the report above is complete; check the state directory") from None
        return {"run_id": run_id, "new": len(new), "persisting": len(persisting), "resolved": len(resolved),
                "new_fingerprints": sorted(new), "resolved_fingerprints": sorted(resolved)}

    def record_validation(self, site: str, report: dict[str, Any], *, started: float, elapsed: float,
                          now: float | None = None) -> int:
        """Store one validation run (its report as `--json` prints it); returns its id."""
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
            cur = c.execute("INSERT INTO validations (started, elapsed, site, rack, status, dragging, report) "
                            "VALUES (?,?,?,?,?,?,?)",
                            (started, elapsed, site, str(report.get("rack")), str(report.get("status")),
                             json.dumps(list(report.get("dragging") or [])), json.dumps(report)))
            cutoff = (now if now is not None else time.time()) - RETENTION_DAYS * 86400
            c.execute("DELETE FROM validations WHERE started < ?", (cutoff,))
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise EnvironmentProblem(f"cannot record the validation in {self.path}: {exc}",
                                     hint="the report above is complete; check the state directory") from None
        return int(cur.lastrowid)

    # ------------------------------------------------------------------ reading

    def validations(self, since: float) -> list[dict[str, Any]]:
        """The validation runs since *since*: when, which rack, the status, the dragging trays, each partition."""
        try:
            has = self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='validations'").fetchone()
        except sqlite3.Error as exc:
            raise self._damaged(f"cannot be read ({exc})") from None
        if not has:
            return []
        rows = self._query("SELECT id, started, elapsed, site, rack, status, dragging, report FROM validations "
                           "WHERE started >= ? ORDER BY started, id", (since,))
        num, txt = (int, float), (str,)
        out = []
        for r in rows:
            self._check_row("validations", r, ((int,), num, num, txt, txt, txt, txt, txt))
            try:
                dragging, report = json.loads(r[6]), json.loads(r[7])
            except (ValueError, RecursionError):
                raise self._damaged(f"validations row {r[0]}: dragging or report is not JSON") from None
            if not isinstance(dragging, list) or not isinstance(report, dict):
                raise self._damaged(f"validations row {r[0]}: dragging must be a JSON array, report an object")
            parts = report.get("partitions") if isinstance(report.get("partitions"), list) else []
            out.append({"id": r[0], "started": iso_time(r[1]), "elapsed": round(r[2], 3), "site": r[3],
                        "rack": r[4], "status": r[5], "dragging": dragging,
                        "partitions": [{k: p.get(k) for k in ("name", "status", "busbw", "text")}
                                       for p in parts if isinstance(p, dict)]})
        return out

    def _damaged(self, what: str) -> EnvironmentProblem:
        from mctl.state.files import DamagedState

        return DamagedState(self.path, what, hint="move the damaged history aside (mctl audit starts a new one), "
                                                  "or restore it from a backup")

    def _query(self, sql: str, args: tuple) -> list[tuple]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._damaged(f"cannot be read ({exc})") from None

    def _check_row(self, table: str, row: tuple, types: tuple[tuple[type, ...], ...]) -> None:
        """SQLite keeps any type in any column: a value of the wrong type is damage, named here, not a
        TypeError later."""
        for i, (value, allowed) in enumerate(zip(row, types)):
            if not isinstance(value, allowed):
                raise self._damaged(f"{table} row {row[0]!r}: column {i + 1} holds {type(value).__name__} "
                                    f"{str(value)[:40]!r}")

    def runs(self, since: float) -> list[dict[str, Any]]:
        rows = self._query("SELECT id, started, elapsed, site, racks, complete, exit_code, fail_on, critical, "
                           "warn, gaps FROM runs WHERE started >= ? ORDER BY started, id", (since,))
        num, txt = (int, float), (str,)
        out = []
        for r in rows:
            self._check_row("runs", r, ((int,), num, num, txt, txt, (int,), (int,), txt, (int,), (int,), txt))
            try:
                racks, gaps = json.loads(r[4]), json.loads(r[10])
            except (ValueError, RecursionError):
                raise self._damaged(f"runs row {r[0]}: racks or gaps is not JSON") from None
            if not isinstance(racks, list) or not isinstance(gaps, list):
                raise self._damaged(f"runs row {r[0]}: racks and gaps must be JSON arrays")
            out.append({"id": r[0], "started": iso_time(r[1]), "elapsed": round(r[2], 3), "site": r[3],
                        "racks": racks, "complete": bool(r[5]), "exit_code": r[6], "fail_on": r[7],
                        "critical": r[8], "warn": r[9], "incomplete": gaps})
        return out

    def lifecycles(self, since: float) -> list[Lifecycle]:
        """Open findings (new if first seen since *since*, else persisting) and those resolved since then."""
        rows = self._query(
            "SELECT fingerprint, family, check_id, host, rack, subject, severity, message, action, first_seen, "
            "last_seen, resolved_at FROM status WHERE resolved_at IS NULL OR resolved_at >= ?", (since,))
        num, txt, opt = (int, float), (str,), (str, type(None))
        out = []
        for r in rows:
            self._check_row("status", r, (txt, txt, txt, opt, opt, txt, txt, txt, opt, num, num,
                                          (int, float, type(None))))
            resolved_at = r[11]
            status = "resolved" if resolved_at is not None else ("new" if r[9] >= since else "persisting")
            out.append(Lifecycle(status, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                                 resolved_at))
        order = {"new": 0, "persisting": 1, "resolved": 2}
        rank = {"critical": 0, "warn": 1}
        return sorted(out, key=lambda l: (order[l.status], rank.get(l.severity, 2), l.check, l.host or "",
                                          l.subject))
