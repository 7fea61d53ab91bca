"""Drains and resumes in Slurm's words: the commands mctl sends and how it reads the answers.

Pure and standard library only (the node check runs the same commands on the
tray). The watch reads every node with `scontrol show node -o`, decides, then
sends one script to the controller that carries out all actions of the sweep.
Each action re-checks its guard on the controller right before `scontrol
update` (not drained, not down; for a resume: the reason is still mctl's), so
an operator who drains a node in the meantime is never overwritten.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from mctl.health.policy import DRAIN, RESUME, Decision, NodeView
from mctl.model.settings import REASON_PREFIX
from mctl.sched.slurm.facts import NodeState, parse_show_nodes

SHOW_NODES = "scontrol show node -o"
MARK = "@@mctl-action"
RC_GUARD = 3          # the guard refused: the node is drained (by anyone) or down
RC_NOT_OURS = 4       # the guard refused a resume: the reason no longer starts with mctl:
# Slurm keeps a resumed node's last reason (24.11, checked in the lab; docs/decisions.md D18), so
# a resume replaces mctl's reason with this in the same update; it does not start with 'mctl:'.
RESUMED_REASON = "resumed by mctl"

# What scontrol prints when slurmctld is not there (the command ran, the controller did not answer).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|"
                          r"Communication connection failure|Zero Bytes were transmitted", re.I)
_RESULT = re.compile(re.escape(MARK) + r" (?P<host>\S+) rc=(?P<rc>\d+)$")


class SchedulerUnreachable(Exception):
    """slurmctld (or the host it runs on) did not answer."""


def controller_down(text: str) -> bool:
    return bool(_UNREACHABLE.search(text))


def read_nodes(text: str) -> tuple[dict[str, NodeView], dict[str, NodeState]]:
    """`scontrol show node -o` -> (view per node, the parsed state per node)."""
    states = {n.name: n for n in parse_show_nodes(text)}
    return {name: NodeView.from_slurm(s) for name, s in states.items()}, states


def show_node_command(name: str | None = None) -> str:
    return SHOW_NODES + (f" {shlex.quote(name)}" if name else "")


def _drain_lines(host: str, reason: str) -> list[str]:
    q = shlex.quote(host)
    return [
        f"s=$(scontrol show node -o {q} 2>&1) || {{ printf '%s\\n' \"$s\"; rc=1; }}",
        "if [ -z \"$rc\" ]; then",
        "  st=${s#* State=}; st=${st%% *}",
        f"  case \"$st\" in *DRAIN*|*DOWN*|*FAIL*) echo \"refused: the node is $st\"; rc={RC_GUARD};; esac",
        "fi",
        f"[ -n \"$rc\" ] || {{ scontrol update NodeName={q} State=DRAIN Reason={shlex.quote(reason)} 2>&1; rc=$?; }}",
    ]


def _resume_lines(host: str) -> list[str]:
    q = shlex.quote(host)
    prefix = REASON_PREFIX
    return [
        f"s=$(scontrol show node -o {q} 2>&1) || {{ printf '%s\\n' \"$s\"; rc=1; }}",
        "if [ -z \"$rc\" ]; then",
        "  st=${s#* State=}; st=${st%% *}",
        f"  case \"$st\" in *DOWN*) echo \"refused: the node is $st\"; rc={RC_GUARD};; esac",
        "fi",
        "if [ -z \"$rc\" ]; then",
        f"  case \"$s\" in *' Reason={prefix}'*) ;; *) echo 'refused: the reason is no longer mctl'\"'\"'s'; "
        f"rc={RC_NOT_OURS};; esac",
        "fi",
        f"[ -n \"$rc\" ] || {{ scontrol update NodeName={q} State=RESUME Reason={shlex.quote(RESUMED_REASON)} 2>&1; "
        "rc=$?; }",
    ]


def _bounded_scontrol(limit_s: float) -> list[str]:
    """`sc`, scontrol bounded on the controller by what is left of *limit_s* from the script's start.

    mctl's deadline drops the connection, but a command cut off that way goes on running on the
    controller: scontrol keeps retrying a slurmctld that is down and applies the update when it
    comes back, long after mctl logged the action as queued (seen in the chaos soak: a resume
    done in Slurm, logged as failed, then forgotten as "resumed outside mctl"). So every scontrol
    of the script is killed at the deadline; a killed one reads as the controller not answering
    (queued, re-decided on the next sweep)."""
    n = max(1, int(limit_s) - 2)          # a margin for the trip there and the 1 s steps of date +%s
    return [
        f"mctl_end=$(( $(date +%s) + {n} ))",
        "sc() { left=$(( mctl_end - $(date +%s) )); [ \"$left\" -ge 1 ] || left=1; "
        "timeout -s KILL \"$left\" scontrol \"$@\"; r=$?; "
        f"[ \"$r\" -ne 137 ] || echo 'Socket timed out: scontrol killed at the {n}s deadline of mctl'; "
        "return $r; }",
    ]


def apply_script(decisions: Sequence[Decision], limit_s: float | None = None) -> str:
    """One script for every drain and resume of a sweep; each prints its own result marker. With
    *limit_s*, no scontrol of it runs past that many seconds from the script's start."""
    lines = _bounded_scontrol(limit_s) if limit_s else []
    for d in decisions:
        if d.action not in (DRAIN, RESUME):
            raise ValueError(f"not a scheduler action: {d.action}")
        lines.append("rc=")
        lines += _drain_lines(d.host, d.reason or REASON_PREFIX) if d.action == DRAIN else _resume_lines(d.host)
        lines.append(f"printf '\\n{MARK} %s rc=%d\\n' {shlex.quote(d.host)} \"$rc\"")
    text = "\n".join(lines) + "\n"
    if limit_s:
        text = text.replace("$(scontrol ", "$(sc ").replace("{ scontrol ", "{ sc ")
    return text


@dataclass(frozen=True)
class ActResult:
    decision: Decision
    ok: bool
    error: str | None = None
    unreachable: bool = False      # slurmctld did not answer: the action is queued
    refused: bool = False          # the guard said no at the last moment
    not_ours: bool = False         # ... because the drain's reason is someone else's now


def parse_apply(stdout: str, decisions: Sequence[Decision]) -> list[ActResult]:
    results: dict[str, tuple[int, str]] = {}
    chunk: list[str] = []
    for line in stdout.splitlines():
        m = _RESULT.match(line.strip())
        if m:
            results[m["host"]] = (int(m["rc"]), "\n".join(l for l in chunk if l.strip()).strip())
            chunk = []
        else:
            chunk.append(line)
    out = []
    for d in decisions:
        if d.host not in results:
            out.append(ActResult(d, False, "no result (the script was cut short)", unreachable=True))
            continue
        rc, text = results[d.host]
        if rc == 0:
            out.append(ActResult(d, True))
        elif rc in (RC_GUARD, RC_NOT_OURS):
            out.append(ActResult(d, False, text or "refused by the guard", refused=True, not_ours=rc == RC_NOT_OURS))
        else:
            out.append(ActResult(d, False, text or f"scontrol exited {rc}", unreachable=controller_down(text)))
    return out
