"""Trays left drained: for longer than the threshold, or with no reason.

Slurm stamps a drain reason with who set it and when, in the controller's local
time: `Reason=mctl: xid 79 [root@2026-11-29T19:51:38]`. The age is measured
against the controller's own clock read in the same SSH command, so neither
time zones nor the audit host's clock matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

from mctl.model.findings import Finding, Severity
from mctl.sched.slurm.facts import NodeState

FAMILY = "drains"
AGE = "drain.age"
REASON = "drain.reason"
DEFAULT_MAX_AGE = 86400.0


@dataclass(frozen=True)
class Drain:
    node: str
    state: str
    reason: str | None          # without the stamp; None when Slurm holds none
    who: str | None = None
    since: datetime | None = None


def drain_of(node: NodeState) -> Drain | None:
    """The drain on *node* with its stamp split off, or None when it is not drained."""
    if not node.drained:
        return None
    stamp = node.stamp
    return Drain(node.name, node.state, node.reason_text, stamp.who if stamp else None, stamp.since if stamp else None)


def human_age(seconds: float) -> str:
    """The two largest units that are not zero: '1d', '1d 2h', '3h 5m', '40s'."""
    s = int(max(0, seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        value, s = divmod(s, size)
        if value or (parts and len(parts) < 2):
            parts.append(f"{value}{unit}")
        if len(parts) == 2:
            break
    parts = [p for p in parts if not p.startswith("0")]
    return " ".join(parts) or "0s"


def check(trays: Sequence[str], nodes: Mapping[str, NodeState], now_local: datetime | None,
          max_age_s: float = DEFAULT_MAX_AGE) -> list[Finding]:
    """One finding per tray Slurm knows: OK when not drained (or drained recently with a reason)."""
    out: list[Finding] = []
    resume = "find out why it is drained; resume it (scontrol update NodeName={n} State=RESUME) or repair it"
    for tray in trays:
        node = nodes.get(tray)
        if node is None:
            continue            # not a Slurm node: the slurm family reports it
        drain = drain_of(node)
        if drain is None:
            out.append(Finding(Severity.OK, tray, AGE, f"not drained ({node.state})", None, {"subject": "drain"}))
            continue
        if drain.reason is None:
            out.append(Finding(Severity.WARN, tray, REASON, f"drained ({node.state}) with no reason",
                               "ask who drained it and record why: scontrol update NodeName="
                               f"{tray} State=DRAIN Reason='...'", {"subject": "drain"}))
        else:
            out.append(Finding(Severity.OK, tray, REASON, f"drained with a reason: {drain.reason}", None,
                               {"subject": "drain"}))
        age = (now_local - drain.since).total_seconds() if (now_local and drain.since) else None
        since = f"since {drain.since.isoformat()}" + (f" by {drain.who}" if drain.who else "") if drain.since else ""
        why = f": {drain.reason}" if drain.reason else ""
        if age is not None and age > max_age_s:
            out.append(Finding(Severity.WARN, tray, AGE,
                               f"drained for {human_age(age)} ({since}), longer than {human_age(max_age_s)}{why}",
                               resume.format(n=tray),
                               {"subject": "drain", "age_s": round(age), "since": drain.since.isoformat(),
                                "reason": drain.reason, "by": drain.who}))
        else:
            told = f"drained for {human_age(age)}" if age is not None else "drained (no time stamp)"
            out.append(Finding(Severity.OK, tray, AGE, f"{told}{why}", None, {"subject": "drain"}))
    return out
