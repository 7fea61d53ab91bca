"""What a partition change tells, and asks, whoever started it: the change service's one interface outwards.

The change service (mctl.change.service) conducts every partition change the same way — plan,
the jobs rule, the journaled run, the result — and talks to the outside only through a `ChangeUI`:

    plan(rack, plan, dry_run)          the NMX-M plan, once asked
    change(cp, dry_run, has_nmx, record)   the cross-layer plan (trays, IMEX, Slurm, labels, work, steps)
    note(text) / warn(text) / caution(text)   a line of progress, a warning, a warning for a person only
    confirm(cp, breaks) -> bool        --force: go ahead and break the work named? (False: not confirmed)
    held(held, refused, busy, seconds) --drain: the trays held, and the wait that follows
    released(trays)                    the holds lifted
    starting(spec)                     the jobs rule and the rack lock let the change go: it starts now
    nmx_step(number, total, change)    --nmx-only: each NMX-M operation as it runs
    line / step_started / step_ended   the journaled run's steps (mctl.change.run.Report)

The CLI passes a terminal UI (mctl.cli.partition_change.TerminalUI: rich or plain text, silent with
--json, a question on the terminal for --force). The watch's isolation passes `SilentUI`: it shows
nothing and its confirm refuses, so a change the watch starts never breaks running work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from mctl.change.run import Report

if TYPE_CHECKING:
    from mctl.change.run import ChangeSpec
    from mctl.model.change import ChangePlan
    from mctl.model.fabric import PartitionChange, PartitionPlan
    from mctl.model.site import Rack


class ChangeUI(Report):
    """Says nothing and confirms nothing; a caller overrides what it shows or asks."""

    def plan(self, rack: "Rack", plan: "PartitionPlan", *, dry_run: bool) -> None:
        pass

    def change(self, cp: "ChangePlan", *, dry_run: bool, has_nmx: bool = True, record: bool = False) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def caution(self, text: str) -> None:
        """A warning for a person reading the plan (a document for a program carries it otherwise)."""

    def confirm(self, cp: "ChangePlan", breaks: str) -> bool:
        return False

    def held(self, held: Sequence[str], refused: dict[str, str], busy: Sequence[str], seconds: float) -> None:
        pass

    def released(self, trays: Sequence[str]) -> None:
        pass

    def starting(self, spec: "ChangeSpec") -> None:
        pass

    def nmx_step(self, number: int, total: int, change: "PartitionChange") -> None:
        pass


class SilentUI(ChangeUI):
    """Nobody to ask (the health watch): nothing shown, and --force is never confirmed."""
