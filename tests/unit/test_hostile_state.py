"""Hostile state (issue 17, deliverables 4, 6, 7, 8): damaged state files, links and modes, locks, markup, secrets.

Every damaged file is refused with exit 2, a message that names the file, a hint, no traceback, and the
file left as it was. Each parameter below is a malformed input of our own (hand-written, not captured).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest

from mctl.cli import render
from mctl.errors import EXIT_INTERNAL, EnvironmentProblem, MctlError, UsageError
from mctl.health import store
from mctl.state import DamagedState, LockBusy, ensure_dir, file_lock, rack_lock, rack_lock_path, read_json
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example-gb200"
RUN_ID = "20260101-000000-abcdef"


# ------------------------------------------------------------------ helpers

@pytest.fixture()
def inv(tmp_path):
    """A copy of the example inventory (images resolve) whose SSH identity is a private key of mode 0600."""
    dest = tmp_path / "inventories" / "example-gb200"
    shutil.copytree(EXAMPLE, dest)
    shutil.copytree(REPO / "images", tmp_path / "images")
    key = tmp_path / "id_test"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    text = (dest / "mctl.yml").read_text().replace("~/.ssh/id_ed25519", str(key))
    (dest / "mctl.yml").write_text(text)
    return dest


@pytest.fixture()
def state(tmp_path):
    return tmp_path / "state"


def _refused(r, path: Path | str, code: int = 2) -> None:
    """Exit *code*, the damaged file named, a hint, one error, no traceback."""
    assert r.code == code, (r.code, r.out, r.err)
    assert str(path) in r.err, r.err
    assert "hint:" in r.err, r.err
    assert "Traceback" not in r.err + r.out
    assert r.err.count("mctl: error:") == 1, r.err


def _write(path: Path, data: bytes | str) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    path.write_bytes(raw)
    return raw


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


# ------------------------------------------------------------------ health state and breaker

HEALTH_STATE = [
    ("array", "[]"),
    ("string", '"state"'),
    ("null", "null"),
    ("number", "42"),
    ("empty", ""),
    ("truncated", '{"schema": 1, "tra'),
    ("not-utf8", b'\xff\xfe{"schema": 1}'),
    ("latin1-reason", '{"schema": 1, "trays": {}, "site": "x"}'.encode().replace(b'"x"', b'"caf\xe9"')),
    ("too-deep", _deep()),
    ("trays-array", '{"schema": 1, "trays": []}'),
    ("tray-record-string", '{"schema": 1, "trays": {"t1": "drained"}}'),
    ("tray-host-missing", '{"schema": 1, "trays": {"t1": {"misses": 1}}}'),
    ("tray-misses-text", '{"schema": 1, "trays": {"t1": {"host": "t1", "misses": "3"}}}'),
    ("tray-drained-text", '{"schema": 1, "trays": {"t1": {"host": "t1", "drained": "yes"}}}'),
    ("tray-streak-float-list", '{"schema": 1, "trays": {"t1": {"host": "t1", "bad_streak": [1]}}}'),
    ("tray-pending-list", '{"schema": 1, "trays": {"t1": {"host": "t1", "pending": [1]}}}'),
    ("tray-pending-since-text", '{"schema": 1, "trays": {"t1": {"host": "t1", "pending": {"since": "now"}}}}'),
    ("tray-drained-at-bool", '{"schema": 1, "trays": {"t1": {"host": "t1", "drained_at": true}}}'),
    ("site-number", '{"schema": 1, "site": 7}'),
    ("updated-text", '{"schema": 1, "updated": "yesterday"}'),
    ("breaker-array", '{"schema": 1, "breaker": []}'),
    ("breaker-tripped-text", '{"schema": 1, "breaker": {"tripped": "yes"}}'),
    ("breaker-reason-number", '{"schema": 1, "breaker": {"tripped": true, "reason": 5}}'),
    ("breaker-tripped-at-text", '{"schema": 1, "breaker": {"tripped": true, "tripped_at": "noon"}}'),
    ("breaker-drains-object", '{"schema": 1, "breaker": {"drains": {"a": 1}}}'),
    ("breaker-drains-numbers", '{"schema": 1, "breaker": {"drains": [1, 2]}}'),
    ("breaker-drain-time-text", '{"schema": 1, "breaker": {"drains": [{"time": "t", "host": "h"}]}}'),
    ("breaker-drain-host-missing", '{"schema": 1, "breaker": {"drains": [{"time": 1.0}]}}'),
    ("schema-other", '{"schema": 99}'),
]


@pytest.mark.parametrize("content", [c for _, c in HEALTH_STATE], ids=[i for i, _ in HEALTH_STATE])
@pytest.mark.parametrize("command", [("health", "breaker", "status"), ("health", "breaker", "reset")],
                         ids=["status", "reset"])
def test_damaged_health_state_is_named_and_left_alone(capsys, state, content, command):
    path = store.state_path(state)
    before = _write(path, content)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), *command)
    _refused(r, path)
    assert path.read_bytes() == before
    assert not store.actions_path(state).exists()          # nothing was logged as done


def test_health_state_that_is_a_directory(capsys, state):
    store.state_path(state).mkdir(parents=True)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "health", "breaker", "status")
    _refused(r, store.state_path(state))


def test_good_health_state_still_loads(state):
    store.save_state(state, store.HealthState("example"))
    assert store.load_state(state).site == "example"


# ------------------------------------------------------------------ bring-up journals

def _journal(**over) -> dict:
    data = {"schema": 1, "kind": "bringup", "site": "example", "inventory": "x", "rack": "rack-a",
            "run_id": RUN_ID, "status": "failed", "created": 1.0, "updated": 2.0, "command": "mctl",
            "options": {}, "attempts": [{"pid": 1, "host": "h", "started": 1.0}],
            "phases": [{"name": "preflight", "status": "failed", "started": 1.0, "ended": 2.0, "summary": None,
                        "changed": False, "details": [], "artifacts": {}, "error": None}], "result": None}
    data.update(over)
    return data


JOURNALS = [
    ("array", "[]"),
    ("truncated", json.dumps(_journal())[:-20]),
    ("not-utf8", b'{"schema": 1, "kind": "bringup", "rack": "\xff"}'),
    ("kind-other", json.dumps(_journal(kind="audit"))),
    ("schema-other", json.dumps(_journal(schema=7))),
    ("phases-number", json.dumps(_journal(phases=5))),
    ("phase-string", json.dumps(_journal(phases=["preflight"]))),
    ("phase-status-unknown", json.dumps(_journal(phases=[{**_journal()["phases"][0], "status": "exploded"}]))),
    ("phase-details-text", json.dumps(_journal(phases=[{**_journal()["phases"][0], "details": "x"}]))),
    ("phase-artifacts-list", json.dumps(_journal(phases=[{**_journal()["phases"][0], "artifacts": []}]))),
    ("run-id-path", json.dumps(_journal(run_id="../../etc"))),
    ("run-id-newline", json.dumps(_journal(run_id=RUN_ID + "\n"))),
    ("run-id-missing", json.dumps({k: v for k, v in _journal().items() if k != "run_id"})),
    ("attempt-pid-text", json.dumps(_journal(attempts=[{"pid": "1", "host": "h"}]))),
    ("attempts-object", json.dumps(_journal(attempts={"pid": 1}))),
    ("options-list", json.dumps(_journal(options=["--resume"]))),
    ("options-accept-number", json.dumps(_journal(options={"accept": 5}))),
    ("options-from-unknown-phase", json.dumps(_journal(options={"from": "teardown"}))),
    ("options-imex-wait-text", json.dumps(_journal(options={"imex_wait": "a minute"}))),
    ("status-number", json.dumps(_journal(status=3))),
]


@pytest.mark.parametrize("content", [c for _, c in JOURNALS], ids=[i for i, _ in JOURNALS])
def test_damaged_newest_journal_stops_a_resume(capsys, state, content):
    path = state / "bringup" / "rack-a" / RUN_ID / "journal.json"
    before = _write(path, content)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "rack", "bring-up", "rack-a", "--resume")
    _refused(r, path)
    assert r.out == ""
    assert path.read_bytes() == before


def test_damaged_newest_journal_is_not_skipped_for_an_older_run(capsys, state):
    """An older good run must not be resumed behind the operator's back when the newest one is damaged."""
    older = state / "bringup" / "rack-a" / "20250101-000000-000000" / "journal.json"
    _write(older, json.dumps(_journal(run_id="20250101-000000-000000")))
    newest = state / "bringup" / "rack-a" / RUN_ID / "journal.json"
    _write(newest, "{broken")
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "rack", "bring-up", "rack-a", "--resume")
    _refused(r, newest)
    assert str(newest.parent) in r.err              # the hint names the run folder to move aside
    assert json.loads(older.read_text())["status"] == "failed"


# ------------------------------------------------------------------ inventory snapshots

SNAPSHOTS = [
    ("array", "[]"),
    ("truncated", '{"trays": [{"host": "rack-a-tray01"'),
    ("not-utf8", b'{"trays": [], "site": "\xc3\x28"}'),
    ("trays-number", '{"trays": 5}'),
    ("tray-string", '{"trays": ["rack-a-tray01"]}'),
    ("tray-host-missing", '{"trays": [{"reach": "ok"}]}'),
    ("nvidia-smi-list", '{"trays": [{"host": "t", "nvidia_smi": []}]}'),
    ("cluster-uuids-text", '{"trays": [{"host": "t", "nvidia_smi": {"cluster_uuids": "abc"}}]}'),
    ("cluster-uuid-number", '{"trays": [{"host": "t", "nvidia_smi": {"cluster_uuids": [5]}}]}'),
    ("findings-object", '{"trays": [], "findings": {}}'),
    ("finding-message-missing", '{"trays": [], "findings": [{"severity": "warn"}]}'),
]


@pytest.mark.parametrize("content", [c for _, c in SNAPSHOTS], ids=[i for i, _ in SNAPSHOTS])
@pytest.mark.parametrize("rack,extra", [("rack-a", ("--diff",)), ("rack-b", ())], ids=["own-diff", "other-rack"])
def test_damaged_snapshot_is_named_before_any_host_is_asked(capsys, state, content, rack, extra):
    """rack-a's latest snapshot is damaged: read for `--diff` of rack-a and for the domains of other racks.
    The example's trays do not exist; the command must stop on the file before it tries them."""
    path = state / "snapshots" / "inventory" / "rack-a" / "20260101T000000.000000Z.json"
    before = _write(path, content)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "rack", "inventory", rack, *extra)
    _refused(r, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]     # no new snapshot written


# ------------------------------------------------------------------ provisioning records

def _recap(**over) -> dict:
    data = {"run_id": RUN_ID, "run_dir": "", "status": "failed", "rc": 2, "started": 1.0, "ended": 2.0,
            "hosts": {"rack-a-tray01": {"host": "rack-a-tray01", "ok": 1, "changed": 0, "failed": 1,
                                        "unreachable": 0, "skipped": 0, "failed_task": "x", "message": "y",
                                        "status": "failed"}},
            "check": False, "failed_hosts": ["rack-a-tray01"], "duration_s": 1.0}
    data.update(over)
    return data


LAST = [
    ("last-array", "[]", None),
    ("last-run-dir-number", '{"run_id": "x", "run_dir": 5}', None),
    ("last-not-utf8", b'{"run_dir": "\xff"}', None),
    ("recap-array", None, "[]"),
    ("recap-truncated", None, json.dumps(_recap())[:40]),
    ("recap-not-utf8", None, b'{"run_id": "\xfe"}'),
    ("recap-hosts-list", None, json.dumps(_recap(hosts=["rack-a-tray01"]))),
    ("recap-host-failed-text", None, json.dumps(_recap(hosts={"rack-a-tray01": {"failed": "1"}}))),
    ("recap-host-unknown-field", None, json.dumps(_recap(hosts={"rack-a-tray01": {"failed": 1, "rm -rf": 1}}))),
    ("recap-started-text", None, json.dumps(_recap(started="noon"))),
    ("recap-status-missing", None, json.dumps({k: v for k, v in _recap().items() if k != "status"})),
]


@pytest.mark.parametrize("last,recap", [(a, b) for _, a, b in LAST], ids=[i for i, _, _ in LAST])
def test_damaged_provisioning_record_is_named(capsys, inv, state, last, recap):
    run_dir = state / "provision" / "runs" / RUN_ID
    pointer = state / "provision" / "last.json"
    if recap is not None:
        recap_raw = _write(run_dir / "recap.json", recap)
        _write(pointer, json.dumps({"run_id": RUN_ID, "run_dir": str(run_dir)}))
        damaged, before = run_dir / "recap.json", recap_raw
    else:
        before = _write(pointer, last)
        damaged = pointer
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "provision", "rack-a", "--retry-failed",
                "--dry-run")
    _refused(r, damaged)
    assert damaged.read_bytes() == before


# ------------------------------------------------------------------ audit history

def _history(state: Path) -> Path:
    from mctl.audit.history import History

    h = History.open(state)
    h.close()
    return state / "audit" / "history.sqlite"


def _audit(capsys, state):
    return run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "audit", "history", "--since", "3650d")


def test_audit_history_that_is_not_a_database(capsys, state):
    path = state / "audit" / "history.sqlite"
    before = _write(path, "this is not sqlite\n" * 10)
    _refused(_audit(capsys, state), path)
    assert path.read_bytes() == before


def test_audit_history_truncated(capsys, state):
    path = _history(state)
    raw = path.read_bytes()
    path.write_bytes(raw[:100])
    _refused(_audit(capsys, state), path)


@pytest.mark.parametrize("sql", [
    "INSERT INTO runs VALUES (1, 'yesterday', 1.0, 'x', '[]', 1, 0, 'critical', 0, 0, '{}', '[]')",
    "INSERT INTO runs VALUES (1, 1e12, 1.0, 'x', 'not json', 1, 0, 'critical', 0, 0, '{}', '[]')",
    "INSERT INTO runs VALUES (1, 1e12, 1.0, 'x', '{\"a\": 1}', 1, 0, 'critical', 0, 0, '{}', '[]')",
    "INSERT INTO status VALUES ('fp', 'f', 'c', 'h', 'r', 's', 'warn', 'm', NULL, 'first', 1.0, NULL)",
    "INSERT INTO status VALUES ('fp', 'f', 'c', 'h', 'r', 's', 'warn', x'ff00', NULL, 1e12, 1e12, NULL)",
    "DROP TABLE status",
], ids=["started-text", "racks-not-json", "racks-object", "first-seen-text", "message-blob", "table-missing"])
def test_audit_history_rows_of_the_wrong_type(capsys, state, sql):
    path = _history(state)
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    _refused(_audit(capsys, state), path)
    assert path.read_bytes() == before


# ------------------------------------------------------------------ the action log

def _entry(action: str, host: str = "t1") -> dict:
    return store.action_entry(action, host, "mctl: x", who="me", at=0.0)


def test_torn_last_line_is_skipped_and_the_next_entry_starts_on_its_own_line(state):
    store.append_actions(state, [_entry("drain")])
    path = store.actions_path(state)
    with open(path, "ab") as fh:                 # a crash mid-write leaves half a line, no newline
        fh.write(b'{"time": "1970-01-01T00:00:00.000+00:00", "tray": "t2", "act')
    damaged: list[str] = []
    assert [e.action for e in store.read_actions(state, damaged=damaged)] == ["drain"]
    assert damaged == [f"{path}:2: torn last line (no newline); skipped"]
    store.append_actions(state, [_entry("resume")])
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and json.loads(lines[-2])["action"] == "resume"      # not merged into the torn line
    damaged = []
    assert [e.action for e in store.read_actions(state, damaged=damaged)] == ["drain", "resume"]
    assert damaged == [f"{path}:2: not JSON; skipped"]


@pytest.mark.parametrize("line,why", [(b"\xff\xfe garbage", "not UTF-8"), (b"[1, 2, 3]", "not a JSON object"),
                                      (b'"just text"', "not a JSON object"), (b"{not json", "not JSON"),
                                      (_deep(50_000).encode(), "not JSON")],
                         ids=["not-utf8", "array", "string", "broken", "too-deep"])
def test_damaged_action_log_lines_are_flagged_not_fatal(state, line, why):
    store.append_actions(state, [_entry("drain")])
    path = store.actions_path(state)
    with open(path, "ab") as fh:
        fh.write(line + b"\n")
    store.append_actions(state, [_entry("resume")])
    damaged: list[str] = []
    assert [e.action for e in store.read_actions(state, damaged=damaged)] == ["drain", "resume"]
    assert damaged == [f"{path}:2: {why}; skipped"]


def test_action_log_entries_are_one_line_each_whatever_they_hold(state):
    store.append_actions(state, [store.action_entry("drain", "t\n1", "reason\nwith\nnewlines \u2028", who="me")])
    lines = store.actions_path(state).read_bytes().split(b"\n")
    assert len(lines) == 2 and lines[1] == b""
    assert store.read_actions(state)[0].tray == "t\n1"


def test_action_log_that_is_a_link_is_refused(state, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    path = store.actions_path(state)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(EnvironmentProblem) as err:
        store.append_actions(state, [_entry("drain")])
    assert str(path) in err.value.message
    assert target.read_text() == "precious\n"


# ------------------------------------------------------------------ locks and modes

def test_symlinked_rack_lock_is_refused_and_its_target_untouched(capsys, inv, state, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    lock = rack_lock_path(state, "rack-a")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(target)
    before = (inv / "mctl.yml").read_text()
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "partition", "create", "rack-a",
                "--template", "3x6", "--no-apply")
    _refused(r, lock)
    assert "symbolic link" in r.err and r.out == ""
    assert target.read_text() == "keep me\n" and (inv / "mctl.yml").read_text() == before


def test_dangling_symlinked_lock_creates_nothing(state, tmp_path):
    lock = state / "locks" / "x.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(MctlError, match="symbolic link"):
        with file_lock(lock):
            pass
    assert not (tmp_path / "would-be-created").exists()


def test_lock_that_is_a_fifo_or_folder_is_refused(state):
    fifo = state / "locks" / "rack-rack-a.lock"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    with pytest.raises(MctlError, match="not a regular file"):
        with rack_lock(state, "rack-a"):
            pass
    (state / "locks" / "rack-rack-b.lock").mkdir()
    with pytest.raises(MctlError, match="rack-rack-b.lock"):
        with rack_lock(state, "rack-b"):
            pass


@pytest.mark.parametrize("rack", ["../x", "../../etc/passwd", "a/b", "-rf", "", "x\ny", "..", "x\n", "a..b"])
def test_rack_lock_name_is_never_a_path(state, rack):
    with pytest.raises(MctlError, match="cannot be used in a lock file name"):
        rack_lock_path(state, rack)
    assert not state.exists()


@pytest.mark.parametrize("content", [b"[1, 2]", b'"x"', b"\xff\xfe", b'{"pid": "1; rm -rf /", "since": [1]}',
                                     b"{" * 3000, b"[" * 3000],
                         ids=["array", "string", "binary", "wrong-types", "deep-object", "deep-array"])
def test_damaged_lock_holder_record_still_gives_a_clean_refusal(state, content, processes):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()

    def hold():
        path = rack_lock_path(state, "rack-a")
        with rack_lock(state, "rack-a"):
            with open(path, "r+b") as fh:           # the holder's record is overwritten by someone else
                fh.truncate(0)
                fh.write(content)
            ready.set()
            release.wait(20)

    proc = ctx.Process(target=hold)
    proc.start()
    try:
        assert ready.wait(20)
        with pytest.raises(LockBusy) as err:
            with rack_lock(state, "rack-a"):
                pass
        assert err.value.message.startswith("rack rack-a is locked")
    finally:
        release.set()
        proc.join(20)


def test_state_dir_is_made_0750_level_by_level_even_under_umask_000(tmp_path):
    old = os.umask(0)
    try:
        store.append_actions(tmp_path / "a" / "b" / "state", [_entry("drain")])
        with rack_lock(tmp_path / "c" / "state", "rack-a"):
            pass
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "state",
                   tmp_path / "a" / "b" / "state" / "health", tmp_path / "c", tmp_path / "c" / "state",
                   tmp_path / "c" / "state" / "locks"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750, folder
    assert stat.S_IMODE(rack_lock_path(tmp_path / "c" / "state", "rack-a").stat().st_mode) == 0o640
    assert stat.S_IMODE(store.actions_path(tmp_path / "a" / "b" / "state").stat().st_mode) == 0o640


@pytest.mark.parametrize("mode", [0o777, 0o773, 0o757])
def test_world_writable_lock_folder_is_refused(capsys, inv, state, mode):
    locks = state / "locks"
    locks.mkdir(parents=True)
    locks.chmod(mode)
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "partition", "create", "rack-a",
                "--template", "3x6", "--no-apply")
    _refused(r, locks)
    assert "writable by everyone" in r.err and "chmod 750" in r.err and r.out == ""
    assert list(locks.iterdir()) == []


def test_sticky_world_writable_folder_is_allowed_for_locks(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    with file_lock(folder / "x.lock"):
        pass


def test_ensure_dir_over_a_file_is_named(tmp_path):
    (tmp_path / "state").write_text("a file where the state directory should be")
    with pytest.raises(EnvironmentProblem, match="cannot create directory"):
        ensure_dir(tmp_path / "state" / "locks")


@pytest.fixture()
def held(state, held_lock):
    """rack-a's lock held by another process (as a bring-up would): its pid."""
    with held_lock(rack_lock_path(state, "rack-a"), "mctl rack bring-up") as pid:
        yield pid


@pytest.mark.parametrize("words", [
    ("partition", "create", "rack-a", "--template", "3x6", "--no-apply"),
    ("partition", "create", "rack-a", "p9", "--trays", "rack-a-tray01", "--no-apply"),
    ("partition", "delete", "rack-a", "p1", "--no-apply"),
    ("partition", "delete", "rack-a", "p1"),
    ("imex", "apply", "rack-a"),
    ("provision", "rack-a"),
    ("provision", "rack-a-tray[01-02]", "--tags", "base"),
    ("node", "install-check", "rack-a"),
    ("deploy", "slurm"),
    ("deploy", "slurm", "--topology-only"),
    ("health", "resume", "rack-a-tray01"),
    ("health", "check", "rack-a", "--remediate"),
], ids=lambda w: " ".join(w[:2]) + ("" if len(w) < 4 else f" {w[3]}") + ("" if len(w) != 3 else f" {w[2]}"))
def test_mutating_command_takes_the_rack_lock_before_it_prints_anything(capsys, inv, state, held, words):
    before = (inv / "mctl.yml").read_text()
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), *words)
    assert r.code == 2, (r.out, r.err)
    assert r.out == ""                                   # nothing printed, planned or asked before the refusal
    assert f"rack rack-a is locked by pid {held}" in r.err and "rack bring-up" in r.err
    assert "Traceback" not in r.err
    assert (inv / "mctl.yml").read_text() == before
    assert not (state / "provision").exists()


def test_dry_run_takes_no_lock_but_names_the_holder(capsys, inv, state, held):
    before = (inv / "mctl.yml").read_text()
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "partition", "create", "rack-a",
                "--template", "3x6", "--no-apply", "--dry-run")
    assert r.code == 0, r.err
    assert f"rack rack-a is locked by pid {held}" in r.err and "this dry run" in r.err
    assert "p0=rack-a-tray[01-06]" in r.out
    assert (inv / "mctl.yml").read_text() == before


def test_lock_is_released_when_the_command_ends(capsys, inv, state):
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "partition", "create", "rack-a",
                "--template", "3x6", "--no-apply")
    assert r.code == 0, r.err
    with rack_lock(state, "rack-a"):           # free again, and the record is cleared
        pass
    assert rack_lock_path(state, "rack-a").read_bytes() == b""


# ------------------------------------------------------------------ the SSH ControlPath folder

@pytest.fixture()
def control_dir(monkeypatch, tmp_path):
    """The ControlPath folder's parent moved from /tmp to a folder of the test's, so the test owns the name."""
    import mctl.ansible.runner as runner

    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(runner, "CONTROL_BASE", base)
    return base / f"mctl-ssh-{os.getuid()}"


def test_control_path_folder_is_made_private(control_dir):
    from mctl.ansible.runner import control_path_dir

    old = os.umask(0)
    try:
        assert control_path_dir() == control_dir
    finally:
        os.umask(old)
    assert stat.S_IMODE(control_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("kind", ["world-writable", "group-readable", "symlink", "file", "other-owner"])
def test_control_path_folder_not_ours_or_open_is_refused(control_dir, tmp_path, kind):
    from mctl.ansible.runner import control_path_dir

    if kind == "world-writable":
        control_dir.mkdir()
        control_dir.chmod(0o777)
    elif kind == "group-readable":
        control_dir.mkdir()
        control_dir.chmod(0o750)
    elif kind == "symlink":
        (tmp_path / "attacker").mkdir(mode=0o700)
        control_dir.symlink_to(tmp_path / "attacker")
    elif kind == "file":
        control_dir.write_text("")
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to give the folder to another user")
        control_dir.mkdir(mode=0o700)
        os.chown(control_dir, 65534, 65534)
    with pytest.raises(EnvironmentProblem) as err:
        control_path_dir()
    assert str(control_dir) in err.value.message and err.value.hint


# ------------------------------------------------------------------ data is not markup

@pytest.fixture()
def rich_terminal(monkeypatch):
    """Render as on a terminal (rich parses markup there), into capsys."""
    monkeypatch.setattr(render, "_plain", lambda: False)
    monkeypatch.setattr(render, "_plain_err", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    render.reset()
    yield
    render.reset()


MARKUP = ["[/x]", "[bold]loud[/bold]", "[red", "x[/]", "trailing\\", "[link=file:///etc/passwd]x[/link]"]


@pytest.mark.parametrize("text", MARKUP)
def test_markup_in_table_cells_prints_literally(capsys, rich_terminal, text):
    render.table(f"title {text}", ["name", text], [[text, "ok"]])
    out = capsys.readouterr().out
    assert out.count(text) == 3


@pytest.mark.parametrize("text", MARKUP)
def test_markup_in_errors_and_warnings_prints_literally(capsys, rich_terminal, text):
    render.error(f"unknown rack {text}", f"hint {text}")
    render.warn(f"warned {text}")
    err = capsys.readouterr().err
    assert f"unknown rack {text}" in err and f"hint {text}" in err and f"warned {text}" in err


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "plain"])
@pytest.mark.parametrize("text", ["\x1b]0;pwned\x07", "\x1b[2J", "a\rb", "\x00"])
def test_control_characters_in_errors_are_shown_not_sent(capsys, monkeypatch, terminal, text):
    if terminal:
        monkeypatch.setattr(render, "_plain_err", lambda: False)
        render.reset()
    render.error(f"unknown rack {text}", f"hint {text}")
    render.warn(f"warned {text}")
    err = capsys.readouterr().err
    render.reset()
    assert "\x1b" not in err and "\r" not in err and "\x00" not in err and "\x07" not in err
    assert err.count("\\x") >= 3


@pytest.mark.parametrize("text", ["[/x]", "[bold]"])
def test_markup_in_a_rack_name_on_the_command_line(capsys, rich_terminal, text):
    r = run_cli(capsys, "-i", str(EXAMPLE), "partition", "create", text, "--template", "2x9", "--no-apply",
                "--dry-run")
    assert r.code == 2 and f"unknown rack '{text}'" in r.err and "Traceback" not in r.err


def test_markup_in_a_breaker_reason_from_the_state(capsys, rich_terminal, state):
    from mctl.health.breaker import BreakerState

    store.save_state(state, store.HealthState("example", breaker=BreakerState(True, 1.0, "[/x] [bold]boom")))
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "health", "breaker", "status")
    assert "[/x] [bold]boom" in r.out and "Traceback" not in r.err


def test_markup_in_a_lock_holder_record(capsys, rich_terminal, inv, state, held_lock):
    with held_lock(rack_lock_path(state, "rack-a"), "[/x] [bold]"):
        r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "partition", "delete", "rack-a", "p1",
                    "--no-apply")
        assert r.code == 2 and "[/x] [bold]" in r.err and "Traceback" not in r.err


# ------------------------------------------------------------------ the last net

def test_unexpected_exception_is_one_line_and_exit_70(capsys, monkeypatch, state):
    def boom(_state_dir):
        raise KeyError("tripped_at")

    monkeypatch.setattr(store, "load_state", boom)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "health", "breaker", "status")
    assert r.code == EXIT_INTERNAL == 70
    assert "Traceback" not in r.err
    assert r.err.splitlines()[0] == "mctl: error: internal error: KeyError: 'tripped_at'"
    assert "-v" in r.err
    r = run_cli(capsys, "-v", "-i", str(EXAMPLE), "--state-dir", str(state), "health", "breaker", "status")
    assert r.code == 70 and "Traceback (most recent call last)" in r.err and "boom" in r.err


def test_unexpected_exception_text_stays_on_one_line(capsys, monkeypatch, state):
    def boom(_state_dir):
        raise RuntimeError("line one\nline two\n[/x]")

    monkeypatch.setattr(store, "load_state", boom)
    r = run_cli(capsys, "-i", str(EXAMPLE), "--state-dir", str(state), "health", "breaker", "status")
    assert r.code == 70 and "internal error: RuntimeError: line one line two [/x]" in r.err


# ------------------------------------------------------------------ secrets

@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666, 0o601])
def test_private_key_others_can_read_is_refused(capsys, inv, state, tmp_path, mode):
    key = tmp_path / "id_test"
    key.chmod(mode)
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "provision", "rack-a")
    _refused(r, key)
    assert "chmod 600" in r.err and f"{mode:04o}" in r.err
    assert not (state / "provision").exists()


def test_private_key_checked_by_mctl_own_ssh_too(tmp_path):
    from mctl.transport.ssh import SSHConfig, SSHPool

    key = tmp_path / "id"
    key.write_text("x")
    key.chmod(0o644)
    (tmp_path / "known_hosts").write_text("")
    pool = SSHPool(SSHConfig(known_hosts=tmp_path / "known_hosts", identity_file=key))
    with pytest.raises(UsageError, match="readable or writable by others") as err:
        pool._base_options()
    assert err.value.hint == f"chmod 600 {key}"


def test_private_key_that_is_a_folder_is_refused(capsys, inv, state, tmp_path):
    key = tmp_path / "id_test"
    key.unlink()
    key.mkdir()
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(state), "node", "install-check", "rack-a")
    _refused(r, key)
    assert "not a regular file" in r.err


def test_ansible_gets_only_the_variables_it_needs(monkeypatch):
    from mctl.ansible.runner import ansible_env, runner_env

    environ = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_TIME": "C", "SSH_AUTH_SOCK": "/run/agent",
               "AWS_SECRET_ACCESS_KEY": "s3cr3t", "NMX_PASSWORD": "hunter2", "GITHUB_TOKEN": "ghp_x",
               "ANSIBLE_SSH_COMMON_ARGS": "-o ProxyCommand=evil", "ANSIBLE_CONFIG": "/tmp/evil.cfg",
               "http_proxy": "http://proxy:3128", "LD_PRELOAD": "/tmp/x.so", "PYTHONPATH": "/tmp/evil"}
    ours = {"PATH": "/venv/bin:/usr/bin", "ANSIBLE_HOST_KEY_CHECKING": "True"}
    prepared = {**environ, **ours, "ANSIBLE_STDOUT_CALLBACK": "awx_display", "AWX_ISOLATED_DATA_DIR": "/x"}
    env = runner_env(prepared, ours, environ)
    assert env == {"PATH": "/venv/bin:/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_TIME": "C",
                   "SSH_AUTH_SOCK": "/run/agent",
                   "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_STDOUT_CALLBACK": "awx_display",
                   "AWX_ISOLATED_DATA_DIR": "/x"}
    assert "ANSIBLE_SSH_CONTROL_PATH_DIR" in ansible_env()


def test_ansible_run_folder_keeps_no_secret_from_mctl_environment(tmp_path, monkeypatch, processes):
    """A real (local, tiny) ansible-runner run: the environment recorded in its folder is the allow-list."""
    from mctl.ansible.runner import PlaybookRequest, run_playbook

    monkeypatch.setenv("MCTL_TEST_SECRET", "do-not-leak-4711")
    monkeypatch.setenv("MCTL_KEEP_RUNS", "2")
    playbook = tmp_path / "noop.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  connection: local\n  tasks:\n"
                        "    - ansible.builtin.debug: {msg: hello}\n")
    state = tmp_path / "state"
    runs = state / "provision" / "runs"
    for i in range(3):                                   # three older finished runs and one unfinished
        old = runs / f"20200101-00000{i}-000000"
        old.mkdir(parents=True)
        (old / "recap.json").write_text("{}")
    (runs / "20200101-000009-000000").mkdir()
    result = run_playbook(PlaybookRequest(playbook=str(playbook), inventory="localhost,", forks=1), state)
    assert result.status == "successful", result
    recorded = list((Path(result.run_dir) / "artifacts").rglob("command"))
    assert recorded
    text = "".join(p.read_text() for p in Path(result.run_dir).rglob("*") if p.is_file())
    assert "do-not-leak-4711" not in text
    env = json.loads(recorded[0].read_text())["env"]
    assert "MCTL_TEST_SECRET" not in env and env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    left = sorted(p.name for p in runs.iterdir())
    # Two kept (the newest: this run and the unfinished one, which is also too young to prune).
    assert left == ["20200101-000009-000000", Path(result.run_dir).name]


@pytest.mark.parametrize("value", ["many", "-1", "1.5", "2e3"])
def test_keep_runs_setting_is_checked_before_anything_runs(monkeypatch, tmp_path, value):
    from mctl.ansible.runner import PlaybookRequest, prune_runs, run_playbook

    monkeypatch.setenv("MCTL_KEEP_RUNS", value)
    with pytest.raises(UsageError, match="MCTL_KEEP_RUNS"):
        prune_runs(tmp_path)
    with pytest.raises(UsageError, match="MCTL_KEEP_RUNS"):
        run_playbook(PlaybookRequest(playbook="site", inventory="localhost,"), tmp_path / "state")
    assert not (tmp_path / "state").exists()


def test_prune_keeps_the_newest_and_unfinished_young_runs(tmp_path):
    from mctl.ansible.runner import prune_runs

    runs = tmp_path / "provision" / "runs"
    names = [f"20260101-00000{i}-000000" for i in range(6)]
    for i, name in enumerate(names):
        (runs / name).mkdir(parents=True)
        if i != 1:
            (runs / name / "recap.json").write_text("{}")
    removed = prune_runs(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == [names[0], names[2], names[3]]
    assert sorted(p.name for p in runs.iterdir()) == [names[1], names[4], names[5]]
    assert prune_runs(tmp_path, keep=0) == []


# ------------------------------------------------------------------ read_json itself

@pytest.mark.parametrize("raw,expect,needle", [
    (b"\xff", dict, "not UTF-8"), (b"", dict, "not valid JSON"), (b"[]", dict, "must be an object"),
    (b"{}", list, "must be an array"), (_deep().encode(), None, "nested too deeply"),
], ids=["binary", "empty", "array-for-object", "object-for-array", "deep"])
def test_read_json_names_damage(tmp_path, raw, expect, needle):
    path = tmp_path / "f.json"
    path.write_bytes(raw)
    with pytest.raises(DamagedState) as err:
        read_json(path, expect=expect)
    assert str(path) in err.value.message and needle in err.value.message and err.value.exit_code == 2



def test_markup_in_tray_and_rack_names_on_the_watch_screen():
    """The live screen draws tray and rack names as panel titles: data, never markup."""
    import time as _time

    from rich.console import Console

    from mctl.health.breaker import BreakerState
    from mctl.health.sweep import SweepResult
    from mctl.model.tray import TrayFacts
    from mctl.health.record import TrayVerdict
    from mctl.model.drain import NodeView
    from mctl.cli.health_screen import WatchScreen
    from mctl.health.watch import WatchView
    from mctl.model.findings import Severity

    rack, hosts = "[/rack]", ["[bold]t1", "t2[/]"]
    verdicts = [TrayVerdict(h, rack, "ok", Severity.OK) for h in hosts]
    result = SweepResult(1, _time.time(), 0.1, {h: TrayFacts(h, elapsed=0.1) for h in hosts}, [], verdicts,
                         {h: NodeView(h, state="IDLE", reason="[/reason]") for h in hosts}, "slurm",
                         remediate=False, logged=[], breaker=BreakerState(), records={})
    view = WatchView(site="[/site]", racks={rack: hosts}, interval=2, remediate=False, dry_run=False)
    view.statuses = {h: "healthy" for h in hosts}
    view.last = result
    con = Console(width=160, height=40, record=True, color_system=None, force_terminal=True)
    con.print(WatchScreen(view))
    text = con.export_text()
    assert "[/rack]" in text and "[/site]" in text


def test_known_hosts_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from mctl.transport.known_hosts import KnownHosts

    path = tmp_path / "known_hosts"
    path.write_bytes(b"good ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\nbad ssh-ed25519 \xff\xfe\n")
    with pytest.raises(UsageError) as err:
        KnownHosts.load(path)
    assert f"{path}:2: not UTF-8" in err.value.message and "mctl ssh trust" in err.value.hint
