"""The Slurm adapter the health engine drains and resumes through.

`scontrol` over SSH on the controller host (Site.scheduler.controller), through the
same connection pool as the sweep, so the watch keeps that connection open too.
Reading every node is one command; all actions of a sweep are one script
(mctl.sched.slurm.drain.apply_script) with a guard before each.

Like the Kubernetes adapter (mctl.sched.k8s.cordon.K8sAdapter) it exposes `kind`,
`where`, `read() -> (views, raw states)` and `apply(decisions) -> [ActResult]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from mctl.model.drain import ActResult, Decision, NodeView, SchedulerUnreachable
from mctl.model.budget import BudgetView
from mctl.sched.slurm.budget import split_reservations, with_reservations
from mctl.sched.slurm.drain import apply_script, controller_down, parse_apply, read_nodes, show_node_command

READ_COMMAND = with_reservations(show_node_command())    # the nodes, then the safety budget's grants

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.sched.slurm.facts import NodeState
    from mctl.transport import SSHPool, SSHTarget


class SlurmAdapter:
    kind = "slurm"

    def __init__(self, pool: "SSHPool", target: "SSHTarget", *, timeout: float = 30.0):
        self.pool = pool
        self.target = target
        self.timeout = timeout
        self.budget: BudgetView | None = None        # the safety budget's grants as the last read saw them

    @property
    def where(self) -> str:
        return f"slurmctld on {self.target.name}"

    async def read(self, *, deadline: float | None = None) -> tuple[dict[str, NodeView], dict[str, "NodeState"]]:
        """Every node, and the safety budget's grants beside them (one round trip; `budget`)."""
        result = await self.pool.run_one(self.target, READ_COMMAND, timeout=self.timeout,
                                         deadline=min(self.timeout, deadline) if deadline else None)
        if not result.status.reached:
            raise SchedulerUnreachable(f"{self.target.name} did not answer: {result.summary()}")
        text = result.stdout + result.stderr
        if not result.ok:
            said = (text.strip().splitlines() or [result.summary()])[-1]
            if controller_down(text):
                raise SchedulerUnreachable(f"slurmctld did not answer on {self.target.name}: {said}")
            raise SchedulerUnreachable(f"scontrol on {self.target.name} failed: {said}")
        nodes, self.budget = split_reservations(result.stdout)
        return read_nodes(nodes)

    async def apply(self, decisions: Sequence[Decision], *, deadline: float | None = None) -> list[ActResult]:
        if not decisions:
            return []
        limit = min(self.timeout, deadline) if deadline else self.timeout
        result = await self.pool.run_one(self.target, apply_script(decisions, limit_s=limit), timeout=self.timeout,
                                         deadline=min(self.timeout, deadline) if deadline else None)
        if not result.status.reached:
            return [ActResult(d, False, f"{self.target.name}: {result.summary()}", unreachable=True)
                    for d in decisions]
        return parse_apply(result.stdout, decisions)


    async def set_features(self, steps: Sequence, *, deadline: float | None = None) -> dict:
        """Put mctl's node feature on or off (mctl.sched.slurm.features): one bounded script; host -> StepResult."""
        from mctl.sched.slurm import features

        if not steps:
            return {}
        limit = min(self.timeout, deadline) if deadline else self.timeout
        result = await self.pool.run_one(self.target, features.script(steps, limit_s=limit), timeout=self.timeout,
                                         deadline=limit)
        hosts = [s.host for s in steps]
        if not result.status.reached:
            from mctl.sched.slurm.drain import StepResult

            return {h: StepResult(h, "unreachable", f"{self.target.name}: {result.summary()}") for h in hosts}
        return features.parse(result.stdout, hosts)

    async def release_grants(self, trays: Sequence[str], *, deadline: float | None = None) -> list[str]:
        """Give back the safety budget's grants of *trays* (mctl.sched.slurm.budget); the trays done."""
        from mctl.sched.slurm.budget import release_script

        result = await self.pool.run_one(self.target, release_script(trays), timeout=self.timeout,
                                         deadline=min(self.timeout, deadline) if deadline else None)
        if not result.status.reached:
            return []
        return [line.split()[1] for line in result.stdout.splitlines() if line.startswith("released ")]


def slurm_adapter(site: "Site", pool: "SSHPool") -> SlurmAdapter:
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import targets_for

    controller = controller_of(site)
    (target,) = targets_for(site, [controller])
    return SlurmAdapter(pool, target, timeout=min(30.0, site.ssh.command_timeout))
