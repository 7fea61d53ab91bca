"""Audit history in SQLite: new, persisting and resolved findings, coverage-aware, pruned, and its command."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from mctl.audit.history import RETENTION_DAYS, History, history_path
from mctl.audit.model import AuditReport, Entry, Gap, fingerprint
from mctl.errors import EnvironmentProblem
from mctl.model.findings import Finding, Severity
from tests.unit.cli_helpers import run_cli

TRAYS = ["r1-tray01", "r1-tray02", "r1-tray03"]
NOW = time.time()


def entry(host: str, check: str, severity: Severity = Severity.CRITICAL, family: str = "imex",
          message: str = "differs", subject: str = "/etc/nvidia-imex/nodes_config.cfg") -> Entry:
    return Entry(family, Finding(severity, host, check, message), subject, "r1")


def run(at: float, problems: list[Entry], covered: list[str] = TRAYS, gaps=()) -> AuditReport:
    """A report whose imex family looked at *covered* and found *problems*."""
    oks = [entry(h, "imex.nodes_config", Severity.OK, message="ok") for h in covered]
    entries = oks + problems
    coverage = {"imex": sorted(set(covered) | {e.host for e in problems})}
    return AuditReport("lab", ["r1"], at, 1.0, entries, coverage, list(gaps))


def statuses(store: History, since: float) -> dict[tuple[str, str], str]:
    return {(l.host, l.check): l.status for l in store.lifecycles(since)}


def test_new_persisting_resolved_and_back(tmp_path):
    store = History.open(tmp_path)
    a = entry("r1-tray02", "imex.nodes_config")
    b = entry("r1-tray03", "imex.config", Severity.WARN)
    t0 = NOW - 10 * 86400
    first = store.record(run(t0, [a, b]))
    assert (first["new"], first["persisting"], first["resolved"]) == (2, 0, 0)
    second = store.record(run(t0 + 3600, [a]))
    assert (second["new"], second["persisting"], second["resolved"]) == (0, 1, 1)
    assert second["resolved_fingerprints"] == [b.fingerprint]
    # tray02 unreachable: not looked at, so its finding is not resolved by its absence
    third = store.record(run(NOW - 2 * 86400, [], covered=["r1-tray01", "r1-tray03"],
                             gaps=[Gap("reach", "r1-tray02", "unreachable")]))
    assert third["resolved"] == 0
    assert statuses(store, NOW - 7 * 86400) == {("r1-tray02", "imex.nodes_config"): "persisting"}
    # the 10-day window still sees the config finding resolved, and the node list finding as new then
    assert statuses(store, NOW - 11 * 86400) == {("r1-tray02", "imex.nodes_config"): "new",
                                                 ("r1-tray03", "imex.config"): "resolved"}
    fourth = store.record(run(NOW - 86400, []))
    assert fourth["resolved_fingerprints"] == [a.fingerprint]
    assert statuses(store, NOW - 7 * 86400) == {("r1-tray02", "imex.nodes_config"): "resolved"}
    again = store.record(run(NOW - 60, [a]))
    assert again["new"] == 1
    (life,) = [l for l in store.lifecycles(NOW - 7 * 86400)]
    assert life.status == "new" and life.first_seen == NOW - 60 and life.resolved_at is None
    runs = store.runs(NOW - 7 * 86400)
    assert [r["complete"] for r in runs] == [False, True, True]
    assert runs[0]["incomplete"] == [{"family": "reach", "scope": "r1-tray02", "reason": "unreachable", "hosts": []}]
    store.close()


def test_one_row_per_fingerprint_keeps_the_worst(tmp_path):
    store = History.open(tmp_path)
    warm = entry("r1-tray01", "gpu.temperature", Severity.WARN, "health", "gpu1 86 C", "")
    hot = entry("r1-tray01", "gpu.temperature", Severity.CRITICAL, "health", "gpu0 95 C", "")
    assert warm.fingerprint == hot.fingerprint == fingerprint("gpu.temperature", "r1-tray01", "")
    report = run(NOW, [warm, hot])
    report.coverage["health"] = ["r1-tray01"]
    store.record(report)
    (life,) = store.lifecycles(NOW - 60)
    assert life.severity == "critical" and life.message == "gpu0 95 C"
    store.close()


def test_subject_tells_findings_apart_and_ignores_case_and_spacing():
    assert fingerprint("slurm.topology", "r1", "r1-p0") != fingerprint("slurm.topology", "r1", "r1-p1")
    assert fingerprint("slurm.topology", "r1", " R1-P0 ") == fingerprint("slurm.topology", "r1", "r1-p0")


def test_old_runs_are_pruned(tmp_path):
    store = History.open(tmp_path)
    old = NOW - (RETENTION_DAYS + 1) * 86400
    store.record(run(old, [entry("r1-tray02", "imex.nodes_config")]), now=NOW)
    store.record(run(old + 60, []), now=NOW)            # resolves it, long ago
    store.record(run(NOW, []), now=NOW)
    con = sqlite3.connect(history_path(tmp_path))
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    assert con.execute("SELECT COUNT(*) FROM findings").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM status").fetchone()[0] == 0
    store.close()


def test_history_command(tmp_path, capsys):
    store = History.open(tmp_path)
    store.record(run(NOW - 3 * 86400, [entry("r1-tray02", "imex.nodes_config"),
                                       entry("r1-tray03", "imex.config", Severity.WARN)]))
    store.record(run(NOW - 3600, [entry("r1-tray02", "imex.nodes_config")]))
    store.close()
    res = run_cli(capsys, "--state-dir", str(tmp_path), "audit", "history", "--since", "7d")
    assert res.code == 0, res.err
    assert "2 runs" in res.out and "1 new, 0 persisting, 1 resolved" in res.out
    assert res.out.splitlines()[1].split()[:3] == ["STATUS", "SEVERITY", "CHECK"]
    res = run_cli(capsys, "--state-dir", str(tmp_path), "audit", "history", "--since", "1d", "--json")
    data = json.loads(res.out)
    assert data["summary"] == {"new": 0, "persisting": 1, "resolved": 1}
    assert [f["status"] for f in data["findings"]] == ["persisting", "resolved"]
    assert len(data["runs"]) == 1
    bad = run_cli(capsys, "--state-dir", str(tmp_path), "audit", "history", "--since", "a week")
    assert bad.code == 2 and "--since 'a week' is not a duration" in bad.err


def test_history_without_runs_or_with_a_newer_schema(tmp_path, capsys):
    res = run_cli(capsys, "--state-dir", str(tmp_path / "empty"), "audit", "history")
    assert res.code == 2 and "no audit history" in res.err and "hint: run 'mctl audit' first" in res.err
    store = History.open(tmp_path)
    store.conn.execute("PRAGMA user_version = 99")
    store.close()
    with pytest.raises(EnvironmentProblem, match="schema 99"):
        History.open(tmp_path)
