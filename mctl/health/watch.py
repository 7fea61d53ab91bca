"""`mctl health watch`: sweep every interval for days, keep connections open, act, report.

The loop owns one SSH pool (connections stay open; a dead one is reopened on
the next command) and one Engine. A sweep that fails as a whole (the state
lock busy, a damaged state file, a bug) is reported as an event and the watch
goes on: it is meant to run unattended in tmux. SIGINT/SIGTERM end it after
the sweep in progress (a second Ctrl-C ends it at once), so an action is never
cut between the scheduler and the state file.

Everything a screen or log needs is in WatchView; the CLI renders it (rich
live screen on a terminal, plain lines otherwise) and this module never prints.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mctl.errors import MctlError
from mctl.model.drain import DRAIN, NOTES, RESUME
from mctl.model.settings import LADDER_RUNGS

LADDER_ACTIONS = (*LADDER_RUNGS, "repair", "recovery-failed")
ISOLATE_ACTIONS = ("isolate",)          # the watch isolating a tray from its partition (mctl.health.isolate)
ESCALATION_ACTION = "rack-escalation"   # a rack held by escalation (mctl.health.escalation.ACTION)

if TYPE_CHECKING:
    from mctl.health.sweep import SweepResult
    from mctl.model.settings import HealthSettings
    from mctl.health.failover import Elector
    from mctl.health.site_view import Scope
    from mctl.model.site import Site


@dataclass(frozen=True)
class Event:
    at: float
    kind: str            # drain | resume | skip | queue | forget | breaker | status | error | info
    host: str | None
    text: str

    def line(self) -> str:
        stamp = datetime.fromtimestamp(self.at).strftime("%Y-%m-%d %H:%M:%S")
        who = f" {self.host}" if self.host else ""
        return f"{stamp} {self.kind.upper():7}{who} {self.text}"


@dataclass
class WatchView:
    site: str
    racks: dict[str, list[str]]               # rack -> trays in order
    interval: float
    remediate: bool
    dry_run: bool
    started: float = field(default_factory=time.time)
    last: "SweepResult | None" = None
    next_at: float | None = None
    events: deque = field(default_factory=lambda: deque(maxlen=200))
    counters: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    stopping: bool = False
    statuses: dict[str, str] = field(default_factory=dict)
    shard: str | None = None                  # the shard this watch owns (health.shards / --rack-set), None: the site
    role: str | None = None                   # leader | standby with a lease (health.failover), None: alone

    def add(self, event: Event) -> None:
        self.events.append(event)

    def count(self, action: str, result: str) -> None:
        key = f"{action}:{result}"
        self.counters[key] = self.counters.get(key, 0) + 1


def events_of(result: "SweepResult", previous: dict[str, str], *, dry_run: bool) -> list[Event]:
    """What changed in this sweep, in words: status changes, actions, guards, the breaker."""
    now = result.started
    out: list[Event] = []
    for v in result.verdicts:
        status = result.tray_status(v.host)
        before = previous.get(v.host)
        if before is not None and before != status:
            worst = [f for f in v.findings if f.severity.value == v.worst.value and f.severity.value != "ok"]
            why = f": {worst[0].check}: {worst[0].message}" if worst else ""
            out.append(Event(now, "status", v.host, f"{before} -> {status}{why}"))
    if dry_run:
        for d in result.decisions:
            if d.action in (DRAIN, RESUME, "power-off"):
                out.append(Event(now, d.action, d.host, f"would {d.action} (dry run): {d.reason or ''} — {d.why}"))
            elif d.action in (*LADDER_ACTIONS, *ISOLATE_ACTIONS, ESCALATION_ACTION):   # rungs, marks, isolations, holds
                out.append(Event(now, d.action, d.host, f"would {d.action} (dry run): {d.why}"))
            elif d.action in NOTES:
                out.append(Event(now, d.action, d.host, f"(dry run) {d.why}"))
        return out
    for e in (entry.to_dict() for entry in result.logged):
        action = e.get("action")
        host = e.get("tray")
        result_text = e.get("result", "")
        if action == DRAIN:
            text = f"{e.get('reason')} ({result_text}; {e.get('why', '')})"
        elif action == RESUME:
            text = f"{e.get('why', 'resumed')} (was {e.get('reason')!r}; {result_text})"
        elif action == "breaker-trip":
            text = f"circuit breaker TRIPPED: {e.get('reason')}"
            action = "breaker"
        else:
            text = e.get("why") or e.get("reason") or ""
            if result_text not in ("ok", "noted"):
                text += f" ({result_text})"
            if e.get("seconds") is not None:        # the recovery ladder: how long the phase took
                text += f" [{e['seconds']:.1f}s]"
        out.append(Event(now, str(action), host, text))
    return out


async def run_watch(site: "Site", scope: "Scope", settings: "HealthSettings", state_dir: Path, *,
                    interval: float, remediate: bool, dry_run: bool, view: WatchView,
                    on_update: Callable[[WatchView, list[Event], bool], None], timeout: float | None = None,
                    max_sweeps: int | None = None, elector: "Elector | None" = None) -> None:
    """The loop. Returns when stopped by a signal (or after max_sweeps, for tests and benchmarks).

    With an *elector* (health.failover) the watch sweeps only while it holds the lease; the standby asks for
    it every `elector.poll` seconds, and a sweep whose acts the fence refuses ends there (mctl.health.failover)."""
    from mctl.health.failover import Fenced

    from mctl.health.engine import Engine
    from mctl.transport import SSHConfig, SSHPool

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals_seen = 0
    current: asyncio.Task | None = None

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        view.stopping = True
        stop.set()
        if signals_seen > 1 and current is not None:
            current.cancel()
        on_update(view, [Event(time.time(), "info", None, "stopping after this sweep (Ctrl-C again to stop now)"
                               if signals_seen == 1 else "stopping now")], False)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    engine = None
    lease_news: deque = deque()         # what the elector said (its renewal runs in a thread)
    if elector is not None:
        elector.on_change = lambda text: lease_news.append(Event(time.time(), "lease", None, text))
    try:
        async with SSHPool(SSHConfig.from_site(site)) as pool:
            # bmc_watch: the BMCs are read beside the sweeps, on their own cadence (mctl.health.oob.BmcWatch)
            engine = Engine(site, scope, settings, state_dir, pool, remediate=remediate, dry_run=dry_run,
                            timeout=timeout, interval=interval, bmc_watch=True,
                            fence=elector.fence if elector is not None else None)
            sweeps = 0
            while not stop.is_set():
                t0 = time.monotonic()
                events: list[Event] = []
                if elector is not None and not await _lead(elector, view, lease_news, on_update, stop):
                    continue
                current = asyncio.ensure_future(engine.sweep())
                try:
                    result = await current
                except asyncio.CancelledError:
                    break
                except Fenced as exc:           # refused before any act: the fenced lines are in the log
                    view.error = exc.message
                    events.append(Event(time.time(), "fenced", None, exc.message))
                except MctlError as exc:
                    view.error = exc.message
                    events.append(Event(time.time(), "error", None, exc.message + (f" ({exc.hint})" if exc.hint
                                                                                    else "")))
                except Exception as exc:  # noqa: BLE001 - a watch that runs for days reports and goes on
                    view.error = f"{type(exc).__name__}: {exc}"
                    events.append(Event(time.time(), "error", None, f"sweep failed: {view.error}"))
                else:
                    view.error = None
                    events = events_of(result, view.statuses, dry_run=dry_run)
                    for e in result.logged:
                        view.count(e.action, "ok" if e.ok else "failed")
                    view.statuses = {v.host: result.tray_status(v.host) for v in result.verdicts}
                    view.last = result
                finally:
                    current = None
                sweeps += 1
                events = [*_news(lease_news), *events]      # the lease's news first (its thread said them meanwhile)
                for e in events:
                    view.add(e)
                view.next_at = time.time() + max(0.0, interval - (time.monotonic() - t0))
                on_update(view, events, True)
                if max_sweeps is not None and sweeps >= max_sweeps:
                    break
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval - (time.monotonic() - t0)))
                except asyncio.TimeoutError:
                    pass
    finally:
        if engine is not None:
            engine.close()
        if elector is not None:
            elector.resign()            # a clean stop hands the lease over at once
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _news(news: deque) -> list[Event]:
    out = []
    while news:
        out.append(news.popleft())
    return out


async def _lead(elector: "Elector", view: WatchView, news: deque,
                on_update: Callable[[WatchView, list[Event], bool], None], stop: asyncio.Event) -> bool:
    """True when this watch holds the lease (sweep now); else, as the standby, wait one poll and say False."""
    leading = await asyncio.to_thread(elector.campaign)
    view.role = "leader" if leading else "standby"
    events = _news(news)
    for e in events:
        view.add(e)
    if leading:
        if events:
            on_update(view, events, False)      # said now, not after the sweep
        return True
    view.next_at = time.time() + elector.poll
    on_update(view, events, False)
    try:
        await asyncio.wait_for(stop.wait(), timeout=elector.poll)
    except asyncio.TimeoutError:
        pass
    return False
