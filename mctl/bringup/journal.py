"""The journal of one bring-up run: what each phase did, written atomically after every change.

`<state>/bringup/<rack>/<run-id>/journal.json` is rewritten (temp file + rename)
whenever a phase starts or ends, so after a crash or `kill -9` it still says
which phases finished, with their results and artifacts; `--resume` continues
from the first phase that did not. Nothing else decides what is done: a phase
marked done is never run again by a resume.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mctl.errors import UsageError
from mctl.state.files import DamagedState, check_shape, ensure_dir, read_json, write_json

SCHEMA = 1
# Phase states. "excluded": outside --from/--until of the run; never run by it or its resumes.
PENDING, RUNNING, DONE, SKIPPED, FAILED, INTERRUPTED, EXCLUDED = (
    "pending", "running", "done", "skipped", "failed", "interrupted", "excluded")
FINISHED = (DONE, SKIPPED, EXCLUDED)
# Run states. A run found "running" whose process is gone was killed (kill -9, power cut).
RUN_RUNNING, RUN_SUCCEEDED, RUN_FAILED, RUN_INTERRUPTED = "running", "succeeded", "failed", "interrupted"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def runs_dir(state_dir: Path, rack: str, folder: str = "bringup") -> Path:
    if not _SAFE.fullmatch(rack):
        raise UsageError(f"rack name {rack!r} cannot be used as a folder name")
    return Path(state_dir) / folder / rack


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _pid_alive(pid: int | None, host: str | None) -> bool:
    if not pid or host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_OPT_STR = (str, type(None))
_OPT_NUM = (int, float, type(None))
_PHASE_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "status": (str,), "started": _OPT_NUM, "ended": _OPT_NUM, "summary": _OPT_STR,
    "changed": (bool,), "details": (list,), "artifacts": (dict,), "error": (dict, type(None)), "history": (list,),
}


def check_journal_shape(path: Path, data: dict[str, Any]) -> None:
    """The fields a bring-up reads and rewrites have the types it writes; else DamagedState naming the field."""
    for key, types in (("run_id", (str,)), ("rack", (str,)), ("status", (str,)), ("options", (dict, type(None))),
                       ("attempts", (list, type(None))), ("phases", (list,)), ("created", _OPT_NUM),
                       ("updated", _OPT_NUM), ("result", (dict, type(None)))):
        check_shape(path, data.get(key), types, key)
    if not _SAFE.fullmatch(data["run_id"]):
        raise DamagedState(path, f"run_id {data['run_id']!r} is not a run id")
    options = data.get("options") or {}
    names = [p.get("name") for p in data["phases"] if isinstance(p, dict)]
    for key, types in (("from", _OPT_STR), ("until", _OPT_STR), ("accept", (list, type(None))),
                       ("trust_new_keys", (bool, type(None))), ("reprovision", (bool, type(None))),
                       ("burn_in", _OPT_STR), ("imex_wait", _OPT_NUM)):
        check_shape(path, options.get(key), types, f"options.{key}")
    for key in ("from", "until"):
        if options.get(key) is not None and options[key] not in names:
            raise DamagedState(path, f"options.{key} {options[key]!r} is not a phase of this run")
    for i, item in enumerate(options.get("accept") or []):
        check_shape(path, item, str, f"options.accept[{i}]")
    for i, attempt in enumerate(data.get("attempts") or []):
        check_shape(path, attempt, dict, f"attempts[{i}]")
        check_shape(path, attempt.get("pid"), (int, type(None)), f"attempts[{i}].pid")
        check_shape(path, attempt.get("host"), _OPT_STR, f"attempts[{i}].host")
    for i, phase in enumerate(data["phases"]):
        check_shape(path, phase, dict, f"phases[{i}]")
        for key, types in _PHASE_TYPES.items():
            if key in phase or key in ("name", "status", "details", "artifacts"):
                check_shape(path, phase.get(key), types, f"phases[{i}].{key}")
        if phase["status"] not in (PENDING, RUNNING, DONE, SKIPPED, FAILED, INTERRUPTED, EXCLUDED):
            raise DamagedState(path, f"phases[{i}].status {phase['status']!r} is not a phase state")


@dataclass
class Journal:
    path: Path
    data: dict[str, Any]

    # What the journal records: a bring-up here; a partition change (mctl.change.run) reuses the
    # class with its own kind and folder (<state>/<FOLDER>/<rack>/<run-id>/journal.json).
    KIND = "bringup"
    FOLDER = "bringup"
    LABEL = "bring-up"

    # --- creation and lookup --------------------------------------------------------------

    @classmethod
    def create(cls, state_dir: Path, site: str, inventory: str, rack: str, phases: list[str],
               selected: list[str], options: dict[str, Any]) -> "Journal":
        run_id = new_run_id()
        folder = ensure_dir(runs_dir(state_dir, rack, cls.FOLDER) / run_id)
        now = time.time()
        data = {
            "schema": SCHEMA, "kind": cls.KIND, "site": site, "inventory": inventory, "rack": rack,
            "run_id": run_id, "status": RUN_RUNNING, "created": now, "updated": now,
            "command": " ".join(["mctl", *sys.argv[1:]])[:500], "options": options,
            "attempts": [{"pid": os.getpid(), "host": socket.gethostname(), "started": now}],
            "phases": [{"name": p, "status": PENDING if p in selected else EXCLUDED, "started": None, "ended": None,
                        "summary": None, "changed": False, "details": [], "artifacts": {}, "error": None}
                       for p in phases],
            "result": None,
        }
        journal = cls(folder / "journal.json", data)
        journal.save()
        return journal

    @classmethod
    def load(cls, path: Path) -> "Journal":
        data = read_json(path, expect=dict, what=f"a {cls.LABEL} journal")
        if data.get("kind") != cls.KIND or data.get("schema") != SCHEMA:
            raise DamagedState(path, f"not a {cls.LABEL} journal this mctl reads (kind {data.get('kind')!r}, "
                                     f"schema {data.get('schema')!r}, this mctl reads schema {SCHEMA})")
        check_journal_shape(Path(path), data)
        return cls(Path(path), data)

    @classmethod
    def runs(cls, state_dir: Path, rack: str, *, damaged: list[DamagedState] | None = None) -> list["Journal"]:
        """Every run of the rack, oldest first (run ids sort by time).

        A damaged journal is skipped (never fatal to a new run) and, when *damaged* is given, kept there
        so a resume can refuse to pick an older run behind the operator's back.
        """
        folder = runs_dir(state_dir, rack, cls.FOLDER)
        if not folder.is_dir():
            return []
        out = []
        for p in sorted(folder.glob("*/journal.json")):
            try:
                out.append(cls.load(p))
            except DamagedState as exc:
                if damaged is not None:
                    damaged.append(exc)
            except (UsageError, OSError):
                continue
        return out

    @classmethod
    def latest(cls, state_dir: Path, rack: str) -> "Journal | None":
        runs = cls.runs(state_dir, rack)
        return runs[-1] if runs else None

    @classmethod
    def by_time(cls, runs: list["Journal"]) -> list["Journal"]:
        """Oldest first by creation time (two run ids of one second sort by their random part)."""
        return sorted(runs, key=lambda j: (j.data.get("created") or 0, j.run_id))

    @classmethod
    def to_resume(cls, state_dir: Path, rack: str, *, finished: tuple[str, ...] = (RUN_SUCCEEDED,),
                  none_hint: str, finished_hint: str, damaged_hint: str) -> "Journal":
        """The rack's last run, for a resume: UsageError when there is none, it finished (a status in
        *finished*) or its process still runs; its DamagedState when a newer run's journal is damaged (a
        resume never picks an older run behind the operator's back)."""
        damaged: list[DamagedState] = []
        runs = cls.by_time(cls.runs(Path(state_dir), rack, damaged=damaged))
        last = runs[-1] if runs else None
        if damaged and (last is None or damaged[-1].path.parent.name > last.path.parent.name):
            bad = damaged[-1]
            bad.hint = f"move the run folder {bad.path.parent} aside; {damaged_hint}"
            raise bad
        if last is None:
            raise UsageError(f"no {cls.LABEL} of rack {rack} to resume", hint=none_hint)
        if last.status in finished:
            raise UsageError(f"the last {cls.LABEL} of rack {rack} ({last.run_id}) finished ({last.status}); "
                             "nothing to resume", hint=finished_hint)
        if last.status == RUN_RUNNING:
            raise UsageError(f"the {cls.LABEL} {last.run_id} of rack {rack} is still running (its process is alive)",
                             hint="wait for it to end")
        return last

    # --- reading --------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.data["run_id"]

    @property
    def rack(self) -> str:
        return self.data["rack"]

    @property
    def status(self) -> str:
        """The run's state; a "running" run whose process is gone reads as interrupted."""
        st = self.data["status"]
        if st == RUN_RUNNING:
            last = (self.data.get("attempts") or [{}])[-1]
            if not _pid_alive(last.get("pid"), last.get("host")):
                return RUN_INTERRUPTED
        return st

    @property
    def options(self) -> dict[str, Any]:
        return self.data.get("options") or {}

    def phase(self, name: str) -> dict[str, Any]:
        for p in self.data["phases"]:
            if p["name"] == name:
                return p
        raise KeyError(name)

    def phase_names(self) -> list[str]:
        return [p["name"] for p in self.data["phases"]]

    def next_phase(self) -> str | None:
        """The first phase not completed (the one --resume starts with), or None when all are."""
        for p in self.data["phases"]:
            if p["status"] not in FINISHED:
                return p["name"]
        return None

    def phase_rows(self) -> list[dict[str, Any]]:
        """Every phase as a run's --json document lists it: name, status, summary, seconds, details, error."""
        return [{"step": p["name"], "status": p["status"], "summary": p["summary"], "changed": p["changed"],
                 "seconds": round(p["ended"] - p["started"], 2) if p.get("started") and p.get("ended") else None,
                 "details": p["details"], "error": p["error"]} for p in self.data["phases"]]

    def completed(self) -> list[str]:
        return [p["name"] for p in self.data["phases"] if p["status"] in (DONE, SKIPPED)]

    # --- writing --------------------------------------------------------------------------

    def save(self) -> None:
        self.data["updated"] = time.time()
        write_json(self.path, self.data)

    def attempt(self) -> None:
        """A resume: this process now owns the run. A phase still marked running was killed with its process."""
        for p in self.data["phases"]:
            if p["status"] == RUNNING:
                p.setdefault("history", []).append({"started": p["started"], "ended": None, "status": "killed"})
                p["status"] = INTERRUPTED
        self.data.setdefault("attempts", []).append({"pid": os.getpid(), "host": socket.gethostname(),
                                                     "started": time.time()})
        self.data["status"] = RUN_RUNNING
        self.data["result"] = None
        self.save()

    def start(self, name: str) -> None:
        p = self.phase(name)
        p.setdefault("history", [])
        p.update(status=RUNNING, started=time.time(), ended=None, summary=None, error=None, details=[])
        self.save()

    def note(self, name: str, artifacts: dict[str, Any]) -> None:
        """Artifacts known while the phase still runs (a provisioning run folder), kept if it dies."""
        self.phase(name)["artifacts"].update(artifacts)
        self.save()

    def finish(self, name: str, status: str, summary: str, *, changed: bool = False,
               details: list[str] | None = None, artifacts: dict[str, Any] | None = None,
               error: dict[str, Any] | None = None) -> None:
        p = self.phase(name)
        if p.get("status") == RUNNING and p.get("started"):
            p["history"].append({"started": p["started"], "ended": time.time(), "status": status})
        p.update(status=status, ended=time.time(), summary=summary, changed=changed, details=details or [],
                 error=error)
        p["artifacts"].update(artifacts or {})
        self.save()

    def finish_outcome(self, name: str, outcome: Any) -> None:
        """Record a step's outcome (status, summary, changed, details, artifacts)."""
        self.finish(name, outcome.status, outcome.summary, changed=outcome.changed, details=outcome.details,
                    artifacts=outcome.artifacts)

    def crashed(self, name: str, exc: BaseException) -> None:
        """A step ended by an internal error: the step and the run are marked failed (the caller re-raises)."""
        self.finish(name, FAILED, f"internal error: {exc!r}", error={"message": repr(exc), "hint": None,
                                                                     "exit_code": None})
        self.close(RUN_FAILED)

    def close(self, status: str, result: dict[str, Any] | None = None) -> None:
        self.data["status"] = status
        self.data["result"] = result
        self.save()
