"""The isolation responder: what the watch does for the isolations mctl.health.isolate decides.

After the sweep's drains, resumes and the recovery ladder, under the state lock:

1. `isolate.decide` picks the trays (drained by mctl, a hardware fault now, the breaker admits);
2. once the change can start, an intent line per tray (fsynced) and the state marking it as being sent
   (the actuator's `go()`), so a watch killed in between never starts it twice (a stopped change is
   finished by `mctl partition apply RACK --resume`);
3. one tray at a time: the same change `mctl partition isolate TRAY` runs, through the change
   service (mctl.change.service: the NMX-M plan, the jobs rule without --drain or --force, the
   journaled run under the rack lock, the tray tolerated as unreachable) with a UI that asks nobody,
   each step under its own deadline;
4. the result logged, the state saved, and the engine told the inventory changed (the watch then
   judges the trays' cliques against the new partitions).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from mctl.health import breaker as breakerlib
from mctl.health import isolate, store
from mctl.health.actuator import Act, Done
from mctl.health.responders import Context, Responder
from mctl.model.drain import Decision

if TYPE_CHECKING:
    from mctl.model.site import Site


def run_isolation(site: "Site", iso: isolate.Isolation, state_dir, on_go=None) -> tuple[str, str, tuple]:
    """("ok" | "failed" | "waiting", text, the rack's partitions after): `mctl partition isolate` of iso.host
    through the change service, with a UI that asks nobody (so running work is never broken: the jobs
    rule refuses and the watch waits); *on_go* is called once the jobs rule and the rack lock let the
    change start."""
    from mctl.change.request import ChangeRequest
    from mctl.change.service import WorkRefused, execute
    from mctl.change.ui import SilentUI
    from mctl.errors import MctlError
    from mctl.state.lock import LockBusy

    if iso.rack not in site.racks:
        return "failed", f"rack {iso.rack} is no longer in the inventory", ()
    started = False

    class Watch(SilentUI):
        def starting(self, spec) -> None:
            nonlocal started
            started = True
            if on_go is not None:
                on_go()

    try:
        result = execute(site, ChangeRequest("isolate", tray=iso.host, to=iso.to), state_dir, Watch(),
                         purpose="mctl health watch: isolate")
    except WorkRefused as exc:
        cp = exc.plan
        named = "; ".join(w.describe() for w in cp.work) or f"the work could not be read ({cp.work_error})"
        return "waiting", f"the change touches trays with running work: {named}", ()
    except LockBusy as exc:
        return "waiting", exc.message, ()               # another command holds the rack: a later sweep
    except MctlError as exc:
        # before the change started (NMX-M or the scheduler not answering the plan): asked again later
        return ("failed" if started else "waiting"), exc.message, ()
    run = result.run
    if result.error is not None:
        return "failed", f"change {run.journal.run_id} {run.status}: {result.error.message}", ()
    parts = "; ".join(f"{p.name}={p.nodeset}" for p in result.after)
    return "ok", f"change {run.journal.run_id}: {parts}", tuple(result.after)


class IsolationResponder(Responder):
    name = "isolation"

    def __init__(self, site: "Site"):
        self.site = site

    def _decide(self, ctx: Context, state: store.HealthState, now: float):
        # a rack held by rack escalation is out as a whole: none of its trays is moved out of its partition
        verdicts = [v for v in ctx.result.verdicts if v.rack not in state.escalations]
        return isolate.decide(state.records, verdicts, ctx.settings, state.breaker, ctx.sizes, ctx.site.racks,
                              now=now)

    def dry_run(self, ctx: Context, state: store.HealthState):
        """`--dry-run`: each isolation the watch would start, as decisions (nothing is sent or written)."""
        out = self._decide(ctx, state, time.time())
        state.records, state.breaker = out.records, out.breaker
        return [Decision(i.host, "isolate", f"{i.why} (to {i.to})", rack=i.rack, at=i.at) for i in out.isolations]

    async def respond(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        if ctx.result.nodes is None:
            return []
        out = self._decide(ctx, state, time.time())
        events = [store.action_entry(e.action, e.host, e.why if e.action == "breaker-trip" else None,
                                     who=ctx.who, at=e.at, result=e.result, why=e.why, rack=e.rack)
                  for e in out.events]
        state.records, state.breaker = out.records, out.breaker
        # one at a time: each is a change of its rack's partitions; the intent only once it starts
        acts = [self._act(ctx, state, i) for i in out.isolations]
        return await ctx.actuator.run(state, acts, before=events)

    def _act(self, ctx: Context, state: store.HealthState, i: isolate.Isolation) -> Act:
        async def run(go) -> Done:
            t0 = time.monotonic()
            outcome, text, parts = await asyncio.to_thread(run_isolation, ctx.site, i, ctx.state_dir, go)
            return Done("ok" if outcome == "ok" else f"failed: {text}", raw=(outcome, text, parts),
                        started=outcome != "waiting",
                        fields={"detail": text, "seconds": round(time.monotonic() - t0, 3)})

        def settle(done: Done) -> list[store.ActionEntry]:
            outcome, text, parts = done.raw
            note = isolate.settle(state.records, i, outcome, text)
            if outcome == "waiting":
                # not carried out: the breaker forgets it, the next sweep asks again; said once per reason
                state.breaker = breakerlib.discard(state.breaker, i.host, i.at)
                return [store.action_entry("isolate-wait", i.host, None, who=ctx.who, result="noted", why=note,
                                           rack=i.rack)] if note is not None else []
            if outcome == "ok":
                ctx.partitions_changed(i.rack, parts)
            return []

        return Act(Decision(i.host, "isolate", i.why, rack=i.rack, at=i.at), run=run, serial=True,
                   intent_on_start=True, fields={"to": i.to}, mark=lambda: isolate.mark_sending(state.records, i),
                   settle=settle)
