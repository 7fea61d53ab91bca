"""The watch's isolations: what the engine runs for the isolations mctl.health.isolate decides.

After the sweep's drains, resumes and the recovery ladder, under the state lock:

1. `isolate.decide` picks the trays (drained by mctl, a hardware fault now, the breaker admits);
2. an intent line per tray (fsynced) and the state marking it as being sent, so a watch killed in
   between never starts it twice (a stopped change is finished by `mctl partition apply RACK --resume`);
3. one tray at a time: the same change `mctl partition isolate TRAY` runs, through the change
   service (mctl.change.service: the NMX-M plan, the jobs rule without --drain or --force, the
   journaled run under the rack lock, the tray tolerated as unreachable) with a UI that asks nobody,
   each step under its own deadline;
4. the result logged, the state saved, and the engine told the inventory changed (the watch then
   judges the trays' cliques against the new partitions).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from mctl.health import isolate, store

if TYPE_CHECKING:
    from mctl.health.engine import Engine, SweepResult
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


class IsolationRunner:
    def __init__(self, site: "Site"):
        self.site = site

    def _decide(self, engine: "Engine", result: "SweepResult", state: store.HealthState, now: float):
        return isolate.decide(state.records, result.verdicts, engine.settings, state.breaker, engine.sizes,
                              engine.site.racks, now=now)

    def dry_run(self, engine: "Engine", result: "SweepResult", state: store.HealthState):
        """`--dry-run`: each isolation the watch would start, as decisions (nothing is sent or written)."""
        import time

        from mctl.model.drain import Decision

        out = self._decide(engine, result, state, time.time())
        state.records, state.breaker = out.records, out.breaker
        return [Decision(i.host, "isolate", f"{i.why} (to {i.to})", rack=i.rack, at=i.at) for i in out.isolations]

    async def run(self, engine: "Engine", result: "SweepResult", state: store.HealthState) -> list[store.ActionEntry]:
        import time

        from mctl.health import breaker as breakerlib

        now = time.time()
        out = self._decide(engine, result, state, now)
        entries = [store.action_entry(e.action, e.host, e.why if e.action == "breaker-trip" else None,
                                      who=engine.who, at=e.at, result=e.result, why=e.why, rack=e.rack)
                   for e in out.events]
        ids = {i.host: f"{i.host}@{i.at:.3f}:{os.urandom(4).hex()}" for i in out.isolations}
        state.records, state.breaker = out.records, out.breaker
        store.append_actions(engine.state_dir, entries)
        store.save_state(engine.state_dir, state)
        after: list[store.ActionEntry] = []
        went: set[str] = set()
        for i in out.isolations:           # one at a time: each is a change of its rack's partitions

            def go(i=i) -> None:
                # Before the change starts: the intent (fsynced) and the state saying it is being sent.
                went.add(i.host)
                isolate.mark_sending(state.records, i)
                store.append_actions(engine.state_dir, [store.action_entry(
                    "intent", i.host, None, who=engine.who, at=i.at, result="pending", why=i.why, rack=i.rack,
                    intent="isolate", intent_id=ids[i.host], to=i.to)])
                store.save_state(engine.state_dir, state)

            t0 = time.monotonic()
            outcome, text, parts = await asyncio.to_thread(run_isolation, engine.site, i, engine.state_dir, go)
            note = isolate.settle(state.records, i, outcome, text)
            if outcome == "waiting":
                # not carried out: the breaker forgets it, the next sweep asks again; said once per reason
                state.breaker = breakerlib.discard(state.breaker, i.host, i.at)
                if note is not None:
                    after.append(store.action_entry("isolate-wait", i.host, None, who=engine.who, result="noted",
                                                    why=note, rack=i.rack))
                continue
            if outcome == "ok":
                engine.partitions_changed(i.rack, parts)
            after.append(store.action_entry("isolate", i.host, None, who=engine.who, at=i.at,
                                            result="ok" if outcome == "ok" else f"failed: {text}", why=i.why,
                                            rack=i.rack, intent_id=ids[i.host] if i.host in went else None, to=i.to,
                                            detail=text, seconds=round(time.monotonic() - t0, 3)))
        store.append_actions(engine.state_dir, after)
        store.save_state(engine.state_dir, state)
        return entries + after

