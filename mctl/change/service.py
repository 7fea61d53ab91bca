"""The one conductor of a partition change: plan, the jobs rule, the journaled run, the result.

    execute(site, request, state_dir, ui) -> ChangeResult

Every partition command (`mctl partition create|apply|delete|isolate|restore`, `apply --resume`)
and the health watch's isolation run through here, in the same order:

1. the rack's lock (reentrant: `health check --remediate` holds its racks' locks already; a dry
   run locks nothing and names a rack someone else holds);
2. the command's own plan (mctl.change.commands: the inventory edit and the NMX-M plan), then the
   cross-layer plan with the work on the trays it touches (mctl.change.plan), both shown through
   the UI;
3. the jobs rule (mctl.fabric.change.decide): no work, go; work and no consent, refused with the
   jobs named; --drain holds the trays in Slurm (mctl.sched.slurm.holds) and waits for the jobs;
   --force says what breaks and asks through the UI (the watch's UI never confirms);
4. the change on every layer, journaled and rolled back (mctl.change.run), or the `--no-apply` /
   `--nmx-only` paths where the command asks for them;
5. the result: the document `--json` prints, the error to raise, the line to close with.

The service prints nothing: the UI shows, the caller renders the result.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from mctl.change import commands as cmds
from mctl.change.plan import busy_trays, change_plan
from mctl.change.request import ChangeRequest
from mctl.change.ui import ChangeUI
from mctl.errors import MctlError, PartialFailure, UsageError

if TYPE_CHECKING:
    from mctl.change.run import ChangeRun
    from mctl.model.change import ChangePlan
    from mctl.model.fabric import PartitionPlan
    from mctl.model.site import Partition, Rack, Site

DEFAULT_WAIT = 600.0                # --drain's default wait for the jobs on the held trays, seconds


@dataclass
class ChangeResult:
    """What a change ended with: the --json document (None: the command prints none), the error to raise
    after it (None: success), the closing line for a person, and the journaled run if one ran."""

    document: dict[str, Any] | None = None
    error: MctlError | None = None
    done: str | None = None
    run: "ChangeRun | None" = None
    after: tuple["Partition", ...] = ()         # the rack's partitions once the change succeeded


class WorkRefused(UsageError):
    """The jobs rule refused the change: work runs on the trays it touches and no consent was given."""

    def __init__(self, message: str, *, hint: str | None, plan: "ChangePlan"):
        super().__init__(message, hint=hint)
        self.plan = plan


def execute(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI | None = None, *,
            purpose: str | None = None) -> ChangeResult:
    """Run *req*; the result (never printed here). Errors before the change starts are raised.
    *purpose* names who holds the rack's lock meanwhile (default: the command, "mctl partition ...")."""
    ui = ui or ChangeUI()
    conduct = {"create": _create, "apply": _apply, "delete": _delete, "isolate": _isolate, "restore": _restore,
               "resume": _resume}[req.command]
    return conduct(site, req, Path(state_dir), ui, purpose)


# ------------------------------------------------------------------ racks and locks

def rack_of(site: "Site", name: str) -> "Rack":
    if name not in site.racks:
        raise UsageError(f"unknown rack {name!r}", hint=f"known racks: {', '.join(site.racks)}")
    return site.racks[name]


def rack_of_tray(site: "Site", tray: str) -> "Rack":
    for r in site.racks.values():
        if tray in {h.name for h in r.compute}:
            return r
    raise UsageError(f"unknown compute tray {tray!r}", hint="see 'mctl inventory show'")


@contextlib.contextmanager
def rack_lock(state_dir: Path, rack: str, purpose: str, *, dry_run: bool = False,
              ui: ChangeUI | None = None) -> Iterator[None]:
    """The rack's lock for the change (rack_lock_at); a dry run takes none and names the holder, because
    the plan it shows may be out of date when they finish."""
    from mctl.state.lock import describe_holder, lock_holder, rack_lock_path

    path = rack_lock_path(state_dir, rack)
    if dry_run:
        holder = lock_holder(path)
        if holder and ui is not None:
            ui.warn(f"rack {rack} is locked {describe_holder(holder)}; this dry run shows the state before that "
                    "command finishes")
        yield
        return
    with rack_lock_at(path, rack, purpose):
        yield


@contextlib.contextmanager
def rack_lock_at(path: Path, rack: str, purpose: str = "mctl partition change") -> Iterator[None]:
    """The rack's lock at *path*. Already this process's (`health check --remediate` holds its racks' locks
    for the whole command) is enough; someone else's: LockBusy."""
    from mctl.state.lock import LockBusy, file_lock

    stack = contextlib.ExitStack()
    try:
        stack.enter_context(file_lock(path, purpose=purpose, label=f"rack {rack}"))
    except LockBusy as exc:
        if exc.holder.get("pid") != os.getpid():
            raise
    with stack:
        yield


# ------------------------------------------------------------------ the jobs rule

def _named(cp: "ChangePlan") -> str:
    return "; ".join(w.describe() for w in cp.work) or f"unknown ({cp.work_error})"


def gate(site: "Site", cp: "ChangePlan", req: ChangeRequest, ui: ChangeUI) -> list[str]:
    """Apply the jobs rule; the trays held in Slurm for the change (released once it is done)."""
    from mctl.fabric.change import DRAIN, FORCE, GO, decide
    from mctl.model.site import fold

    verdict = decide(cp, drain=req.drain, force=req.force)
    if verdict == GO:
        return []
    trays = fold(cp.affected)
    k8s = cp.scheduler == "k8s"
    if req.dry_run:
        word = {DRAIN: (f"would cordon {trays} and evict their GPU pods (their PodDisruptionBudgets asked)" if k8s
                        else f"would hold {trays} in Slurm and wait for the jobs"),
                FORCE: "would delete the pods named" if k8s else "would break the work named",
                }.get(verdict, "would be refused (--drain or --force)")
        ui.note(f"  the change {word}")
        return []
    if verdict == FORCE:
        what = _named(cp)
        ui.warn(f"--force: the change of {trays} breaks what runs there: {what} (their NVLink partition and "
                "IMEX domain change under them" + ("; the pods are deleted, their PodDisruptionBudgets not asked)"
                                                   if k8s and cp.work_known else ")"))
        if not ui.confirm(cp, what):
            raise UsageError("not confirmed; nothing was changed")
        return force_for_change(site, cp, ui) if k8s else []
    if verdict != DRAIN:
        hint = ("wait for them to end, or give --drain [--wait SECONDS] to hold the trays and wait, or --force to "
                "break them" if cp.work_known else "fix the scheduler's answer, or give --force")
        raise WorkRefused(f"rack {cp.rack}: the change touches trays with running work: {_named(cp)}; "
                          "nothing was changed", hint=hint, plan=cp)
    seconds = DEFAULT_WAIT if req.wait is None else req.wait
    on_held = lambda held, refused: ui.held(held, refused, busy_trays(cp), seconds)      # noqa: E731
    if k8s:
        return evict_for_change(site, cp, seconds, on_held=on_held)
    return hold_for_change(site, cp, seconds, on_held=on_held)


FORCE_WAIT = 120.0          # --force on Kubernetes: s for the deleted pods to be gone before the change goes on


def _cordon(site: "Site", cp: "ChangePlan", client) -> tuple[list[str], dict[str, str]]:
    """Cordon the change's trays (all or nothing: a Kubernetes API that keeps failing uncordons those done)."""
    import time

    from mctl.sched.k8s import evict

    reason = evict.change_reason(cp.rack)
    deadline = time.monotonic() + evict.HOLD_WAIT
    try:
        held, refused = evict.hold_nodes(client, list(cp.affected), reason, f"mctl partition change of {cp.rack}",
                                         deadline=deadline)
    except MctlError:
        evict.release_nodes(client, list(cp.affected), reason, deadline=time.monotonic() + evict.HOLD_WAIT)
        raise
    return held, refused


def evict_for_change(site: "Site", cp: "ChangePlan", wait: float, *,
                     on_held: Callable[[list[str], dict[str, str]], None] | None = None) -> list[str]:
    """Kubernetes --drain: cordon the affected nodes, evict their GPU pods through the Eviction API (their
    PodDisruptionBudgets asked) and wait until they are gone, all within *wait* seconds; the nodes cordoned.

    When the pods cannot all be evicted by then (a budget that keeps refusing, an API server that keeps
    failing), the cordons are lifted again and the error names what held it: the change stops before any
    layer changed (the pods evicted already are said)."""
    import time

    from mctl.sched.k8s import evict

    client = evict.client_for(site)
    held, refused = _cordon(site, cp, client)
    if on_held is not None:
        on_held(held, refused)
    try:
        evict.evict_pods(client, list(cp.affected), wait)
    except MctlError as exc:
        left = evict.release_nodes(client, held, evict.change_reason(cp.rack),
                                   deadline=time.monotonic() + evict.HOLD_WAIT)
        exc.message = f"rack {cp.rack}: {exc.message}; nothing was changed, and " + (
            f"{', '.join(left)} could not be uncordoned: {'; '.join(left.values())}" if left else
            "the cordons are lifted again")
        if left:
            exc.hint = (exc.hint or "") + "; uncordon them: " + evict.uncordon_command(list(left))
        raise
    return held


def force_for_change(site: "Site", cp: "ChangePlan", ui: ChangeUI) -> list[str]:
    """Kubernetes --force (confirmed): cordon the affected nodes and delete their GPU pods, no budget asked; the
    nodes cordoned. Pods not gone within FORCE_WAIT are said, and the change goes on."""
    from mctl.sched.k8s import evict

    client = evict.client_for(site)
    held, refused = _cordon(site, cp, client)
    ui.held(held, refused, busy_trays(cp), FORCE_WAIT)
    done = evict.delete_pods(client, list(cp.affected), FORCE_WAIT)
    if done.evicted:
        ui.note(f"  deleted {', '.join(w.id for w in done.evicted)}")
    if done.terminating:
        ui.warn("still terminating, the change goes on: " + "; ".join(w.describe() for w in done.terminating))
    if done.left:
        ui.warn("left (DaemonSet pods, put back by their controller): " + "; ".join(w.describe() for w in done.left))
    return held


def hold_for_change(site: "Site", cp: "ChangePlan", wait: float, *,
                    on_held: Callable[[list[str], dict[str, str]], None] | None = None) -> list[str]:
    """Hold the affected trays in Slurm and wait up to *wait* seconds for their jobs; the trays held.

    on_held is told the trays held and {tray: why not} for those mctl does not hold, before the
    wait. Raises PartialFailure when jobs still run at the deadline (the trays stay held).
    """
    from mctl.model.site import fold
    from mctl.sched.slurm import holds
    from mctl.sched.work import wait_for_jobs

    held, refused = holds.hold_within_budget(site, list(cp.affected), holds.PARTITION_CHANGE,
                                             holds.change_reason(cp.rack))
    if on_held is not None:
        on_held(held, refused)
    left = wait_for_jobs(site, list(cp.affected), wait)
    if left:
        raise PartialFailure(f"rack {cp.rack}: the jobs on the trays did not end within {wait:g}s: "
                             f"{'; '.join(w.describe() for w in left)}; nothing was changed, and "
                             f"{fold(held) if held else 'no tray'} stay held (reason '{holds.HOLD_PREFIX} ...')",
                             hint="run the same command again (with --drain) to go on waiting, or release the trays: "
                                  + (holds.release_command(held) if held else "nothing to release"))
    return held


def release_held(site: "Site", held: Sequence[str], ui: ChangeUI) -> None:
    """Resume the trays held for the change; PartialFailure naming those that could not be."""
    from mctl.model.site import fold
    from mctl.sched.slurm import holds

    if not held:
        return
    if site.scheduler is not None and site.scheduler.type == "k8s":
        from mctl.sched.k8s import evict

        rack = site.host(held[0]).rack if site.host(held[0]) is not None else ""
        failed = evict.release(site, held, evict.change_reason(rack))
        command = evict.uncordon_command(list(failed))
    else:
        failed = holds.release(site, held, holds.PARTITION_CHANGE)
        command = holds.release_command(list(failed))
    if failed:
        raise PartialFailure(f"the change is done but {fold(failed)} could not be released: "
                             + "; ".join(f"{t}: {w}" for t, w in failed.items()), hint=command)
    ui.released(held)


def held_hint(held: Sequence[str]) -> str:
    """What an error's hint adds when trays stay held in Slurm."""
    from mctl.sched.slurm.holds import release_command

    return f"; {', '.join(held)} stay held in Slurm: once fixed run the command again, or release them: " \
           f"{release_command(held)}" if held else ""


def _with_held_hint(held: Sequence[str], work: Callable[[], Any]) -> Any:
    try:
        return work()
    except MctlError as exc:
        exc.hint = (exc.hint or "") + held_hint(held)
        raise


def steps_of(cp: "ChangePlan", *, has_nmx: bool, record: bool) -> list[dict]:
    """The steps of the change in their order, each with why it does not apply (None: it does); for --json."""
    from mctl.fabric.change import plan_steps

    return [{"step": s, "title": t, "applies": why is None, "not_applicable": why}
            for s, t, why in plan_steps(cp, has_nmx=has_nmx, record=record)]


# ------------------------------------------------------------------ the journaled run

def _journaled(site: "Site", r: "Rack", command: str, after: Sequence["Partition"], nmx_plan: "PartitionPlan | None",
               held: Sequence[str], state_dir: Path, ui: ChangeUI, **kw: Any) -> "ChangeRun":
    """Run the change across every layer (mctl.change.run); the run, its error not raised."""
    from mctl.change.run import ChangeSpec, run_change
    from mctl.fabric.change import before_from_plan

    spec = ChangeSpec.of(r.name, command, before_from_plan(r, nmx_plan), tuple(after), held=tuple(held), **kw)
    ui.starting(spec)
    return run_change(site, spec, state_dir, report=ui)


def _steps_printer(ui: ChangeUI, total: int) -> Callable:
    return lambda number, change: ui.nmx_step(number, total, change)


# ------------------------------------------------------------------ create

def _create(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
            purpose: str | None) -> ChangeResult:
    r = rack_of(site, req.rack or "")
    with rack_lock(state_dir, r.name, purpose or "mctl partition create", dry_run=req.dry_run, ui=ui):
        trays = req.trays
        if req.gpus:
            whole = cmds.whole_trays(site, r, req.name or "", req.gpus, gpu_granularity=req.gpu_granularity)
            if whole is None:
                return _create_gpu_partition(site, r, req, ui)
            trays = whole                   # whole trays after all: an ordinary, recorded partition
        op = cmds.plan_create(site, r, name=req.name, template=req.template, trays=trays, no_apply=req.no_apply,
                              dry_run=req.dry_run)
        for w in op.warnings:
            ui.warn(w)
        before = "; ".join(f"{p.name}={p.nodeset}" for p in op.before) or "none (default partition)"
        after = "; ".join(f"{p.name}={p.nodeset}" for p in op.partitions)
        ui.note(f"rack {r.name} partitions in {op.edit.path}: {before} -> {after}" if op.edit.changed
                else f"rack {r.name}: the inventory already declares {after}")
        if r.nmx is None and not req.no_apply:
            ui.caution(f"rack {r.name} has no NMX-Manager endpoint: recorded in the inventory only")
        held: list[str] = []
        total = 0
        if op.apply:
            try:
                plan = cmds.plan_create_on_nmx(site, op, kind=req.kind,
                                               on_plan=lambda p: ui.plan(r, p, dry_run=req.dry_run))
                total = len(plan.changes)
                op.change = change_plan(site, r, op.partitions, op.plan)
                ui.change(op.change, dry_run=req.dry_run, record=True)
                held = gate(site, op.change, req, ui)
            except MctlError as exc:
                return ChangeResult(op.to_dict(error=exc.message), exc)
        if req.dry_run:
            out = op.to_dict()
            if op.change is not None:
                out["steps"] = steps_of(op.change, has_nmx=True, record=True)
            return ChangeResult(out)
        if not op.apply:                    # --no-apply, or no NMX-M endpoint: the inventory only
            cmds.record_create(op)
            return ChangeResult(op.to_dict())
        if req.nmx_only:                    # as before issue 18: the inventory, then NMX-M
            cmds.record_create(op)
            try:
                _with_held_hint(held, lambda: cmds.apply_create(op, on_step=_steps_printer(ui, total)))
            except MctlError as exc:
                return ChangeResult(op.to_dict(error=exc.message), exc)
            release_held(site, held, ui)
            return ChangeResult(op.to_dict(), done=f"rack {r.name}: partitions applied on NMX-M (--nmx-only: IMEX, "
                                                   "Slurm and labels not changed)")
        if not op.edit.changed and op.change is not None and op.change.empty:
            op.applied = True
            return ChangeResult(op.to_dict(), done=f"rack {r.name}: every layer holds these partitions already")
        run = _journaled(site, r, "create", op.partitions, op.plan, held, state_dir, ui, record=True, kind=req.kind)
        op.applied = run.error is None
        return ChangeResult({**op.to_dict(error=run.error.message if run.error else None), "run": run.to_dict()},
                            run.error, f"rack {r.name}: partitions applied on every layer", run, tuple(op.partitions))


def _create_gpu_partition(site: "Site", r: "Rack", req: ChangeRequest, ui: ChangeUI) -> ChangeResult:
    op = cmds.check_gpu_partition(site, r, req.name or "", req.gpus, no_apply=req.no_apply, dry_run=req.dry_run)
    for w in op.warnings:
        ui.warn(w)
    ui.warn(f"partition {req.name!r} is created on NMX-M only: it is not recorded in the inventory, and IMEX domains "
            "and Slurm blocks are derived from whole trays")
    plan = cmds.plan_gpu_partition(site, op, kind=req.kind)
    ui.plan(r, plan, dry_run=req.dry_run)
    if not req.dry_run:
        cmds.commit_gpu_partition(op, on_step=_steps_printer(ui, len(plan.changes)))
    return ChangeResult(op.to_dict())


# ------------------------------------------------------------------ apply

def _apply(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
           purpose: str | None) -> ChangeResult:
    from mctl.fabric.partitions import desired_from_rack, validate_desired

    racks = [rack_of(site, req.rack)] if req.rack else [r for r in site.racks.values() if r.nmx is not None]
    if req.rack and racks[0].nmx is None:
        raise UsageError(f"rack {req.rack} has no NMX-Manager endpoint",
                         hint=f"add racks.{req.rack}.nmx with url and credentials_file to the inventory")
    if not racks:
        raise UsageError("no rack has an NMX-Manager endpoint", hint="add racks.<rack>.nmx to the inventory")
    out = []
    failures: list[str] = []
    for r in racks:
        desired = desired_from_rack(r)
        validate_desired(r, desired, site=site)
        try:
            with contextlib.nullcontext() if req.dry_run else rack_lock(state_dir, r.name, purpose or "partition apply"):
                op = cmds.plan_apply(site, r, desired, prune=req.prune, kind=req.kind,
                                     on_plan=lambda p, r=r: ui.plan(r, p, dry_run=req.dry_run))
                op.change = change_plan(site, r, r.partitions, op.plan)
                ui.change(op.change, dry_run=req.dry_run)
                held = gate(site, op.change, req, ui)
                entry = op.to_dict()
                entry["steps"] = steps_of(op.change, has_nmx=True, record=False)
                if not req.dry_run and op.change.empty:
                    op.applied = True
                elif not req.dry_run and req.nmx_only:
                    _with_held_hint(held, lambda: cmds.commit_apply(op, on_step=_steps_printer(
                        ui, len(op.plan.changes))))
                    release_held(site, held, ui)
                    entry = op.to_dict()
                elif not req.dry_run:
                    run = _journaled(site, r, "apply", r.partitions, op.plan, held, state_dir, ui, prune=req.prune,
                                     kind=req.kind)
                    op.applied = run.error is None
                    entry = {**op.to_dict(), "run": run.to_dict()}
                    if run.error is not None:
                        if len(racks) == 1:
                            return ChangeResult({"dry_run": req.dry_run, "racks": [entry]}, run.error, run=run)
                        raise run.error
            out.append(entry)
        except MctlError as exc:
            if len(racks) == 1:
                raise
            failures.append(f"{r.name}: {exc.message}")
            out.append({"rack": r.name, "error": exc.message, "applied": False})
            ui.warn(f"rack {r.name}: {exc.message}")
    error = PartialFailure(f"{len(failures)} of {len(racks)} racks failed: {'; '.join(failures)}") if failures else None
    return ChangeResult({"dry_run": req.dry_run, "racks": out}, error)


# ------------------------------------------------------------------ delete

def _delete(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
            purpose: str | None) -> ChangeResult:
    r = rack_of(site, req.rack or "")
    name = req.name or ""
    with rack_lock(state_dir, r.name, purpose or "mctl partition delete", dry_run=req.dry_run, ui=ui):
        op = cmds.plan_delete(site, r, name, no_apply=req.no_apply, dry_run=req.dry_run)
        if op.edit is not None:
            ui.note(f"rack {r.name}: {'would remove' if req.dry_run else 'removing'} partition {name} from "
                    f"{op.edit.path}")
        if op.plan is not None:
            ui.plan(r, op.plan, dry_run=req.dry_run)
        elif op.asked_nmx:
            ui.note(f"rack {r.name}: NMX-M holds no partition {name!r}")
        held: list[str] = []
        steps = None
        if not req.no_apply:
            op.change = change_plan(site, r, op.after, op.plan)
            ui.change(op.change, dry_run=req.dry_run, has_nmx=r.nmx is not None, record=op.edit is not None)
            steps = steps_of(op.change, has_nmx=r.nmx is not None, record=op.edit is not None)
            held = gate(site, op.change, req, ui)
        if req.dry_run:
            return ChangeResult({**op.to_dict(), "steps": steps})
        if req.nmx_only:                    # as before issue 18: the inventory, then NMX-M
            total = len(op.plan.changes) if op.plan else 0
            _with_held_hint(held, lambda: cmds.commit_delete(op, on_step=_steps_printer(ui, total)))
            release_held(site, held, ui)
            return ChangeResult(op.to_dict())
        if req.no_apply or r.nmx is None:   # the inventory only
            cmds.commit_delete(op)
            return ChangeResult(op.to_dict())
        run = _journaled(site, r, "delete", op.after, op.plan, held, state_dir, ui, record=op.edit is not None,
                         remove=(name,))
        return ChangeResult({**op.to_dict(), "steps": steps, "run": run.to_dict()}, run.error, run=run,
                            after=tuple(op.after))


# ------------------------------------------------------------------ around a failed tray

def tray_drained(site: "Site", tray: str) -> str | None:
    """None when Slurm has the tray drained or down (or the site runs no Slurm); else its state."""
    from mctl.sched.slurm.control import controller_run
    from mctl.sched.slurm.drain import read_nodes, show_node_command

    if site.scheduler is None or site.scheduler.type != "slurm":
        return None
    views, _ = read_nodes(controller_run(site, show_node_command([tray])).stdout)
    v = views.get(tray)
    if v is None:
        return "unknown to Slurm"
    return None if (v.drained or v.down) else (v.state or "not drained")


def _isolate(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
             purpose: str | None) -> ChangeResult:
    from mctl.fabric.change import isolate_partitions

    tray = req.tray or ""
    r = rack_of_tray(site, tray)
    after = isolate_partitions(r, tray, to=req.to)
    with rack_lock(state_dir, r.name, purpose or "mctl partition isolate", dry_run=req.dry_run, ui=ui):
        state = tray_drained(site, tray)
        if state is not None:
            raise UsageError(f"{tray} is {state} in Slurm: isolate moves a drained tray",
                             hint=f"drain it first: scontrol update NodeName={tray} State=DRAIN Reason='...'")
        return _tray_change(site, r, tray, after, "isolate", req, state_dir, ui, tolerate=(tray,))


def _restore(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
             purpose: str | None) -> ChangeResult:
    from mctl.change.run import last_isolation, read_cliques
    from mctl.fabric.change import restore_partitions

    tray = req.tray or ""
    r = rack_of_tray(site, tray)
    with rack_lock(state_dir, r.name, purpose or "mctl partition restore", dry_run=req.dry_run, ui=ui):
        after = restore_partitions(r, tray, last_isolation(state_dir, r.name, tray))
        _, errors = read_cliques(site, [h for h in r.compute if h.name == tray])
        if errors:
            raise UsageError(f"{tray} is not healthy enough to go back: {errors[tray]}",
                             hint="fix it first; 'mctl health check " + tray + "' says more")
        return _tray_change(site, r, tray, after, "restore", req, state_dir, ui, tolerate=())


def _tray_change(site: "Site", r: "Rack", tray: str, after, command: str, req: ChangeRequest, state_dir: Path,
                 ui: ChangeUI, *, tolerate: tuple[str, ...]) -> ChangeResult:
    from mctl.fabric.partitions import validate_desired
    from mctl.fabric.service import plan_partitions_for
    from mctl.model.fabric import DesiredPartition

    desired = [DesiredPartition(p.name, r.name, tuple(p.trays)) for p in after]
    for w in validate_desired(r, desired, site=site):
        ui.warn(w)
    before = "; ".join(f"{p.name}={p.nodeset}" for p in r.partitions) or "none (default partition)"
    ui.note(f"rack {r.name}: {command} {tray}: {before} -> " + "; ".join(f"{p.name}={p.nodeset}" for p in after))
    plan = None
    if r.nmx is not None:
        _, plan = plan_partitions_for(site, r, desired)
        ui.plan(r, plan, dry_run=req.dry_run)
    cp = change_plan(site, r, after, plan)
    ui.change(cp, dry_run=req.dry_run, has_nmx=r.nmx is not None, record=True)
    out = {"rack": r.name, "tray": tray, "command": command, "dry_run": req.dry_run,
           "partitions": [{"name": p.name, "trays": str(p.nodeset)} for p in after],
           "plan": plan.to_dict() if plan else None, "change": cp.to_dict(),
           "steps": steps_of(cp, has_nmx=r.nmx is not None, record=True)}
    held = gate(site, cp, req, ui)
    if req.dry_run:
        return ChangeResult(out)
    run = _journaled(site, r, command, after, plan, held, state_dir, ui, record=True, tolerate=tolerate, tray=tray)
    return ChangeResult({**out, "run": run.to_dict()}, run.error,
                        f"rack {r.name}: {tray} {'isolated' if command == 'isolate' else 'restored'} on every layer",
                        run, tuple(after))


# ------------------------------------------------------------------ resume

def _resume(site: "Site", req: ChangeRequest, state_dir: Path, ui: ChangeUI,
            purpose: str | None) -> ChangeResult:
    from mctl.change.run import last_change, resume_change

    r = rack_of(site, req.rack or "")
    with rack_lock(state_dir, r.name, purpose or "mctl partition apply --resume"):
        last = last_change(state_dir, r.name)
        run = resume_change(site, r.name, state_dir, report=ui)
    return ChangeResult({"rack": r.name, "resumed": True, "run": run.to_dict()}, run.error,
                        f"rack {r.name}: partition change {run.journal.run_id} finished"
                        + (f" (was {last.status})" if last is not None else ""), run)
