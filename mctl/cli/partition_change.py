"""The terminal's side of a partition change: its options, the plan printed, --force asked, the steps shown.

The change itself is conducted by mctl.change.service; `TerminalUI` is the UI it talks to from
the CLI (mctl.change.ui.ChangeUI): it prints the NMX-M plan and the cross-layer plan (trays, IMEX,
Slurm blocks, labels, the work on the trays, the steps), the holds of --drain, each step of the
journaled run as it runs, and asks before --force breaks work (unless --yes; refused without a
terminal). Silent with --json except warnings; `render_result` prints what the change ended with.
See docs/partitions.md and docs/decisions.md (D24).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional, Sequence

import typer

from mctl.change.ui import ChangeUI
from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import finite
from mctl.errors import UsageError

if TYPE_CHECKING:
    from mctl.change.service import ChangeResult
    from mctl.model.change import ChangePlan
    from mctl.model.fabric import PartitionChange, PartitionPlan
    from mctl.model.site import Rack

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


def confirm_breaking(yes: bool) -> bool:
    """--force's question before running work is broken (a partition change, a provisioning): --yes answers
    it; without a terminal to ask, nothing is changed."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError("--force needs a confirmation and there is no terminal to ask; nothing was changed",
                         hint="give --yes as well to go ahead without a question")
    return typer.confirm("go ahead and break it?", default=False, err=True)


class TerminalUI(ChangeUI):
    """The change service's UI on the operator's terminal (plain text off a terminal; silent with --json)."""

    def __init__(self, *, yes: bool = False):
        self.yes = yes

    @property
    def quiet(self) -> bool:
        return options().json

    def plan(self, rack: "Rack", plan: "PartitionPlan", *, dry_run: bool) -> None:
        if not self.quiet:
            print_plan(plan, rack.gpus_per_tray, dry_run=dry_run)

    def change(self, cp: "ChangePlan", *, dry_run: bool, has_nmx: bool = True, record: bool = False) -> None:
        print_change(cp, dry_run=dry_run, has_nmx=has_nmx, record=record)

    def note(self, text: str) -> None:
        if not self.quiet:
            _say(text)

    def warn(self, text: str) -> None:
        render.warn(text)

    def caution(self, text: str) -> None:
        if not self.quiet:
            render.warn(text)

    def confirm(self, cp: "ChangePlan", breaks: str) -> bool:
        return confirm_breaking(self.yes)

    def held(self, held: Sequence[str], refused: dict[str, str], busy: Sequence[str], seconds: float) -> None:
        from mctl.model.site import fold

        for tray, why in refused.items():
            render.warn(f"{tray} was not held by mctl: {why} (left as it is)")
        self.note(f"  held in Slurm: {fold(held) if held else 'none'}; waiting up to {seconds:g}s for the jobs on "
                  f"{fold(busy)} to end")

    def released(self, trays: Sequence[str]) -> None:
        from mctl.model.site import fold

        self.note(f"  released {fold(trays)} in Slurm")

    def nmx_step(self, number: int, total: int, change: "PartitionChange") -> None:
        self.note(f"  [{number}/{total}] {change.action} {change.name} ...")

    # the journaled run's steps (mctl.change.run.Report)
    def line(self, text: str) -> None:
        self.note(f"  {text}")

    def step_started(self, index: int, total: int, step: str) -> None:
        if not self.quiet:
            render.console().print(f"  [{index}/{total}] {step} ...", markup=False, highlight=False, end="")

    def step_ended(self, step: str, status: str, summary: str, seconds: float) -> None:
        self.note(f" {status} ({seconds:.1f}s): {summary}")


def render_result(result: "ChangeResult") -> None:
    """The change's --json document (when it has one), then its error raised, or its closing line."""
    if options().json and result.document is not None:
        render.print_json(result.document)
    if result.error is not None:
        raise result.error
    if result.done and not options().json:
        _say(result.done)


def print_plan(plan: "PartitionPlan", gpus_per_tray: int, *, dry_run: bool) -> None:
    from mctl.fabric.partitions import describe_change

    head = f"rack {plan.rack} (NMX-M {plan.endpoint})"
    if plan.empty:
        _say(f"{head}: partitions match the inventory; nothing to change")
    else:
        verb = "would make" if dry_run else "makes"
        _say(f"{head}: {verb} {len(plan.changes)} change{'s' if len(plan.changes) > 1 else ''}")
        for i, change in enumerate(plan.changes, start=1):
            _say(f"  {i}. {describe_change(change, gpus_per_tray)}")
    if plan.unchanged:
        _say(f"  unchanged: {', '.join(plan.unchanged)}")
    if plan.unmanaged:
        _say(f"  left alone (on NMX-M, not in the inventory; --prune deletes them): {', '.join(plan.unmanaged)}")
    if plan.released:
        from mctl.model.fabric import describe_members
        _say(f"  back to the default partition: {describe_members(plan.released, gpus_per_tray)}")
    for w in plan.warnings:
        render.warn(w)


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


def print_steps(cp: "ChangePlan", *, dry_run: bool, has_nmx: bool, record: bool) -> None:
    from mctl.change.service import steps_of

    _say(f"  steps ({'would run' if dry_run else 'run'} in this order, journaled; 'partition apply {cp.rack} "
         "--resume' finishes a change that was stopped):")
    for i, st in enumerate(steps_of(cp, has_nmx=has_nmx, record=record), start=1):
        _say(f"    {i:>2}. {st['step']}: {st['title']}" + ("" if st["applies"] else
                                                         f" (not applicable: {st['not_applicable']})"))


def _part(name: str | None, trays: Sequence[str]) -> str:
    from mctl.model.site import fold

    return f"{name} ({fold(trays)})" if name else "default partition"


