"""The cross-layer plan of a partition change, as `mctl partition create|apply|delete` print and gate it.

The plan comes from mctl.fabric.partition_service.change_plan (mctl.fabric.change
over the work mctl.fabric.work discovers); here it is printed and the jobs rule
is applied: running work on the affected trays refuses the change, unless
--drain (the service holds the trays in Slurm and waits for their jobs) or
--force (say what breaks, ask unless --yes). See docs/partitions.md and
docs/decisions.md (D24).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional, Sequence

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import finite
from mctl.errors import UsageError
from mctl.fabric.partition_service import DEFAULT_WAIT

if TYPE_CHECKING:
    from mctl.model.change import ChangePlan
    from mctl.model.site import Site

DrainOpt = Annotated[bool, typer.Option("--drain", help="When jobs run on the trays the change touches: hold those "
                                                        "trays in Slurm (reason 'mctl: partition change ...'), wait "
                                                        "for the jobs to end (--wait), then go on.")]
WaitOpt = Annotated[Optional[float], typer.Option("--wait", click_type=finite(min=0.0), metavar="SECONDS",
                                        help="With --drain: how long to wait for the jobs on the held trays (default 600).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Go ahead although work runs on the trays the change "
                                                        "touches (it is named and broken); asks unless --yes.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="With --force: do not ask.")]
NmxOnlyOpt = Annotated[bool, typer.Option("--nmx-only", help="Change the inventory and NMX-M only, not journaled: "
                                                             "IMEX, Slurm and the labels are left behind ('mctl "
                                                             "audit' names them), as before issue 18.")]


def _say(text: str) -> None:
    render.console().print(text, markup=False, highlight=False)


def check_flags(drain: bool, wait: float | None, force: bool, yes: bool) -> None:
    if drain and force:
        raise UsageError("--drain and --force exclude each other",
                         hint="--drain waits for the jobs to end; --force breaks them")
    if wait is not None and not drain:
        raise UsageError("--wait goes with --drain", hint="e.g. --drain --wait 900")
    if yes and not force:
        raise UsageError("--yes goes with --force", hint="it skips the question --force asks")


def print_change(cp: "ChangePlan", *, dry_run: bool, has_nmx: bool = True, record: bool = False) -> None:
    from mctl.model.site import fold

    if options().json:
        return
    if not cp.affected:
        _say(f"rack {cp.rack}: no tray changes partition")
        return
    keep = f"; {len(cp.unaffected)} keep running untouched ({fold(cp.unaffected)})" if cp.unaffected else ""
    _say(f"rack {cp.rack}: the change {'would touch' if dry_run else 'touches'} {len(cp.affected)} tray"
         f"{'s' if len(cp.affected) > 1 else ''} ({fold(cp.affected)}){keep}")
    _say("  trays (partition before -> after):")
    for t in cp.trays:
        _say(f"    {t.tray}: {_part(t.before, t.before_trays)} -> {_part(t.after, t.after_trays)}")
    _say("  IMEX (files on the affected trays, previous kept as .mctl-bak; daemons restarted there):")
    for d in cp.imex:
        nodes = ", ".join(d.nodes_after.split()) or "none"
        _say(f"    domain {d.domain} ({fold(d.trays)}): nodes_config {nodes}")
        for tray, files in d.files.items():
            before = ", ".join(d.nodes_before.get(tray, "").split()) or "none"
            _say(f"      {tray}: {', '.join(files)} change (node list before: {before})")
        if d.restart:
            _say(f"      restart nvidia-imex on {fold(d.restart)}")
    if cp.slurm is not None:
        _say("  Slurm topology.conf (on the controller and the trays, then verified in 'scontrol show topology'):")
        for b in cp.slurm.blocks_before:
            _say(f"    before: BlockName={b['name']} Nodes={b['nodes']}")
        for b in cp.slurm.blocks_after:
            _say(f"    after:  BlockName={b['name']} Nodes={b['nodes']}")
        _say("    then: scontrol reconfigure" if cp.slurm.reconfigure else "    blocks unchanged: no reconfigure")
    if cp.scheduler == "k8s":
        _say("  Kubernetes node labels:")
        for lab in cp.labels:
            _say(f"    {lab.node}: {lab.label} {lab.before or '(none)'} -> {lab.after or '(none)'}")
        if not cp.labels:
            _say("    unchanged")
    print_steps(cp, dry_run=dry_run, has_nmx=has_nmx, record=record)
    if not cp.work_known:
        render.warn(f"the work on the trays could not be read: {cp.work_error}")
    elif cp.scheduler is None:
        _say("  running work: the site names no scheduler, so none is known")
    elif cp.work:
        _say("  running on the affected trays:")
        for w in cp.work:
            _say(f"    {w.describe()}")
    else:
        _say("  running on the affected trays: nothing")


def steps_of(cp: "ChangePlan", *, has_nmx: bool, record: bool) -> list[dict]:
    """The steps of the change in their order, each with why it does not apply (None: it does); for --json."""
    from mctl.fabric.change import plan_steps

    return [{"step": s, "title": t, "applies": why is None, "not_applicable": why}
            for s, t, why in plan_steps(cp, has_nmx=has_nmx, record=record)]


def print_steps(cp: "ChangePlan", *, dry_run: bool, has_nmx: bool, record: bool) -> None:
    _say(f"  steps ({'would run' if dry_run else 'run'} in this order, journaled; 'partition apply {cp.rack} "
         "--resume' finishes a change that was stopped):")
    for i, st in enumerate(steps_of(cp, has_nmx=has_nmx, record=record), start=1):
        _say(f"    {i:>2}. {st['step']}: {st['title']}" + ("" if st["applies"] else
                                                         f" (not applicable: {st['not_applicable']})"))


class StepPrinter:
    """Prints each step of a journaled change as it runs (mctl.bringup.change_run.Report); silent with --json."""

    def line(self, text: str) -> None:
        if not options().json:
            _say(f"  {text}")

    def step_started(self, index: int, total: int, step: str) -> None:
        if not options().json:
            render.console().print(f"  [{index}/{total}] {step} ...", markup=False, highlight=False, end="")

    def step_ended(self, step: str, status: str, summary: str, seconds: float) -> None:
        if not options().json:
            _say(f" {status} ({seconds:.1f}s): {summary}")


def run_journaled(site: "Site", spec, *, resume: bool = False):
    """Run (or resume) the change across every layer; the run, whose to_dict() --json reports; raises its error."""
    from mctl.bringup.change_run import resume_change, run_change

    state_dir = options().state_dir
    run = resume_change(site, spec, state_dir, report=StepPrinter()) if resume else \
        run_change(site, spec, state_dir, report=StepPrinter())
    return run


def _part(name: str | None, trays: Sequence[str]) -> str:
    from mctl.model.site import fold

    return f"{name} ({fold(trays)})" if name else "default partition"


def _named(cp: "ChangePlan") -> str:
    return "; ".join(w.describe() for w in cp.work) or f"unknown ({cp.work_error})"


def gate(site: "Site", cp: "ChangePlan", *, drain: bool, wait: float | None, force: bool, yes: bool,
         dry_run: bool) -> list[str]:
    """Apply the jobs rule; returns the trays held in Slurm for the change (release them once it is done)."""
    from mctl.fabric.change import DRAIN, FORCE, GO, decide
    from mctl.fabric.partition_service import busy_trays, hold_for_change
    from mctl.model.site import fold

    verdict = decide(cp, drain=drain, force=force)
    if verdict == GO:
        return []
    trays = fold(cp.affected)
    if dry_run:
        word = {DRAIN: f"would hold {trays} in Slurm and wait for the jobs", FORCE: "would break the work named",
                }.get(verdict, "would be refused (--drain or --force)")
        if not options().json:
            _say(f"  the change {word}")
        return []
    if verdict == FORCE:
        what = _named(cp)
        render.warn(f"--force: the change of {trays} breaks what runs there: {what} (their NVLink partition and "
                    "IMEX domain change under them)")
        if not yes:
            if not sys.stdin.isatty():
                raise UsageError("--force needs a confirmation and there is no terminal to ask; nothing was changed",
                                 hint="give --yes as well to go ahead without a question")
            if not typer.confirm("go ahead and break it?", default=False, err=True):
                raise UsageError("not confirmed; nothing was changed")
        return []
    if verdict != DRAIN:
        hint = ("wait for them to end, or give --drain [--wait SECONDS] to hold the trays and wait, or --force to "
                "break them" if cp.work_known else "fix the scheduler's answer, or give --force")
        if cp.work_known and any(w.kind == "k8s" for w in cp.work) and drain:
            hint = "--drain holds trays in Slurm only; move the pods off the trays, or give --force"
        raise UsageError(f"rack {cp.rack}: the change touches trays with running work: {_named(cp)}; "
                         "nothing was changed", hint=hint)
    busy = busy_trays(cp)
    seconds = DEFAULT_WAIT if wait is None else wait

    def on_held(held: list[str], refused: dict[str, str]) -> None:
        for tray, why in refused.items():
            render.warn(f"{tray} was not held by mctl: {why} (left as it is)")
        if not options().json:
            _say(f"  held in Slurm: {fold(held) if held else 'none'}; waiting up to {seconds:g}s for the jobs on "
                 f"{fold(busy)} to end")

    return hold_for_change(site, cp, seconds, on_held=on_held)


def release(site: "Site", held: Sequence[str]) -> None:
    from mctl.fabric.partition_service import release_held
    from mctl.model.site import fold

    if not held:
        return
    release_held(site, held)
    if not options().json:
        _say(f"  released {fold(held)} in Slurm")
