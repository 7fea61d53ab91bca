"""open: the trays bring-up held are resumed in Slurm; trays drained by anyone else are left alone.

The scripts and their parsers come from mctl.sched.slurm.holds; they run on the
controller through sched.slurm.control.
"""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, controller, names, scheduler_skip
from mctl.errors import EXIT_PARTIAL
from mctl.model.site import fold


def _nodes(ctx: Context):
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import run_on_controller

    res = run_on_controller(ctx.site, holds.show_command(names(ctx.trays)))
    if not res.status.reached or "NodeName=" not in res.stdout:
        said = (res.stderr.strip().splitlines() or [res.summary()])[-1]
        raise PhaseFailed(f"cannot read the trays' Slurm state on {controller(ctx).name}: {said}",
                          exit_code=EXIT_PARTIAL)
    return holds.classify(res.stdout, names(ctx.trays))


def plan(ctx: Context) -> list[str]:
    from mctl.sched.slurm import holds

    skip = scheduler_skip(ctx)
    if skip:
        return [f"skipped: {skip}"]
    nodes = _nodes(ctx)
    lines = [f"Slurm now: {holds.summary(nodes)}"]
    lines.append(f"resume {fold(nodes.held)} (held by bring-up)" if nodes.held else "nothing to resume")
    lines += [f"left alone: {t} drained by someone else ({why})" for t, why in nodes.operator.items()]
    return lines


def run(ctx: Context) -> Outcome:
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import run_on_controller

    skip = scheduler_skip(ctx)
    if skip:
        return Outcome("skipped", f"{skip}: nothing to open")
    nodes = _nodes(ctx)
    resumed: list[str] = []
    details: list[str] = []
    if nodes.held:
        res = run_on_controller(ctx.site, holds.release_script(holds.BRING_UP, nodes.held))
        if not res.status.reached:
            raise PhaseFailed(f"could not resume the trays on {controller(ctx).name}: {res.summary()}")
        for t, (what, text) in holds.parse_actions(res.stdout, nodes.held).items():
            if what == "done":
                resumed.append(t)
            else:
                details.append(f"{t}: {text}")
        nodes = _nodes(ctx)
    details += [f"{t}: left drained (someone else's reason: {why})" for t, why in nodes.operator.items()]
    artifacts = {"nodes": nodes.to_dict(), "resumed": resumed}
    if nodes.down or nodes.unknown or nodes.held:
        raise PhaseFailed(f"not every tray is open: {holds.summary(nodes)}",
                          hint="see 'scontrol show node' on the controller", details=details, artifacts=artifacts)
    text = (f"resumed {fold(resumed)}; " if resumed else "") + holds.summary(nodes)
    return Outcome("done", text, changed=bool(resumed), details=details, artifacts=artifacts)


PHASE = Phase("open", plan, run)
