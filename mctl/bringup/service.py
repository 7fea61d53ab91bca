"""`mctl rack bring-up` as a service: run the phases in order under the rack's lock, journalled.

    plan_bring_up(site, rack, state_dir, options) -> list[PlannedPhase]      --dry-run, changes nothing
    bring_up(site, rack, state_dir, options, resume=False, report=None) -> BringUpResult

The journal is written before and after every phase, so a run killed at any
point can be resumed (`resume=True`) from the first phase it did not finish.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mctl.bringup import journal as jr
from mctl.bringup.context import BURN_IN_LEVELS, PHASES, TITLES, Context, Options, PhaseFailed, RackHold, Reporter
from mctl.bringup.journal import Journal
from mctl.errors import EXIT_OK, MctlError, UsageError

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

EXIT_INTERRUPTED = 130


def _rack(site: "Site", name: str) -> "Rack":
    if name not in site.racks:
        raise UsageError(f"unknown rack {name!r}", hint=f"known racks: {', '.join(site.racks) or 'none'}")
    return site.racks[name]


def check_options(options: Options, *, resume: bool = False) -> None:
    for flag, value in (("--from", options.from_phase), ("--until", options.until_phase)):
        if value is not None and value not in PHASES:
            raise UsageError(f"unknown phase {value!r} for {flag}", hint=f"phases, in order: {', '.join(PHASES)}")
    if options.from_phase and options.until_phase and \
            PHASES.index(options.from_phase) > PHASES.index(options.until_phase):
        raise UsageError(f"--from {options.from_phase} comes after --until {options.until_phase}",
                         hint=f"phases, in order: {', '.join(PHASES)}")
    if options.burn_in not in BURN_IN_LEVELS:
        raise UsageError(f"unknown burn-in level {options.burn_in!r}", hint=f"use one of {', '.join(BURN_IN_LEVELS)}")
    if resume and (options.from_phase or options.until_phase):
        raise UsageError("--resume continues the last run with its own phases; it takes no --from/--until",
                         hint="start a new run with --from PHASE instead")


# ------------------------------------------------------------------ dry run

@dataclass
class PlannedPhase:
    name: str
    title: str
    selected: bool
    lines: list[str]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.name, "title": self.title, "selected": self.selected, "plan": self.lines,
                "error": self.error}


def plan_bring_up(site: "Site", rack: str, state_dir: Path, options: Options,
                  report: Reporter | None = None) -> list[PlannedPhase]:
    """What every phase would do, discovered read-only (no lock, no journal, nothing written)."""
    from mctl.bringup.phases import REGISTRY

    check_options(options)
    ctx = Context(site, _rack(site, rack), Path(state_dir), options, report or Reporter())
    selected = options.selected()
    out = []
    for name in PHASES:
        if name not in selected:
            out.append(PlannedPhase(name, TITLES[name], False, ["not run (--from/--until)"]))
            continue
        try:
            out.append(PlannedPhase(name, TITLES[name], True, REGISTRY[name].plan(ctx)))
        except MctlError as exc:
            out.append(PlannedPhase(name, TITLES[name], True, [], error=exc.message + (
                "; earlier phases may change this" if PHASES.index(name) > 0 else "")))
    return out


# ------------------------------------------------------------------ the run

@dataclass
class BringUpResult:
    journal: Journal
    status: str                              # succeeded | failed | interrupted
    exit_code: int
    resumed: bool = False
    failed_phase: str | None = None
    error: MctlError | None = None
    ran: tuple[str, ...] = ()                # phases this invocation ran

    @property
    def already_up(self) -> bool:
        """A full, successful run that found every phase in place: nothing changed."""
        d = self.journal.data
        opts = d.get("options") or {}
        return (self.status == jr.RUN_SUCCEEDED and not self.resumed and not opts.get("from")
                and not opts.get("until") and not any(p.get("changed") for p in d["phases"]))

    def summary(self) -> dict[str, Any]:
        """The rack at the end of the run, from the phases' artifacts."""
        phases = {p["name"]: p for p in self.journal.data["phases"]}

        def art(name: str) -> dict[str, Any]:
            return (phases.get(name) or {}).get("artifacts") or {}

        nodes = art("open").get("nodes") or {}
        health = art("health")
        return {
            "trays": {"total": len(self.rack_trays()), "open": len(nodes.get("open") or []),
                      "states": nodes.get("states") or {}, "drained_by_others": nodes.get("operator") or {}},
            "partitions": art("partitions").get("partitions"),
            "imex_domains": art("imex").get("domains"),
            "scheduler": {"blocks": art("scheduler").get("blocks"), "held": art("scheduler").get("held")},
            "health": {"checks_passed": health.get("checks_passed"), "findings": health.get("findings"),
                       "accepted": health.get("accepted"), "noted": health.get("noted") or []},
            "inventory_snapshot": art("inventory").get("snapshot"),
        }

    def rack_trays(self) -> list[str]:
        nodes = ((next((p for p in self.journal.data["phases"] if p["name"] == "open"), {}).get("artifacts") or {})
                 .get("nodes") or {})
        return sorted(nodes.get("states") or {})

    def to_dict(self) -> dict[str, Any]:
        d = self.journal.data
        return {
            "rack": d["rack"], "site": d["site"], "run_id": d["run_id"], "journal": str(self.journal.path),
            "status": self.status, "exit_code": self.exit_code, "resumed": self.resumed,
            "already_up": self.already_up, "failed_phase": self.failed_phase,
            "error": {"message": self.error.message, "hint": self.error.hint} if self.error else None,
            "ran": list(self.ran),
            "phases": [{"phase": p["name"], "status": p["status"], "summary": p["summary"], "changed": p["changed"],
                        "seconds": round(p["ended"] - p["started"], 1) if p.get("started") and p.get("ended")
                        else None, "details": p["details"], "error": p["error"]} for p in d["phases"]],
            "summary": self.summary(),
        }


def _journal_for(state_dir: Path, site: "Site", rack: str, options: Options, resume: bool,
                 report: Reporter) -> tuple[Journal, Options]:
    if resume:
        damaged: list = []
        runs = Journal.runs(state_dir, rack, damaged=damaged)
        last = runs[-1] if runs else None
        if damaged and (last is None or damaged[-1].path.parent.name > last.path.parent.name):
            # The newest run's journal is damaged: resuming an older run instead would redo or skip phases.
            bad = damaged[-1]
            bad.hint = (f"move the run folder {bad.path.parent} aside and start a new run "
                        f"('mctl rack bring-up {rack}'; it changes only what differs)")
            raise bad
        if last is None:
            raise UsageError(f"no bring-up of rack {rack} to resume", hint=f"start one: mctl rack bring-up {rack}")
        if last.status == jr.RUN_SUCCEEDED:
            raise UsageError(f"the last bring-up of rack {rack} ({last.run_id}) finished; nothing to resume",
                             hint=f"run 'mctl rack bring-up {rack}' again (it changes only what differs)")
        stored = Options.from_dict(last.options)
        # What a resume may add: accepted health exceptions and trusting new keys (the gate's own hints).
        merged = replace(stored, accept=tuple(dict.fromkeys(stored.accept + options.accept)),
                         trust_new_keys=stored.trust_new_keys or options.trust_new_keys)
        last.data["options"] = merged.to_dict()
        last.attempt()
        report.line(f"resuming run {last.run_id} at phase {last.next_phase()} "
                    f"(done: {', '.join(last.completed()) or 'none'})")
        return last, merged
    previous = Journal.latest(state_dir, rack)
    journal = Journal.create(state_dir, site.name, str(site.file), rack, list(PHASES), options.selected(),
                             options.to_dict())
    if previous is not None and previous.status in (jr.RUN_FAILED, jr.RUN_INTERRUPTED):
        journal.data["previous"] = {"run_id": previous.run_id, "status": previous.status,
                                    "stopped_at": previous.next_phase()}
        journal.save()
        report.line(f"note: run {previous.run_id} stopped at {previous.next_phase()} ({previous.status}); "
                    "this is a new run (--resume would have continued that one)")
    return journal, options


def bring_up(site: "Site", rack: str, state_dir: Path, options: Options, *, resume: bool = False,
             report: Reporter | None = None) -> BringUpResult:
    """Run the selected phases (or resume the last run) under the rack's lock; never raises for a failed phase."""
    from mctl.bringup.phases import REGISTRY
    from mctl.state.lock import file_lock

    check_options(options, resume=resume)
    report = report or Reporter()
    state_dir = Path(state_dir)
    r = _rack(site, rack)
    from mctl.state.lock import rack_lock_path

    rack_lock_path(state_dir, rack)         # a rack name that is not a plain file name never becomes a path
    with contextlib.ExitStack() as stack:
        # One bring-up per rack, for the whole run; the rack lock itself is let go while `deploy slurm` runs.
        stack.enter_context(file_lock(state_dir / "locks" / f"bringup-{rack}.lock", purpose="mctl rack bring-up",
                                      label=f"bring-up of rack {rack}"))
        hold = RackHold(state_dir, rack, "mctl rack bring-up")
        hold.acquire()
        stack.callback(hold.release)
        journal, options = _journal_for(state_dir, site, rack, options, resume, report)
        ctx = Context(site, r, state_dir, options, report, run_id=journal.run_id, journal=journal, hold=hold)
        todo = [p for p in journal.phase_names() if journal.phase(p)["status"] not in jr.FINISHED]
        selected = [p for p in journal.phase_names() if journal.phase(p)["status"] != jr.EXCLUDED]
        ran: list[str] = []
        for name in todo:
            index = selected.index(name) + 1
            report.phase_started(index, len(selected), name)
            journal.start(name)
            ran.append(name)
            started = time.monotonic()
            try:
                outcome = REGISTRY[name].run(ctx)
            except KeyboardInterrupt:
                journal.finish(name, jr.INTERRUPTED, "interrupted")
                journal.close(jr.RUN_INTERRUPTED)
                report.phase_ended(name, jr.INTERRUPTED, "interrupted", time.monotonic() - started)
                return BringUpResult(journal, jr.RUN_INTERRUPTED, EXIT_INTERRUPTED, resume, name, None, tuple(ran))
            except MctlError as exc:
                details = exc.details if isinstance(exc, PhaseFailed) else []
                artifacts = exc.artifacts if isinstance(exc, PhaseFailed) else {}
                journal.finish(name, jr.FAILED, exc.message, details=details, artifacts=artifacts,
                               error={"message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code})
                report.phase_ended(name, jr.FAILED, exc.message, time.monotonic() - started)
                result = BringUpResult(journal, jr.RUN_FAILED, exc.exit_code, resume, name, exc, tuple(ran))
                journal.close(jr.RUN_FAILED, result.to_dict())
                return result
            except BaseException as exc:
                journal.crashed(name, exc)
                raise
            journal.finish_outcome(name, outcome)
            report.phase_ended(name, outcome.status, outcome.summary, time.monotonic() - started)
        result = BringUpResult(journal, jr.RUN_SUCCEEDED, EXIT_OK, resume, None, None, tuple(ran))
        journal.close(jr.RUN_SUCCEEDED, result.to_dict())
        return result
