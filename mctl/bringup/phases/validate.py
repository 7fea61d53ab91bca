"""validate: rack-scale NVLink validation (bringup.validate) once the trays are open in Slurm.

The all-reduce (or DCGM's mndiag, where every tray of the partition has DCGM >= 4.3) of each NVLink
partition is a Slurm job like any other, so it runs once the open phase has resumed the trays (a tray
bring-up holds is drained: Slurm places nothing on it). A tray the finder names as dragging its
partition, or that mndiag's results fail, is held again with bring-up's hold, so no job lands on it
before it is repaired; `--from open` after the repair opens it and validates again. Skipped with
`--burn-in off` and where no tray carries all_reduce_perf.
"""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, scheduler_skip
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL
from mctl.model.site import fold


def _skip(ctx: Context) -> str | None:
    from mctl.health.burnin import probe_tools

    skip = scheduler_skip(ctx)
    if skip:
        return skip
    if ctx.options.burn_in == "off":
        return "--burn-in off"
    found, _failed = probe_tools(ctx.site, ctx.trays)
    if not any("all_reduce_perf" in tools for tools in found.values()):
        return "no tray carries nccl-tests' all_reduce_perf"
    return None


def plan(ctx: Context) -> list[str]:
    from mctl.bringup.validate import choose_methods, dry_lines, plan as vplan

    skip = _skip(ctx)
    if skip:
        return [f"skipped: {skip}"]
    return dry_lines(choose_methods(ctx.site, vplan(ctx.site, ctx.rack)))


def run(ctx: Context) -> Outcome:
    from mctl.bringup.validate import choose_methods, plan as vplan, run_validation
    from mctl.sched.slurm import holds

    skip = _skip(ctx)
    if skip:
        return Outcome("skipped", skip)

    def on_round(n: int, results) -> None:
        ctx.report.line(f"validate round {n}: " + "; ".join(f"{r.job.label} {'ok' if r.ok else 'FAIL'}"
                                                           for r in results))

    result = run_validation(ctx.site, choose_methods(ctx.site, vplan(ctx.site, ctx.rack)), state_dir=ctx.state_dir,
                            on_round=on_round)
    doc = result.to_dict()
    lines = result.lines()
    if result.status == "passed":
        return Outcome("done", f"NVLink validation passed on {len(result.verdicts)} partition(s) in "
                               f"{len(result.rounds)} round(s)", details=lines, artifacts={"validation": doc})
    dragging = result.named()
    if dragging and ctx.run_id:
        held, refused = holds.hold(ctx.site, dragging, holds.BRING_UP, holds.bringup_reason(ctx.run_id))
        lines += [f"{t}: held by bring-up until repaired" for t in held]
        lines += [f"{t}: not held ({why})" for t, why in refused.items()]
    failed = [v.plan.name for v in result.verdicts if v.status != "passed"]
    if result.status == "unplaced":
        raise PhaseFailed(f"Slurm could not place the validation of {', '.join(failed)}",
                          hint="see Slurm's reason above (a drained or down tray); fix it, then --from validate",
                          exit_code=EXIT_PARTIAL, details=lines, artifacts={"validation": doc})
    named = f": {fold(dragging)} drag{'s' if len(dragging) == 1 else ''} it" if dragging else ""
    raise PhaseFailed(f"NVLink validation failed on {', '.join(failed)}{named}",
                      hint="repair the named trays, then --from open", exit_code=EXIT_FINDINGS, details=lines,
                      artifacts={"validation": doc})


PHASE = Phase("validate", plan, run)
