"""inventory: facts over SSH (`mctl rack inventory`'s service) against the rack's expected shape."""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, finding_line
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL


def collect(ctx: Context, *, save: bool):
    """The rack's inventory report; its trays' facts are kept in ctx.cache["facts"] for later phases."""
    from mctl.rackinv.service import run_inventory

    report = run_inventory(ctx.site, [ctx.rack], state_dir=ctx.state_dir, save=save)
    rack_report = report.racks[0]
    ctx.cache["facts"] = {t.host: t for t in rack_report.trays}
    return rack_report


def run(ctx: Context) -> Outcome:
    from mctl.model.findings import Severity

    r = collect(ctx, save=True)
    crit = [f for f in r.findings if f.severity is Severity.CRITICAL]
    warn = [f for f in r.findings if f.severity is Severity.WARN]
    lines = [finding_line(f) for f in crit + warn]
    artifacts = {"snapshot": str(r.snapshot_path) if r.snapshot_path else None,
                 "critical": len(crit), "warn": len(warn)}
    if r.unreached or crit:
        raise PhaseFailed(f"rack {ctx.rack.name} does not have its expected shape: {len(crit)} critical findings"
                          + (f", {len(r.unreached)} trays not inventoried" if r.unreached else ""),
                          hint=f"see 'mctl rack inventory {ctx.rack.name}'; fix, then --resume",
                          exit_code=EXIT_PARTIAL if r.unreached else EXIT_FINDINGS, details=lines,
                          artifacts=artifacts)
    gpus = sum(t.gpu_count or 0 for t in r.trays)
    domain = ctx.rack.nvlink_domain or "undeclared"
    return Outcome("done", f"{len(r.trays)} trays, {gpus} GPUs, NVLink domain {domain}"
                   + (f"; {len(warn)} warnings" if warn else ""), details=lines, artifacts=artifacts)


def plan(ctx: Context) -> list[str]:
    r = ctx.rack
    return [f"collect facts from {len(r.compute)} trays over SSH (nvidia-smi, OS, IMEX, slurmd, XIDs) and check "
            f"{r.model}: {r.compute_trays} trays x {r.gpus_per_tray} GPUs, one NVLink domain "
            f"({r.nvlink_domain or 'undeclared'}), fabric Completed; save a snapshot"]


PHASE = Phase("inventory", plan, run)
