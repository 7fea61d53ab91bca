"""What to do about each tray after a sweep: the remediation policy (pure).

Per tray mctl keeps a small record: consecutive unreachable sweeps (misses),
consecutive critical sweeps, consecutive healthy sweeps, and whether mctl owns
a drain on it (with the exact reason it set). From the record, this sweep's
verdict and the scheduler's view of the node, `decide` returns decisions:

- drain: critical for `confirm_sweeps` sweeps, or unreachable for
  `unreachable_sweeps_before_drain` sweeps (an unreachable tray is not an
  unhealthy one), and the circuit breaker admits it;
- resume: mctl drained it, its reason still starts with `mctl:`, and it has
  been healthy (no critical finding) for `resume_after_healthy_sweeps` sweeps;
- skip: a guard said no (node DOWN, drained by an operator or another tool,
  breaker tripped, not a scheduler node); logged once per change;
- forget: mctl's drain was lifted or taken over by someone else, so mctl no
  longer owns it;
- queue: the scheduler did not answer; the action waits and is re-decided
  (guards included) on the next sweep that reaches it.

The guards follow LBNL NHC: never overwrite a reason set by someone else, only
resume own drains, never touch down nodes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

from mctl.health import breaker as breakerlib
from mctl.health.breaker import BreakerState
from mctl.checks import compose_reason, drain_reason
from mctl.model.settings import REASON_PREFIX, HealthSettings
from mctl.model.findings import Finding, Severity

DRAIN, RESUME, SKIP, FORGET, QUEUE = "drain", "resume", "skip", "forget", "queue"
ACTIONS = (DRAIN, RESUME, SKIP, FORGET, QUEUE)

_SLURM_STAMP = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]\s*$")


def is_mctl_reason(reason: str | None) -> bool:
    return bool(reason) and reason.strip().startswith(REASON_PREFIX)


@dataclass(frozen=True)
class NodeView:
    """The scheduler's view of one tray, whatever the scheduler."""

    name: str
    known: bool = True
    drained: bool = False          # Slurm DRAIN/DRAINING/DRAINED/FAIL; Kubernetes cordoned
    down: bool = False             # Slurm DOWN; Kubernetes NotReady
    reason: str | None = None      # without Slurm's ' [user@time]' suffix
    state: str = ""

    @property
    def mctl_drain(self) -> bool:
        return self.drained and is_mctl_reason(self.reason)

    @classmethod
    def from_slurm(cls, node) -> "NodeView":
        """From mctl.sched.slurm.facts.NodeState (`scontrol show node -o`)."""
        flags = node.flags
        drained = bool(flags & {"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})
        down = "DOWN" in flags
        # Slurm keeps a resumed node's last reason; like `sinfo -R`, it counts only while the
        # node is drained, down or failing (scontrol(1): the reason a node is in those states).
        reason = _SLURM_STAMP.sub("", node.reason) if node.reason and (drained or down) else None
        return cls(node.name, True, drained, down, reason or None, node.state)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrayVerdict:
    """One sweep's result for one tray."""

    host: str
    rack: str | None
    reach: str                             # ok, unreachable, timeout, host-key-mismatch
    worst: Severity
    findings: tuple[Finding, ...] = ()

    @property
    def reached(self) -> bool:
        return self.reach == "ok"

    @property
    def status(self) -> str:
        return self.worst.value if self.reached else "unreachable"


@dataclass(frozen=True)
class TrayRecord:
    host: str
    rack: str | None = None
    status: str = "unknown"
    misses: int = 0
    bad_streak: int = 0
    healthy_streak: int = 0
    drained: bool = False                  # mctl owns a drain on this tray
    reason: str | None = None              # the exact reason mctl set
    full_reason: str | None = None
    drained_at: float | None = None
    pending: dict[str, Any] | None = None  # {"action", "reason", "full", "since"} while the scheduler is away
    note: str | None = None                # the last skip/queue message (logged once per change)
    xid_ack: float | None = None           # XIDs before this time were dealt with (a resume by hand)
    latches: dict[str, Any] | None = None  # flapping findings held by mctl.health.hysteresis

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrayRecord":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Decision:
    host: str
    action: str
    why: str
    reason: str | None = None              # the scheduler reason (drain) or the one lifted (resume)
    full: str | None = None                # the full text for the action log
    rack: str | None = None
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    records: dict[str, TrayRecord]
    decisions: list[Decision]
    breaker: BreakerState
    notes: list[Decision] = field(default_factory=list)      # skips/queues that are new this sweep

    @property
    def actions(self) -> list[Decision]:
        return [d for d in self.decisions if d.action in (DRAIN, RESUME)]


def _advance(rec: TrayRecord, v: TrayVerdict) -> TrayRecord:
    if not v.reached:
        return replace(rec, rack=v.rack, status="unreachable", misses=rec.misses + 1, healthy_streak=0)
    if v.worst is Severity.CRITICAL:
        return replace(rec, rack=v.rack, status="critical", misses=0, bad_streak=rec.bad_streak + 1, healthy_streak=0)
    return replace(rec, rack=v.rack, status=v.worst.value, misses=0, bad_streak=0,
                   healthy_streak=rec.healthy_streak + 1)


def _held(rec: TrayRecord, v: TrayVerdict, s: HealthSettings) -> tuple[TrayVerdict, dict[str, Any] | None]:
    """This sweep's verdict with the findings hysteresis still holds (flapping links, XID storms)."""
    from mctl.health.hysteresis import step
    from mctl.model.findings import worst

    findings, latches = step(rec.latches, v.findings, s.hysteresis, reached=v.reached)
    if not v.reached or findings == list(v.findings):
        return v, latches or None
    level = v.worst if v.worst.rank >= worst(findings).rank else worst(findings)
    return replace(v, findings=tuple(findings), worst=level), latches or None


def _wanted_drain(rec: TrayRecord, v: TrayVerdict, s: HealthSettings) -> tuple[str, str] | None:
    """(reason, full text) when the tray should be drained now, else None."""
    if v.reached:
        if v.worst is Severity.CRITICAL and rec.bad_streak >= s.confirm_sweeps:
            reason, full = drain_reason(v.findings)
            if s.confirm_sweeps > 1:
                full += f" (critical for {rec.bad_streak} sweeps)"
            return reason, full
        return None
    if rec.misses >= s.unreachable_sweeps_before_drain:
        what = {"timeout": "hung", "host-key-mismatch": "host key refused"}.get(v.reach, "unreachable")
        detail = "; ".join(f.message for f in v.findings) or v.reach
        return (compose_reason(f"{what} {rec.misses} sweeps"),
                f"tray.reachable: {what} for {rec.misses} consecutive sweeps: {detail}")
    return None


def decide(records: Mapping[str, TrayRecord], verdicts: Sequence[TrayVerdict], nodes: Mapping[str, NodeView] | None,
           settings: HealthSettings, breaker: BreakerState, rack_sizes: Mapping[str, int], *,
           now: float) -> Outcome:
    """Decisions for this sweep. *nodes* None: the scheduler did not answer (actions are queued)."""
    out = {h: r for h, r in records.items()}
    decisions: list[Decision] = []
    notes: list[Decision] = []
    state = breaker.pruned(now, settings.breaker_window_s) if not breaker.tripped else breaker
    wanted: list[tuple[TrayVerdict, TrayRecord, str, str]] = []

    def note(rec: TrayRecord, action: str, why: str, **kw) -> TrayRecord:
        d = Decision(rec.host, action, why, rack=rec.rack, at=now, **kw)
        decisions.append(d)
        if rec.note != why:
            notes.append(d)
        return replace(rec, note=why)

    for v in verdicts:
        prev = out.get(v.host) or TrayRecord(v.host, v.rack)
        v, latches = _held(prev, v, settings)
        rec = _advance(replace(prev, latches=latches), v)
        want = _wanted_drain(rec, v, settings)
        if nodes is None:
            if rec.drained and rec.healthy_streak >= settings.resume_after_healthy_sweeps:
                pending = {"action": RESUME, "reason": rec.reason, "since": (rec.pending or {}).get("since", now)}
                rec = note(replace(rec, pending=pending), QUEUE, "scheduler unreachable: resume queued",
                           reason=rec.reason)
            elif want and not rec.drained:
                pending = {"action": DRAIN, "reason": want[0], "full": want[1],
                           "since": (rec.pending or {}).get("since", now)}
                rec = note(replace(rec, pending=pending), QUEUE, "scheduler unreachable: drain queued",
                           reason=want[0], full=want[1])
            else:
                rec = replace(rec, pending=None)
            out[v.host] = rec
            continue
        rec = replace(rec, pending=None)
        node = nodes.get(v.host)
        if node is None or not node.known:
            out[v.host] = note(rec, SKIP, "not a node of the scheduler") if want else rec
            continue
        if rec.drained:
            if not node.drained:
                d = Decision(v.host, FORGET, "resumed outside mctl", reason=rec.reason, rack=rec.rack, at=now)
                decisions.append(d)
                notes.append(d)
                rec = replace(rec, drained=False, reason=None, full_reason=None, drained_at=None, note=None)
            elif not is_mctl_reason(node.reason):
                d = Decision(v.host, FORGET, f"reason changed to {node.reason!r}: the drain is someone else's now",
                             reason=rec.reason, rack=rec.rack, at=now)
                decisions.append(d)
                notes.append(d)
                out[v.host] = replace(rec, drained=False, reason=None, full_reason=None, drained_at=None, note=None)
                continue
            else:
                if rec.healthy_streak >= settings.resume_after_healthy_sweeps:
                    if node.down:
                        out[v.host] = note(rec, SKIP, "healthy again but the node is DOWN; mctl never touches down "
                                                      "nodes", reason=node.reason)
                        continue
                    decisions.append(Decision(v.host, RESUME, f"healthy for {rec.healthy_streak} sweeps",
                                              reason=node.reason, full=rec.full_reason, rack=rec.rack, at=now))
                    rec = replace(rec, note=None)
                out[v.host] = rec
                continue
        if not want:
            out[v.host] = replace(rec, note=None) if rec.note else rec
            continue
        if node.down:
            out[v.host] = note(rec, SKIP, f"node is {node.state or 'DOWN'}; mctl never touches down nodes")
            continue
        if node.drained:
            who = "mctl elsewhere (node check or another watch)" if node.mctl_drain else "an operator or another tool"
            out[v.host] = note(rec, SKIP, f"already drained by {who}: {node.reason or 'no reason'}")
            continue
        out[v.host] = rec
        wanted.append((v, rec, want[0], want[1]))

    # Critical trays before unreachable ones, then by name: who gets drained first is reproducible.
    wanted.sort(key=lambda w: (not w[0].reached, w[0].host))
    for v, rec, reason, full in wanted:
        adm = breakerlib.admit(state, v.host, v.rack, rack_sizes, max_share=settings.breaker_max_share,
                               window_s=settings.breaker_window_s, scope=settings.breaker_scope, now=now)
        state = adm.state
        if not adm.allowed:
            out[v.host] = note(rec, SKIP, adm.why, reason=reason, full=full)
            continue
        decisions.append(Decision(v.host, DRAIN, adm.why, reason=reason, full=full, rack=v.rack, at=now))
        out[v.host] = replace(rec, drained=True, reason=reason, full_reason=full, drained_at=now, note=None,
                              healthy_streak=0)
    return Outcome(out, decisions, state, notes)


def settle(outcome: Outcome, decision: Decision, ok: bool, error: str | None = None, *,
           unreachable: bool = False) -> None:
    """Fold an executed (or failed) action back into the records and the breaker."""
    rec = outcome.records[decision.host]
    if decision.action == DRAIN:
        if ok:
            return
        outcome.breaker = breakerlib.discard(outcome.breaker, decision.host, decision.at)
        pending = {"action": DRAIN, "reason": decision.reason, "full": decision.full, "since": decision.at} \
            if unreachable else None
        outcome.records[decision.host] = replace(rec, drained=False, reason=None, full_reason=None, drained_at=None,
                                                 pending=pending, note=f"drain failed: {error}")
    elif decision.action == RESUME:
        if ok:
            outcome.records[decision.host] = replace(rec, drained=False, reason=None, full_reason=None,
                                                     drained_at=None, healthy_streak=rec.healthy_streak, note=None)
        elif unreachable:
            outcome.records[decision.host] = replace(rec, pending={"action": RESUME, "reason": decision.reason,
                                                                   "since": decision.at},
                                                     note=f"resume failed: {error}")
        else:
            outcome.records[decision.host] = replace(rec, note=f"resume failed: {error}")
