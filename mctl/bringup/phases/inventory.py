"""inventory: facts over SSH (`mctl rack inventory`'s service) against the rack's expected shape.

On trays that arrived with their OS only, nvidia-smi is not installed yet: the phase asks the
trays' BMCs and NMX-M whether the GPUs are there (mctl.rackinv.bare, judged by
mctl.checks.bare_tray) and leaves the tools to provisioning when both show every GPU; a GPU
either does not show, an unreadable witness or two trays with one chassis serial stop the run.
After provisioning, `gate` inventories again and requires the full shape (the provision phase
calls it).
"""

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


def _judge(ctx: Context, r, *, allow_bare: bool):
    """(the findings that stand, tray -> what provisioning will install there)."""
    bare = [t.host for t in r.trays if t.gpu_tools_missing]
    if not allow_bare or not bare:
        return list(r.findings), {}
    from mctl.checks.bare_tray import judge
    from mctl.rackinv.bare import witnesses

    seen, serials = witnesses(ctx.site, ctx.rack, bare)
    return judge(ctx.rack, r.trays, r.findings, seen, serials)


def _check(ctx: Context, *, allow_bare: bool, after: str = "") -> Outcome:
    from mctl.model.findings import Severity
    from mctl.model.site import fold

    r = collect(ctx, save=True)
    findings, deferred = _judge(ctx, r, allow_bare=allow_bare)
    crit = [f for f in findings if f.severity is Severity.CRITICAL]
    warn = [f for f in findings if f.severity is Severity.WARN]
    lines = [finding_line(f) for f in crit + warn]
    artifacts = {"snapshot": str(r.snapshot_path) if r.snapshot_path else None,
                 "critical": len(crit), "warn": len(warn), "to_install": dict(deferred)}
    if r.unreached or crit:
        raise PhaseFailed(f"{after}rack {ctx.rack.name} does not have its expected shape: {len(crit)} critical findings"
                          + (f", {len(r.unreached)} trays not inventoried" if r.unreached else ""),
                          hint=f"see 'mctl rack inventory {ctx.rack.name}'; fix, then --resume",
                          exit_code=EXIT_PARTIAL if r.unreached else EXIT_FINDINGS, details=lines,
                          artifacts=artifacts)
    ctx.cache["to_install"] = deferred
    gpus = sum(t.gpu_count or 0 for t in r.trays)
    domain = ctx.rack.nvlink_domain or "undeclared"
    summary = f"{len(r.trays)} trays, {gpus} GPUs, NVLink domain {domain}"
    if deferred:
        summary += (f"; provisioning installs the GPU tools on {fold(deferred)} (their BMC and NMX-M show "
                    f"{ctx.rack.gpus_per_tray} GPUs each)")
        lines += [f"{host}: {note}" for host, note in deferred.items()]
    return Outcome("done", summary + (f"; {len(warn)} warnings" if warn else ""), details=lines, artifacts=artifacts)


def run(ctx: Context) -> Outcome:
    return _check(ctx, allow_bare=True)


def gate(ctx: Context) -> Outcome:
    """After provisioning: inventory again, nothing left to provisioning; the full shape or PhaseFailed."""
    return _check(ctx, allow_bare=False, after="after provisioning, ")


def plan(ctx: Context) -> list[str]:
    r = ctx.rack
    return [f"collect facts from {len(r.compute)} trays over SSH (nvidia-smi, OS, IMEX, slurmd, XIDs) and check "
            f"{r.model}: {r.compute_trays} trays x {r.gpus_per_tray} GPUs, one NVLink domain "
            f"({r.nvlink_domain or 'undeclared'}), fabric Completed; save a snapshot",
            "trays without GPU tools yet: their BMC and NMX-M must show every GPU (provisioning installs the "
            "tools; the shape is checked again after it)"]


PHASE = Phase("inventory", plan, run)
