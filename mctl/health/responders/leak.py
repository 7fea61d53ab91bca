"""The leak responder: a tray whose critical leak outlasted its grace is powered off through its BMC, once.

The leak episode itself (held critical, drained at once by the drain responder, ended by clear
readings) is the policy's (mctl.health.leaks, mctl.health.policy). This responder only sends the
ForceOff once `health.leak.power_off_after` passed (the "power-off" batch of the actuator: every due
tray's BMC at once, each within its deadline), and notes once per change why an open episode will
not power its tray off.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from mctl.health import leaks, store
from mctl.health.actuator import Act, Done
from mctl.health.record import PowerOffNote
from mctl.health.responders import Context, Responder
from mctl.model.drain import SKIP, Decision

if TYPE_CHECKING:
    from mctl.model.site import Host

POWER_OFF_DEADLINE_MIN = 20.0


def power_off_batch(hosts_of: Callable[[], dict[str, "Host"]], oob_settings, oob_problem: str | None,
                    deadline: float):
    """The actuator's executor for power-offs: one BMC fan-out for the batch (mctl.health.oob.power_off)."""
    from mctl.health import oob

    async def run(acts: list[Act]) -> list[Done]:
        hosts = hosts_of()
        targets = [hosts[a.decision.host] for a in acts]
        if oob_settings is None:
            results = {h.name: oob.PowerOffResult(h.name, False, False, None,
                                                  f"no BMC settings ({oob_problem or 'no bmc section'})")
                       for h in targets}
        else:
            results = await asyncio.to_thread(oob.power_off, targets, oob_settings, deadline)
        out = []
        for a in acts:
            r = results[a.decision.host]
            out.append(Done(r.result, raw=r, fields={"power_state": r.power_state, "sent": r.sent}))
        return out
    return run


class LeakResponder(Responder):
    name = "leak"

    def _due(self, ctx: Context, state: store.HealthState) -> tuple[list[Decision], list[Decision]]:
        """(power-off decisions due now, notes of why an episode will not power its tray off: new ones only);
        the notes are kept in the episodes (`blocked`), so each is said once per change."""
        s = ctx.settings
        hosts = {h.name for h in ctx.scope.hosts}
        now = ctx.now
        due: list[Decision] = []
        notes: list[Decision] = []
        for name, rec in sorted(state.records.items()):
            ep = rec.leak
            if ep is None or ep.sent or name not in hosts:
                continue
            if now < ep.since + s.leak_power_off_after_s:
                continue
            excluded = name in s.leak_exclude
            why = leaks.power_off_due(ep, excluded=excluded, enabled=s.leak_power_off,
                                      after_s=s.leak_power_off_after_s, now=now)
            if why is None:
                blocked = leaks.blocked(ep, excluded=excluded, enabled=s.leak_power_off)
                if blocked and ep.blocked != blocked:
                    notes.append(Decision(name, SKIP, f"leak: not powered off: {blocked}", reason=rec.reason,
                                          rack=rec.rack, at=now))
                    state.records[name] = replace(rec, leak=replace(ep, blocked=blocked))
                continue
            due.append(Decision(name, leaks.POWER_OFF, why, reason=rec.reason, full=rec.full_reason, rack=rec.rack,
                                at=now))
        return due, notes

    async def respond(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        due, notes = self._due(ctx, state)
        ctx.decisions += notes + due

        def settle(d: Decision) -> Callable[[Done], list]:
            def fold(done: Done) -> list:
                r, rec = done.raw, state.records[d.host]
                ep = rec.leak
                if ep is not None:
                    ep = leaks.sent(ep, at=d.at, result=r.result, power_state=r.power_state) if r.sent or r.ok \
                        else replace(ep, power_off=PowerOffNote(d.at, r.result, r.power_state))  # tried again
                    state.records[d.host] = replace(rec, leak=ep)
                return []
            return fold

        acts = [Act(d, batch="power-off", settle=settle(d)) for d in due]
        return await ctx.actuator.run(state, acts, before=[store.note_entry(n, who=ctx.who) for n in notes])

    def dry_run(self, ctx: Context, state: store.HealthState) -> list[Decision]:
        due, _notes = self._due(ctx, state)
        return due
