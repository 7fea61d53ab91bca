"""Holding a rack's trays out of Slurm during bring-up, and opening them at the end (pure).

Bring-up drains the trays it has just deployed Slurm on, with a reason that
starts `mctl: bring-up`, so no job lands before the health gate and burn-in
pass; the open phase resumes exactly those. A tray drained or down for any
other reason (an operator's, the health watch's) is never touched: each action
re-checks its guard on the controller right before `scontrol update`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from mctl.sched.slurm.facts import NodeState, parse_show_nodes

REASON_PREFIX = "mctl: bring-up"
# What a tray's reason says once bring-up opened it. Slurm keeps a node's last reason after a
# RESUME (24.11, checked in the lab: RESUME, UNDRAIN, Reason='' and DOWN then RESUME all leave
# it), so the resume sets this one in the same `scontrol update`: the hold reason is gone, and
# the text does not start with 'mctl:', so no guard of mctl ever takes the tray for held.
REASON_OPENED = "opened by mctl bring-up"
MARK = "@@mctl-bringup"
RC_REFUSED = 3
_RESULT = re.compile(re.escape(MARK) + r" (?P<host>\S+) rc=(?P<rc>\d+)$")


def reason(run_id: str) -> str:
    return f"{REASON_PREFIX} {run_id}: opens when health and burn-in pass"


def ours(node: NodeState) -> bool:
    return (node.reason or "").startswith(REASON_PREFIX)


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
        down = "DOWN" in n.flags or "FAIL" in n.flags
        if ours(n) and (n.drained or down):
            out.held.append(t)
        elif n.drained:
            out.operator[t] = n.reason or "(no reason)"
        elif down:
            out.down[t] = n.state + (f" ({n.reason})" if n.reason else "")
        else:
            out.open.append(t)
    return out


def show_command(trays: Sequence[str]) -> str:
    return "scontrol show node -o " + shlex.quote(",".join(trays))


def _guarded(host: str, action: str, guard: str) -> list[str]:
    q = shlex.quote(host)
    return [
        "rc=",
        f"s=$(scontrol show node -o {q} 2>&1) || {{ printf '%s\\n' \"$s\"; rc=1; }}",
        f"[ -n \"$rc\" ] || {guard}",
        f"[ -n \"$rc\" ] || {{ {action} 2>&1; rc=$?; }}",
        f"printf '\\n{MARK} %s rc=%d\\n' {q} \"$rc\"",
    ]


def drain_script(trays: Sequence[str], why: str) -> str:
    """Drain each tray unless something else holds it already (drained or down by anyone)."""
    lines: list[str] = []
    for t in trays:
        guard = ("{ st=${s#* State=}; st=${st%% *}; case \"$st\" in *DRAIN*|*DOWN*|*FAIL*) "
                 f"echo \"left alone: the node is $st\"; rc={RC_REFUSED};; esac; }}")
        lines += _guarded(t, f"scontrol update NodeName={shlex.quote(t)} State=DRAIN Reason={shlex.quote(why)}",
                          guard)
    return "\n".join(lines) + "\n"


def resume_script(trays: Sequence[str]) -> str:
    """Resume each tray only while it is held and its reason is still bring-up's; the resume
    replaces the hold reason (REASON_OPENED) in the same update, so it is never left behind."""
    lines: list[str] = []
    for t in trays:
        guard = (f"case \"$s\" in *' Reason={REASON_PREFIX}'*) ;; *) echo 'left alone: the reason is no longer "
                 f"bring-up'\"'\"'s'; rc={RC_REFUSED};; esac; "
                 "[ -n \"$rc\" ] || { st=${s#* State=}; st=${st%% *}; case \"$st\" in *DRAIN*) ;; "
                 f"*) echo \"left alone: the node is $st, not drained\"; rc={RC_REFUSED};; esac; }}")
        lines += _guarded(t, f"scontrol update NodeName={shlex.quote(t)} State=RESUME "
                             f"Reason={shlex.quote(REASON_OPENED)}", guard)
    return "\n".join(lines) + "\n"


def parse_actions(stdout: str, trays: Sequence[str]) -> dict[str, tuple[str, str]]:
    """tray -> (done | refused | failed, what the controller said)."""
    said: dict[str, tuple[int, str]] = {}
    chunk: list[str] = []
    for line in stdout.splitlines():
        m = _RESULT.match(line.strip())
        if m:
            said[m["host"]] = (int(m["rc"]), " ".join(x.strip() for x in chunk if x.strip()))
            chunk = []
        else:
            chunk.append(line)
    out: dict[str, tuple[str, str]] = {}
    for t in trays:
        if t not in said:
            out[t] = ("failed", "no answer (the script was cut short)")
            continue
        rc, text = said[t]
        out[t] = ("done", text) if rc == 0 else ("refused" if rc == RC_REFUSED else "failed",
                                                   text or f"scontrol exited {rc}")
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
