"""The degraded-fabric mark on the trays of a partition whose NVLink fabric is degraded (D107).

Slurm: the node feature `nvl_degraded` (mctl.sched.slurm.features: one bounded compare-and-set
script on the controller per sweep, every other feature kept). Kubernetes: the node label
`mctl.io/nvlink-degraded=true` (mctl.sched.k8s.cordon.fabric_label_patch: a merge patch with the
node's resourceVersion, no other label touched). The decision is mctl.health.fabric_limit's
(pure; the clear waits `resume_after_healthy_sweeps` sweeps). The acts go through the actuator
as batch `fabric` with no intent: the mark is read back every sweep and set again when it is
missing, so a watch killed half way only leaves the next sweep to finish it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mctl.health import fabric_limit
from mctl.health.actuator import Act, Done
from mctl.health.fabric_limit import Limits, wanted_marks
from mctl.health.responders import Context, Responder
from mctl.model.drain import Decision

if TYPE_CHECKING:
    from mctl.health.store import ActionEntry, HealthState

MARK, CLEAR = "fabric-mark", "fabric-clear"
READ_DEADLINE_S = 10.0          # the Kubernetes nodes' labels, read once a sweep (a GET per node)


def mark_name(kind: str | None) -> str:
    from mctl.sched.k8s.cordon import FABRIC_LABEL
    from mctl.sched.slurm.features import FEATURE

    return FABRIC_LABEL if kind == "k8s" else FEATURE


class FabricLimitResponder(Responder):
    name = "fabric"

    def __init__(self, clear_sweeps: int):
        self.limits = Limits(clear_sweeps=max(1, clear_sweeps))
        self._steps: dict[str, object] = {}            # this sweep's Slurm compare-and-set step per tray

    def batch(self, scheduler, deadline: float):
        """The actuator's executor for the sweep's marks and clears (one script, or one patch per node)."""
        async def run(acts: list[Act]) -> list[Done]:
            if getattr(scheduler, "kind", None) == "k8s":
                said = await scheduler.set_fabric_marks([(a.decision.host, a.decision.action == MARK) for a in acts],
                                                        deadline=deadline)
                results = {h: (status, text) for h, (status, text) in said.items()}
            else:
                got = await scheduler.set_features([self._steps[a.decision.host] for a in acts], deadline=deadline)
                results = {h: (r.status, r.text) for h, r in got.items()}
            out = []
            for a in acts:
                status, text = results.get(a.decision.host, ("unreachable", "no result"))
                if status == "done":
                    out.append(Done("ok"))
                elif status == "unreachable":
                    out.append(Done(f"failed: {text} (the next sweep tries again)"))
                else:
                    out.append(Done(f"{'refused' if status == 'refused' else 'failed'}: {text}"))
            return out
        return run

    def _decide(self, ctx: Context, marked: dict[str, bool]) -> list[tuple[str, bool, str]]:
        result = ctx.result
        want, read = wanted_marks(result.switch_side, result.findings)
        racks = {h.name: h.rack for h in ctx.scope.hosts}
        return self.limits.decide({t: (racks.get(t), m) for t, m in marked.items()}, want, read)

    def _slurm_marks(self, ctx: Context) -> tuple[dict[str, bool], dict[str, object]]:
        from mctl.sched.slurm import features

        marked, nodes = {}, {}
        for h in ctx.scope.hosts:
            node = ctx.result.facts[h.name].slurm_node if h.name in ctx.result.facts else None
            if node is None or not hasattr(node, "fields"):
                continue                                 # not read from Slurm this sweep: nothing decided
            marked[h.name] = features.marked(node)
            nodes[h.name] = node
        return marked, nodes

    async def respond(self, ctx: Context, state: "HealthState") -> list["ActionEntry"]:
        from mctl.sched.slurm import features

        kind = getattr(ctx.scheduler, "kind", None)
        if not ctx.result.switch_side or kind not in ("slurm", "k8s"):
            return []
        self.limits = fabric_limit.load(ctx.state_dir, self.limits.clear_sweeps)
        if kind == "k8s":
            marked = await ctx.scheduler.fabric_marks([h.name for h in ctx.scope.hosts], deadline=READ_DEADLINE_S)
            plan = self._decide(ctx, marked)
            self._steps = {}
        else:
            marked, nodes = self._slurm_marks(ctx)
            plan = []
            self._steps = {}
            for t, m, why in self._decide(ctx, marked):
                step = features.update(nodes[t], m)
                if step is not None:
                    plan.append((t, m, why))
                    self._steps[t] = step
        fabric_limit.save(ctx.state_dir, self.limits)
        racks = {h.name: h.rack for h in ctx.scope.hosts}
        name = mark_name(kind)
        acts = [Act(Decision(t, MARK if m else CLEAR, why, reason=name, rack=racks.get(t), at=ctx.now),
                    batch="fabric", intent=False, result_fields={"mark": name}) for t, m, why in plan]
        if not acts:
            return []
        return await ctx.actuator.run(state, acts)

    def dry_run(self, ctx: Context, state: "HealthState") -> list[Decision]:
        """What the Slurm marks would be (a Kubernetes dry run reads no labels: it shows none)."""
        if not ctx.result.switch_side or getattr(ctx.scheduler, "kind", None) != "slurm":
            return []
        self.limits = fabric_limit.load(ctx.state_dir, self.limits.clear_sweeps)
        marked, _ = self._slurm_marks(ctx)
        return [Decision(t, MARK if m else CLEAR, why, reason=mark_name("slurm")) for t, m, why in
                self._decide(ctx, marked)]
