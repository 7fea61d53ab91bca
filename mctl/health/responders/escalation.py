"""The rack-escalation responder: one hold on a rack that fails as a whole, instead of drains one by one.

Runs first after each sweep (before the drain responder), under the state lock. Per rack of the scope
it folds the sweep into the rack's memory (mctl.health.escalation.observe: which compute trays fail and
since when, which switch trays are critical); when the rule says the rack must be held, it records a
`RackHold` and takes it through the actuator: one act per rack (`rack-escalation`: one intent line,
one result line naming the cause and the trays, so one event), whose effect is one guarded script on
the Slurm controller (mctl.sched.slurm.holds.hold_rack): every compute tray of the rack gets the one
reason `mctl: rack escalated: ...` — a free tray is drained (its jobs finish), a tray the watch drained
itself gets the rack's reason in place of its own, a tray drained by someone else or down is left alone
and named. Each tray asks the safety budget for a grant, counted, never held back (D99).

While a rack is held, the drain responder leaves its trays alone (no drain, no resume): the hold is
lifted by a person, `mctl health escalation lift RACK` (mctl.health.service), never by the watch. A hold
whose script failed (the controller did not answer) is sent again on the next sweep (idempotent: a tray
holding the reason already is counted held). On Kubernetes the hold is mctl's own taint on each node of
the rack (`mctl.io/rack-escalated=<rack>:NoSchedule`, its cause in an annotation; mctl.sched.k8s.cordon),
the watch's own cordons left as they are.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from mctl.health import escalation, store
from mctl.health.actuator import Act, Done
from mctl.health.escalation import RackHold
from mctl.health.responders import Context, Responder
from mctl.model.drain import SKIP, Decision
from mctl.model.site import fold

NO_HOLD = ("this scheduler takes no rack hold (Slurm and Kubernetes do); the trays are drained one by one "
           "(through the circuit breaker)")


def _kind(ctx: Context) -> str | None:
    return getattr(ctx.scheduler, "kind", None) or getattr(ctx.site.scheduler, "type", None)


def _backend(ctx: Context):
    """hold(rack hold, trays, the watch's own drains) -> (held, {tray: why not}, None or why no answer): Slurm's
    one guarded script (mctl.sched.slurm.holds.hold_rack), or Kubernetes' rack taint (mctl.sched.k8s.cordon);
    None where the scheduler takes no rack hold."""
    kind, site = _kind(ctx), ctx.site
    if kind == "slurm":
        from mctl.sched.slurm import holds

        return lambda hold, trays, own: holds.hold_rack(site, hold.rack, trays, hold.reason, own)
    if kind == "k8s" and hasattr(ctx.scheduler, "hold_rack"):
        adapter = ctx.scheduler
        return lambda hold, trays, own: adapter.hold_rack(hold.rack, trays, f"{hold.reason}: {hold.cause}")
    return None


def racks_in_scope(ctx: Context) -> list[str]:
    return [r for r in ctx.scope.racks if r in ctx.site.racks]


class EscalationResponder(Responder):
    name = "escalation"

    def __init__(self) -> None:
        self.said: dict[str, str] = {}      # rack -> the kind last noted (a scheduler without holds: once a change)

    def _observe(self, ctx: Context, state: store.HealthState) -> list[tuple[str, "escalation.Trigger"]]:
        """Each rack's memory advanced by this sweep; the racks that must be held now (not held yet)."""
        verdicts = {v.host: v for v in ctx.result.verdicts}
        out = []
        for name in racks_in_scope(ctx):
            rack = ctx.site.racks[name]
            switches = [h.name for h in rack.switches]
            findings = {sw: [f for f in ctx.result.findings if f.host == sw] for sw in switches}
            compute = [h.name for h in rack.compute]
            watch, trigger = escalation.observe(state.rack_watch.get(name), compute, switches,
                                                {t: verdicts[t] for t in compute if t in verdicts}, state.records,
                                                findings, ctx.settings, now=ctx.now,
                                                held=name in state.escalations)
            if watch.failing or watch.switch or watch.lifted_at is not None:
                state.rack_watch[name] = watch
            else:
                state.rack_watch.pop(name, None)
            if trigger is not None:
                out.append((name, trigger))
        return out

    async def respond(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        if not ctx.settings.escalation.enabled:
            return []
        triggers = self._observe(ctx, state)
        if _backend(ctx) is None:
            notes: list[store.ActionEntry] = []
            for name, trig in triggers:
                if self.said.get(name) != trig.kind:
                    self.said[name] = trig.kind
                    d = Decision(name, SKIP, f"{trig.cause}; {NO_HOLD}", rack=name, at=ctx.now)
                    notes.append(store.note_entry(d, who=ctx.who))
                    ctx.decisions.append(d)
            return await ctx.actuator.run(state, [], before=notes)
        for name, trig in triggers:
            state.escalations[name] = escalation.opened(trig, name, ctx.now)
        acts = [self._act(ctx, state, hold) for name, hold in sorted(state.escalations.items())
                if hold.result != "ok" and name in racks_in_scope(ctx)]
        ctx.decisions += [a.decision for a in acts]
        return await ctx.actuator.run(state, acts)

    def _act(self, ctx: Context, state: store.HealthState, hold: RackHold) -> Act:
        rack = ctx.site.racks[hold.rack]
        trays = [h.name for h in rack.compute]
        own = {t: state.records[t].reason for t in trays
               if t in state.records and state.records[t].drained and state.records[t].reason
               and not state.records[t].reason.startswith(escalation.ESCALATION_PREFIX)}
        d = Decision(hold.rack, escalation.ACTION, hold.cause, reason=hold.reason, rack=hold.rack, at=ctx.now)
        backend, retags = _backend(ctx), _kind(ctx) == "slurm"

        async def run(go) -> Done:
            held, left, error = await asyncio.to_thread(backend, hold, trays, own)
            if error is not None:
                result = f"failed: {error} (sent again next sweep)"
            elif left:
                result = f"partial: {len(held)} of {len(trays)} held; {fold(sorted(left))} left alone"
            else:
                result = "ok"
            return Done(result, raw=(held, left, error),
                        fields={"cause": hold.kind, "failed": list(hold.failed), "held": held, "left": left})

        def settle(done: Done) -> list:
            held, left, error = done.raw
            now_hold = state.escalations.get(hold.rack)
            if now_hold is None:
                return []
            state.escalations[hold.rack] = replace(now_hold, result="ok" if error is None else done.result,
                                                   held=tuple(held) if error is None else now_hold.held,
                                                   left=dict(left) if error is None else now_hold.left)
            if error is None and retags:
                for t in held:      # Slurm: the watch's own drains now carry the rack's reason
                    rec = state.records.get(t)
                    if rec is not None and rec.drained:
                        state.records[t] = replace(rec, reason=hold.reason, note=None)
            return []

        return Act(d, run=run, settle=settle, fields={"trays": trays, "scheduler": _kind(ctx)})

    def dry_run(self, ctx: Context, state: store.HealthState) -> list[Decision]:
        if not ctx.settings.escalation.enabled:
            return []
        out = []
        for name, trig in self._observe(ctx, state):
            state.escalations[name] = escalation.opened(trig, name, ctx.now)
            out.append(Decision(name, escalation.ACTION, trig.cause, reason=trig.reason, rack=name, at=ctx.now))
        return out
