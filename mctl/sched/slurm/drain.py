"""Drains, resumes and holds in Slurm's words: the one guarded script mctl sends and its one parser.

Pure and standard library only (the node check runs the same script on the tray).
Every user of a drain — the health watch, the node check, `health resume`, bring-up's
hold and open, a partition change's hold — builds `Step`s: a host, the state to set
(DRAIN or RESUME), the reason to set, and a `Guard` that the script re-checks on the
controller right before `scontrol update`. So an operator who drains a node in the
meantime is never overwritten, and nobody resumes a drain that is not its own.

Each step prints one result marker, `@@mctl-action HOST rc=N`: 0 done, 3 refused by
the guard, 4 refused because the reason is no longer the owner's, anything else the
exit status of scontrol (`parse` reads them into `StepResult`s).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

from mctl.model.drain import DRAIN, REASON_PREFIX, RESUME, ActResult, Decision, NodeView
from mctl.sched.slurm.facts import NodeState, parse_show_nodes

SHOW_NODES = "scontrol show node -o"
MARK = "@@mctl-action"
RC_REFUSED = 3        # the guard refused: the node is drained (by anyone), down, or not drained
RC_NOT_OURS = 4       # the guard refused: the reason no longer starts with the owner's prefix
RC_BUDGET = 5         # the safety budget refused the grant (tripped, or every grant taken): mctl.sched.slurm.budget
RC_NO_BUDGET = 6      # ... or it is not in Slurm at all (not deployed)
# Slurm keeps a resumed node's last reason (24.11, checked in the lab; docs/decisions.md D18), so
# a resume replaces the owner's reason with its own in the same update; none starts with 'mctl:'.
RESUMED_REASON = "resumed by mctl"

# What scontrol prints when slurmctld is not there (the command ran, the controller did not answer).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|"
                          r"Communication connection failure|Zero Bytes were transmitted", re.I)
_RESULT = re.compile(re.escape(MARK) + r" (?P<host>\S+) rc=(?P<rc>\d+)$")


def controller_down(text: str) -> bool:
    return bool(_UNREACHABLE.search(text))


def show_node_command(names: str | Sequence[str] | None = None) -> str:
    """`scontrol show node -o`, of every node or of *names* (one name or several, comma-joined)."""
    if not names:
        return SHOW_NODES
    return f"{SHOW_NODES} {shlex.quote(names if isinstance(names, str) else ','.join(names))}"


def read_nodes(text: str) -> tuple[dict[str, NodeView], dict[str, NodeState]]:
    """`scontrol show node -o` -> (view per node, the parsed state per node)."""
    states = {n.name: n for n in parse_show_nodes(text)}
    return {name: s.view() for name, s in states.items()}, states


@dataclass(frozen=True)
class Guard:
    """What must hold on the controller right before the update, checked in this order:
    not drained or down by anyone (`free`), not down (`not_down`), the reason starts with
    `owner_prefix`, the node is drained (`held`). `verb` and `owner` word the refusals."""

    free: bool = False
    not_down: bool = False
    owner_prefix: str | None = None
    held: bool = False
    owner: str = "mctl"
    verb: str = "refused"

    def lines(self) -> list[str]:
        out: list[str] = []
        v = self.verb
        if self.free or self.not_down:
            states = "*DRAIN*|*DOWN*|*FAIL*" if self.free else "*DOWN*"
            out.append(f"[ -n \"$rc\" ] || {{ st=${{s#* State=}}; st=${{st%% *}}; case \"$st\" in {states}) "
                       f"echo \"{v}: the node is $st\"; rc={RC_REFUSED};; esac; }}")
        if self.owner_prefix is not None:
            out.append(f"[ -n \"$rc\" ] || case \"$s\" in *{shlex.quote(' Reason=' + self.owner_prefix)}*) ;; "
                       f"*) echo {shlex.quote(f'{v}: the reason is no longer {self.owner}' + chr(39) + 's')}; "
                       f"rc={RC_NOT_OURS};; esac")
        if self.held:
            out.append(f"[ -n \"$rc\" ] || {{ st=${{s#* State=}}; st=${{st%% *}}; case \"$st\" in *DRAIN*) ;; "
                       f"*) echo \"{v}: the node is $st, not drained\"; rc={RC_REFUSED};; esac; }}")
        return out


@dataclass(frozen=True)
class Grant:
    """Ask the site's safety budget (mctl.sched.slurm.budget) for the tray before a drain: the tray's rack
    and the grant's words. *count_only*: the drain goes ahead even if the budget refuses (a leak's: the
    budget counts it but never blocks it)."""

    rack: str | None
    comment: str
    count_only: bool = False
    trip: bool = True                   # False: a refusal is said but does not trip the budget (a person's command)


@dataclass(frozen=True)
class Step:
    """One guarded `scontrol update NodeName=host State=state Reason=reason`; a drain may first ask the
    safety budget for a grant (`grant`), a resume give the tray's grant back (`release`)."""

    host: str
    state: str                     # DRAIN | RESUME
    reason: str
    guard: Guard
    grant: Grant | None = None
    release: bool = False

    def lines(self) -> list[str]:
        from mctl.sched.slurm import budget

        q = shlex.quote(self.host)
        asked: list[str] = []
        if self.grant is not None:
            asked = budget.grant_lines(self.host, self.grant.rack, self.grant.comment, trip=self.grant.trip)
            if self.grant.count_only:
                asked.append(f"[ \"$rc\" != {budget.RC_BUDGET} ] && [ \"$rc\" != {budget.RC_NO_BUDGET} ] || "
                             "{ echo 'counted beyond it: a leak is never held back'; rc=; }")
        return [
            "rc=",
            f"s=$(scontrol show node -o {q} 2>&1) || {{ printf '%s\\n' \"$s\"; rc=1; }}",
            *self.guard.lines(),
            *asked,
            f"[ -n \"$rc\" ] || {{ scontrol update NodeName={q} State={self.state} Reason={shlex.quote(self.reason)} "
            "2>&1; rc=$?; }",
            *(budget.give_back_lines(self.host) if self.grant is not None else []),
            *(budget.release_lines(self.host) if self.release else []),
            f"printf '\\n{MARK} %s rc=%d\\n' {q} \"$rc\"",
        ]


def drain_step(host: str, reason: str, *, verb: str = "refused", grant: Grant | None = None) -> Step:
    """Drain unless something holds the node already (drained, down or failing, by anyone); with *grant*,
    only once the safety budget grants the tray."""
    return Step(host, "DRAIN", reason, Guard(free=True, verb=verb), grant)


def resume_step(host: str, *, prefix: str = REASON_PREFIX, reason: str = RESUMED_REASON, owner: str = "mctl",
                verb: str = "refused", not_down: bool = True, held: bool = False, release: bool = False) -> Step:
    """Resume only while the reason still starts with *prefix*; the resume replaces it with *reason*
    in the same update. The watch's resume also refuses a down node; bring-up's requires a drain.
    *release*: the tray's grant of the safety budget goes back once resumed."""
    return Step(host, "RESUME", reason, Guard(not_down=not_down, owner_prefix=prefix, held=held, owner=owner,
                                              verb=verb), release=release)


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


def script(steps: Sequence[Step], limit_s: float | None = None) -> str:
    """One script for all *steps*; each prints its own result marker. With *limit_s*, no scontrol of it
    runs past that many seconds from the script's start."""
    lines = _bounded_scontrol(limit_s) if limit_s else []
    for step in steps:
        lines += step.lines()
    text = "\n".join(lines) + "\n"
    if limit_s:
        text = text.replace("$(scontrol ", "$(sc ").replace("{ scontrol ", "{ sc ")
    return text


@dataclass(frozen=True)
class StepResult:
    host: str
    status: str                    # done | refused | not-ours | failed | unreachable
    text: str                      # what the controller said (the guard's words, scontrol's error)

    @property
    def ok(self) -> bool:
        return self.status == "done"


def parse(stdout: str, hosts: Sequence[str]) -> dict[str, StepResult]:
    """The script's output -> one result per host; a host without a marker was cut short (unreachable)."""
    said: dict[str, tuple[int, str]] = {}
    chunk: list[str] = []
    for line in stdout.splitlines():
        m = _RESULT.match(line.strip())
        if m:
            said[m["host"]] = (int(m["rc"]), "\n".join(x for x in chunk if x.strip()).strip())
            chunk = []
        else:
            chunk.append(line)
    out: dict[str, StepResult] = {}
    for host in hosts:
        if host not in said:
            out[host] = StepResult(host, "unreachable", "")
            continue
        rc, text = said[host]
        if rc == 0:
            out[host] = StepResult(host, "done", text)
        elif rc in (RC_REFUSED, RC_NOT_OURS, RC_BUDGET, RC_NO_BUDGET):
            out[host] = StepResult(host, "not-ours" if rc == RC_NOT_OURS else "refused", text)
        else:
            out[host] = StepResult(host, "unreachable" if controller_down(text) else "failed",
                                   text or f"scontrol exited {rc}")
    return out


# --- the remediation policy's decisions ------------------------------------------------------------

def _step_of(d: Decision) -> Step:
    """Every drain of the remediation policy asks the safety budget first (a leak's is counted, never
    held back); every resume gives the tray's grant back."""
    if d.action == DRAIN:
        return drain_step(d.host, d.reason or REASON_PREFIX,
                          grant=Grant(d.rack, d.reason or d.why, count_only=d.outranks_budget))
    if d.action == RESUME and d.after_reboot:
        # DOWN after the recovery ladder's own reboot: the reason must still be the one the watch saw
        return resume_step(d.host, prefix=d.reason if d.reason and not d.reason.startswith(REASON_PREFIX)
                           else REASON_PREFIX, not_down=False, release=True)
    if d.action == RESUME:
        return resume_step(d.host, release=True)
    raise ValueError(f"not a scheduler action: {d.action}")


def apply_script(decisions: Sequence[Decision], limit_s: float | None = None) -> str:
    """The script for the drains and resumes of a sweep (the watch's and the node check's guards)."""
    return script([_step_of(d) for d in decisions], limit_s)


def parse_apply(stdout: str, decisions: Sequence[Decision]) -> list[ActResult]:
    results = parse(stdout, [d.host for d in decisions])
    return [act_result(d, results[d.host]) for d in decisions]


def act_result(d: Decision, r: StepResult) -> ActResult:
    if r.status == "done":
        return ActResult(d, True)
    if r.status in ("refused", "not-ours"):
        return ActResult(d, False, r.text or "refused by the guard", refused=True, not_ours=r.status == "not-ours")
    if r.status == "unreachable":
        return ActResult(d, False, r.text or "no result (the script was cut short)", unreachable=True)
    return ActResult(d, False, r.text)

