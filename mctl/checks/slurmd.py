"""slurmd runs on the tray and the controller hears from it (Slurm sites only)."""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

CHECK = "slurm.slurmd"


def check(facts, expect, settings) -> list[Finding]:
    if expect.scheduler != "slurm":
        return []
    host = facts.host
    svc = facts.slurmd
    node = facts.slurm_node
    if svc is not None and svc.installed is False:
        return [fail(host, CHECK, "slurmd is not installed",
                     "mctl deploy slurm (or provision the tray's image)", short="slurmd not installed")]
    if svc is not None and not svc.running:
        return [fail(host, CHECK, f"slurmd is not running ({svc.short})",
                     "systemctl restart slurmd on the tray; see /var/log/slurm/slurmd.log",
                     short="slurmd not running")]
    if node is not None and ("NOT_RESPONDING" in node.flags or node.state.endswith("*")):
        return [finding(Severity.WARN, host, CHECK, f"slurmctld does not hear from slurmd (state {node.state})",
                        "check the network between the tray and the controller, and slurmd's port")]
    if svc is None and node is None:
        return []
    state = f", Slurm state {node.state}" if node is not None else ""
    return [ok(host, CHECK, f"slurmd running{state}")]
