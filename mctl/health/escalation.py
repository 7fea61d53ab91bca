"""Rack-level escalation: when a rack fails as a whole, one hold on it instead of drains one by one (pure).

Without it, a fault on most trays of a rack at once (a power shelf, a manifold, the rack's NVLink
switches) is drained tray by tray until the circuit breaker stops the drains, and the trays it did
not reach keep taking jobs. With `health.escalation.enabled`, the watch keeps per rack which compute
trays are failing and since when (`RackWatch`), and `observe` says the rack must be held when

- **share**: more than `rack_share` of its compute trays failed, each failure begun within `window_s`
  and at least `min_trays` of them. A tray is failing when it is critical for `confirm_sweeps`
  sweeps (as for a drain), a critical leak reads on it, or mctl's own drain holds it; an unreachable
  tray counts only under `count_unreachable` (an unreachable rack is as often its management network
  as its trays, and Slurm marks trays that stop answering DOWN on its own);
- **switch tray**: a switch tray of the rack has had a critical finding for `confirm_sweeps` sweeps
  (`on_switch_tray`), whichever check found it (its BMC's leak detectors, NMX-M's switch health):
  without its switch trays a rack's NVLink domain is gone, so every tray of it is.

Hysteresis: a rack once held stays held until a person lifts it (`mctl health escalation lift`); the
failures seen before a lift never escalate the rack again (`lifted_at`), only new ones do. The
hold itself (`RackHold`) is the responder's (mctl.health.responders.escalation); Slurm's side is one
guarded script (mctl.sched.slurm.holds: `ESCALATION`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from mctl.health.record import RackHold, RackWatch, TrayRecord, TrayVerdict  # noqa: F401 (the escalation's state)
from mctl.model.findings import Finding, Severity
from mctl.model.site import fold
from mctl.sched.slurm.holds import ESCALATION

ESCALATION_PREFIX = ESCALATION.prefix
ACTION = "rack-escalation"            # the action-log line (and event) of a rack hold (the watch: ESCALATION_ACTION)
LIFT = "rack-escalation-lift"
SHARE = "share"
SWITCH = "switch-tray"


@dataclass(frozen=True)
class Trigger:
    """Why a rack must be held now."""

    kind: str                         # SHARE | SWITCH
    cause: str                        # the words of the event and of `escalation status`
    trays: tuple[str, ...]            # the failed trays (compute, or the switch tray)
    reason: str                       # the Slurm reason, short, starting with the hold owner's prefix


def reason_of(kind: str, failed: Sequence[str], size: int) -> str:
    """The Slurm reason of a rack hold (mctl.sched.slurm.holds.ESCALATION's prefix), short: the trays are named
    in the event and in `mctl health escalation status`."""
    if kind == SWITCH:
        return f"{ESCALATION.prefix}: switch tray {fold(list(failed))} failed"
    return f"{ESCALATION.prefix}: {len(failed)} of {size} trays failed"


def _failing(v: TrayVerdict | None, rec: TrayRecord | None, *, confirm_sweeps: int, unreachable_sweeps: int,
             count_unreachable: bool) -> bool:
    """The tray failed this sweep: critical and confirmed (as for a drain), a critical leak, mctl's own drain,
    or (by policy only) unreachable long enough to be drained for it."""
    from mctl.health import leaks

    if rec is not None and rec.drained:
        return True
    if v is None:
        return False
    if leaks.drain_now(v.findings):
        return True
    if v.reached:
        return v.worst is Severity.CRITICAL and (rec.bad_streak if rec else 0) + 1 >= confirm_sweeps
    return count_unreachable and (rec.misses if rec else 0) + 1 >= unreachable_sweeps


def observe(watch: RackWatch | None, compute: Sequence[str], switches: Sequence[str],
            verdicts: Mapping[str, TrayVerdict], records: Mapping[str, TrayRecord],
            switch_findings: Mapping[str, Sequence[Finding]], settings, *, now: float,
            held: bool = False) -> tuple[RackWatch, Trigger | None]:
    """One sweep of one rack: (what to remember, why the rack must be held now or None).

    *compute*, *switches*: the rack's trays; *verdicts*: this sweep's (a tray not swept keeps what was known);
    *records*: the trays' records before this sweep (their streaks); *switch_findings*: this sweep's findings
    per switch tray; *settings*: HealthSettings; *held*: the rack is held already (no second trigger)."""
    e = settings.escalation
    watch = watch or RackWatch()
    failing: dict[str, float] = {}
    for t in compute:
        if t not in verdicts and not (records.get(t) and records[t].drained):
            if t in watch.failing:
                failing[t] = watch.failing[t]
            continue
        if _failing(verdicts.get(t), records.get(t), confirm_sweeps=settings.confirm_sweeps,
                    unreachable_sweeps=settings.unreachable_sweeps_before_drain, count_unreachable=e.count_unreachable):
            rec = records.get(t)
            began = rec.drained_at if rec is not None and rec.drained and rec.drained_at else now
            failing[t] = watch.failing.get(t, began)
    switch: dict[str, tuple[float, int]] = {}
    for sw in switches:
        crit = [f for f in switch_findings.get(sw, ()) if f.severity is Severity.CRITICAL]
        if crit:
            since, n = watch.switch.get(sw, (now, 0))
            switch[sw] = (since, n + 1)
    out = replace(watch, failing=failing, switch=switch)
    if held or not e.enabled:
        return out, None
    after = max(now - e.window_s, watch.lifted_at if watch.lifted_at is not None else float("-inf"))
    if e.on_switch_tray:
        bad = sorted(sw for sw, (since, n) in switch.items() if n >= settings.confirm_sweeps
                     and (watch.lifted_at is None or since > watch.lifted_at))
        if bad:
            checks = sorted({f.check for sw in bad for f in switch_findings.get(sw, ())
                             if f.severity is Severity.CRITICAL})
            cause = (f"switch tray {fold(bad)} failed ({', '.join(checks)}) for {settings.confirm_sweeps} sweep(s): "
                     f"the rack's NVLink domain depends on it; health.escalation.on_switch_tray holds the rack")
            return out, Trigger(SWITCH, cause, tuple(bad), reason_of(SWITCH, bad, len(compute)))
    recent = sorted(t for t, since in failing.items() if since > after)
    n = len(compute)
    if n and len(recent) >= e.min_trays and len(recent) / n > e.rack_share:
        cause = (f"{len(recent)} of {n} compute trays failed within {_duration(e.window_s)} ({fold(recent)}): "
                 f"{len(recent) / n:.0%} > health.escalation.rack_share {e.rack_share:.0%}")
        return out, Trigger(SHARE, cause, tuple(recent), reason_of(SHARE, recent, n))
    return out, None


def held_back_early(watch: RackWatch | None, tray: str, batch_failing: int, settings) -> bool:
    """A tray whose own answer wants a drain waits for the end of the sweep instead of being drained at once
    (the drain responder's early drains) when its rack may escalate: another tray of it failed within the
    window, or *batch_failing* (the rack's trays wanting a drain in this batch of answers, and those drained
    earlier in this sweep, the tray included) is more than one. The first failure of a rack keeps the early
    drain; a rack failing as a whole is decided with all its answers in."""
    e = settings.escalation
    if not e.enabled:
        return False
    if batch_failing > 1:
        return True
    if watch is None:
        return False
    return any(t != tray for t in watch.failing)


def opened(trigger: Trigger, rack: str, now: float) -> RackHold:
    return RackHold(rack, trigger.kind, trigger.cause, trigger.reason, trigger.trays, now)


def _duration(s: float) -> str:
    if s >= 3600 and s % 3600 == 0:
        return f"{int(s // 3600)}h"
    if s >= 60 and s % 60 == 0:
        return f"{int(s // 60)}m"
    return f"{s:g}s"
