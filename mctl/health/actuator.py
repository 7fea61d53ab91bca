"""The one actuator: every action the watch takes on a tray goes intent -> act -> settle -> result logged here.

A responder (mctl.health.responders) decides what to do about a sweep and hands the actuator
`Act`s: a drain or resume, a leak's power-off, a recovery-ladder rung, a repair hook, an
isolation. For each batch of acts, in this order and in this one place:

1. **intent**: one `intent` line per act in the action log, fsynced, and the health state saved
   with whatever says the act is being sent (`mark`), so a watch killed at any later point never
   sends it twice and the next start finds the intent without a result (an act that may not start
   at all, an isolation waiting for running work, writes its intent only when it starts: `go()`);
2. **act**: the acts of one `batch` go to one call of their executor (every drain and resume of
   the sweep in one guarded script on the controller, every power-off in one BMC fan-out); the
   others run concurrently, or one after the other when `serial`; every executor is bounded by a
   deadline of its own and never raises for one tray's trouble;
3. **settle**: each act's `settle` folds what happened (`Done`) back into the tray's record;
4. **result**: one result line per act (the act's action, or the one its result says, e.g. a drain
   queued when the scheduler did not answer), then the lines the responder adds, and the state saved.

With a leader lease (mctl.health.failover), the **fence** comes first: etcd is asked whether this watch
still holds the lease, right before the first intent is written; when it does not (or etcd cannot say),
every act of the batch is refused with one `fenced` line and `Fenced` is raised, nothing else written
and the state not saved. The token is on every intent and result line (`fence`).

Every line it writes is also handed to `emit` (the event stream, mctl.health.events), after it is in
the log; emitting never blocks or raises.

The caller holds the state lock. The actuator knows nothing of why an act is taken.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from mctl.health import store
from mctl.model.drain import Decision


@dataclass
class Done:
    """What an executor made of one act."""

    result: str                                  # the result line's text: ok | failed: ... | refused: ... | ...
    action: str | None = None                    # the result line's action, when not the act's (a drain queued)
    raw: Any = None                              # the executor's own answer (an ActResult, a PowerOffResult, ...)
    fields: dict[str, Any] = field(default_factory=dict)    # more keys of the result line (power_state, detail, ...)
    started: bool = True                         # False: never started (no intent, no result line; settle says why)
    why: str | None = None                       # the result line's why, when not the act's


@dataclass
class Act:
    """One action on one tray, as a responder asks for it."""

    decision: Decision                           # the tray, the action, why, the reason set or lifted, when
    run: Callable[[Callable[[], None]], Awaitable[Done]] | None = None   # the effect, given go(); None: batched
    batch: str | None = None                     # acts of one batch go to one executor call
    serial: bool = False                         # run one after the other (each a change of a rack)
    fields: dict[str, Any] = field(default_factory=dict)          # keys of the intent and result lines
    result_fields: dict[str, Any] = field(default_factory=dict)   # keys of the result line only
    mark: Callable[[], None] | None = None       # the record saying the act is being sent (saved with its intent)
    settle: Callable[[Done], Sequence[store.ActionEntry]] | None = None   # fold the result back; more lines
    intent_on_start: bool = False                # the intent only when the executor calls go()
    intent: bool = True                          # False: a notice to someone (a repair hook), not an act on the tray
    intent_id: str = ""
    went: bool = False                           # its intent was written


Batch = Callable[[list[Act]], Awaitable[list[Done]]]


class Actuator:
    def __init__(self, state_dir: Path, who: str, batches: dict[str, Batch] | None = None,
                 emit: Callable[[Sequence[store.ActionEntry]], None] | None = None,
                 fence: Callable[[], int] | None = None):
        self.state_dir = Path(state_dir)
        self.fence = fence              # the leader lease's check (mctl.health.failover.Elector.fence); None: alone
        self.who = who
        self.batches: dict[str, Batch] = dict(batches or {})
        # every line written goes out as an event too (mctl.health.events: intents are not events)
        self.emit = emit or (lambda lines: None)

    def _log(self, lines: Sequence[store.ActionEntry]) -> None:
        store.append_actions(self.state_dir, list(lines))
        self.emit(lines)

    def intent_line(self, act: Act) -> store.ActionEntry:
        d = act.decision
        return store.action_entry("intent", d.host, d.reason, who=self.who, full=d.full, at=d.at, result="pending",
                                  why=d.why, rack=d.rack, intent=d.action, intent_id=act.intent_id, **act.fields)

    def result_line(self, act: Act, done: Done) -> store.ActionEntry:
        d = act.decision
        return store.action_entry(done.action or d.action, d.host, d.reason, who=self.who, full=d.full,
                                  at=d.at or None, result=done.result, why=done.why or d.why, rack=d.rack,
                                  intent_id=act.intent_id if act.went else None, **act.fields, **act.result_fields,
                                  **done.fields)

    async def run(self, state: store.HealthState, acts: Sequence[Act], *,
                  before: Sequence[store.ActionEntry] = (), after: Sequence[store.ActionEntry] = (),
                  commit: Callable[[], None] | None = None,
                  finish: Callable[[], Sequence[store.ActionEntry]] | None = None) -> list[store.ActionEntry]:
        """Carry out *acts* on *state* (the caller holds the state lock): *before*'s lines go to the log with
        the intents, *after*'s with the results; *finish* decides what waited on the results once every act
        is settled (the breaker's trip on the drains that happened) and its lines follow *after*'s; *commit*
        puts the responder's decisions into *state* then, before it is saved (a state saved with the intents
        holds none of them yet). The lines this sweep reports, in their order (the intent lines stay in the
        log: a report shows each act once, by its result)."""
        if not acts and not before and not after:
            after = list(finish()) if finish is not None else []
            finish = None
            if not after:
                if commit is not None:
                    commit()
                return []                   # nothing to write: the engine saves the state once, at the end
        for a in acts:
            a.intent_id = a.intent_id or f"{a.decision.host}@{a.decision.at:.3f}:{secrets.token_hex(4)}"
        if self.fence is not None and acts:
            token = self._fenced(acts)
            for a in acts:
                a.fields = {**a.fields, "fence": token}
        now = [a for a in acts if not a.intent_on_start and a.intent]
        for a in now:
            if a.mark is not None:
                a.mark()
            a.went = True
        first = list(before) + [self.intent_line(a) for a in now]
        self._log(first)
        if first:
            store.save_state(self.state_dir, state)
        lines: list[store.ActionEntry] = []
        for act, done in await self._execute(state, list(acts)):
            if done.started:
                lines.append(self.result_line(act, done))
            if act.settle is not None:
                lines.extend(act.settle(done))
        lines.extend(after)
        if finish is not None:
            lines.extend(finish())
        if commit is not None:
            commit()
        self._log(lines)
        store.save_state(self.state_dir, state)
        return list(before) + lines

    def _fenced(self, acts: Sequence[Act]) -> int:
        """The fencing token, if this watch may act now; else one `fenced` line per act and Fenced raised."""
        from mctl.health.failover import FENCED, Fenced

        assert self.fence is not None
        try:
            return self.fence()
        except Fenced as exc:
            self._log([store.action_entry(FENCED, a.decision.host, a.decision.reason, who=self.who,
                                          result=f"refused: {exc.message}", why=a.decision.why, rack=a.decision.rack,
                                          intent=a.decision.action, fence=exc.token) for a in acts])
            raise

    async def _execute(self, state: store.HealthState, acts: list[Act]) -> list[tuple[Act, Done]]:
        out: dict[int, Done] = {}
        batched: dict[str, list[Act]] = {}
        for a in acts:
            if a.run is None:
                batched.setdefault(a.batch or "", []).append(a)
        for name, group in batched.items():
            for a, done in zip(group, await self.batches[name](group)):
                out[id(a)] = done
        concurrent = [a for a in acts if a.run is not None and not a.serial]
        dones = await asyncio.gather(*(a.run(self._go(state, a)) for a in concurrent))
        out.update({id(a): d for a, d in zip(concurrent, dones)})
        for a in (a for a in acts if a.run is not None and a.serial):
            out[id(a)] = await a.run(self._go(state, a))
        return [(a, out[id(a)]) for a in acts]

    def _go(self, state: store.HealthState, act: Act) -> Callable[[], None]:
        """What an executor calls once the act really starts: for an act whose intent waits for it, the
        mark and the intent line (fsynced) and the state saved, before anything is sent."""
        def go() -> None:
            if not act.intent_on_start or act.went or not act.intent:
                return
            act.went = True
            if act.mark is not None:
                act.mark()
            self._log([self.intent_line(act)])
            store.save_state(self.state_dir, state)
        return go
