"""The drain responder: the remediation policy's drains and resumes, through the scheduler, through the actuator.

After each sweep, under the state lock: the intents a killed mctl left without a result are
reconciled once (the first sweep that reads the scheduler), the policy decides each tray
(mctl.health.policy.decide: drain, resume, skip, forget, queue, adopt, through the circuit
breaker), the drains and resumes go to the scheduler in one guarded script (the actuator's
"scheduler" batch), and the records follow what the scheduler did.

With remediation a tray whose own answer decides a drain is drained as that answer arrives
(`EarlyDrains`), so a frozen tray's deadline never delays another tray's drain; the end of the
sweep then decides every other tray with the same breaker state (docs/health.md, "Drains as the
answers arrive").
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from mctl.health import escalation, policy, store
from mctl.health.actuator import Act, Done
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.health.responders import Context, Responder
from mctl.model.drain import DRAIN, QUEUE, RESUME, ActResult, Decision, NodeView
from mctl.model.findings import Severity
from mctl.model.site import fold

GRANT_GRACE_S = 10.0       # a grant this old whose tray is back in service goes back

if TYPE_CHECKING:
    from mctl.model.tray import TrayFacts


def scheduler_batch(scheduler, deadline: float):
    """The actuator's executor for drains and resumes: one `apply` (one guarded script) for the batch."""
    async def run(acts: list[Act]) -> list[Done]:
        applied = await scheduler.apply([a.decision for a in acts], deadline=deadline)
        by_host = {r.decision.host: r for r in applied}
        out = []
        for a in acts:
            r = by_host.get(a.decision.host) or ActResult(a.decision, False, "no result", unreachable=True)
            text = "ok" if r.ok else ("refused: " if r.refused else "failed: ") + (r.error or "")
            out.append(Done(text, action=None if r.ok or not r.unreachable else QUEUE, raw=r,
                            fields=dict(r.fields or {})))
        return out
    return run


def _act(d: Decision, where: str, outcome: policy.Outcome, verdict: TrayVerdict | None) -> Act:
    findings = [f.to_dict() for f in verdict.findings if f.severity is not Severity.OK] \
        if verdict is not None and d.action == DRAIN else None
    return Act(d, batch="scheduler", fields={"scheduler": where}, result_fields={"findings": findings},
               settle=lambda done: policy.settle(outcome, done.raw) or ())


class DrainResponder(Responder):
    name = "drain"

    def __init__(self) -> None:
        self.reconciled = False          # intents a killed mctl left are reconciled once, on the first sweep
        self.early: EarlyDrains | None = None     # this sweep's early drains (the engine sets it)
        self.stale_since: dict[str, float] = {}   # tray -> when its grant was first seen with the tray back in service

    # ------------------------------------------------------------------ the end of the sweep

    async def respond(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        result, early = ctx.result, self.early
        before: list[store.ActionEntry] = []
        if not self.reconciled and result.nodes is not None:
            before += reconcile(ctx, state, result.nodes)
            self.reconciled = True
        tripped_before = state.breaker.tripped
        acted = early.before if early is not None else {}
        held = [v for v in result.verdicts if v.rack in state.escalations]      # the rack's hold decides them
        outcome = policy.decide(state.records, [v for v in result.verdicts if v.host not in acted and
                                                v.rack not in state.escalations],
                                result.nodes, ctx.settings, state.breaker, ctx.sizes, now=ctx.now, budget=_budget(ctx))
        for v in held:
            prev = acted.get(v.host) or state.records.get(v.host) or TrayRecord(v.host, v.rack)
            step = policy.decide_tray(prev, v, (result.nodes or {}).get(v.host), ctx.settings,
                                      answered=result.nodes is not None, now=ctx.now)
            outcome.records[v.host] = _streaks_of(step.record, state.records.get(v.host) or prev)
        for v in result.verdicts:
            if v.host in acted and v.rack not in state.escalations:
                # Drained earlier in this sweep: its record advances once, on the whole verdict (the
                # rack-wide checks included), and keeps what the drain made of it.
                step = policy.decide_tray(acted[v.host], v, (result.nodes or {}).get(v.host), ctx.settings,
                                          answered=result.nodes is not None, now=ctx.now)
                outcome.records[v.host] = _with_drain_of(step.record, state.records[v.host])
        by_host = {v.host: v for v in result.verdicts}
        acts = [_act(d, ctx.scheduler.where, outcome, by_host.get(d.host)) for d in outcome.actions]
        notes = [store.note_entry(n, who=ctx.who) for n in outcome.notes]
        notes += self._budget_lines(ctx, state)
        notes += await self._give_back(ctx, result.nodes)

        def finish() -> list[store.ActionEntry]:
            # Once the drains are answered (a refusal of the safety budget settled: not counted), the trays
            # that waited on them, and the breaker's trip, which counts only the drains that happened.
            out = [store.note_entry(n, who=ctx.who) for n in policy.resolve(outcome, ctx.settings, ctx.sizes,
                                                                            now=ctx.now)]
            b = outcome.breaker
            if b.tripped and not tripped_before:
                out.append(store.action_entry("breaker-trip", None, b.reason, who=ctx.who, at=b.tripped_at,
                                              result="tripped", scope=ctx.settings.breaker_scope))
            return out

        def commit() -> None:
            state.records, state.breaker, state.site = outcome.records, outcome.breaker, ctx.site.name

        lines = await ctx.actuator.run(state, acts, before=before, after=notes, commit=commit, finish=finish)
        ctx.decisions += outcome.decisions
        return lines

    def _budget_lines(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        """One `budget-trip` line per trip of the site's safety budget (whoever tripped it: this watch, a
        tray's node check, a hold), naming the tray refused and the trays that hold its grants."""
        budget = _budget(ctx)
        if budget is None:
            return []
        out = self._drift_line(ctx, state, budget)
        if budget.tripped is None:
            state.budget_trip = None
            return out
        if state.budget_trip == budget.tripped:
            return out
        state.budget_trip = budget.tripped
        held = sorted(budget.grants)
        return out + [store.action_entry("budget-trip", None, None, who=ctx.who, result="tripped",
                                   why=f"the safety budget tripped: {budget.tripped}; {len(held)} trays hold its grants"
                                       f"{' (' + fold(held) + ')' if held else ''}; no tray is taken out of service "
                                       "by mctl until 'mctl health breaker reset'",
                                   grants=held, tripped_at=budget.tripped_at)]

    def _drift_line(self, ctx: Context, state: store.HealthState, budget) -> list[store.ActionEntry]:
        """One `budget-drift` line when the scheduler enforces other caps than the inventory declares (the
        inventory changed, `mctl deploy slurm` not run yet): the scheduler's numbers are the ones that hold."""
        from mctl.sched.slurm.budget import site_caps

        drift = "; ".join(budget.drift(site_caps(ctx.site)))
        if (drift or None) == state.budget_drift:
            return []
        state.budget_drift = drift or None
        if not drift:
            return []
        return [store.action_entry("budget-drift", None, None, who=ctx.who, result="differs",
                                   why=f"the safety budget in the scheduler is not the inventory's ({drift}); the "
                                       "scheduler's caps hold until 'mctl deploy slurm' applies the inventory")]

    async def _give_back(self, ctx: Context, nodes: dict[str, NodeView] | None) -> list[store.ActionEntry]:
        """Grants of the safety budget whose tray is back in service by other hands (an operator resumed it:
        neither drained nor held by mctl, nor down) go back, once the grant is older than GRANT_GRACE_S by the
        controller's clock (a grant is made just before its drain, so a young one may be a drain in flight);
        where that clock was not read, once this watch saw it so for that long."""
        budget = _budget(ctx)
        release = getattr(ctx.scheduler, "release_grants", None)
        if budget is None or nodes is None or release is None:
            return []
        back = [t for t in budget.grants if t in nodes and not nodes[t].mctl_drain and not nodes[t].down]
        self.stale_since = {t: self.stale_since.get(t, ctx.now) for t in back}

        def old(t: str) -> bool:
            age = budget.age(t)
            return (age if age is not None else ctx.now - self.stale_since[t]) >= GRANT_GRACE_S

        due = sorted(t for t in back if old(t))
        if not due:
            return []
        done = await release(due)
        for t in done:
            self.stale_since.pop(t, None)
        return [store.action_entry("budget-release", t, None, who=ctx.who, result="ok" if t in done else "failed",
                                   why=f"back in service by other hands ({nodes[t].state}): its grant of the safety "
                                       "budget goes back") for t in due]

    def dry_run(self, ctx: Context, state: store.HealthState) -> list[Decision]:
        outcome = policy.decide(state.records, [v for v in ctx.result.verdicts if v.rack not in state.escalations],
                                ctx.result.nodes, ctx.settings, state.breaker, ctx.sizes, now=ctx.now,
                                budget=_budget(ctx))
        policy.resolve(outcome, ctx.settings, ctx.sizes, now=ctx.now)     # as if every drain asked were done
        state.records, state.breaker = outcome.records, outcome.breaker
        return outcome.decisions

    # ------------------------------------------------------------------ as the answers arrive

    async def drain_early(self, ctx: Context, hosts: list[str], facts: dict[str, "TrayFacts"],
                          nodes: dict[str, NodeView], states: dict, early: "EarlyDrains",
                          verdict_of) -> None:
        """Drain now the trays among *hosts* whose own answer already decides a drain; every other tray
        waits for the end of the sweep.

        A tray is drained here only when the policy, on its record and its own findings, wants a drain
        and the circuit breaker admits it, threaded through the same breaker state as the end-of-sweep
        pass; one the breaker refuses is left to that pass (which skips it with the breaker's reason, or
        trips it), so no sweep drains more than deciding all trays at once would."""
        with store.state_lock(ctx.state_dir):
            state = store.load_state(ctx.state_dir)
            before: list[store.ActionEntry] = []
            if not self.reconciled:
                before = reconcile(ctx, state, nodes)
                self.reconciled = True
            now = time.time()
            s = ctx.settings
            breaker = state.breaker if state.breaker.tripped else state.breaker.pruned(now, s.breaker_window_s)
            records = dict(state.records)
            decisions: list[Decision] = []
            notes: list[Decision] = []
            verdicts: dict[str, TrayVerdict] = {}
            wanted: list[Decision] = []
            asked: list[str] = []           # drains of this batch, not answered yet (the breaker waits on them)
            steps = []
            for host in sorted(hosts):
                v = verdict_of(facts[host].with_slurm_node(states.get(host)))
                prev = records.get(host) or TrayRecord(host, v.rack)
                step = policy.decide_tray(prev, v, nodes.get(host), s, answered=True, now=now)
                if step.want is not None and v.rack not in state.escalations:
                    steps.append((host, v, prev, step))
            # trays of a rack wanting a drain in this batch, and those of it drained earlier in this sweep
            per_rack = Counter(v.rack for _h, v, _p, _s in steps) + Counter(
                records[h].rack for h in early.before if h in records)
            for host, v, prev, step in steps:
                if escalation.held_back_early(state.rack_watch.get(v.rack or ""), host, per_rack[v.rack], s):
                    continue        # its rack may escalate: the end of the sweep decides it with the rack's answers
                admitted, d, _why = policy.admit(breaker, step, v, s, ctx.sizes, _budget(ctx), now=now, asked=asked)
                if d is None:
                    continue        # not tripped here: the end of the sweep decides it with every other tray
                breaker = admitted
                asked.append(host)
                early.before[host] = prev
                verdicts[host] = v
                records[host] = policy.drained(step.record, d)
                decisions += step.decisions + [d]
                notes += step.notes
                wanted.append(d)
            if not wanted and not before:
                return
            outcome = policy.Outcome(records, decisions, breaker, notes)
            acts = [_act(d, ctx.scheduler.where, outcome, verdicts[d.host]) for d in wanted]

            def commit() -> None:
                if wanted:
                    state.records, state.breaker, state.site = outcome.records, outcome.breaker, ctx.site.name

            early.logged += await ctx.actuator.run(
                state, acts, before=before, after=[store.note_entry(n, who=ctx.who) for n in notes] if wanted else [],
                commit=commit)
            early.decisions += decisions


class EarlyDrains:
    """The drains of one sweep that are decided as the trays' answers arrive (watch with remediation).

    One task takes the trays offered since its last batch, once the scheduler's view is in, and
    drains those whose own answer decides it (DrainResponder.drain_early); batches follow each other,
    so the state lock is taken by one at a time. close() lets the batch in progress finish and leaves
    the trays not taken yet to the end of the sweep."""

    def __init__(self, drains: DrainResponder, ctx_of, verdict_of):
        self.drains = drains
        self.ctx_of = ctx_of
        self.verdict_of = verdict_of
        self.read: "asyncio.Future | None" = None
        self.facts: dict[str, "TrayFacts"] = {}
        self.offered: list[str] = []
        self.wake = asyncio.Event()
        self.closed = False
        self.before: dict[str, TrayRecord] = {}      # tray drained early -> its record before this sweep
        self.decisions: list[Decision] = []
        self.logged: list[store.ActionEntry] = []
        self.task: "asyncio.Task | None" = None

    def offer(self, facts: "TrayFacts", read: "asyncio.Future") -> None:
        self.facts[facts.host] = facts
        if self.task is None:
            self.read = read
            self.task = asyncio.ensure_future(self._run())
        self.offered.append(facts.host)
        self.wake.set()

    async def _run(self) -> None:
        views, states, error = await asyncio.shield(self.read)
        if views is None or error:
            return              # the scheduler did not answer: the end of the sweep queues the actions
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.closed:
                return
            batch, self.offered = self.offered, []
            if batch:
                await self.drains.drain_early(self.ctx_of(), batch, self.facts, views, states or {}, self,
                                              self.verdict_of)

    async def close(self) -> None:
        self.closed = True
        self.wake.set()
        if self.task is not None:
            await self.task

    def cancel(self) -> None:
        """Stop the task if the sweep ends another way (it failed, or a second Ctrl-C cancelled it)."""
        if self.task is None:
            return
        if not self.task.done():
            self.task.cancel()
        elif not self.task.cancelled():
            self.task.exception()       # retrieved: the sweep's own error is the one reported


def _budget(ctx: Context):
    """The site's safety budget as the scheduler's last read showed it (None: this scheduler keeps none)."""
    return getattr(ctx.scheduler, "budget", None)


def _streaks_of(advanced: TrayRecord, held: TrayRecord) -> TrayRecord:
    """A tray of a rack held by escalation: its streaks and status advance (what `health drains` shows), while
    what mctl owns of it stays as the hold left it (the lift, not the watch, resumes it)."""
    return replace(held, status=advanced.status, misses=advanced.misses, bad_streak=advanced.bad_streak,
                   healthy_streak=advanced.healthy_streak, latches=advanced.latches, leak=advanced.leak)


def _with_drain_of(advanced: TrayRecord, drained: TrayRecord) -> TrayRecord:
    """*advanced* (this sweep's record from the whole verdict) with what an early drain made of the tray."""
    return replace(advanced, drained=drained.drained, reason=drained.reason, full_reason=drained.full_reason,
                   drained_at=drained.drained_at, pending=drained.pending, note=drained.note,
                   healthy_streak=drained.healthy_streak)


def reconcile(ctx: Context, state: store.HealthState, nodes: dict[str, NodeView]) -> list[store.ActionEntry]:
    """Settle the intents a killed mctl left without a result against the scheduler's view now:
    one action-log line each (the action, `ok` or `failed`, reconciled) and records to match."""
    out = []
    for intent in store.unresolved_intents(ctx.state_dir):
        host = intent.tray
        if not host or intent.intent not in (DRAIN, RESUME):
            continue
        at = _epoch(intent.time)
        d = Decision(host, intent.intent, intent.why or "", reason=intent.reason, full=intent.full_reason,
                     rack=intent.rack, at=at)
        rec, state.breaker, applied = policy.reconcile(state.records.get(host), state.breaker, d, nodes.get(host))
        if rec is not None:
            state.records[host] = rec
        node = nodes.get(host)
        seen = f"{node.state}, reason {node.reason!r}" if node else "not a node of the scheduler"
        out.append(store.action_entry(
            d.action, host, d.reason, who=ctx.who, full=d.full, at=at,
            result="ok" if applied else f"failed: not applied (the scheduler shows {seen})",
            why=f"reconciled after an interrupted run ({seen}): {intent.why or d.action}", rack=d.rack,
            scheduler=ctx.scheduler.where if ctx.scheduler else None, intent_id=intent.intent_id))
    return out


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()

