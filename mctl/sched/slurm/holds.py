"""Holding trays out of Slurm and letting them go: the one home of every hold mctl takes.

A hold is a drain whose reason starts with its owner's prefix, so the owner (and only the owner)
finds and lifts it again, and every other guard of mctl takes the tray for held. Three owners hold
trays today, each described by a `HoldOwner` (data, not code):

- a partition change (`mctl partition ... --drain`, mctl.change): "mctl: partition change of RACK:
  held until the change is done", lifted once the change is done on every layer;
- bring-up (mctl.bringup): "mctl: bring-up RUN: opens when health and burn-in pass", so no job
  lands before the health gate and burn-in pass; the open phase lifts exactly those, and its
  resume also opens a held tray that is down (a restarted slurmd), with `REASON_OPENED`;
- provisioning (`mctl provision ... --drain`, `--rolling N`, mctl.rollout): "mctl: provision RUN:
  held until its provisioning is verified", lifted once the tray's new software is verified; the
  release also opens a held tray that is down (the rollout reboots trays), with `REASON_PROVISIONED`.

A tray drained or down for any other reason (an operator's, the health watch's) is never touched:
each action re-checks its guard on the controller right before `scontrol update` (the one guarded
script of mctl.sched.slurm.drain). Everything runs on the controller through one runner
(mctl.sched.slurm.control). The scripts and parsers are pure; `hold`/`release` do the round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mctl.model.drain import REASON_PREFIX
from mctl.sched.slurm import drain as sd
from mctl.sched.slurm.facts import NodeState, parse_show_nodes

if TYPE_CHECKING:
    from mctl.model.site import Site

# What a tray's reason says once bring-up opened it. Slurm keeps a node's last reason after a
# RESUME (24.11, checked in the lab: RESUME, UNDRAIN, Reason='' and DOWN then RESUME all leave
# it), so the resume sets this one in the same `scontrol update`: the hold reason is gone, and
# the text does not start with 'mctl:', so no guard of mctl ever takes the tray for held.
REASON_OPENED = "opened by mctl bring-up"
REASON_PROVISIONED = "released by mctl provision"


@dataclass(frozen=True)
class HoldOwner:
    """Who holds trays, as data: the reason's prefix, and how a release lifts the hold."""

    name: str                         # named in the guard's refusals ("the reason is no longer bring-up's")
    prefix: str                       # every hold reason of this owner starts with it
    verb: str                         # the guard's word for a tray it leaves as it is
    release_prefix: str               # a release lifts only a drain whose reason still starts with this
    release_reason: str               # what the reason says once released (Slurm keeps the last one)
    release_down: bool = False        # a release also opens a held tray that is down
    release_held: bool = False        # a release needs the tray drained (not merely down)

    def holds(self, node: NodeState) -> bool:
        """The node is drained or down with one of this owner's reasons."""
        return node.owned_by(self.prefix)


PARTITION_CHANGE = HoldOwner("mctl", "mctl: partition change", "refused", REASON_PREFIX, sd.RESUMED_REASON)
BRING_UP = HoldOwner("bring-up", "mctl: bring-up", "left alone", "mctl: bring-up", REASON_OPENED,
                     release_down=True, release_held=True)
PROVISION = HoldOwner("provision", "mctl: provision", "left alone", "mctl: provision", REASON_PROVISIONED,
                      release_down=True, release_held=True)

# The partition change's prefix under its historical name (reasons, error texts and tests read it).
HOLD_PREFIX = PARTITION_CHANGE.prefix


def change_reason(rack: str) -> str:
    """The reason of a partition change's hold on the trays of *rack*."""
    return f"{PARTITION_CHANGE.prefix} of {rack}: held until the change is done"


def bringup_reason(run_id: str) -> str:
    """The reason of bring-up's hold during run *run_id*."""
    return f"{BRING_UP.prefix} {run_id}: opens when health and burn-in pass"


def provision_reason(run_id: str) -> str:
    """The reason of provisioning's hold during rollout *run_id*."""
    return f"{PROVISION.prefix} {run_id}: held until its provisioning is verified"


# ------------------------------------------------------------------ scripts and their results (pure)

def hold_script(owner: HoldOwner, trays: Sequence[str], reason: str) -> str:
    """Drain each tray with *reason* unless something holds it already (drained or down by anyone)."""
    return sd.script([sd.drain_step(t, reason, verb=owner.verb) for t in trays])


def release_script(owner: HoldOwner, trays: Sequence[str]) -> str:
    """Resume each tray only while its reason is still the owner's; the resume sets the owner's
    release reason in the same update, so the hold reason is never left behind."""
    return sd.script([sd.resume_step(t, prefix=owner.release_prefix, reason=owner.release_reason, owner=owner.name,
                                     verb=owner.verb, not_down=not owner.release_down, held=owner.release_held)
                      for t in trays])


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


def show_command(trays: Sequence[str]) -> str:
    return sd.show_node_command(trays)


@dataclass(frozen=True)
class RackNodes:
    """The rack's trays as Slurm sees them, sorted by who holds them (for one owner)."""

    open: list[str]                    # schedulable (not drained, not down)
    held: list[str]                    # drained or down by the owner
    operator: dict[str, str]           # drained or down for another reason -> that reason
    down: dict[str, str]               # down without a drain (not responding, ...) -> state
    unknown: list[str]                 # not in Slurm
    states: dict[str, str]

    def to_dict(self) -> dict:
        return {"open": self.open, "held": self.held, "operator": self.operator, "down": self.down,
                "unknown": self.unknown, "states": self.states}


def classify(text: str, trays: Sequence[str], owner: HoldOwner = BRING_UP) -> RackNodes:
    """`scontrol show node -o` of *trays* -> who holds each of them."""
    nodes = {n.name: n for n in parse_show_nodes(text)}
    out = RackNodes([], [], {}, {}, [], {})
    for t in trays:
        n = nodes.get(t)
        if n is None:
            out.unknown.append(t)
            continue
        out.states[t] = n.state
        if owner.holds(n):
            out.held.append(t)
        elif n.drained:
            out.operator[t] = n.reason or "(no reason)"
        elif n.down:
            out.down[t] = n.state + (f" ({n.reason})" if n.reason else "")
        else:
            out.open.append(t)
    return out


def summary(nodes: RackNodes, owner: HoldOwner = BRING_UP) -> str:
    from mctl.model.site import fold

    parts = []
    if nodes.open:
        parts.append(f"{len(nodes.open)} open")
    if nodes.held:
        parts.append(f"{len(nodes.held)} held by {owner.name} ({fold(nodes.held)})")
    if nodes.operator:
        parts.append(f"{len(nodes.operator)} drained by others ({fold(nodes.operator)})")
    if nodes.down:
        parts.append(f"{len(nodes.down)} down ({fold(nodes.down)})")
    if nodes.unknown:
        parts.append(f"{len(nodes.unknown)} unknown to Slurm ({fold(nodes.unknown)})")
    return ", ".join(parts) or "no trays"


def release_command(trays: Sequence[str]) -> str:
    """What an operator runs to lift holds mctl could not (an error's hint)."""
    from mctl.model.site import fold

    return f"scontrol update NodeName={fold(trays)} State=RESUME Reason='released by the operator'"


# ------------------------------------------------------------------ the round trips

def hold(site: "Site", trays: Sequence[str], owner: HoldOwner, reason: str) -> tuple[list[str], dict[str, str]]:
    """Hold *trays* for *owner* with *reason*: (the trays it holds, including those it held already;
    {tray: why not} for the others: drained or down for someone else, whom mctl never overrides)."""
    from mctl.sched.slurm.control import controller_run

    shown = controller_run(site, sd.show_node_command())
    _, states = sd.read_nodes(shown.stdout)
    already = [t for t in trays if t in states and states[t].drained and owner.holds(states[t])]
    todo = [t for t in trays if t not in already]
    held, refused = list(already), {}
    if todo:
        result = controller_run(site, hold_script(owner, todo, reason))
        for t, r in sd.parse(result.stdout, todo).items():
            if r.ok:
                held.append(t)
            else:
                refused[t] = _said(t, r)
    order = {t: i for i, t in enumerate(trays)}
    return sorted(held, key=order.__getitem__), refused


def release(site: "Site", trays: Sequence[str], owner: HoldOwner) -> dict[str, str]:
    """Lift *owner*'s holds on *trays* (only while the reason is still the owner's); {tray: why not}."""
    from mctl.sched.slurm.control import controller_run

    if not trays:
        return {}
    result = controller_run(site, release_script(owner, trays))
    return {t: _said(t, r) for t, r in sd.parse(result.stdout, list(trays)).items() if not r.ok}


def _said(tray: str, r: "sd.StepResult") -> str:
    """Why a hold or release of *tray* did not happen, in the words every drain result uses."""
    from mctl.model.drain import DRAIN, Decision

    return sd.act_result(Decision(tray, DRAIN, ""), r).error or "refused"
