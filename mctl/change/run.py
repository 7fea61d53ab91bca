"""A partition change applied across every layer, journaled and resumable like a bring-up.

    run_change(site, spec, state_dir, report=...) -> ChangeRun        a new change (the caller holds the rack lock)
    resume_change(site, rack, state_dir, report=...) -> ChangeRun     the last unfinished change of the rack

The steps (mctl.fabric.change.STEPS) run in their safe order: hold -> record -> NMX-M ->
the GPUs' cliques -> IMEX files -> IMEX restart -> domains UP -> Slurm topology.conf and
reconfigure -> `scontrol show topology` verified -> Kubernetes labels -> release. The journal
(the bring-up's mctl.bringup.journal.Journal, kind "partition-change", under
<state>/partition-change/<rack>/<run-id>/) is written before and after every step and keeps
the change itself (partitions before and after), so a change killed at any point is finished
by a resume. A step that fails rolls every layer it (or an earlier step) changed back to the
partitions before, in the same order (undo-* steps appended to the journal); when the
rollback cannot finish either, the run stops with the trays held and says which layer holds
which partitions and how to resume. Steps that do not apply to the site are journaled as
skipped with the reason. The bring-up lock of the rack is taken too: a change never runs
beside a bring-up of its rack. Part of the change service (layer 3: it composes fabric, sched and
the journal); mctl.change.service decides what to run and calls it. See docs/decisions.md (D46).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.bringup import journal as jr
from mctl.bringup.journal import Journal
from mctl.errors import EnvironmentProblem, MctlError, PartialFailure
from mctl.fabric import change as ch

if TYPE_CHECKING:
    from mctl.model.site import Partition, Rack, Site

CLIQUE_WAIT = 120.0         # seconds for every affected GPU to report its new clique
IMEX_WAIT = 120.0           # seconds for the affected IMEX domains to be UP
SLURM_WAIT = 60.0           # seconds for `scontrol show topology` to show the new blocks
EXIT_INTERRUPTED = 130


class ChangeJournal(Journal):
    KIND = "partition-change"
    FOLDER = "partition-change"
    LABEL = "partition change"


class StepFailed(MctlError):
    exit_code = 3


# ------------------------------------------------------------------ what a change is

@dataclass
class ChangeSpec:
    """One partition change, as the journal keeps it (enough for a resume in another process)."""

    rack: str
    command: str                                  # create | apply | delete | isolate | restore
    before: tuple[tuple[str, tuple[str, ...]], ...]
    after: tuple[tuple[str, tuple[str, ...]], ...]
    record: bool = False                          # write `after` into the inventory (create, delete, isolate)
    prune: bool = False
    remove: tuple[str, ...] = ()                  # NMX-M partitions deleted by name (delete)
    kind: str = "ID_BASED"
    held: tuple[str, ...] = ()                    # trays the jobs rule (--drain) holds already
    tolerate: tuple[str, ...] = ()                # trays that need not answer (isolating a dead tray)
    clique_wait: float = CLIQUE_WAIT
    imex_wait: float = IMEX_WAIT
    slurm_wait: float = SLURM_WAIT
    tray: str | None = None                       # the tray isolate / restore moves
    labels_wait: float = 60.0                     # s for the label patches and their read-back (429/5xx asked again)

    @classmethod
    def of(cls, rack: str, command: str, before: Sequence["Partition"], after: Sequence["Partition"],
           **kw: Any) -> "ChangeSpec":
        return cls(rack, command, tuple((p.name, tuple(p.trays)) for p in before),
                   tuple((p.name, tuple(p.trays)) for p in after), **kw)

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "command": self.command,
                "before": [{"name": n, "trays": list(t)} for n, t in self.before],
                "after": [{"name": n, "trays": list(t)} for n, t in self.after],
                "record": self.record, "prune": self.prune, "remove": list(self.remove), "kind": self.kind,
                "held": list(self.held), "tolerate": list(self.tolerate), "clique_wait": self.clique_wait,
                "imex_wait": self.imex_wait, "slurm_wait": self.slurm_wait, "tray": self.tray,
                "labels_wait": self.labels_wait}

    @classmethod
    def from_dict(cls, path: Path, d: Any) -> "ChangeSpec":
        from mctl.state.files import DamagedState

        try:
            parts = lambda key: tuple((str(p["name"]), tuple(str(t) for t in p["trays"])) for p in d[key])  # noqa: E731
            return cls(str(d["rack"]), str(d["command"]), parts("before"), parts("after"), bool(d["record"]),
                       bool(d["prune"]), tuple(map(str, d["remove"])), str(d["kind"]), tuple(map(str, d["held"])),
                       tuple(map(str, d["tolerate"])), float(d["clique_wait"]), float(d["imex_wait"]),
                       float(d["slurm_wait"]), None if d.get("tray") is None else str(d["tray"]),
                       float(d.get("labels_wait", 60.0)))      # (a journal written before labels_wait: its default)
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedState(path, f"the change it records cannot be read ({exc!r})") from None

    def partitions(self, which: str) -> tuple["Partition", ...]:
        from mctl.model.site import Partition

        return tuple(Partition(n, self.rack, t) for n, t in (self.before if which == "before" else self.after))


# ------------------------------------------------------------------ progress

class Report:
    """Told each step as it starts and ends (the CLI prints them; silent by default)."""

    def line(self, text: str) -> None:
        pass

    def step_started(self, index: int, total: int, step: str) -> None:
        pass

    def step_ended(self, step: str, status: str, summary: str, seconds: float) -> None:
        pass


@dataclass
class Outcome:
    status: str
    summary: str
    changed: bool = False
    details: list[str] = field(default_factory=list)
    artifacts: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChangeRun:
    journal: ChangeJournal
    status: str                                   # succeeded | rolled-back | failed | interrupted
    exit_code: int
    resumed: bool = False
    error: MctlError | None = None
    ran: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = self.journal.data
        return {"run_id": d["run_id"], "journal": str(self.journal.path), "status": self.status,
                "exit_code": self.exit_code, "resumed": self.resumed, "change": d.get("change"),
                "rollback": d.get("rollback"),
                "error": {"message": self.error.message, "hint": self.error.hint} if self.error else None,
                "ran": list(self.ran), "steps": self.journal.phase_rows()}


# ------------------------------------------------------------------ the run

@dataclass
class _Ctx:
    site: "Site"
    spec: ChangeSpec
    journal: ChangeJournal
    report: Report
    undo: bool = False
    cache: dict = field(default_factory=dict)

    @property
    def rack(self) -> "Rack":
        return self.site.racks[self.spec.rack]

    def target(self) -> tuple["Site", "Rack"]:
        """The site and rack as the step makes them: after the change, or before it for an undo step."""
        from mctl.fabric.change import with_partitions

        return with_partitions(self.site, self.rack, self.spec.partitions("before" if self.undo else "after"))

    def source(self) -> tuple["Site", "Rack"]:
        from mctl.fabric.change import with_partitions

        return with_partitions(self.site, self.rack, self.spec.partitions("after" if self.undo else "before"))

    @property
    def affected(self) -> list[str]:
        from mctl.fabric.change import tray_changes

        return [t.tray for t in tray_changes(self.rack, self.spec.partitions("before"), self.spec.partitions("after"))]

    @property
    def held(self) -> list[str]:
        return list(self.journal.data["change"].get("held") or [])

    def hosts(self, names: Sequence[str]):
        by = {h.name: h for h in self.rack.compute}
        return [by[n] for n in names if n in by]


def _why_not(ctx: _Ctx, step: str) -> str | None:
    spec = ctx.spec
    scheduler = ctx.site.scheduler.type if ctx.site.scheduler else None
    why = ch.step_applies(ch.forward_name(step), scheduler=scheduler, has_nmx=ctx.rack.nmx is not None,
                          record=spec.record, affected=bool(ctx.affected))
    if why is None and scheduler == "slurm" and \
            ch.forward_name(step) in (ch.HOLD, ch.RELEASE, ch.SLURM_TOPOLOGY, ch.SLURM_VERIFY) and not _slurm_deployed(ctx):
        return "Slurm is not deployed yet (no slurm.conf on the controller): 'mctl deploy slurm' renders " \
               "topology.conf from the partitions"
    return why


def _slurm_deployed(ctx: _Ctx) -> bool:
    """Whether the controller holds slurm.conf (asked once per run; EnvironmentProblem when it does not answer)."""
    from mctl.sched.slurm.control import controller_run
    from mctl.sched.slurm.render import settings_of

    if "slurm" not in ctx.cache:
        conf = shlex.quote(settings_of(ctx.site).conf_dir.rstrip("/") + "/slurm.conf")
        result = controller_run(ctx.site, f"if [ -e {conf} ]; then echo deployed; else echo absent; fi")
        ctx.cache["slurm"] = result.stdout.strip() == "deployed"
    return ctx.cache["slurm"]


def _lock(state_dir: Path, rack: str):
    from mctl.state.lock import file_lock

    return file_lock(Path(state_dir) / "locks" / f"bringup-{rack}.lock", purpose="mctl partition change",
                     label=f"bring-up of rack {rack}")


def run_change(site: "Site", spec: ChangeSpec, state_dir: Path, *, report: Report | None = None) -> ChangeRun:
    """Journal a new change and run it; the caller holds the rack lock. Never raises for a failed step."""
    report = report or Report()
    with _lock(state_dir, spec.rack):
        journal = ChangeJournal.create(Path(state_dir), site.name, str(site.file), spec.rack, list(ch.STEPS),
                                       list(ch.STEPS), {})
        journal.data["change"] = spec.to_dict()
        journal.save()
        return _run(site, spec, journal, report, resumed=False)


def _by_time(runs: list[ChangeJournal]) -> list[ChangeJournal]:
    return ChangeJournal.by_time(runs)  # type: ignore[return-value]


def last_change(state_dir: Path, rack: str) -> ChangeJournal | None:
    runs = _by_time(ChangeJournal.runs(Path(state_dir), rack))
    return runs[-1] if runs else None


def last_isolation(state_dir: Path, rack: str, tray: str) -> "tuple[tuple[Partition, ...], tuple[Partition, ...]] | None":
    """(before, after) of the last isolate of *tray* that finished, unless a restore of it finished since."""
    for j in reversed(_by_time(ChangeJournal.runs(Path(state_dir), rack))):
        d = j.data.get("change") or {}
        if d.get("tray") != tray or j.status != jr.RUN_SUCCEEDED:
            continue
        if d.get("command") == "restore":
            return None
        if d.get("command") == "isolate":
            spec = ChangeSpec.from_dict(j.path, d)
            return spec.partitions("before"), spec.partitions("after")
    return None


def resume_change(site: "Site", rack: str, state_dir: Path, *, report: Report | None = None) -> ChangeRun:
    """Finish the last change of *rack* (forward, or its rollback where one had begun)."""
    report = report or Report()
    with _lock(state_dir, rack):
        last = ChangeJournal.to_resume(state_dir, rack, finished=(jr.RUN_SUCCEEDED, "rolled-back"),
                                       none_hint=f"see 'mctl partition list {rack}'",
                                       finished_hint=f"see 'mctl partition list {rack}'",
                                       damaged_hint="then check 'mctl audit' and change again")
        spec = ChangeSpec.from_dict(last.path, last.data.get("change"))
        last.attempt()
        todo = [p for p in last.phase_names() if last.phase(p)["status"] not in jr.FINISHED
                and (not last.data.get("rollback") or p.startswith(ch.UNDO))]
        report.line(f"resuming partition change {last.run_id} of rack {rack} at {todo[0] if todo else 'the end'} "
                    f"(done: {', '.join(last.completed()) or 'none'})")
        return _run(site, spec, last, report, resumed=True)


def _run(site: "Site", spec: ChangeSpec, journal: ChangeJournal, report: Report, *, resumed: bool) -> ChangeRun:
    ctx = _Ctx(site, spec, journal, report)
    ran: list[str] = []
    while True:
        rolling_back = bool(journal.data.get("rollback"))
        todo = [p for p in journal.phase_names() if journal.phase(p)["status"] not in jr.FINISHED
                and (not rolling_back or p.startswith(ch.UNDO))]
        if not todo:
            break
        name = todo[0]
        rolling = name.startswith(ch.UNDO)
        ctx.undo = rolling
        names = [p for p in journal.phase_names() if p.startswith(ch.UNDO) == rolling]
        report.step_started(names.index(name) + 1, len(names), name)
        journal.start(name)
        ran.append(name)
        started = time.monotonic()
        try:
            why = _why_not(ctx, name)
            outcome = Outcome(jr.SKIPPED, f"not applicable: {why}") if why else _STEPS[ch.forward_name(name)](ctx)
        except KeyboardInterrupt:
            journal.finish(name, jr.INTERRUPTED, "interrupted")
            journal.close(jr.RUN_INTERRUPTED)
            report.step_ended(name, jr.INTERRUPTED, "interrupted", time.monotonic() - started)
            return ChangeRun(journal, jr.RUN_INTERRUPTED, EXIT_INTERRUPTED, resumed, None, tuple(ran))
        except MctlError as exc:
            journal.finish(name, jr.FAILED, exc.message, error={"message": exc.message, "hint": exc.hint,
                                                                  "exit_code": exc.exit_code})
            report.step_ended(name, jr.FAILED, exc.message, time.monotonic() - started)
            if rolling:
                return _stopped(ctx, name, exc, resumed, ran)
            if name == ch.RELEASE:
                err = PartialFailure(f"rack {spec.rack}: the change is done on every layer but the holds could not "
                                     f"be released: {exc.message}", hint=exc.hint)
                journal.close(jr.RUN_FAILED, {"error": err.message})
                return ChangeRun(journal, jr.RUN_FAILED, err.exit_code, resumed, err, tuple(ran))
            _begin_rollback(journal, name, exc)
            report.line(f"step {name} failed: {exc.message}; rolling back to the partitions before")
            continue
        except BaseException as exc:
            journal.crashed(name, exc)
            raise
        journal.finish_outcome(name, outcome)
        report.step_ended(name, outcome.status, outcome.summary, time.monotonic() - started)
    rollback = journal.data.get("rollback")
    if rollback:
        failed = rollback["failed"]
        err = StepFailed(f"rack {spec.rack}: step {failed} failed: {rollback['error']['message']}; rolled back: "
                         "NMX-M, IMEX, Slurm and the inventory hold the partitions before the change again",
                         hint=rollback["error"].get("hint") or "fix the cause, then run the change again")
        journal.close("rolled-back", {"error": err.message})
        return ChangeRun(journal, "rolled-back", err.exit_code, resumed, err, tuple(ran))
    journal.close(jr.RUN_SUCCEEDED, None)
    return ChangeRun(journal, jr.RUN_SUCCEEDED, 0, resumed, None, tuple(ran))


def _begin_rollback(journal: ChangeJournal, failed: str, exc: MctlError) -> None:
    done = [p for p in ch.STEPS if journal.phase(p)["status"] in (jr.DONE, jr.SKIPPED)]
    journal.data["rollback"] = {"failed": failed, "error": {"message": exc.message, "hint": exc.hint}}
    for step in ch.rollback_steps(failed, done):
        journal.data["phases"].append({"name": step, "status": jr.PENDING, "started": None, "ended": None,
                                       "summary": None, "changed": False, "details": [], "artifacts": {},
                                       "error": None})
    # the forward steps not reached are never run (a resume continues the rollback)
    for p in journal.data["phases"]:
        if p["name"] in ch.STEPS and p["status"] in (jr.PENDING, jr.INTERRUPTED):
            p["status"] = jr.EXCLUDED
    journal.save()


def _stopped(ctx: _Ctx, step: str, exc: MctlError, resumed: bool, ran: list[str]) -> ChangeRun:
    """The rollback could not finish: say which layer holds which partitions, keep the holds, name the resume."""
    from mctl.model.site import fold

    journal = ctx.journal
    back = [ch.forward_name(p["name"]) for p in journal.data["phases"]
            if p["name"].startswith(ch.UNDO) and p["status"] in (jr.DONE, jr.SKIPPED)]
    layers = {ch.NMX: "NMX-M", ch.IMEX_FILES: "IMEX files", ch.IMEX_RESTART: "IMEX daemons",
              ch.SLURM_TOPOLOGY: "Slurm topology", ch.LABELS: "Kubernetes labels", ch.RECORD: "the inventory"}
    undos = [ch.forward_name(p["name"]) for p in journal.data["phases"] if p["name"].startswith(ch.UNDO)]
    restored = [layers[s] for s in back if s in layers]
    pending = [layers[s] for s in undos if s in layers and s not in back]
    held = ctx.held
    failed = journal.data["rollback"]["failed"]
    err = PartialFailure(
        f"rack {ctx.spec.rack}: step {failed} failed ({journal.data['rollback']['error']['message']}) and the "
        f"rollback stopped at {step}: {exc.message}. Back to the partitions before: "
        f"{', '.join(restored) or 'nothing yet'}; not yet back: {', '.join(pending) or 'nothing'}"
        + (f"; {fold(held)} stay held ({'cordoned in Kubernetes' if _k8s(ctx) else 'in Slurm'}), so no work lands "
           "on them meanwhile" if held else ""),
        hint=(exc.hint + "; " if exc.hint else "") +
        f"once fixed, finish the rollback with 'mctl partition apply {ctx.spec.rack} --resume' "
        f"(journal {journal.path})")
    journal.close(jr.RUN_FAILED, {"error": err.message, "hint": err.hint})
    return ChangeRun(journal, jr.RUN_FAILED, err.exit_code, resumed, err, tuple(ran))


# ------------------------------------------------------------------ the steps

def _k8s(ctx: _Ctx) -> bool:
    return ctx.site.scheduler is not None and ctx.site.scheduler.type == "k8s"


def _hold(ctx: _Ctx) -> Outcome:
    from mctl.model.site import fold
    from mctl.sched.k8s import evict
    from mctl.sched.slurm import holds

    affected = ctx.affected
    if _k8s(ctx):
        held, refused = evict.hold(ctx.site, affected, evict.change_reason(ctx.spec.rack), f"mctl partition change "
                                   f"of {ctx.spec.rack}")
    else:
        held, refused = holds.hold(ctx.site, affected, holds.PARTITION_CHANGE, holds.change_reason(ctx.spec.rack))
    order = {t: i for i, t in enumerate(affected)}
    all_held = sorted(set(held) | set(ctx.spec.held), key=lambda t: order.get(t, len(order)))
    ctx.journal.data["change"]["held"] = all_held
    ctx.journal.save()
    details = [f"{t} not held by mctl: {why} (left as it is)" for t, why in refused.items()]
    where = "cordoned in Kubernetes" if _k8s(ctx) else "in Slurm"
    return Outcome(jr.DONE, f"held {fold(all_held) if all_held else 'no tray'} {where}", bool(held), details,
                   {"held": all_held, "refused": refused})


def _release(ctx: _Ctx) -> Outcome:
    from mctl.model.site import fold
    from mctl.sched.k8s import evict
    from mctl.sched.slurm import holds

    held = ctx.held
    if not held:
        return Outcome(jr.DONE, "nothing held")
    if _k8s(ctx):
        failed = evict.release(ctx.site, held, evict.change_reason(ctx.spec.rack))
        command = evict.uncordon_command(list(failed))
    else:
        failed = holds.release(ctx.site, held, holds.PARTITION_CHANGE)
        command = holds.release_command(list(failed))
    if failed:
        raise PartialFailure(f"{fold(failed)} could not be released: " +
                             "; ".join(f"{t}: {w}" for t, w in failed.items()), hint=command)
    ctx.journal.data["change"]["held"] = []
    ctx.journal.save()
    return Outcome(jr.DONE, f"released {fold(held)} " + ("(uncordoned)" if _k8s(ctx) else "in Slurm"), True)


def _record(ctx: _Ctx) -> Outcome:
    from mctl.fabric.record import edit_partitions, write_edit

    parts = ctx.spec.partitions("before" if ctx.undo else "after")
    edit = edit_partitions(ctx.site, ctx.spec.rack, parts)
    backup = write_edit(edit)
    what = "; ".join(f"{p.name}={p.nodeset}" for p in parts) or "no partition"
    if backup is None:
        return Outcome(jr.DONE, f"the inventory already declares {what}")
    return Outcome(jr.DONE, f"{edit.path}: {what} (previous in {backup.name})", True)


# --- NMX-M

def nmx_plan(site: "Site", rack: "Rack", spec: ChangeSpec, *, undo: bool):
    """The NMX-M plan towards the step's partitions: converge (create, update, delete what is in the way), and
    delete by name what the change removes (delete's partition; an undo deletes what the change created)."""
    from dataclasses import replace as dc_replace

    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.partitions import plan_partitions
    from mctl.fabric.reconcile import discover
    from mctl.model.fabric import DesiredPartition

    target = spec.before if undo else spec.after
    other = spec.after if undo else spec.before
    remove = set(n for n, _ in other) - set(n for n, _ in target) if undo else set(spec.remove)
    desired = [DesiredPartition(n, rack.name, t) for n, t in target]
    client = NMXClient.for_rack(site, rack)
    state = discover(client, rack)
    plan = plan_partitions(rack, desired, state.fabric, state.partitions, prune=spec.prune and not undo,
                           kind=spec.kind, endpoint=client.url)
    if spec.command == "delete" and not undo:     # delete deletes, and nothing else (the plan it showed)
        plan = dc_replace(plan, changes=())
    if remove:
        pruned = plan_partitions(rack, desired, state.fabric, state.partitions, prune=True, kind=spec.kind,
                                 endpoint=client.url)
        have = {c.name for c in plan.changes}
        extra = tuple(c for c in pruned.changes if c.action == "delete" and c.name in remove and c.name not in have)
        plan = dc_replace(plan, changes=extra + plan.changes,
                          unmanaged=tuple(n for n in plan.unmanaged if n not in remove))
    return client, plan


def _nmx(ctx: _Ctx) -> Outcome:
    from mctl.fabric.partitions import describe_change
    from mctl.fabric.reconcile import apply_plan

    client, plan = nmx_plan(ctx.site, ctx.rack, ctx.spec, undo=ctx.undo)
    if plan.empty:
        return Outcome(jr.DONE, "NMX-M holds the partitions already")
    done = apply_plan(client, plan, ctx.rack.gpus_per_tray)
    return Outcome(jr.DONE, f"{len(done)} NMX-M operation{'s' if len(done) > 1 else ''} completed", True,
                   [describe_change(c, ctx.rack.gpus_per_tray) for c in done])


# --- cliques

SMI = "timeout 20 nvidia-smi -q -x"


def read_cliques(site: "Site", hosts) -> tuple[dict[str, str | None], dict[str, str]]:
    """Each tray's clique label (None: not every GPU fabric-attached in one clique) and {tray: why unread}."""
    from mctl.errors import MctlError as _Err
    from mctl.facts.nvidia_smi import parse_xml
    from mctl.transport import SSHConfig, run_sync, targets_for

    if not hosts:
        return {}, {}
    labels: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for r in run_sync(SSHConfig.from_site(site), targets_for(site, list(hosts)), SMI, timeout=30.0, deadline=40.0):
        if not r.status.reached or not r.ok:
            errors[r.host] = r.summary()
            continue
        try:
            labels[r.host] = parse_xml(r.stdout).clique_label
        except _Err as exc:
            errors[r.host] = exc.message
    return labels, errors


def cliques_settled(groups: Sequence[Sequence[str]], labels: dict[str, str | None]) -> list[str]:
    """What still differs (empty: settled): every tray read has one clique label (all its GPUs fabric-attached,
    in one clique), trays of one partition share it, trays of different partitions do not (pure).

    Only the grouping is judged, never the numbers: NMX-M may give a new partition the PartitionID (and so
    the clique ID) of one it just deleted."""
    group_of = {t: i for i, g in enumerate(groups) for t in g}
    problems = [f"{t}: no clique yet (fabric not attached, or its GPUs disagree)"
                for t, lab in labels.items() if lab is None]
    by_label: dict[str, set[int]] = {}
    by_group: dict[int, set[str]] = {}
    for t, lab in labels.items():
        if lab is not None and t in group_of:
            by_label.setdefault(lab, set()).add(group_of[t])
            by_group.setdefault(group_of[t], set()).add(lab)
    for lab, gs in by_label.items():
        if len(gs) > 1:
            problems.append(f"clique {lab} spans {len(gs)} partitions")
    for g, labs in by_group.items():
        if len(labs) > 1:
            problems.append(f"the partition of {', '.join(groups[g])} shows {len(labs)} cliques")
    return problems


def _groups(rack: "Rack") -> list[tuple[str, ...]]:
    """The trays that share an NVLink partition: each partition, and the rest in NMX-M's default one."""
    parts = [tuple(p.trays) for p in rack.partitions]
    taken = {t for p in parts for t in p}
    rest = tuple(h.name for h in rack.compute if h.name not in taken)
    return parts + ([rest] if rest else [])


def _cliques(ctx: _Ctx) -> Outcome:
    _, rack_t = ctx.target()
    _, rack_s = ctx.source()
    affected = set(ctx.affected)
    groups = _groups(rack_t)
    # the trays of every partition, before and after, that holds an affected tray: a tray still in its
    # old clique shows up as a clique that spans two partitions, or a partition with two cliques
    read = {t for g in groups + _groups(rack_s) if affected & set(g) for t in g}
    trays = [h.name for h in ctx.rack.compute if h.name in read and h.name not in ctx.spec.tolerate]
    deadline = time.monotonic() + ctx.spec.clique_wait
    while True:
        labels, errors = read_cliques(ctx.site, ctx.hosts(trays))
        problems = [f"{t}: {why}" for t, why in errors.items()] + cliques_settled(groups, labels)
        if not problems:
            n = len(set(labels.values()))
            return Outcome(jr.DONE, f"the GPUs of {len(trays)} tray{'s' if len(trays) != 1 else ''} show the "
                                    f"partitions ({n} clique{'s' if n != 1 else ''})", artifacts={"labels": labels})
        if time.monotonic() >= deadline:
            raise EnvironmentProblem(f"the GPUs' cliques did not follow NMX-M within {ctx.spec.clique_wait:g}s: "
                                     + "; ".join(problems[:6]),
                                     hint="check the fabric ('mctl partition show', nvidia-smi -q on the trays)")
        time.sleep(1.0)


# --- IMEX

def _imex_targets(ctx: _Ctx):
    from mctl.fabric.imex import expected_files
    from mctl.fabric.service import imex_settings

    settings = imex_settings(ctx.site)
    _, rack_t = ctx.target()
    expected = expected_files(rack_t, settings)
    trays = [t for t in ctx.affected if t in expected]
    return settings, expected, trays


def _imex_files(ctx: _Ctx) -> Outcome:
    from mctl.fabric.imex import trays_needing
    from mctl.fabric.imex_remote import collect, push
    from mctl.model.site import fold

    settings, expected, trays = _imex_targets(ctx)
    if not trays:
        return Outcome(jr.DONE, "no affected tray is in an IMEX domain")
    reports, held = collect(ctx.site, ctx.hosts(trays), settings)
    unreachable = [t for t, rep in reports.items() if not rep.reachable]
    blocking = [t for t in unreachable if t not in ctx.spec.tolerate]
    if blocking:
        raise EnvironmentProblem(f"{fold(blocking)} cannot be reached: no IMEX file was written (a domain is "
                                 "changed whole or not at all)", hint="bring the trays back (mctl exec TRAYS -- true)")
    reach = [t for t in trays if t not in unreachable]
    plan = trays_needing({t: expected[t] for t in reach}, held)
    if not plan:
        return Outcome(jr.DONE, f"the IMEX files of {fold(reach)} are in place already",
                       details=[f"{t}: not reached, left as it is" for t in unreachable])
    results = push(ctx.site, ctx.hosts(list(plan)), {t: {p: expected[t][p] for p in plan[t]} for t in plan}, None)
    failed = {x.host: x.summary() for x in results if not x.ok}
    if failed:
        raise PartialFailure(f"the IMEX files could not be written on {fold(failed)}: "
                             + "; ".join(f"{t}: {w}" for t, w in failed.items()))
    return Outcome(jr.DONE, f"IMEX files written on {fold(plan)} (previous kept as .mctl-bak)", True,
                   [f"{t}: {', '.join(files)}" for t, files in plan.items()] +
                   [f"{t}: not reached, left as it is" for t in unreachable])


def _imex_restart(ctx: _Ctx) -> Outcome:
    from mctl.fabric.imex_remote import push
    from mctl.model.site import fold

    settings, _, trays = _imex_targets(ctx)
    if not trays:
        return Outcome(jr.DONE, "no IMEX daemon to restart")
    results = push(ctx.site, ctx.hosts(trays), {}, settings.restart_command)
    failed = {x.host: x.summary() for x in results if not x.ok}
    fatal = {t: w for t, w in failed.items() if t not in ctx.spec.tolerate}
    if fatal:
        raise PartialFailure(f"nvidia-imex could not be restarted on {fold(fatal)}: "
                             + "; ".join(f"{t}: {w}" for t, w in fatal.items()))
    done = [t for t in trays if t not in failed]
    return Outcome(jr.DONE, f"nvidia-imex restarted on {fold(done)}", True,
                   [f"{t}: not restarted ({w}); the tray is the one moved, it need not answer"
                    for t, w in failed.items()])


def _imex_up(ctx: _Ctx) -> Outcome:
    from mctl.fabric.imex import assess_domain, imex_domains
    from mctl.fabric.imex_remote import collect

    settings, _, trays = _imex_targets(ctx)
    _, rack_t = ctx.target()
    tolerate = set(ctx.spec.tolerate)
    domains = [d for d in imex_domains(rack_t) if set(d.trays) & set(trays) and not set(d.trays) <= tolerate]
    if not domains:
        return Outcome(jr.DONE, "no IMEX domain to wait for")
    hosts = ctx.hosts(sorted({t for d in domains for t in d.trays}))
    deadline = time.monotonic() + ctx.spec.imex_wait
    while True:
        reports, _ = collect(ctx.site, hosts, settings)
        healths = [assess_domain(d, reports) for d in domains]
        down = [h for h in healths if h.state != "UP"]
        if not down:
            return Outcome(jr.DONE, f"IMEX domain{'s' if len(healths) > 1 else ''} "
                                    f"{', '.join(h.domain.name for h in healths)} UP",
                           artifacts={"domains": [h.to_dict() for h in healths]})
        if time.monotonic() >= deadline:
            raise EnvironmentProblem(
                f"IMEX domains not UP within {ctx.spec.imex_wait:g}s: " + "; ".join(
                    f"{h.domain.name} {h.state}" + (f" ({h.reasons[0].to_dict().get('message', '')})"
                                                    if h.reasons else "") for h in down),
                hint=f"see 'mctl imex status {ctx.spec.rack}'")
        time.sleep(1.0)


# --- Slurm

def _slurm_config(ctx: _Ctx):
    from mctl.sched.slurm.remote import controller_state
    from mctl.sched.slurm.render import controller_of, render

    key = ("slurm-config", ctx.undo)
    if key in ctx.cache:
        return ctx.cache[key]
    site_t, _ = ctx.target()
    controller = controller_of(site_t)
    version, plugin = controller_state(site_t, controller)
    config = render(site_t, version, None, topology_only=True)
    if plugin != f"topology/{config.plugin}":
        now = f"slurmctld runs {plugin}" if plugin else f"slurmctld does not answer on {controller.name}"
        raise EnvironmentProblem(f"the change needs a running Slurm with topology/{config.plugin}, but {now}",
                                 hint="run a full 'mctl deploy slurm' first")
    ctx.cache[key] = (site_t, controller, config)
    return ctx.cache[key]


def _slurm_topology(ctx: _Ctx) -> Outcome:
    from mctl.fabric.imex_remote import push_command
    from mctl.model.site import fold
    from mctl.sched.slurm.render import settings_of
    from mctl.transport import SSHConfig, run_sync, targets_for

    site_t, controller, config = _slurm_config(ctx)
    text = config.files["topology.conf"]
    path = settings_of(site_t).conf_dir.rstrip("/") + "/topology.conf"
    hosts = [controller] + [t for t in site_t.compute_trays() if t.name != controller.name]
    results = run_sync(SSHConfig.from_site(site_t), targets_for(site_t, hosts), push_command({path: text}, None),
                       timeout=30.0, deadline=40.0)
    by = {r.host: r for r in results}
    if not by[controller.name].ok:
        raise EnvironmentProblem(f"topology.conf could not be written on the controller {controller.name}: "
                                 f"{by[controller.name].summary()}")
    missed = [r.host for r in results if not r.ok]
    reconf = "for i in 1 2 3 4 5; do scontrol reconfigure && exit 0; sleep 2; done; exit 1"
    (rc,) = run_sync(SSHConfig.from_site(site_t), targets_for(site_t, [controller]), reconf, timeout=40.0,
                     deadline=50.0)
    if not rc.ok:
        raise EnvironmentProblem(f"scontrol reconfigure failed on {controller.name}: {rc.summary()}",
                                 hint="check slurmctld (systemctl status slurmctld)")
    details = [f"BlockName={b.name} Nodes={b.nodeset}" for b in config.blocks]
    if missed:
        details.append(f"not written on {fold(missed)} (unreachable): slurmctld's copy is the one that counts; "
                       "'mctl deploy slurm --topology-only' writes theirs once they are back")
    return Outcome(jr.DONE, f"topology.conf ({len(config.blocks)} blocks) on {controller.name} and "
                            f"{len(hosts) - 1 - len(missed)} trays (previous kept as .mctl-bak); scontrol reconfigure",
                   True, details)


def _slurm_verify(ctx: _Ctx) -> Outcome:
    from mctl.sched.slurm.remote import VERIFY_COMMAND, judge
    from mctl.transport import SSHConfig, run_sync, targets_for

    site_t, controller, config = _slurm_config(ctx)
    started = time.monotonic()
    deadline = started + ctx.spec.slurm_wait
    last = None
    while True:
        (r,) = run_sync(SSHConfig.from_site(site_t), targets_for(site_t, [controller]), VERIFY_COMMAND,
                        timeout=30.0, deadline=40.0)
        if r.status.reached and "NodeName=" in r.stdout:
            last = judge(r.stdout, config, time.monotonic() - started)
            if last.blocks_match:
                return Outcome(jr.DONE, f"scontrol show topology shows the {len(last.blocks_found)} blocks",
                               artifacts={"blocks": last.blocks_found})
        if time.monotonic() >= deadline:
            said = f"expected {last.blocks_expected}, Slurm has {last.blocks_found}" if last else r.summary()
            raise EnvironmentProblem(f"scontrol show topology did not show the new blocks within "
                                     f"{ctx.spec.slurm_wait:g}s: {said}", hint="check slurmctld's log")
        time.sleep(1.0)


# --- Kubernetes

def _clique_labels(ctx: _Ctx) -> dict[str, str]:
    """The affected trays' clique labels as their GPUs reported them in this direction's cliques step (what GPU
    Feature Discovery sets from NVML); {} when that step did not run (no NMX-M: the fabric did not change)."""
    name = (ch.UNDO if ctx.undo else "") + ch.CLIQUES
    phase = next((p for p in ctx.journal.data["phases"] if p["name"] == name), None)
    if phase is None or phase["status"] != jr.DONE:
        return {}
    labels = (phase.get("artifacts") or {}).get("labels") or {}
    return {t: v for t, v in labels.items() if t in set(ctx.affected) and v}


def _labels(ctx: _Ctx) -> Outcome:
    from mctl.change.plan import label_changes
    from mctl.sched.k8s.evict import client_for, within
    from mctl.sched.k8s.manifests import CLIQUE_LABEL

    site_t, _ = ctx.target()
    site_s, _ = ctx.source()
    want: dict[str, dict[str, str | None]] = {}
    for c in label_changes(site_s, site_t, ctx.affected):
        want.setdefault(c.node, {})[c.label] = c.after
    for t, v in _clique_labels(ctx).items():
        want.setdefault(t, {})[CLIQUE_LABEL] = v
    if not want:
        return Outcome(jr.DONE, "labels unchanged")
    client = client_for(ctx.site)
    deadline = time.monotonic() + ctx.spec.labels_wait
    details, patched = [], 0
    for node, labels in want.items():
        obj = within(deadline, f"reading Node {node}", lambda n=node: client.get("Node", n))
        if obj is None:
            raise EnvironmentProblem(f"no Node {node} in the cluster: its labels cannot follow the partitions",
                                     hint="register the tray's kubelet, or take the tray out of the inventory")
        have = (obj.get("metadata") or {}).get("labels") or {}
        todo = {k: v for k, v in labels.items() if have.get(k) != v}
        if todo:
            within(deadline, f"labelling Node {node}",
                   lambda n=node, d=todo: client.merge_patch("Node", n, None, {"metadata": {"labels": d}}))
            patched += 1
            details += [f"{node}: {k} {have.get(k) or '(none)'} -> {v or '(none)'}" for k, v in todo.items()]
    # read back: every label as the step set it (another writer in between is a failed step, rolled back)
    wrong = []
    for node, labels in want.items():
        obj = within(deadline, f"reading Node {node} back", lambda n=node: client.get("Node", n)) or {}
        have = (obj.get("metadata") or {}).get("labels") or {}
        wrong += [f"{node}: {k} is {have.get(k)!r}, not {v!r}" for k, v in labels.items() if have.get(k) != v]
    if wrong:
        raise EnvironmentProblem("the node labels read back differ from what was set: " + "; ".join(wrong[:6]),
                                 hint="another controller writes these labels; see who (kubectl get node -o yaml)")
    n = sum(len(v) for v in want.values())
    return Outcome(jr.DONE, f"{n} node label{'s' if n != 1 else ''} on {len(want)} node{'s' if len(want) != 1 else ''} "
                            f"as the partitions say ({patched} patched), read back", bool(patched), details,
                   {"labels": want})


_STEPS: dict[str, Callable[[_Ctx], Outcome]] = {
    ch.HOLD: _hold, ch.RECORD: _record, ch.NMX: _nmx, ch.CLIQUES: _cliques, ch.IMEX_FILES: _imex_files,
    ch.IMEX_RESTART: _imex_restart, ch.IMEX_UP: _imex_up, ch.SLURM_TOPOLOGY: _slurm_topology,
    ch.SLURM_VERIFY: _slurm_verify, ch.LABELS: _labels, ch.RELEASE: _release,
}
assert set(_STEPS) == set(ch.STEPS)
