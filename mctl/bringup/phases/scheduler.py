"""scheduler: Slurm deployed and verified (`mctl deploy slurm`'s service), then the rack's trays held drained.

The hold's script comes from mctl.sched.slurm.holds (guarded drains with bring-up's
reason) and runs on the controller through sched.slurm.control.
"""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, controller, names, scheduler_skip
from mctl.model.site import fold


def _slurm_state(ctx: Context):
    from mctl.sched.slurm import dry_run, plan_slurm
    from mctl.sched.slurm.remote import verify

    plan = plan_slurm(ctx.site, ctx.state_dir)
    diff = dry_run(plan)
    verification = verify(ctx.site, plan.config, timeout=0) if diff.changes == 0 else None
    return plan, diff, verification


def plan(ctx: Context) -> list[str]:
    skip = scheduler_skip(ctx)
    if skip:
        return [f"skipped: {skip}"]
    slurm_plan, diff, v = _slurm_state(ctx)
    blocks = ", ".join(f"{b.name}={b.nodeset}" for b in slurm_plan.config.blocks)
    lines = [f"Slurm {slurm_plan.config.version} on {slurm_plan.config.controller.name}; blocks {blocks}"]
    if diff.changes == 0 and v is not None and v.ok:
        lines.append("nothing to deploy: files and MUNGE key in place, every tray registered, blocks match")
    else:
        changed = sorted({f"{f.name} ({f.status})" for f in diff.files if f.status in ("changed", "new")})
        lines.append(f"deploy Slurm to {len(slurm_plan.hosts)} hosts ({diff.changes} changes"
                     + (f": {', '.join(changed)}" if changed else "") + "), verify, then hold the rack's trays "
                     "drained until the open phase")
        if v is not None and not v.ok:
            lines += [f"  {p}" for p in v.problems()]
    return lines


def _hold(ctx: Context) -> tuple[list[str], dict[str, str]]:
    """Drain the rack's trays for the rest of the bring-up; trays someone else holds are left alone."""
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import run_on_controller

    trays = names(ctx.trays)
    res = run_on_controller(ctx.site, holds.hold_script(holds.BRING_UP, trays, holds.bringup_reason(ctx.run_id or "dry-run")))
    if not res.status.reached:
        raise PhaseFailed(f"could not drain the trays on {controller(ctx).name}: {res.summary()}")
    actions = holds.parse_actions(res.stdout, trays)
    held = [t for t, (what, _) in actions.items() if what == "done"]
    others = {t: text for t, (what, text) in actions.items() if what != "done"}
    return held, others


def run(ctx: Context) -> Outcome:
    from mctl.sched.slurm import apply

    skip = scheduler_skip(ctx)
    if skip:
        return Outcome("skipped", skip)
    slurm_plan, diff, v = _slurm_state(ctx)
    blocks = [{"name": b.name, "trays": b.nodeset} for b in slurm_plan.config.blocks]
    if diff.changes == 0 and v is not None and v.ok:
        return Outcome("done", f"Slurm unchanged: {len(v.nodes)} trays registered, {len(blocks)} blocks match the "
                       "partitions", artifacts={"blocks": blocks, "held": []})
    ctx.report.hosts_started("deploying Slurm", names(slurm_plan.hosts))
    try:
        with ctx.lent_lock():
            result = apply(slurm_plan, on_event=ctx.report.host_event)
    finally:
        ctx.report.hosts_ended()
    artifacts = {"run_id": result.run.run_id, "run_dir": result.run.run_dir, "blocks": blocks}
    if result.run.status == "canceled":
        raise KeyboardInterrupt
    if not result.ok:
        lines = [f"{n}: {result.run.hosts[n].status} at task '{result.run.hosts[n].failed_task}': "
                 f"{result.run.hosts[n].message}" for n in result.run.failed_hosts]
        lines += result.verification.problems() if result.verification else []
        raise PhaseFailed("Slurm deploy did not finish" + (f": failed on {fold(result.run.failed_hosts)}"
                                                           if result.run.failed_hosts else ""),
                          hint=f"run folder {result.run.run_dir}; 'mctl deploy slurm --dry-run' shows what differs",
                          details=lines, artifacts=artifacts)
    held, others = _hold(ctx)
    artifacts["held"] = held
    details = [f"{t} not held: {why}" for t, why in others.items()]
    return Outcome("done", f"deployed Slurm ({result.run.changed_total} changes), {len(result.verification.nodes)} "
                   f"trays registered, blocks match; {len(held)} trays held drained until open",
                   changed=True, details=details, artifacts=artifacts)


PHASE = Phase("scheduler", plan, run)
