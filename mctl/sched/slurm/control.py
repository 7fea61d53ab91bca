"""Run one script on the site's Slurm controller over SSH (scontrol reads and guarded updates).

    run_on_controller(site, command, timeout=60) -> HostResult

The script's builder and the parser of what it prints belong to the caller's
concept (bring-up's holds, the health watch's drains); this is only where it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.transport.results import HostResult


def run_on_controller(site: "Site", command: str, *, timeout: float = 60) -> "HostResult":
    """The controller's result (never raises for an unreachable controller: see result.status)."""
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, [controller_of(site)]), command,
                    timeout=timeout)[0]
