"""The terminal's side of a provisioning under the jobs rule: its options, the plan, --force asked, the rollout.

The provisioning is conducted by mctl.rollout.service; `TerminalUI` is the UI it talks to from the
CLI (mctl.rollout.ui.RolloutUI): it prints each host's changes with the disruptive ones marked and
the work on it, asks before --force breaks work (unless --yes; refused without a terminal), and
prints each step of a rollout as it runs. Silent with --json except warnings.
See docs/provisioning.md ("Running work") and docs/decisions.md (D71-D74).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, ContextManager, Optional, Sequence

import typer

from mctl.rollout.ui import RolloutUI

if TYPE_CHECKING:
    from mctl.cli.render import HostProgress, Output
    from mctl.model.change import RunningWork

RollingOpt = Annotated[Optional[int], typer.Option("--rolling", min=1, metavar="N",
                                                   help="With --drain: N trays at a time, stopping at the first "
                                                        "tray that fails.")]

WAIT_NOTE_S = 30.0          # how often a wait for jobs says what it still waits for


class TerminalUI(RolloutUI):
    """The rollout service's UI on the operator's terminal, over the command's one Output (plain text off a
    terminal; silent with --json except warnings and host failures)."""

    def __init__(self, out: "Output", *, yes: bool):
        self.out = out
        self.yes = yes
        self._progress: "HostProgress | None" = None
        self._waited = 0.0

    def plan(self, view: dict[str, Any]) -> None:
        if not self.out.json:
            print_view(self.out, view)

    def note(self, text: str) -> None:
        if not self.out.json:
            self.out.line(text)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def confirm(self, breaks: str) -> bool:
        self.out.confirm("go ahead and break it?", yes=self.yes, what="--force")
        return True

    def progress(self, hosts: Sequence[str]) -> ContextManager[Any]:
        self._progress = self.out.hosts(hosts)
        return self._progress

    def event(self, ev) -> None:
        shown = self._progress is not None and self._progress.update(ev.host, f"{ev.host}: {ev.kind:<9} {ev.task}")
        if not shown and ev.kind in ("failed", "unreachable"):
            self.out.event(f"{ev.host}: {ev.kind} at '{ev.task}': {ev.message}")

    def batch(self, number: int, trays: Sequence[str]) -> None:
        from mctl.model.site import fold

        self.note(f"batch {number}: {fold(trays)}")

    def step_started(self, batch: int, step: str, trays: Sequence[str]) -> None:
        self._progress = None

    def step_ended(self, batch: int, step: str, status: str, summary: str, seconds: float) -> None:
        self.note(f"  [{f'batch {batch}' if batch else 'harmless'}] {step}: {status} ({seconds:.1f}s): {summary}")

    def waiting(self, left: Sequence["RunningWork"], remaining: float) -> None:
        now = time.monotonic()
        if now - self._waited >= WAIT_NOTE_S:
            self._waited = now
            self.note(f"    waiting up to {remaining:.0f}s more for: {'; '.join(w.describe() for w in left)}")


def print_view(out: "Output", view: dict[str, Any]) -> None:
    """Each host's changes (disruptive ones marked), the work on it and what happens to it; hosts with the
    same answer are shown once, their names folded."""
    from mctl.model.site import fold

    groups: dict[tuple[str, ...], list[str]] = {}
    for host, t in view["trays"].items():
        groups.setdefault(tuple(_host_lines(t)), []).append(host)
    out.line(f"what the changes do to running work (check pass: {view.get('check_run') or 'none'}):")
    for lines, hosts in groups.items():
        out.line(f"  {fold(hosts)}: {lines[0]}")
        for line in lines[1:]:
            out.line(f"      {line}")
    if view.get("work_error"):
        out.warn(f"the work on the trays could not be read: {view['work_error']}")
    elif view.get("scheduler") is None:
        out.line("  running work: the site names no scheduler, so none is known")


def _host_lines(t: dict[str, Any]) -> list[str]:
    from mctl.model.site import fold

    changes = t.get("changes") or []
    if t.get("unknown"):
        head = f"unknown ({t['unknown']})"
    elif t.get("disruptive") is None:
        head = "not checked (no work on it)"
    elif not changes:
        head = "no change"
    elif t.get("disruptive"):
        head = "DISRUPTIVE" + (", then a reboot" if t.get("reboot") else "")
    else:
        head = "harmless" + (" (takes effect at the next boot)" if t.get("reboot") else "")
    lines = [f"{head} -> {t['action']}"]
    for c in changes:
        what = f" ({', '.join(c['disrupts'])})" if c["disrupts"] else ""
        lines.append(f"{'!' if c['disruptive'] else '-'} {c['task']}{what}" + (f": {c['detail']}" if c["detail"] else ""))
    for w in t.get("work") or []:
        who = f" user {w['user']}" if w.get("user") else ""
        lines.append(f"running: {'job' if w['kind'] == 'slurm' else 'pod'} {w['id']}{who} name {w['name']!r} "
                     f"{w['state']} on {fold(w['nodes'])}")
    return lines


def print_rollout(out: "Output", doc: dict[str, Any]) -> None:
    """A rollout's end: each tray's state (its steps were printed as they ran)."""
    from mctl.model.site import fold

    by: dict[str, list[str]] = {}
    for tray, st in doc["trays"].items():
        by.setdefault(st["status"], []).append(tray)
    parts = [f"{status}: {fold(trays)}" for status, trays in by.items()]
    out.line(f"rollout {doc['run_id']} ({doc['status']}): " + ("; ".join(parts) or "no tray to take out of service")
         + (f"; harmless changes only: {fold(doc['free'])}" if doc["free"] else "")
         + (f"; unchanged: {fold(doc['unchanged'])}" if doc["unchanged"] else ""))
    out.line(f"journal: {doc['journal']}")
