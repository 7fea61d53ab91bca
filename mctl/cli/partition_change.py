"""The terminal's side of a partition change: the plan printed, --force asked, the steps shown as they run.

The change itself is conducted by mctl.change.service; `TerminalUI` is the UI it talks to from
the CLI (mctl.change.ui.ChangeUI), over the command's one Output (mctl.cli.render): it prints the
NMX-M plan and the cross-layer plan (trays, IMEX, Slurm blocks, labels, the work on the trays, the
steps), the holds of --drain, each step of the journaled run as it runs, and asks before --force
breaks work (unless --yes; refused without a terminal). Silent with --json except warnings;
`render` prints what the change ended with. See docs/partitions.md and docs/decisions.md (D24).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from mctl.change.ui import ChangeUI

if TYPE_CHECKING:
    from mctl.change.service import ChangeResult
    from mctl.cli.render import Output
    from mctl.model.change import ChangePlan
    from mctl.model.fabric import PartitionChange, PartitionPlan
    from mctl.model.site import Rack


class TerminalUI(ChangeUI):
    """The change service's UI on the operator's terminal (plain text off a terminal; silent with --json)."""

    def __init__(self, out: "Output", *, yes: bool = False):
        self.out = out
        self.yes = yes

    def plan(self, rack: "Rack", plan: "PartitionPlan", *, dry_run: bool) -> None:
        if not self.out.json:
            print_plan(self.out, plan, rack.gpus_per_tray, dry_run=dry_run)

    kubernetes = False          # the change's site runs Kubernetes (said by change(): its holds are cordons)

    def change(self, cp: "ChangePlan", *, dry_run: bool, has_nmx: bool = True, record: bool = False) -> None:
        self.kubernetes = cp.scheduler == "k8s"
        print_change(self.out, cp, dry_run=dry_run, has_nmx=has_nmx, record=record)

    def note(self, text: str) -> None:
        self.out.line(text)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def caution(self, text: str) -> None:
        if not self.out.json:
            self.out.warn(text)

    def confirm(self, cp: "ChangePlan", breaks: str) -> bool:
        self.out.confirm("go ahead and break it?", yes=self.yes, what="--force")
        return True

    def held(self, held: Sequence[str], refused: dict[str, str], busy: Sequence[str], seconds: float) -> None:
        from mctl.model.site import fold

        for tray, why in refused.items():
            self.out.warn(f"{tray} was not held by mctl: {why} (left as it is)")
        if self.kubernetes:
            self.out.line(f"  cordoned: {fold(held) if held else 'none'}; evicting the GPU pods on {fold(busy)} "
                          f"(their PodDisruptionBudgets asked), up to {seconds:g}s")
            return
        self.out.line(f"  held in Slurm: {fold(held) if held else 'none'}; waiting up to {seconds:g}s for the jobs "
                      f"on {fold(busy)} to end")

    def released(self, trays: Sequence[str]) -> None:
        from mctl.model.site import fold

        self.out.line(f"  released {fold(trays)} " + ("(uncordoned)" if self.kubernetes else "in Slurm"))

    def nmx_step(self, number: int, total: int, change: "PartitionChange") -> None:
        self.out.line(f"  [{number}/{total}] {change.action} {change.name} ...")

    # the journaled run's steps (mctl.change.run.Report)
    def line(self, text: str) -> None:
        self.out.line(f"  {text}")

    def step_started(self, index: int, total: int, step: str) -> None:
        self.out.line(f"  [{index}/{total}] {step} ...", end="")

    def step_ended(self, step: str, status: str, summary: str, seconds: float) -> None:
        self.out.line(f" {status} ({seconds:.1f}s): {summary}")

    def render(self, result: "ChangeResult") -> None:
        """The change's --json document (when it has one), then its error raised, or its closing line."""
        if self.out.json and result.document is not None:
            self.out.result(result.document)
        if result.error is not None:
            raise result.error
        if result.done:
            self.out.line(result.done)


def print_plan(out: "Output", plan: "PartitionPlan", gpus_per_tray: int, *, dry_run: bool) -> None:
    from mctl.fabric.partitions import describe_change

    head = f"rack {plan.rack} (NMX-M {plan.endpoint})"
    if plan.empty:
        out.line(f"{head}: partitions match the inventory; nothing to change")
    else:
        verb = "would make" if dry_run else "makes"
        out.line(f"{head}: {verb} {len(plan.changes)} change{'s' if len(plan.changes) > 1 else ''}")
        for i, change in enumerate(plan.changes, start=1):
            out.line(f"  {i}. {describe_change(change, gpus_per_tray)}")
    if plan.unchanged:
        out.line(f"  unchanged: {', '.join(plan.unchanged)}")
    if plan.unmanaged:
        out.line(f"  left alone (on NMX-M, not in the inventory; --prune deletes them): {', '.join(plan.unmanaged)}")
    if plan.released:
        from mctl.model.fabric import describe_members
        out.line(f"  back to the default partition: {describe_members(plan.released, gpus_per_tray)}")
    for w in plan.warnings:
        out.warn(w)


def print_change(out: "Output", cp: "ChangePlan", *, dry_run: bool, has_nmx: bool = True,
                 record: bool = False) -> None:
    from mctl.model.site import fold

    if out.json:
        return
    if not cp.affected:
        out.line(f"rack {cp.rack}: no tray changes partition")
        return
    keep = f"; {len(cp.unaffected)} keep running untouched ({fold(cp.unaffected)})" if cp.unaffected else ""
    out.line(f"rack {cp.rack}: the change {'would touch' if dry_run else 'touches'} {len(cp.affected)} tray"
         f"{'s' if len(cp.affected) > 1 else ''} ({fold(cp.affected)}){keep}")
    out.line("  trays (partition before -> after):")
    for t in cp.trays:
        out.line(f"    {t.tray}: {_part(t.before, t.before_trays)} -> {_part(t.after, t.after_trays)}")
    out.line("  IMEX (files on the affected trays, previous kept as .mctl-bak; daemons restarted there):")
    for d in cp.imex:
        nodes = ", ".join(d.nodes_after.split()) or "none"
        out.line(f"    domain {d.domain} ({fold(d.trays)}): nodes_config {nodes}")
        for tray, files in d.files.items():
            before = ", ".join(d.nodes_before.get(tray, "").split()) or "none"
            out.line(f"      {tray}: {', '.join(files)} change (node list before: {before})")
        if d.restart:
            out.line(f"      restart nvidia-imex on {fold(d.restart)}")
    if cp.slurm is not None:
        out.line("  Slurm topology.conf (on the controller and the trays, then verified in 'scontrol show topology'):")
        for b in cp.slurm.blocks_before:
            out.line(f"    before: BlockName={b['name']} Nodes={b['nodes']}")
        for b in cp.slurm.blocks_after:
            out.line(f"    after:  BlockName={b['name']} Nodes={b['nodes']}")
        out.line("    then: scontrol reconfigure" if cp.slurm.reconfigure else "    blocks unchanged: no reconfigure")
    if cp.scheduler == "k8s":
        out.line("  Kubernetes node labels:")
        for lab in cp.labels:
            out.line(f"    {lab.node}: {lab.label} {lab.before or '(none)'} -> {lab.after or '(none)'}")
        if not cp.labels:
            out.line("    unchanged")
    print_steps(out, cp, dry_run=dry_run, has_nmx=has_nmx, record=record)
    if not cp.work_known:
        out.warn(f"the work on the trays could not be read: {cp.work_error}")
    elif cp.scheduler is None:
        out.line("  running work: the site names no scheduler, so none is known")
    elif cp.work:
        out.line("  running on the affected trays:")
        for w in cp.work:
            out.line(f"    {w.describe()}")
    else:
        out.line("  running on the affected trays: nothing")


def print_steps(out: "Output", cp: "ChangePlan", *, dry_run: bool, has_nmx: bool, record: bool) -> None:
    from mctl.change.service import steps_of

    out.line(f"  steps ({'would run' if dry_run else 'run'} in this order, journaled; 'partition apply {cp.rack} "
         "--resume' finishes a change that was stopped):")
    for i, st in enumerate(steps_of(cp, has_nmx=has_nmx, record=record), start=1):
        out.line(f"    {i:>2}. {st['step']}: {st['title']}" + ("" if st["applies"] else
                                                         f" (not applicable: {st['not_applicable']})"))


def _part(name: str | None, trays: Sequence[str]) -> str:
    from mctl.model.site import fold

    return f"{name} ({fold(trays)})" if name else "default partition"




def render_detail(out, r, name: str, data: dict, found: bool) -> None:
    """The text of 'partition show': the inventory's trays, then NMX-M's view per tray."""
    from mctl.model.fabric import describe_members
    from mctl.model.site import fold

    members = data["members"]
    out.line(f"partition {name} of rack {r.name}")
    trays = data["inventory_trays"]
    out.line(f"  inventory: {fold(trays) if trays is not None else 'not declared'}")
    if r.nmx is None:
        out.line("  NMX-M: no endpoint configured for this rack")
        return
    if not found:
        out.line(f"  NMX-M ({r.nmx.url}): not present (run 'mctl partition apply {r.name}')")
        return
    out.line(f"  NMX-M: PartitionID {data['partition_id']}, id {data['id']}, {data['type']}, health {data['health']}")
    by_tray: dict[str, list[dict]] = {}
    for m in members:
        by_tray.setdefault(m["tray"] or "(not this rack)", []).append(m)
    for tray, ms in by_tray.items():
        gpus = ", ".join(f"{m['gpu']}={m['gpu_id']}" if m["gpu"] is not None else m["gpu_id"] for m in ms)
        out.line(f"    {tray}: {gpus}")
    out.line(f"  members: {describe_members([(m['tray'], m['gpu']) for m in members if m['tray']], r.gpus_per_tray)}")
