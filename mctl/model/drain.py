"""The drain vocabulary every scheduler and the remediation policy share (pure, standard library).

A scheduler's node, whatever the scheduler (`NodeView`); what mctl decided about a
tray (`Decision`); what the scheduler did with an action (`ActResult`); an action
waiting for the scheduler to answer (`PendingAction`); and the one set of guards
that says whether mctl may drain or resume a node now (`drain_refusal`,
`resume_refusal`), used by the watch, the node check, `health resume` and the
Kubernetes adapter alike. The Slurm script re-checks the same guards on the
controller right before `scontrol update` (mctl.sched.slurm.drain).

The guards follow LBNL NHC: never overwrite a reason set by someone else, only
resume own drains, never touch down nodes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

REASON_PREFIX = "mctl:"          # every drain reason mctl sets starts with this
REASON_MAX = 40          # sinfo -R shows 20 by default; 40 reads whole in `sinfo -R -o "%40E %N"`

DRAIN, RESUME, SKIP, FORGET, QUEUE = "drain", "resume", "skip", "forget", "queue"
ADOPT = "adopt"          # mctl's own drain, resumed, came back when the scheduler restored an older state
NOTES = (SKIP, QUEUE, FORGET, ADOPT)    # decisions that change nothing in the scheduler: logged once per change


def is_mctl_reason(reason: str | None) -> bool:
    return bool(reason) and reason.strip().startswith(REASON_PREFIX)


class SchedulerUnreachable(Exception):
    """slurmctld (or the host it runs on), or the Kubernetes API, did not answer."""


@dataclass(frozen=True)
class NodeView:
    """The scheduler's view of one tray, whatever the scheduler."""

    name: str
    known: bool = True
    drained: bool = False          # Slurm DRAIN/DRAINING/DRAINED/FAIL; Kubernetes cordoned
    down: bool = False             # Slurm DOWN; Kubernetes NotReady
    reason: str | None = None      # without Slurm's ' [user@time]' stamp
    state: str = ""
    stamp: str | None = None       # Slurm's 'user@time' of the reason, as printed (None: no stamp, Kubernetes)
    unregistered: bool = False     # Slurm UNKNOWN: the controller has not heard from the node since it started

    @property
    def mctl_drain(self) -> bool:
        return self.drained and is_mctl_reason(self.reason)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Refusal:
    """Why a guard says no: unknown | down | drained (a drain) or unknown | down | not-drained |
    not-ours (a resume). Each caller words it (the watch's notes, `health resume`, the Kubernetes
    adapter); the Slurm script re-checks the same on the controller."""

    kind: str

    @property
    def not_ours(self) -> bool:
        return self.kind in ("not-drained", "not-ours")


def drain_refusal(view: NodeView | None) -> Refusal | None:
    """None when mctl may drain the node now: known, not down, not drained by anyone."""
    if view is None or not view.known:
        return Refusal("unknown")
    if view.down:
        return Refusal("down")
    if view.drained:
        return Refusal("drained")
    return None


def resume_refusal(view: NodeView | None) -> Refusal | None:
    """None when mctl may resume the node now: known, not down, drained with an `mctl:` reason."""
    if view is None or not view.known:
        return Refusal("unknown")
    if view.down:
        return Refusal("down")
    if not view.drained:
        return Refusal("not-drained")
    if not view.mctl_drain:
        return Refusal("not-ours")
    return None


@dataclass(frozen=True)
class Decision:
    host: str
    action: str
    why: str
    reason: str | None = None              # the scheduler reason (drain) or the one lifted (resume)
    full: str | None = None                # the full text for the action log
    rack: str | None = None
    at: float = 0.0
    # a resume of a node DOWN after mctl's own reboot of it (the recovery ladder): the guard then allows
    # DOWN and checks the reason is still the one the watch saw
    after_reboot: bool = False
    # a drain the safety budget counts but never holds back, nor the circuit breaker (a critical leak)
    outranks_budget: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ActResult:
    decision: Decision
    ok: bool
    error: str | None = None
    unreachable: bool = False      # the scheduler did not answer: the action is queued
    refused: bool = False          # the guard said no at the last moment
    not_ours: bool = False         # ... because the drain is someone else's now (or gone)
    fields: Mapping[str, Any] | None = None    # more keys of the action log's result line (pods evicted, ...)


@dataclass(frozen=True)
class PendingAction:
    """A drain or resume waiting for the scheduler to answer; re-decided, guards included, on the
    next sweep that reaches it. On disk: {"action", "reason", "full", "since"} (full only for a drain)."""

    action: str
    reason: str | None
    since: float | None
    full: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "reason": self.reason}
        if self.action == DRAIN:
            out["full"] = self.full
        out["since"] = self.since
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "PendingAction | None":
        if not data:
            return None
        return cls(str(data.get("action") or ""), data.get("reason"), data.get("since"), data.get("full"))
