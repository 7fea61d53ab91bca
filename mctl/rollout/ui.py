"""What a provisioning tells, and asks, whoever started it: the rollout service's one interface outwards.

    plan(view)                          the check pass's verdict: each tray's changes, the work on it, the verdict
    note(text) / warn(text)             a line of progress, a warning
    confirm(breaks) -> bool             --force: go ahead and break the work named? (False: not confirmed)
    progress(hosts) -> context          around a plain run: its live progress (events go to it meanwhile)
    event(ev)                           a playbook's per-host progress (mctl.ansible.runner.HostEvent)
    batch(number, trays)                a batch of the rollout starts
    step_started(batch, step, trays) / step_ended(batch, step, status, summary, seconds)
    waiting(left, remaining)            --drain: the jobs still running on the held trays

The CLI passes a terminal UI (mctl.cli.provision_rollout.TerminalUI); the default says nothing and
confirms nothing, so a caller without a person never breaks running work.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager, Sequence

if TYPE_CHECKING:
    from mctl.ansible.runner import HostEvent
    from mctl.model.change import RunningWork


class RolloutUI:
    """Says nothing and confirms nothing; a caller overrides what it shows or asks."""

    def plan(self, view: dict[str, Any]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def confirm(self, breaks: str) -> bool:
        return False

    def progress(self, hosts: Sequence[str]) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def event(self, ev: "HostEvent") -> None:
        pass

    def batch(self, number: int, trays: Sequence[str]) -> None:
        pass

    def step_started(self, batch: int, step: str, trays: Sequence[str]) -> None:
        pass

    def step_ended(self, batch: int, step: str, status: str, summary: str, seconds: float) -> None:
        pass

    def waiting(self, left: Sequence["RunningWork"], remaining: float) -> None:
        pass
