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
from typing import TYPE_CHECKING, Mapping, Sequence

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
    budget: bool = True               # its holds are trays out of service by mctl's decision: each needs a grant

    def holds(self, node: NodeState) -> bool:
        """The node is drained or down with one of this owner's reasons."""
        return node.owned_by(self.prefix)


PARTITION_CHANGE = HoldOwner("mctl", "mctl: partition change", "refused", REASON_PREFIX, sd.RESUMED_REASON)
# A rack under bring-up is not in service yet: its holds take no grant of the safety budget.
BRING_UP = HoldOwner("bring-up", "mctl: bring-up", "left alone", "mctl: bring-up", REASON_OPENED,
                     release_down=True, release_held=True, budget=False)
# A rollout's hold takes a tray out of service: each needs a grant (a refused tray waits for a later batch).
PROVISION = HoldOwner("provision", "mctl: provision", "left alone", "mctl: provision", REASON_PROVISIONED,
                      release_down=True, release_held=True)

# Rack escalation (mctl.health.escalation): the watch holds a failing rack's trays with one reason. Its holds count
# against the safety budget but are never held back by it (asked count-only, never tripping: D99).
ESCALATION = HoldOwner("rack escalation", "mctl: rack escalated", "left alone", "mctl: rack escalated",
                       "lifted by mctl rack escalation", release_down=True, release_held=True)

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

def hold_script(owner: HoldOwner, trays: Sequence[str], reason: str,
                racks: "Mapping[str, str | None] | None" = None) -> str:
    """Drain each tray with *reason* unless something holds it already (drained or down by anyone); an
    owner whose holds count asks the safety budget for each tray first (*racks*: tray -> its rack). A hold
    is a person's command: a refusal is said to them and does not trip the site's budget."""
    def grant(t: str) -> "sd.Grant | None":
        return sd.Grant((racks or {}).get(t), reason, trip=False) if owner.budget else None

    return sd.script([sd.drain_step(t, reason, verb=owner.verb, grant=grant(t)) for t in trays])


def release_script(owner: HoldOwner, trays: Sequence[str]) -> str:
    """Resume each tray only while its reason is still the owner's; the resume sets the owner's
    release reason in the same update, so the hold reason is never left behind (and gives the tray's
    grant of the safety budget back)."""
    return sd.script([sd.resume_step(t, prefix=owner.release_prefix, reason=owner.release_reason, owner=owner.name,
                                     verb=owner.verb, not_down=not owner.release_down, held=owner.release_held,
                                     release=owner.budget)
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
        racks = {t: (site.host(t).rack if site.host(t) is not None else None) for t in todo}
        result = controller_run(site, hold_script(owner, todo, reason, racks))
        for t, r in sd.parse(result.stdout, todo).items():
            if r.ok:
                held.append(t)
            else:
                refused[t] = _said(t, r)
    order = {t: i for i, t in enumerate(trays)}
    return sorted(held, key=order.__getitem__), refused


BUDGET_REFUSAL = "held back by the safety budget"


def budget_refused(refused: Mapping[str, str]) -> dict[str, str]:
    """The trays of a hold's {tray: why not} that the safety budget refused."""
    return {t: why for t, why in refused.items() if BUDGET_REFUSAL in why or "safety budget is not in Slurm" in why}


def hold_within_budget(site: "Site", trays: Sequence[str], owner: HoldOwner,
                       reason: str) -> tuple[list[str], dict[str, str]]:
    """`hold`, all or nothing against the safety budget: when it refuses any tray, the trays this call held
    are released again (their grants go back) and UsageError (exit 2) names the refusal and the way out;
    otherwise what `hold` returns. Trays held already by *owner* (a stopped change) stay held."""
    from mctl.errors import UsageError
    from mctl.model.site import fold

    shown = _states(site)
    before = {t for t in trays if t in shown and shown[t].drained and owner.holds(shown[t])}
    held, refused = hold(site, trays, owner, reason)
    over = budget_refused(refused)
    if not over:
        return held, refused
    fresh = [t for t in held if t not in before]
    left = release(site, fresh, owner) if fresh else {}
    why = next(iter(over.values()))
    raise UsageError(f"the safety budget refuses to hold {fold(sorted(over))} ({len(over)} of the {len(trays)} "
                     f"trays to hold): {why}; nothing was changed"
                     + (f", and {fold(sorted(left))} could not be released: {'; '.join(left.values())}" if left
                        else f"{', and ' + fold(fresh) + ' released again' if fresh else ''}"),
                     hint="a hold is a tray out of service: see 'mctl health drains' for the trays that hold its "
                          "grants; for a maintenance that holds more, raise safety.budget in mctl.yml "
                          "(allow_whole_rack for a whole rack) and run 'mctl deploy slurm', or act on fewer trays "
                          "at once")


def _states(site: "Site") -> dict:
    from mctl.sched.slurm.control import controller_run

    return sd.read_nodes(controller_run(site, sd.show_node_command()).stdout)[1]


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


# ------------------------------------------------------------------ rack escalation: one hold on a rack's trays

def escalate_script(rack: str | None, trays: Sequence[str], reason: str, own: Mapping[str, str]) -> str:
    """One guarded script holding *trays* of *rack* with *reason*: a tray free (not drained, not down) is drained;
    a tray mctl's watch drained itself (*own*: tray -> the exact reason it set) gets the rack's reason in its
    place, only while that reason is still on it; any other drain or a down tray is left alone (the guard
    re-checks each on the controller). Each tray asks the safety budget for a grant, counted and never held
    back (a tray mctl drained holds its grant already)."""
    grant = sd.Grant(rack, reason, count_only=True, trip=False)
    steps = []
    for t in trays:
        if t in own:
            steps.append(sd.Step(t, "DRAIN", reason, sd.Guard(owner_prefix=own[t], held=True, owner="the watch",
                                                              verb=ESCALATION.verb), grant))
        else:
            steps.append(sd.drain_step(t, reason, verb=ESCALATION.verb, grant=grant))
    return sd.script(steps)


def hold_rack(site: "Site", rack: str, trays: Sequence[str], reason: str,
              own: Mapping[str, str]) -> tuple[list[str], dict[str, str], str | None]:
    """Hold *trays* of *rack* for rack escalation (escalate_script) in one round trip to the controller:
    (the trays holding *reason*, those already held included; {tray: why not}; None, or why the controller
    did not answer)."""
    from mctl.errors import MctlError
    from mctl.sched.slurm.control import controller_run

    try:
        shown = controller_run(site, sd.show_node_command())
        _, states = sd.read_nodes(shown.stdout)
        already = [t for t in trays if t in states and states[t].drained and (states[t].reason or "") == reason]
        todo = [t for t in trays if t not in already]
        held, refused = list(already), {}
        if todo:
            result = controller_run(site, escalate_script(rack, todo, reason, own))
            for t, r in sd.parse(result.stdout, todo).items():
                if r.ok:
                    held.append(t)
                else:
                    refused[t] = _said(t, r)
    except MctlError as exc:
        return [], {}, exc.message
    order = {t: i for i, t in enumerate(trays)}
    return sorted(held, key=order.__getitem__), refused, None


# ------------------------------------------------------------------ the safety budget's grants asked by a command

def grant_budget(site: "Site", trays: Sequence[str], comment: str, *,
                 count_only: bool = False) -> tuple[list[str], dict[str, str]]:
    """Ask the site's safety budget (mctl.sched.slurm.budget) for *trays* on the controller without holding
    them (a power off): (granted, {tray: why not}); *count_only*: a refusal does not trip the budget."""
    from mctl.sched.slurm import budget
    from mctl.sched.slurm.control import controller_run

    racks = {t: (site.host(t).rack if site.host(t) is not None else None) for t in trays}
    result = controller_run(site, budget.grant_script(racks, comment, count_only=count_only))
    return budget.parse_grants(result.stdout, list(trays))


def release_budget(site: "Site", trays: Sequence[str]) -> list[str]:
    """Give back the grants of *trays* (the trays back in service); the trays whose grant went back."""
    from mctl.sched.slurm import budget
    from mctl.sched.slurm.control import controller_run

    if not trays:
        return []
    result = controller_run(site, budget.release_script(trays))
    return [line.split()[1] for line in result.stdout.splitlines() if line.startswith("released ")]


def release_own_budget(site: "Site", trays: Sequence[str], word: str) -> list[str]:
    """Give back the grants of *trays* that a command whose words start with *word* asked (a power off's,
    at its power on): never a grant the watch or a hold holds for the same tray."""
    from mctl.sched.slurm import budget
    from mctl.sched.slurm.control import controller_run

    view = budget.parse_reservations(controller_run(site, budget.SHOW_RESERVATIONS).stdout)
    own = [t for t in trays if t in view.grants and (view.grants[t].comment or "").startswith(word)]
    return release_budget(site, own)
