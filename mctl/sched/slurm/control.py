"""Run one script on the site's Slurm controller over SSH (scontrol and squeue reads, guarded updates).

    run_on_controller(site, command, timeout=60) -> HostResult     never raises for an unreachable controller
    controller_run(site, command, timeout=30) -> HostResult        EnvironmentProblem when it does not answer

The one runner every Slurm read and update of mctl goes through on the controller (holds, the
work on the trays, a partition change's checks, bring-up's phases). The script's builder and the
parser of what it prints belong to the caller's concept (mctl.sched.slurm.holds, the health watch's
drains in mctl.sched.slurm.drain); this is only where it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.transport.results import HostResult


def run_on_controller(site: "Site", command: str, *, timeout: float = 60,
                      deadline: float | None = None) -> "HostResult":
    """The controller's result (never raises for an unreachable controller: see result.status)."""
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, [controller_of(site)]), command,
                    timeout=timeout, deadline=deadline)[0]


def controller_run(site: "Site", command: str, *, timeout: float = 30.0) -> "HostResult":
    """The controller's result within *timeout* (+10 s to connect); EnvironmentProblem when it did not answer."""
    from mctl.errors import EnvironmentProblem
    from mctl.sched.slurm.render import controller_of

    result = run_on_controller(site, command, timeout=timeout, deadline=timeout + 10.0)
    if not result.status.reached:
        raise EnvironmentProblem(f"the Slurm controller {controller_of(site).name} did not answer: {result.summary()}")
    return result
