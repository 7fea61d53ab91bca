"""The degraded-fabric mark: `nvl_degraded` on the Slurm trays of a partition whose NVLink fabric is degraded.

The decision is mctl.health.fabric_limit's (pure; the clear waits `resume_after_healthy_sweeps`
sweeps); the act is one bounded compare-and-set script on the controller per sweep
(mctl.sched.slurm.features), through the actuator as batch `fabric`. An act needs no intent:
the mark is read back from Slurm every sweep and set again when it is missing, so a watch
killed half way only leaves the next sweep to finish it. Slurm only: on Kubernetes the
responder does nothing (not done yet, docs/health.md says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mctl.health.actuator import Act, Done
from mctl.health import fabric_limit
from mctl.health.fabric_limit import Limits, wanted_marks
from mctl.health.responders import Context, Responder
from mctl.model.drain import Decision

if TYPE_CHECKING:
    from mctl.health.store import ActionEntry, HealthState

MARK, CLEAR = "fabric-mark", "fabric-clear"


class FabricLimitResponder(Responder):
    name = "fabric"

    def __init__(self, clear_sweeps: int):
        self.limits = Limits(clear_sweeps=max(1, clear_sweeps))
        self._steps: dict[str, object] = {}            # this sweep's compare-and-set step per tray

    def batch(self, scheduler, deadline: float):
        """The actuator's executor for the sweep's marks and clears: one script on the controller."""
        async def run(acts: list[Act]) -> list[Done]:
            steps = [self._steps[a.decision.host] for a in acts]
            results = await scheduler.set_features(steps, deadline=deadline)
            out = []
            for a in acts:
                r = results.get(a.decision.host)
                if r is None or r.status == "unreachable":
                    out.append(Done(f"failed: {r.text if r else 'no result'} (the next sweep tries again)"))
                elif r.ok:
                    out.append(Done("ok"))
                else:
                    out.append(Done(f"{'refused' if r.status == 'refused' else 'failed'}: {r.text}"))
            return out
        return run

    def _plan(self, ctx: Context) -> list[tuple[str, bool, str, object]]:
        from mctl.sched.slurm import features

        result = ctx.result
        if not result.switch_side or ctx.scheduler is None or getattr(ctx.scheduler, "kind", None) != "slurm":
            return []
        want, read = wanted_marks(result.switch_side, result.findings)
        trays = {}
        nodes = {}
        for h in ctx.scope.hosts:
            node = result.facts[h.name].slurm_node if h.name in result.facts else None
            if node is None or not hasattr(node, "fields"):
                continue                                 # not read from Slurm this sweep: nothing decided
            trays[h.name] = (h.rack, features.marked(node))
            nodes[h.name] = node
        out = []
        for tray, mark, why in self.limits.decide(trays, want, read):
            step = features.update(nodes[tray], mark)
            if step is not None:
                out.append((tray, mark, why, step))
        return out

    async def respond(self, ctx: Context, state: "HealthState") -> list["ActionEntry"]:
        from mctl.sched.slurm.features import FEATURE

        racks = {h.name: h.rack for h in ctx.scope.hosts}
        self.limits = fabric_limit.load(ctx.state_dir, self.limits.clear_sweeps)
        plan = self._plan(ctx)
        fabric_limit.save(ctx.state_dir, self.limits)
        self._steps = {tray: step for tray, _, _, step in plan}
        acts = [Act(Decision(tray, MARK if mark else CLEAR, why, reason=FEATURE, rack=racks.get(tray),
                             at=ctx.now),
                    batch="fabric", intent=False, result_fields={"feature": FEATURE})
                for tray, mark, why, _ in plan]
        if not acts:
            return []
        return await ctx.actuator.run(state, acts)

    def dry_run(self, ctx: Context, state: "HealthState") -> list[Decision]:
        from mctl.sched.slurm.features import FEATURE

        self.limits = fabric_limit.load(ctx.state_dir, self.limits.clear_sweeps)
        saved = dict(self.limits.healthy)
        try:
            return [Decision(tray, MARK if mark else CLEAR, why, reason=FEATURE) for tray, mark, why, _ in
                    self._plan(ctx)]
        finally:
            self.limits.healthy = saved
