"""The leak responder: what mctl does about leaks beyond the drain, tray by tray and rack by rack.

The leak episode of a compute tray (held critical, drained at once by the drain responder, ended by
clear readings) is the policy's (mctl.health.leaks, mctl.health.policy). This responder:

- powers a compute tray off through its BMC once its episode outlasted `health.leak.power_off_after`
  (the actuator's "power-off" batch: every due tray's BMC at once, each within its deadline) —
  any tray, mctl's drain, an operator's or DOWN, whatever the breaker and the budget say, unless the
  inventory excludes it (`health.leak.exclude`) — and notes once why an open episode will not;
- keeps an episode per **switch tray** from its BMC's leak detectors (found in its own tree under
  `MGX_BMC_0`) and acts by the rack's policy (`health.leak.switch_tray`): `power-off` the switch tray
  after the grace, `rack` the whole rack, `alert` a line and nothing else;
- powers the **whole rack** off, in the documented order (compute trays, then switch trays: mctl.bmc.power),
  once, after the grace, when leaks cover more than `health.leak.rack_share` of its trays (compute and
  switch), or a switch tray leaks under `switch_tray: rack` — unless `health.leak.rack_power_off` is
  false (then one line says so). mctl never powers anything on.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from mctl.health import leaks, store
from mctl.health.actuator import Act, Done
from mctl.health.record import PowerOffNote, RackLeak
from mctl.health.responders import Context, Responder
from mctl.model.drain import SKIP, Decision
from mctl.model.site import fold

RACK_POWER_OFF = "rack-power-off"         # the action (decision, action log)

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
        switch_due, switch_notes = self._switch_trays(ctx, state)
        rack_acts, rack_notes = self._racks(ctx, state)
        due += switch_due
        notes += switch_notes
        ctx.decisions += notes + due + [a.decision for a in rack_acts]

        def fold(ep, d: Decision, r):
            return leaks.sent(ep, at=d.at, result=r.result, power_state=r.power_state) if r.sent or r.ok \
                else replace(ep, power_off=PowerOffNote(d.at, r.result, r.power_state))    # tried again

        def settle(d: Decision) -> Callable[[Done], list]:
            def done_with(done: Done) -> list:
                if d.host in state.switch_leaks:
                    state.switch_leaks[d.host] = fold(state.switch_leaks[d.host], d, done.raw)
                elif d.host in state.records and state.records[d.host].leak is not None:
                    rec = state.records[d.host]
                    state.records[d.host] = replace(rec, leak=fold(rec.leak, d, done.raw))
                return []
            return done_with

        acts = [Act(d, batch="power-off", settle=settle(d)) for d in due] + rack_acts
        return await ctx.actuator.run(state, acts, before=[store.note_entry(n, who=ctx.who) for n in notes],
                                      after=rack_notes)

    # ------------------------------------------------------------------ switch trays

    def _switch_trays(self, ctx: Context, state: store.HealthState) -> tuple[list[Decision], list[Decision]]:
        """Each switch tray's episode, from the leak findings of its BMC this sweep; (power-offs due, notes)."""
        s, now = ctx.settings, ctx.now
        seen = getattr(ctx.result, "switch_bmcs", None) or {}
        due: list[Decision] = []
        notes: list[Decision] = []
        for rack in ctx.site.racks.values():
            for sw in rack.switches:
                findings = [f for f in ctx.result.findings if f.host == sw.name and f.check == leaks.LEAK]
                if sw.name not in seen and sw.name not in state.switch_leaks:
                    continue
                _, ep = leaks.step(state.switch_leaks.get(sw.name), findings, reached=sw.name in seen, now=now,
                                   clear_sweeps=s.leak_clear_sweeps)
                if ep is None:
                    state.switch_leaks.pop(sw.name, None)
                    continue
                state.switch_leaks[sw.name] = ep
                if s.leak_switch_tray != "power-off" or ep.sent or now < ep.since + s.leak_power_off_after_s:
                    if s.leak_switch_tray == "alert" and ep.blocked is None:
                        notes.append(Decision(sw.name, SKIP, "leak: switch tray leaking; health.leak.switch_tray is "
                                              "alert: nothing is powered off", rack=rack.name, at=now))
                        state.switch_leaks[sw.name] = replace(ep, blocked="alert")
                    continue
                excluded = sw.name in s.leak_exclude
                why = leaks.power_off_due(ep, excluded=excluded, enabled=s.leak_power_off,
                                          after_s=s.leak_power_off_after_s, now=now)
                if why is None:
                    blocked = leaks.blocked(ep, excluded=excluded, enabled=s.leak_power_off)
                    if blocked and ep.blocked != blocked:
                        notes.append(Decision(sw.name, SKIP, f"leak: not powered off: {blocked}", rack=rack.name,
                                              at=now))
                        state.switch_leaks[sw.name] = replace(ep, blocked=blocked)
                    continue
                due.append(Decision(sw.name, leaks.POWER_OFF, f"switch tray: {why}", rack=rack.name, at=now))
        return due, notes

    # ------------------------------------------------------------------ the whole rack

    def _racks(self, ctx: Context, state: store.HealthState) -> tuple[list[Act], list[store.ActionEntry]]:
        """The rack-wide response: (the rack power-offs to send, the lines that say why one is not sent)."""
        s, now = ctx.settings, ctx.now
        acts: list[Act] = []
        lines: list[store.ActionEntry] = []
        for name, rack in ctx.site.racks.items():
            trays = [h.name for h in rack.compute] + [h.name for h in rack.switches]
            leaking = sorted([t for t in trays if (state.records.get(t) and state.records[t].leak is not None)
                              or t in state.switch_leaks])
            switch_rule = s.leak_switch_tray == "rack" and any(h.name in state.switch_leaks for h in rack.switches)
            share = len(leaking) / len(trays) if trays else 0.0
            if not leaking or (share <= s.leak_rack_share and not switch_rule):
                state.rack_leaks.pop(name, None)
                continue
            why = (f"{len(leaking)} of {len(trays)} trays of rack {name} leak ({fold(leaking)}): "
                   + ("a switch tray leaks and health.leak.switch_tray is rack" if switch_rule
                      else f"{share:.0%} > health.leak.rack_share {s.leak_rack_share:.0%}"))
            known = state.rack_leaks.get(name)
            if known is None:
                known = state.rack_leaks[name] = RackLeak(now, why)
                lines.append(store.action_entry("rack-leak", None, None, who=ctx.who, result="noted", why=why,
                                                rack=name, trays=leaking))
            if known.sent or now < known.since + s.leak_power_off_after_s:
                continue
            if not s.leak_rack_power_off:
                if known.result != "not powered off":
                    state.rack_leaks[name] = replace(known, result="not powered off")
                    lines.append(store.action_entry("rack-leak", None, None, who=ctx.who, result="noted",
                                                    why=f"{why}; health.leak.rack_power_off is false: the rack "
                                                        "stays on", rack=name))
                continue
            acts.append(self._rack_act(ctx, state, rack, why))
        return acts, lines

    def _rack_act(self, ctx: Context, state: store.HealthState, rack, why: str) -> Act:
        """The whole rack off, in the documented order (mctl.bmc.power: compute trays, then switch trays),
        forced (a leak does not wait for jobs: they are named in the result), trays excluded by name left on."""
        s = ctx.settings
        hosts = [h for h in (*rack.compute, *rack.switches) if h.name not in s.leak_exclude]
        d = Decision(rack.name, RACK_POWER_OFF, why, rack=rack.name, at=ctx.now)

        async def run(go) -> Done:
            report = await asyncio.to_thread(_power_off_rack, ctx, hosts)
            return Done(report[0], raw=report, fields={"trays": [h.name for h in hosts], "detail": report[1]})

        def settle(done: Done) -> list:
            known = state.rack_leaks.get(rack.name)
            if known is not None:
                state.rack_leaks[rack.name] = replace(known, sent=True, result=done.result)
            return []

        return Act(d, run=run, settle=settle)


def _power_off_rack(ctx: Context, hosts) -> tuple[str, str]:
    """(result, what each stage did) of one rack power-off through the BMCs (mctl.bmc.power.run)."""
    from mctl.bmc import power
    from mctl.sched.work import discover

    if ctx.oob_settings is None:
        return f"failed: no BMC settings ({ctx.oob_problem or 'no bmc section'})", ""
    try:
        report = power.run(ctx.site, "off", power.groups_of(hosts), settings=ctx.oob_settings, force=True,
                           graceful_s=0.0, work_lookup=lambda names: discover(ctx.site, names))
    except Exception as exc:  # noqa: BLE001 - one rack's power-off must not end the watch
        return f"failed: {type(exc).__name__}: {exc}", ""
    data = report.to_dict()
    said = "; ".join(f"{st.get('name')}: {st.get('state')}" for st in data.get("stages", []))
    return ("ok" if report.exit_code == 0 else f"failed: exit {report.exit_code}"), said

    def dry_run(self, ctx: Context, state: store.HealthState) -> list[Decision]:
        due, _notes = self._due(ctx, state)
        return due
