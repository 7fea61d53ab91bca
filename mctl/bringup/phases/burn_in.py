"""burn-in: DCGM diagnostics / NCCL tests (health.burnin) on the trays bring-up holds, where the trays have them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, controller, names, slurm
from mctl.errors import EXIT_FINDINGS
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Host


def _trays(ctx: Context) -> tuple[list["Host"], str | None]:
    """Trays bring-up holds out of service (all of them without Slurm); why none, when none."""
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import run_on_controller

    if not slurm(ctx):
        return ctx.trays, None
    res = run_on_controller(ctx.site, holds.show_command(names(ctx.trays)))
    if not res.status.reached:
        raise PhaseFailed(f"cannot ask Slurm on {controller(ctx).name} which trays are held: {res.summary()}")
    nodes = holds.classify(res.stdout, names(ctx.trays))
    held = [h for h in ctx.trays if h.name in nodes.held]
    if not held:
        return [], "every tray is in service (none held by bring-up): burn-in would disturb jobs"
    return held, None


def plan(ctx: Context) -> list[str]:
    from mctl.health.burnin import probe_tools

    if ctx.options.burn_in == "off":
        return ["skipped: --burn-in off"]
    found, failed = probe_tools(ctx.site, ctx.trays)
    with_tools = {t: tools for t, tools in found.items() if tools}
    if not with_tools:
        return ["skipped: no DCGM or NCCL tests on the trays" + (f" ({fold(failed)} not reachable)" if failed else "")]
    return [f"{t}: run {', '.join(sorted(tools))} ({ctx.options.burn_in})" for t, tools in with_tools.items()]


def run(ctx: Context) -> Outcome:
    from mctl.health.burnin import probe_tools, run_burn_in

    if ctx.options.burn_in == "off":
        return Outcome("skipped", "burn-in off (--burn-in off)")
    found, failed = probe_tools(ctx.site, ctx.trays)
    if failed:
        raise PhaseFailed(f"cannot look for burn-in tools on {fold(failed)}",
                          details=[f"{t}: {why}" for t, why in failed.items()])
    if not any(found.values()):
        return Outcome("skipped", "no DCGM or NCCL tests on the trays (dcgmi, all_reduce_perf not found)")
    trays, why_none = _trays(ctx)
    if why_none:
        return Outcome("skipped", why_none)
    with_tools = {h.name: found[h.name] for h in trays if found.get(h.name)}
    level = ctx.options.burn_in
    hosts = [h for h in trays if h.name in with_tools]
    ctx.report.line(f"burn-in ({level}) on {fold(names(hosts))}")
    results = run_burn_in(ctx.site, hosts, with_tools, ctx.rack.gpus_per_tray, level)
    lines = [f"{t}: {v.text}" for t, vs in results.items() for v in vs]
    bad = sorted(t for t, vs in results.items() if any(not v.ok for v in vs))
    without = [h.name for h in trays if h.name not in with_tools]
    if without:
        lines.append(f"no burn-in tools on {fold(without)}")
    if bad:
        raise PhaseFailed(f"burn-in failed on {fold(bad)}", hint="replace or repair the trays, then --resume",
                          exit_code=EXIT_FINDINGS, details=lines)
    return Outcome("done", f"burn-in passed on {fold(names(hosts))}", details=lines)


PHASE = Phase("burn-in", plan, run)
