"""How the watch looks: a rich live screen on a terminal, plain log lines elsewhere.

The live screen is a renderable that lays itself out at render time, so rich's
refresh redraws it at whatever size the terminal has now (a tmux pane resized,
a window split) and its clocks keep ticking between sweeps. Besides each tray's
state it lists every tray that is not healthy with its first finding and what
mctl did about it (`problems`), and its event pane starts with the problems the
first sweep found (`start_events`), so a watch started on a sick rack says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from mctl.health.engine import SweepResult
    from mctl.health.policy import TrayVerdict
    from mctl.health.watch import Event, WatchView

STYLE = {"healthy": "bold green", "warn": "bold yellow", "critical": "bold red", "unreachable": "bold magenta",
         "drained": "bold white on red", "held": "bold white on blue", "unknown": "dim"}
EVENT_STYLE = {"drain": "bold red", "resume": "bold green", "breaker": "bold white on red", "error": "red",
               "skip": "yellow", "queue": "yellow", "forget": "cyan", "adopt": "cyan", "status": "", "info": "dim",
               "power-off": "bold white on red", "lease": "bold cyan", "fenced": "bold red"}


def _ago(at: float | None) -> str:
    if at is None:
        return "never"
    delta = max(0, int(time.time() - at))
    return f"{delta}s ago" if delta < 120 else f"{delta // 60}m ago"


def _label(view: "WatchView", host: str) -> str:
    status = view.statuses.get(host, "unknown")
    if status == "unreachable" and view.last is not None:
        rec = view.last.records.get(host)
        if rec is not None and rec.misses:
            return f"unreach {rec.misses}"
    return status


def _short(host: str, rack: str) -> str:
    return host[len(rack) + 1:] if host.startswith(rack + "-") else host


# ------------------------------------------------------------------ the trays that are not healthy

ORDER = ("critical", "unreachable", "drained", "held", "warn", "unknown")     # the worst first


@dataclass(frozen=True)
class TrayProblem:
    """A tray that is not healthy, as the screen lists it: its first finding and what mctl did about it."""

    host: str
    status: str
    finding: str            # "check: short message"; "" when it has no finding now (a drained tray recovering)
    action: str             # what mctl did, in words


def first_finding(verdict: "TrayVerdict | None") -> str:
    """The tray's first finding as "check: short message": the worst, then the catalogue's order (the one a
    drain reason names); an unreachable tray without findings is its reach."""
    from mctl.checks import precedence

    if verdict is None:
        return ""
    bad = [f for f in verdict.findings if f.severity.value != "ok"]
    if not bad:
        return "" if verdict.reached else f"tray.reachable: {verdict.reach}"
    f = sorted(bad, key=lambda f: (-f.severity.rank, precedence(f)))[0]
    return f"{f.check}: {f.details.get('short') or f.message}"


def what_mctl_did(result: "SweepResult", host: str, status: str) -> str:
    """In words, from this sweep's action-log entries, then its decisions, then what the tray's record and the
    scheduler hold from earlier sweeps: drained, held back by the breaker, queued, skipped and why."""
    from mctl.health.watch import ISOLATE_ACTIONS, LADDER_ACTIONS
    from mctl.model.drain import ADOPT, DRAIN, FORGET, QUEUE, RESUME, SKIP

    acts = (DRAIN, RESUME, "power-off", *LADDER_ACTIONS, *ISOLATE_ACTIONS)
    for e in reversed([e for e in result.logged if e.tray == host]):
        done = "" if e.ok else f" ({e.result})"
        if e.action == DRAIN:
            return f"drained: {e.reason}{done}" if e.ok else f"drain failed: {e.reason}{done}"
        if e.action == RESUME:
            return f"resumed{done}"
        if e.action in acts:
            return f"{e.action}: {e.why or e.reason or ''}{done}".rstrip(": ")
    for d in (d for d in result.decisions if d.host == host):
        if d.action in acts:
            return f"would {d.action} (dry run): {d.reason or d.why}" if result.dry_run else f"{d.action}: {d.why}"
        if d.action == SKIP and d.full:             # a drain the circuit breaker did not admit
            return f"held back by the breaker: {d.why}"
        if d.action == SKIP:
            return f"skipped: {d.why}"
        if d.action == QUEUE:
            return f"queued: {d.why}"
        if d.action == FORGET:
            return f"no longer mctl's drain: {d.why}"
        if d.action == ADOPT:
            return f"drain taken back: {d.reason}"
    rec = result.records.get(host)
    node = (result.nodes or {}).get(host)
    if rec is not None and rec.drained and not result.dry_run:
        return f"drained by mctl: {rec.reason}" + (f" (healthy {rec.healthy_streak} sweeps)"
                                                  if rec.healthy_streak else "")
    if rec is not None and rec.pending is not None:
        return f"queued: {rec.pending.action} waits for the scheduler"
    if node is not None and node.drained:
        who = "mctl elsewhere (node check or another watch)" if node.mctl_drain else "someone else"
        return f"held: drained by {who}: {node.reason or 'no reason'}"
    if not result.remediate:
        return "none: report only (remediation off)"
    if status == "unreachable":
        return f"none yet: unreachable {rec.misses if rec else 1} sweep(s)"
    if status == "critical":
        return f"none yet: critical {rec.bad_streak if rec else 1} sweep(s)"
    return "none: only critical trays are drained" if status == "warn" else "none"


def problems(view: "WatchView") -> list[TrayProblem]:
    """Every tray of the last sweep that is not healthy, the worst first, then in inventory order."""
    last = view.last
    if last is None:
        return []
    verdicts = {v.host: v for v in last.verdicts}
    order = [h for hosts in view.racks.values() for h in hosts]
    place = {h: i for i, h in enumerate(order)}
    out = [TrayProblem(h, s, first_finding(verdicts.get(h)), what_mctl_did(last, h, s))
           for h, s in view.statuses.items() if s != "healthy"]
    return sorted(out, key=lambda p: (ORDER.index(p.status) if p.status in ORDER else len(ORDER),
                                      place.get(p.host, len(order)), p.host))


def start_events(result: "SweepResult") -> list["Event"]:
    """The problems the first sweep found, as events: a watch started on sick trays lists them, not only
    the changes after it."""
    from mctl.health.watch import Event

    verdicts = {v.host: v for v in result.verdicts}
    out = []
    for v in result.verdicts:
        status = result.tray_status(v.host)
        if status != "healthy":
            finding = first_finding(verdicts[v.host])
            out.append(Event(result.started, "status", v.host, f"at start: {status}" + (f": {finding}" if finding
                                                                                          else "")))
    return out


class WatchScreen:
    """The rich renderable of the whole screen."""

    def __init__(self, view: "WatchView"):
        self.view = view
        self.start: list["Event"] = []          # the first sweep's problems (start_events)
        self._first_seen = False

    def update(self, swept: bool) -> None:
        """After each sweep (the watch's on_update): the first one that ended gives the problems at start."""
        if swept and not self._first_seen and self.view.last is not None:
            self._first_seen = True
            self.start = start_events(self.view.last)

    def events(self) -> list["Event"]:
        """The event pane's events, oldest first: the problems at start, then the watch's own events."""
        return sorted([*self.start, *self.view.events], key=lambda e: e.at)

    def __rich_console__(self, console: "Console", options: "ConsoleOptions") -> "RenderResult":
        from rich.columns import Columns
        from rich.layout import Layout
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        v = self.view
        last = v.last
        width = options.max_width
        height = options.height or console.size.height
        header = Table.grid(expand=True)
        header.add_column(ratio=1)
        mode = "DRY RUN" if v.dry_run else ("remediation ON" if v.remediate else "remediation OFF (report only)")
        trays = sum(len(t) for t in v.racks.values())
        shard = f"  shard {v.shard}" if v.shard else ""
        role = {"leader": ("  LEADER", "bold green"), "standby": ("  STANDBY (not acting)", "bold yellow")}.get(
            v.role or "", ("", ""))
        title = Text.assemble(("mctl health watch", "bold"), f"  site {v.site}{shard}  {trays} trays  every "
                              f"{v.interval:g}s  ", (mode, "bold red" if v.remediate and not v.dry_run else "bold yellow"),
                              role)
        header.add_row(title)
        if last is not None:
            breaker = ("TRIPPED: " + (last.breaker.reason or "")) if last.breaker.tripped else "closed"
            sched = ("-" if last.scheduler is None else
                     f"{last.scheduler} " + ("UNREACHABLE" if last.scheduler_error else "ok"))
            nxt = f"next in {max(0, int((v.next_at or 0) - time.time()))}s" if not v.stopping else "stopping"
            header.add_row(Text.assemble(
                f"last sweep #{last.number} at {datetime.fromtimestamp(last.started):%H:%M:%S} "
                f"({_ago(last.started)}, {last.elapsed:.2f}s), {nxt}   scheduler: ",
                (sched, "red" if last.scheduler_error else "green"), "   breaker: ",
                (breaker, "bold white on red" if last.breaker.tripped else "green")))
        else:
            header.add_row(Text("first sweep running ...", style="dim"))
        if v.error:
            header.add_row(Text(f"last sweep failed: {v.error}", style="red"))
        counts: dict[str, int] = {}
        for s in v.statuses.values():
            counts[s] = counts.get(s, 0) + 1
        header.add_row(Text.assemble(*[(f"{s} {counts[s]}  ", STYLE.get(s, "")) for s in STYLE if counts.get(s)]))

        rack_panels = []
        cell = max(12, max((len(_short(h, r)) for r, hs in v.racks.items() for h in hs), default=6) + 4)
        for rack, hosts in v.racks.items():
            cells = [Panel(Text(_label(v, h), style=STYLE.get(v.statuses.get(h, "unknown"), ""), justify="center"),
                           title=Text(_short(h, rack)), width=cell, padding=(0, 0)) for h in hosts]
            rack_panels.append(Panel(Columns(cells, padding=(0, 0)), title=Text(f"rack {rack}"), title_align="left"))
        sick = problems(v)
        header_rows = 4 + (1 if v.error else 0)
        rack_rows = sum(3 * -(-len(hs) // max(1, (width - 4) // cell)) + 2 for hs in v.racks.values())
        rack_size = min(rack_rows, max(5, height - 10))
        # the trays pane gets what the events pane can spare (3 lines), at most half of what is left
        left = height - (header_rows + 2) - rack_size - 1
        listed = sick[:max(1, min(left - 2 - 5, (left - 4) // 2))]
        sick_table = Table.grid(padding=(0, 1), expand=True)
        sick_table.add_column(no_wrap=True)
        sick_table.add_column(no_wrap=True)
        sick_table.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        sick_table.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        only = next(iter(v.racks)) if len(v.racks) == 1 else None          # one rack: its trays' short names
        for p in listed:
            sick_table.add_row(Text(_short(p.host, only) if only else p.host, style="bold"), Text(p.status, style=STYLE.get(p.status, "")),
                               Text(p.finding or "-"), Text(p.action))
        sick_title = (f"not healthy: {len(sick)} tray{'s' if len(sick) > 1 else ''}"
                      + (f" ({len(listed)} shown)" if len(listed) < len(sick) else "")
                      + " - first finding, what mctl did")
        events = Table.grid(padding=(0, 1))
        events.add_column(no_wrap=True)
        events.add_column(overflow="fold")
        shown = self.events()[-max(3, height // 3):]
        for e in reversed(shown):
            events.add_row(Text(datetime.fromtimestamp(e.at).strftime("%H:%M:%S"), style="dim"),
                           Text.assemble((f"{e.kind.upper():7} ", EVENT_STYLE.get(e.kind, "")),
                                         (f"{e.host} " if e.host else "", "bold"), e.text))
        layout = Layout()
        parts = [Layout(Panel(header, padding=(0, 1)), name="header", size=header_rows + 2),
                 Layout(_stack(rack_panels), name="racks", size=rack_size)]
        if sick:
            parts.append(Layout(Panel(sick_table, title=Text(sick_title), title_align="left"), name="trays",
                                size=len(listed) + 2))
        parts += [Layout(Panel(events, title="recent events (newest first)", title_align="left"), name="events"),
                  Layout(Text("Ctrl-C stops the watch after the sweep in progress", style="dim"), name="footer",
                         size=1)]
        layout.split_column(*parts)
        yield layout


def _stack(renderables):
    from rich.console import Group

    return Group(*renderables)


def sweep_line(view: "WatchView") -> str:
    """One plain line per sweep (not on a TTY: logs, journald, a pipe)."""
    last = view.last
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    if last is None:
        return f"{stamp} SWEEP   failed: {view.error}"
    counts: dict[str, int] = {}
    for s in view.statuses.values():
        counts[s] = counts.get(s, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    sched = "" if last.scheduler is None else (" scheduler unreachable;" if last.scheduler_error else "")
    breaker = " breaker TRIPPED;" if last.breaker.tripped else ""
    return (f"{stamp} SWEEP   #{last.number}: {len(last.verdicts)} trays: {parts};{sched}{breaker} "
            f"{last.elapsed:.2f}s")


def event_lines(events: list["Event"]) -> list[str]:
    return [e.line() for e in events]
