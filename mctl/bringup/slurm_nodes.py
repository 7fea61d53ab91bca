"""Holding a rack's trays out of Slurm during bring-up, and opening them at the end (pure).

Bring-up drains the trays it has just deployed Slurm on, with a reason that
starts `mctl: bring-up`, so no job lands before the health gate and burn-in
pass; the open phase resumes exactly those. A tray drained or down for any
other reason (an operator's, the health watch's) is never touched: each action
re-checks its guard on the controller right before `scontrol update` (the one guarded
script of mctl.sched.slurm.drain, with bring-up's reason prefix and guards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mctl.sched.slurm import drain as sd
from mctl.sched.slurm.facts import NodeState, parse_show_nodes

REASON_PREFIX = "mctl: bring-up"
# What a tray's reason says once bring-up opened it. Slurm keeps a node's last reason after a
# RESUME (24.11, checked in the lab: RESUME, UNDRAIN, Reason='' and DOWN then RESUME all leave
# it), so the resume sets this one in the same `scontrol update`: the hold reason is gone, and
# the text does not start with 'mctl:', so no guard of mctl ever takes the tray for held.
REASON_OPENED = "opened by mctl bring-up"


def reason(run_id: str) -> str:
    return f"{REASON_PREFIX} {run_id}: opens when health and burn-in pass"


def ours(node: NodeState) -> bool:
    return node.owned_by(REASON_PREFIX)


@dataclass(frozen=True)
class RackNodes:
    """The rack's trays as Slurm sees them, sorted by who holds them."""

    open: list[str]                    # schedulable (not drained, not down)
    held: list[str]                    # drained or down by bring-up
    operator: dict[str, str]           # drained or down for another reason -> that reason
    down: dict[str, str]               # down without a drain (not responding, ...) -> state
    unknown: list[str]                 # not in Slurm
    states: dict[str, str]

    def to_dict(self) -> dict:
        return {"open": self.open, "held": self.held, "operator": self.operator, "down": self.down,
                "unknown": self.unknown, "states": self.states}


def classify(text: str, trays: Sequence[str]) -> RackNodes:
    nodes = {n.name: n for n in parse_show_nodes(text)}
    out = RackNodes([], [], {}, {}, [], {})
    for t in trays:
        n = nodes.get(t)
        if n is None:
            out.unknown.append(t)
            continue
        out.states[t] = n.state
        if ours(n):
            out.held.append(t)
        elif n.drained:
            out.operator[t] = n.reason or "(no reason)"
        elif n.down:
            out.down[t] = n.state + (f" ({n.reason})" if n.reason else "")
        else:
            out.open.append(t)
    return out


def show_command(trays: Sequence[str]) -> str:
    return sd.show_node_command(trays)


def drain_script(trays: Sequence[str], why: str) -> str:
    """Drain each tray unless something else holds it already (drained or down by anyone)."""
    return sd.script([sd.drain_step(t, why, verb="left alone") for t in trays])


def resume_script(trays: Sequence[str]) -> str:
    """Resume each tray only while it is held and its reason is still bring-up's; the resume
    replaces the hold reason (REASON_OPENED) in the same update, so it is never left behind.
    Unlike the watch's, bring-up's resume opens a held tray that is also down (a restarted slurmd)."""
    return sd.script([sd.resume_step(t, prefix=REASON_PREFIX, reason=REASON_OPENED, owner="bring-up",
                                     verb="left alone", not_down=False, held=True) for t in trays])


def parse_actions(stdout: str, trays: Sequence[str]) -> dict[str, tuple[str, str]]:
    """tray -> (done | refused | failed, what the controller said)."""
    out: dict[str, tuple[str, str]] = {}
    for t, r in sd.parse(stdout, trays).items():
        text = " ".join(line.strip() for line in r.text.splitlines() if line.strip())
        if r.status == "done":
            out[t] = ("done", text)
        elif r.status in ("refused", "not-ours"):
            out[t] = ("refused", text)
        else:
            out[t] = ("failed", text or "no answer (the script was cut short)")
    return out


def summary(nodes: RackNodes) -> str:
    from mctl.model.site import fold

    parts = []
    if nodes.open:
        parts.append(f"{len(nodes.open)} open")
    if nodes.held:
        parts.append(f"{len(nodes.held)} held by bring-up ({fold(nodes.held)})")
    if nodes.operator:
        parts.append(f"{len(nodes.operator)} drained by others ({fold(nodes.operator)})")
    if nodes.down:
        parts.append(f"{len(nodes.down)} down ({fold(nodes.down)})")
    if nodes.unknown:
        parts.append(f"{len(nodes.unknown)} unknown to Slurm ({fold(nodes.unknown)})")
    return ", ".join(parts) or "no trays"
