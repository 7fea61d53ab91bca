"""What to do about each tray after a sweep: the remediation policy (pure).

Per tray mctl keeps a small record: consecutive unreachable sweeps (misses),
consecutive critical sweeps, consecutive healthy sweeps, and whether mctl owns
a drain on it (with the exact reason it set). From the record, this sweep's
verdict and the scheduler's view of the node, `decide` returns decisions:

- drain: critical for `confirm_sweeps` sweeps, or unreachable for
  `unreachable_sweeps_before_drain` sweeps (an unreachable tray is not an
  unhealthy one), and the circuit breaker admits it;
- resume: mctl drained it, its reason still starts with `mctl:`, and it has
  been healthy (no critical finding) for `resume_after_healthy_sweeps` sweeps;
- skip: a guard said no (node DOWN, drained by an operator or another tool,
  breaker tripped, not a scheduler node); logged once per change;
- forget: mctl's drain was lifted or taken over by someone else, so mctl no
  longer owns it;
- queue: the scheduler did not answer; the action waits and is re-decided
  (guards included) on the next sweep that reaches it;
- adopt: a drain mctl had resumed is back, with the same reason and the same
  Slurm stamp (who@time) it had when mctl resumed it: a controller restarted
  from a state saved before the resume (a SIGKILLed slurmctld does). The drain
  is mctl's again, and the usual resume follows (D56). A drain with the same
  reason and a new stamp is a new drain (the node check, another watch), and
  held as someone else's.

The guards follow LBNL NHC: never overwrite a reason set by someone else, only
resume own drains, never touch down nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from mctl.health import breaker as breakerlib
from mctl.health.breaker import BreakerState
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.checks import compose_reason, drain_reason
from mctl.model.settings import HealthSettings
from mctl.model.drain import (ADOPT, DRAIN, FORGET, QUEUE, RESUME, SKIP, ActResult, Decision, NodeView, PendingAction,
                              drain_refusal, is_mctl_reason, resume_refusal)
from mctl.model.findings import Severity

if TYPE_CHECKING:
    from mctl.health.record import Latch, LeakEpisode
    from mctl.model.budget import BudgetView


@dataclass
class Outcome:
    records: dict[str, TrayRecord]
    decisions: list[Decision]
    breaker: BreakerState
    notes: list[Decision] = field(default_factory=list)      # skips/queues that are new this sweep
    # trays the breaker decides once this pass's drains are answered (`resolve`): they would pass its share
    # only with drains the scheduler (the site's safety budget) may still refuse
    waiting: list[tuple[TrayVerdict, TrayStep]] = field(default_factory=list)

    @property
    def actions(self) -> list[Decision]:
        return [d for d in self.decisions if d.action in (DRAIN, RESUME)]


def _advance(rec: TrayRecord, v: TrayVerdict) -> TrayRecord:
    from mctl.checks.boot import in_grace

    if not v.reached:
        return replace(rec, rack=v.rack, status="unreachable", misses=rec.misses + 1, healthy_streak=0)
    if v.worst is not Severity.CRITICAL and in_grace(v.findings):
        # Half booted (mctl.checks.boot): not failed, and not healthy either, until the grace ends.
        return replace(rec, rack=v.rack, status=v.worst.value, misses=0, bad_streak=0, healthy_streak=0)
    if v.worst is Severity.CRITICAL:
        return replace(rec, rack=v.rack, status="critical", misses=0, bad_streak=rec.bad_streak + 1, healthy_streak=0)
    return replace(rec, rack=v.rack, status=v.worst.value, misses=0, bad_streak=0,
                   healthy_streak=rec.healthy_streak + 1)


def _held(rec: TrayRecord, v: TrayVerdict, s: HealthSettings) -> tuple[TrayVerdict, "dict[str, Latch] | None"]:
    """This sweep's verdict with the findings hysteresis still holds (flapping links, XID storms)."""
    from mctl.health.hysteresis import step
    from mctl.model.findings import worst

    findings, latches = step(rec.latches, v.findings, s.hysteresis, reached=v.reached)
    if not v.reached or findings == list(v.findings):
        return v, latches or None
    level = v.worst if v.worst.rank >= worst(findings).rank else worst(findings)
    return replace(v, findings=tuple(findings), worst=level), latches or None


def _leak_held(rec: TrayRecord, v: TrayVerdict, s: HealthSettings, now: float
               ) -> tuple[TrayVerdict, "LeakEpisode | None"]:
    """This sweep's verdict with an open leak episode's finding held critical (mctl.health.leaks)."""
    from mctl.health import leaks
    from mctl.model.findings import worst

    findings, episode = leaks.step(rec.leak, v.findings, reached=v.reached, now=now, clear_sweeps=s.leak_clear_sweeps)
    if findings == list(v.findings):
        return v, episode
    level = v.worst if v.worst.rank >= worst(findings).rank else worst(findings)
    return replace(v, findings=tuple(findings), worst=level), episode


def _wanted_drain(rec: TrayRecord, v: TrayVerdict, s: HealthSettings) -> tuple[str, str] | None:
    """(reason, full text) when the tray should be drained now, else None."""
    from mctl.health import leaks

    if leaks.drain_now(v.findings):          # a critical leak drains at once, reached or not (docs/health.md)
        crit = v.findings if v.reached else leaks.drain_now(v.findings)
        return drain_reason(crit)
    if v.reached:
        if v.worst is Severity.CRITICAL and rec.bad_streak >= s.confirm_sweeps:
            reason, full = drain_reason(v.findings)
            if s.confirm_sweeps > 1:
                full += f" (critical for {rec.bad_streak} sweeps)"
            return reason, full
        return None
    if rec.misses >= s.unreachable_sweeps_before_drain:
        what = {"timeout": "hung", "host-key-mismatch": "host key refused"}.get(v.reach, "unreachable")
        detail = "; ".join(f.message for f in v.findings) or v.reach
        return (compose_reason(f"{what} {rec.misses} sweeps"),
                f"tray.reachable: {what} for {rec.misses} consecutive sweeps: {detail}")
    return None


@dataclass
class TrayStep:
    """What the policy makes of one tray this sweep, before the breaker: its new record, its decisions
    (the notes among them: skips, queues and forgets that are new), and the drain it wants."""

    record: TrayRecord
    decisions: list[Decision] = field(default_factory=list)
    notes: list[Decision] = field(default_factory=list)
    want: tuple[str, str] | None = None         # (reason, full) of a drain the breaker must admit
    outranks: bool = False                      # the drain is a critical leak's: no breaker or budget holds it back

    def note(self, action: str, why: str, now: float, **kw: Any) -> "TrayStep":
        """A skip or queue: decided every sweep, logged once per change of its message."""
        d = Decision(self.record.host, action, why, rack=self.record.rack, at=now, **kw)
        self.decisions.append(d)
        if self.record.note != why:
            self.notes.append(d)
        self.record = replace(self.record, note=why)
        return self

    def forget(self, why: str, now: float) -> "TrayStep":
        """mctl's drain was lifted or taken over: mctl no longer owns it (always logged)."""
        d = Decision(self.record.host, FORGET, why, reason=self.record.reason, rack=self.record.rack, at=now)
        self.decisions.append(d)
        self.notes.append(d)
        self.record = self.record.released(note=None)
        return self


def _queued(step: TrayStep, want: tuple[str, str] | None, s: HealthSettings, now: float) -> TrayStep:
    """The scheduler did not answer: the action it would get waits in the record."""
    rec = step.record
    since = rec.pending.since if rec.pending and rec.pending.since is not None else now
    if rec.drained and rec.healthy_streak >= s.resume_after_healthy_sweeps:
        step.record = replace(rec, pending=PendingAction(RESUME, rec.reason, since))
        return step.note(QUEUE, "scheduler unreachable: resume queued", now, reason=rec.reason)
    if want and not rec.drained:
        step.record = replace(rec, pending=PendingAction(DRAIN, want[0], since, want[1]))
        return step.note(QUEUE, "scheduler unreachable: drain queued", now, reason=want[0], full=want[1])
    step.record = replace(rec, pending=None)
    return step


def _restored(rec: TrayRecord, node: NodeView) -> bool:
    """The drain on *node* is the one mctl resumed last, brought back by the scheduler (see `adopt` above):
    the same reason and the same stamp. Without a stamp (Kubernetes, an older record) it cannot be told
    from a new drain, so it is not."""
    last = rec.resumed
    return (not rec.drained and last is not None and node.drained and bool(node.stamp)
            and node.reason == last.reason and node.stamp == last.stamp)


def _adopt(step: TrayStep, node: NodeView, now: float) -> TrayStep:
    """Own again a drain the scheduler restored after mctl's resume (always logged)."""
    rec, last = step.record, step.record.resumed
    at = last.at if last is not None else None
    when = time.strftime("%H:%M:%S", time.gmtime(at)) + " UTC" if isinstance(at, (int, float)) else "earlier"
    why = (f"its drain came back with the stamp it had when mctl resumed it at {when} ({node.stamp}): "
           "the scheduler restored a state saved before that resume; mctl owns the drain again")
    full = last.full if last is not None else None
    d = Decision(rec.host, ADOPT, why, reason=node.reason, full=full, rack=rec.rack, at=now)
    step.decisions.append(d)
    step.notes.append(d)
    step.record = replace(rec, drained=True, reason=node.reason, full_reason=full or node.reason,
                          drained_at=now, drain_stamp=node.stamp, resumed=None, note=None)
    return step


def _own_drain(step: TrayStep, node: NodeView, s: HealthSettings, now: float) -> bool:
    """A tray mctl drained: forget the drain if it is gone or someone else's, resume it once healthy.
    False when the drain was lifted outside mctl: the tray may be drained again this very sweep."""
    rec = step.record
    if node.drained and node.stamp and node.reason == rec.reason and node.stamp != rec.drain_stamp:
        rec = step.record = replace(rec, drain_stamp=node.stamp)       # which drain this is (see `adopt`)
    if rec.ladder is not None:      # only the watch's records carry one (not the node check's bundle)
        from mctl.health import ladder
    ours = rec.ladder is not None and ladder.rebooted_by_us(rec, node)     # DOWN after a rung of mctl's own
    if not node.drained and not ours:
        step.forget("resumed outside mctl", now)
        return False
    if not is_mctl_reason(node.reason) and not ours:
        step.forget(f"reason changed to {node.reason!r}: the drain is someone else's now", now)
        return True
    if rec.healthy_streak < s.resume_after_healthy_sweeps:
        return True
    held = ladder.holds_resume(rec) if rec.ladder is not None else None
    if held is not None:
        step.note(SKIP, held, now, reason=node.reason)
        return True
    after_reboot = rec.ladder is not None and ladder.down_is_ours(rec, node)
    if node.unregistered:
        # A controller that just started (from saved state) has not heard from the node yet (Slurm UNKNOWN).
        # Slurm's RESUME of such a node lifts the drain but answers "Invalid node state specified": wait.
        step.note(SKIP, f"healthy again; the scheduler has not heard from the node since it started "
                        f"({node.state}): the resume waits for it", now, reason=node.reason)
        return True
    if resume_refusal(node) is not None and not after_reboot:     # down (the ownership was checked above)
        step.note(SKIP, "healthy again but the node is DOWN; mctl never touches down nodes", now, reason=node.reason)
        return True
    why = f"healthy for {rec.healthy_streak} sweeps" + (" after the recovery ladder rebooted it" if after_reboot else "")
    step.decisions.append(Decision(rec.host, RESUME, why, reason=node.reason,
                                   full=rec.full_reason, rack=rec.rack, at=now, after_reboot=after_reboot))
    step.record = replace(rec, note=None)
    return True


def decide_tray(prev: TrayRecord, verdict: TrayVerdict, node: NodeView | None, settings: HealthSettings, *,
                answered: bool, now: float) -> TrayStep:
    """One tray's sweep: advance its record, then drain, resume, skip, forget or queue.

    *answered* False: the scheduler did not answer (actions are queued); else *node* is its view of
    the tray (None: not a node of the scheduler). A drain is only wanted here; `decide` passes it
    through the circuit breaker."""
    v, latches = _held(prev, verdict, settings)
    v, leak = _leak_held(prev, v, settings, now)
    step = TrayStep(_advance(replace(prev, latches=latches, leak=leak), v))
    want = _wanted_drain(step.record, v, settings)
    if not answered:
        return _queued(step, want, settings, now)
    step.record = replace(step.record, pending=None)
    if node is None or not node.known:
        return step.note(SKIP, "not a node of the scheduler", now) if want else step
    if _restored(step.record, node):
        _adopt(step, node, now)
    if step.record.drained and _own_drain(step, node, settings, now):
        return step
    if not want:
        if step.record.note:
            step.record = replace(step.record, note=None)
        return step
    refusal = drain_refusal(node)
    if refusal is not None and refusal.kind == "down":
        return step.note(SKIP, f"node is {node.state or 'DOWN'}; mctl never touches down nodes", now)
    if refusal is not None:
        who = "mctl elsewhere (node check or another watch)" if node.mctl_drain else "an operator or another tool"
        return step.note(SKIP, f"already drained by {who}: {node.reason or 'no reason'}", now)
    from mctl.health import leaks

    step.want = want
    step.outranks = bool(leaks.drain_now(v.findings))
    return step


def admit(state: BreakerState, step: TrayStep, v: TrayVerdict, settings: HealthSettings,
          rack_sizes: Mapping[str, int], budget: "BudgetView | None", *, now: float, asked: Collection[str] = ()
          ) -> tuple[BreakerState, Decision | None, str | None]:
    """(the breaker, the drain, why not) for a tray that wants a drain: a critical leak is drained whatever
    the breaker and the site's safety budget say (counted by both); otherwise a tripped budget holds it
    back, then the breaker decides. The budget's grant itself is asked atomically with the drain (by the
    scheduler's script: mctl.sched.slurm.budget), so this only saves a refusal the ledger would give.
    *asked*: the trays drained earlier in this pass, not answered yet; a tray that would pass the breaker's
    share only with them gets no drain and no trip here, and `WAITS` as its why (see `resolve`)."""
    reason, full = step.want or ("", "")
    if step.outranks:
        state = breakerlib.count(state, v.host, v.rack, now)
        return state, Decision(v.host, DRAIN, "a critical leak: drained whatever the circuit breaker and the safety "
                                              "budget say (counted by both)", reason=reason, full=full, rack=v.rack,
                               at=now, outranks_budget=True), None
    held = budget.held_back() if budget is not None else None
    if held is not None:
        return state, None, held
    adm = breakerlib.admit(state, v.host, v.rack, rack_sizes, max_share=settings.breaker_max_share,
                           window_s=settings.breaker_window_s, scope=settings.breaker_scope, now=now, asked=asked)
    if adm.waits:
        return adm.state, None, WAITS
    if not adm.allowed:
        return adm.state, None, adm.why
    return adm.state, Decision(v.host, DRAIN, adm.why, reason=reason, full=full, rack=v.rack, at=now), None


WAITS = "waits for this sweep's drains to be answered"      # admit's why for a tray `resolve` decides


def resolve(outcome: Outcome, settings: HealthSettings, rack_sizes: Mapping[str, int], *, now: float) -> list[Decision]:
    """Once this pass's drains are answered (settled into *outcome*: a drain the scheduler or the site's
    safety budget refused is no longer counted), decide the trays that were waiting on them: the breaker
    trips when the drains that happened and the tray would pass its share; otherwise the tray is not drained
    this sweep (the drain it would need went unasked) and the next sweep decides it again, against the
    budget's trip if the budget refused. The new notes, which are also added to the outcome."""
    new: list[Decision] = []
    for v, step in outcome.waiting:
        reason, full = step.want or ("", "")
        adm = breakerlib.admit(outcome.breaker, v.host, v.rack, rack_sizes, max_share=settings.breaker_max_share,
                               window_s=settings.breaker_window_s, scope=settings.breaker_scope, now=now)
        if adm.allowed:
            why = ("not drained this sweep: with the drains asked before it the circuit breaker's share would have "
                   "been passed, and some of them were refused (the safety budget or a guard); the next sweep "
                   "decides it again")
        else:
            outcome.breaker, why = adm.state, adm.why
        seen = len(step.decisions), len(step.notes)
        step.note(SKIP, why, now, reason=reason, full=full)
        outcome.decisions += step.decisions[seen[0]:]
        new += step.notes[seen[1]:]
        outcome.records[v.host] = step.record
    outcome.notes += new
    outcome.waiting = []
    return new


def drained(record: TrayRecord, d: Decision) -> TrayRecord:
    """The tray's record once mctl decided to drain it (before the scheduler answers)."""
    return replace(record, drained=True, reason=d.reason, full_reason=d.full, drained_at=d.at, note=None,
                   healthy_streak=0)


def decide(records: Mapping[str, TrayRecord], verdicts: Sequence[TrayVerdict], nodes: Mapping[str, NodeView] | None,
           settings: HealthSettings, breaker: BreakerState, rack_sizes: Mapping[str, int], *,
           now: float, budget: "BudgetView | None" = None) -> Outcome:
    """Decisions for this sweep. *nodes* None: the scheduler did not answer (actions are queued); *budget*:
    the site's safety budget as the scheduler holds it (None: not read)."""
    out = dict(records)
    decisions: list[Decision] = []
    notes: list[Decision] = []
    state = breaker.pruned(now, settings.breaker_window_s) if not breaker.tripped else breaker
    wanted: list[tuple[TrayVerdict, TrayStep]] = []
    for v in verdicts:
        step = decide_tray(out.get(v.host) or TrayRecord(v.host, v.rack), v,
                           (nodes or {}).get(v.host), settings, answered=nodes is not None, now=now)
        out[v.host] = step.record
        decisions += step.decisions
        notes += step.notes
        if step.want:
            wanted.append((v, step))
    # Critical trays before unreachable ones, then by name: who gets drained first is reproducible.
    wanted.sort(key=lambda w: (not w[0].reached, w[0].host))
    asked: list[str] = []
    waiting: list[tuple[TrayVerdict, TrayStep]] = []
    for v, step in wanted:
        state, d, why = admit(state, step, v, settings, rack_sizes, budget, now=now, asked=asked)
        if d is None and why == WAITS:
            waiting.append((v, step))
            continue
        if d is None:
            reason, full = step.want
            seen = len(step.decisions), len(step.notes)
            step.note(SKIP, why or "", now, reason=reason, full=full)
            decisions += step.decisions[seen[0]:]
            notes += step.notes[seen[1]:]
            out[v.host] = step.record
            continue
        decisions.append(d)
        asked.append(v.host)
        out[v.host] = drained(step.record, d)
    return Outcome(out, decisions, state, notes, waiting)


def reconcile(rec: TrayRecord | None, breaker: BreakerState, intent: Decision,
              node: NodeView | None) -> tuple[TrayRecord | None, BreakerState, bool]:
    """An intent a killed mctl left without a result, against the scheduler now: (the record, the breaker,
    whether the action took effect). A drain took effect when the node is drained with the intent's
    reason; a resume when the node is no longer drained by mctl. The records then say what Slurm says."""
    host = intent.host
    if intent.action == DRAIN:
        applied = node is not None and node.drained and (node.reason or "") == (intent.reason or "")
        if not applied:
            return rec, breaker, False
        base = rec or TrayRecord(host, intent.rack)
        if base.drained:
            return base, breaker, True
        drains = breaker.drains if any(d[1] == host and d[0] == intent.at for d in breaker.drains) else \
            breaker.drains + ((intent.at, host, intent.rack),)
        return (replace(base, drained=True, reason=intent.reason, full_reason=intent.full, drained_at=intent.at,
                        healthy_streak=0, pending=None, note=None), replace(breaker, drains=drains), True)
    applied = node is not None and not node.mctl_drain
    if applied and rec is not None and rec.drained:
        return rec.resumed_by_mctl(intent.at, note=None, pending=None), breaker, True
    return rec, breaker, applied


def settle(outcome: Outcome, result: ActResult) -> None:
    """Fold an executed (or failed) action back into the records and the breaker."""
    d, error = result.decision, result.error
    rec = outcome.records[d.host]
    if d.action == DRAIN:
        if result.ok:
            return
        outcome.breaker = breakerlib.discard(outcome.breaker, d.host, d.at)
        pending = PendingAction(DRAIN, d.reason, d.at, d.full) if result.unreachable else None
        outcome.records[d.host] = rec.released(pending=pending, note=f"drain failed: {error}")
    elif d.action == RESUME:
        if result.ok:
            outcome.records[d.host] = rec.resumed_by_mctl(d.at, note=None)
        elif result.unreachable:
            outcome.records[d.host] = replace(rec, pending=PendingAction(RESUME, d.reason, d.at),
                                              note=f"resume failed: {error}")
        elif result.not_ours:
            # the guard found the drain gone or someone else's: mctl no longer owns it
            outcome.records[d.host] = rec.released(note=f"resume failed: {error}")
        else:
            outcome.records[d.host] = replace(rec, note=f"resume failed: {error}")
