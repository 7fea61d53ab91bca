"""How the watch looks: a rich live screen on a terminal, plain log lines elsewhere.

The live screen is a renderable that lays itself out at render time, so rich's
refresh redraws it at whatever size the terminal has now (a tmux pane resized,
a window split) and its clocks keep ticking between sweeps.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from mctl.health.watch import Event, WatchView

STYLE = {"healthy": "bold green", "warn": "bold yellow", "critical": "bold red", "unreachable": "bold magenta",
         "drained": "bold white on red", "held": "bold white on blue", "unknown": "dim"}
EVENT_STYLE = {"drain": "bold red", "resume": "bold green", "breaker": "bold white on red", "error": "red",
               "skip": "yellow", "queue": "yellow", "forget": "cyan", "adopt": "cyan", "status": "", "info": "dim",
               "power-off": "bold white on red"}


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


class WatchScreen:
    """The rich renderable of the whole screen."""

    def __init__(self, view: "WatchView"):
        self.view = view

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
        title = Text.assemble(("mctl health watch", "bold"), f"  site {v.site}  {trays} trays  every {v.interval:g}s  ",
                              (mode, "bold red" if v.remediate and not v.dry_run else "bold yellow"))
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
        events = Table.grid(padding=(0, 1))
        events.add_column(no_wrap=True)
        events.add_column(overflow="fold")
        shown = list(v.events)[-max(3, height // 3):]
        for e in reversed(shown):
            events.add_row(Text(datetime.fromtimestamp(e.at).strftime("%H:%M:%S"), style="dim"),
                           Text.assemble((f"{e.kind.upper():7} ", EVENT_STYLE.get(e.kind, "")),
                                         (f"{e.host} " if e.host else "", "bold"), e.text))
        layout = Layout()
        header_rows = 4 + (1 if v.error else 0)
        rack_rows = sum(3 * -(-len(hs) // max(1, (width - 4) // cell)) + 2 for hs in v.racks.values())
        layout.split_column(Layout(Panel(header, padding=(0, 1)), name="header", size=header_rows + 2),
                            Layout(_stack(rack_panels), name="racks", size=min(rack_rows, max(5, height - 10))),
                            Layout(Panel(events, title="recent events (newest first)", title_align="left"),
                                   name="events"),
                            Layout(Text("Ctrl-C stops the watch after the sweep in progress", style="dim"),
                                   name="footer", size=1))
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
