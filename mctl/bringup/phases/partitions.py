"""partitions: the rack's declared NVLink partitions on NMX-M (`mctl partition apply`'s service)."""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase


def _partition_ids(ctx: Context) -> list[dict]:
    from mctl.fabric.discovery import discover_rack

    state = discover_rack(ctx.site, ctx.rack)
    ids = {p.name: p.partition_id for p in state.partitions}
    return [{"name": p.name, "trays": p.nodeset, "partition_id": ids.get(p.name)} for p in ctx.rack.partitions]


def _default_partition_text(ctx: Context) -> tuple[str, list[str]]:
    from mctl.fabric.service import plan_partitions_for

    text = (f"no partitions declared for {ctx.rack.name}: the whole rack stays in NMX-M's default partition "
            "(one IMEX domain, one Slurm block)")
    lines: list[str] = []
    if ctx.rack.nmx is not None:
        _, plan = plan_partitions_for(ctx.site, ctx.rack, ())
        if plan.unmanaged:
            lines.append(f"NMX-M holds partitions the inventory does not declare: {', '.join(plan.unmanaged)} "
                         f"(left alone; 'mctl partition apply {ctx.rack.name} --prune' removes them)")
    return text, lines


def plan(ctx: Context) -> list[str]:
    from mctl.fabric.partitions import describe_change
    from mctl.fabric.service import apply_partitions

    if not ctx.rack.partitions:
        text, lines = _default_partition_text(ctx)
        return [text] + lines
    res = apply_partitions(ctx.site, ctx.rack, dry_run=True)
    declared = "; ".join(f"{p.name}={p.nodeset}" for p in ctx.rack.partitions)
    if res.plan.empty:
        return [f"partitions {declared}: NMX-M already holds them"]
    return [f"partitions {declared}: {len(res.plan.changes)} changes on NMX-M"] + \
        [f"  {i}. {describe_change(c, ctx.rack.gpus_per_tray)}" for i, c in enumerate(res.plan.changes, 1)]


def run(ctx: Context) -> Outcome:
    from mctl.fabric.partitions import describe_change
    from mctl.fabric.service import apply_partitions, plan_partitions_for

    if not ctx.rack.partitions:
        text, lines = _default_partition_text(ctx)
        return Outcome("done", text, details=lines, artifacts={"partitions": []})

    def step(number: int, change) -> None:
        ctx.report.line(f"[{number}] {describe_change(change, ctx.rack.gpus_per_tray)}")

    res = apply_partitions(ctx.site, ctx.rack, on_step=step)
    _, after = plan_partitions_for(ctx.site, ctx.rack)
    if not after.empty:
        raise PhaseFailed(f"NMX-M does not hold the declared partitions after applying ({len(after.changes)} "
                          "changes still planned)", hint=f"see 'mctl partition list {ctx.rack.name}'")
    parts = _partition_ids(ctx)
    names = ", ".join(f"{p['name']} ({p['trays']}, ID {p['partition_id']})" for p in parts)
    verb = f"applied {len(res.plan.changes)} changes" if res.changed else "already in place"
    return Outcome("done", f"partitions {verb}: {names}", changed=res.changed,
                   details=list(res.warnings), artifacts={"partitions": parts, "plan": res.plan.to_dict()})


PHASE = Phase("partitions", plan, run)
