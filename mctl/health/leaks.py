"""The leak policy (pure): a critical leak drains a tray at once and powers it off after a timeout, once.

A *leak episode* starts with the first sweep whose BMC reading has a detector in Critical
(mctl.checks.leak, `leak.detectors`). While it is open:

- the tray's leak finding stays critical in every sweep (held, like mctl.health.hysteresis: a reading that
  flaps Critical -> OK -> Critical neither resumes the tray nor restarts anything), so the policy drains
  it at once (whatever `confirm_sweeps` and whether SSH reaches it) and never resumes it;
- `power_off_after` (`health.leak.power_off_after`, default 600 s as BCM's "going down timeout") after
  the episode started, the tray is powered off through its BMC (ForceOff, POSTed once: `sent`) — any
  tray: drained by mctl, by an operator, or DOWN, whatever the circuit breaker and the safety budget
  say (they count it, never block it), unless the inventory excludes it by name (`health.leak.exclude`);
  an episode powers a tray off at most once, however often the signal flaps, and mctl never powers a
  tray on;
- it ends after `clear_sweeps` BMC readings in a row without Critical (sweeps whose BMC did not answer
  count neither way) and, once the tray was powered off, only when SSH reaches the tray again (a person
  powered it on after the repair). Then the tray is healthy again and resumed as usual; a later Critical
  opens a new episode.

The episode is a typed section of the tray's record (mctl.health.record.LeakEpisode, `TrayRecord.leak`),
kept across restarts. Time is passed in (`now`), never read here. Standard library only (travels with `mctl node
check`, whose trays have no BMC facts: nothing here fires there).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from mctl.health.record import LeakEpisode, PowerOffNote
from mctl.model.findings import Finding, Severity

LEAK = "leak.detectors"              # mctl.checks.leak.LEAK (not imported: the policy imports this module)
POWER_OFF = "power-off"              # the action (decision, action log, metrics)


def _critical(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.check == LEAK and f.severity is Severity.CRITICAL]


def _read(findings: Sequence[Finding]) -> bool:
    """Whether this sweep read the detectors (a finding from real readings, not 'not read')."""
    return any(f.check == LEAK and f.details.get("read") for f in findings)


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at)) if at is not None else "?"


def step(prev: LeakEpisode | None, findings: Sequence[Finding], *, reached: bool, now: float,
         clear_sweeps: int) -> tuple[list[Finding], LeakEpisode | None]:
    """(findings with the held leak finding, the new episode or None) for one sweep of one tray.

    *reached*: SSH reached the tray this sweep (ends an episode whose tray was powered off)."""
    crit = _critical(findings)
    out = list(findings)
    if crit:
        if prev is None:
            return out, LeakEpisode(since=now, finding=crit[0], last_critical=now)
        flaps = prev.flaps + (1 if prev.clear > 0 else 0)
        return out, replace(prev, last_critical=now, clear=0, flaps=flaps, finding=crit[0])
    if prev is None:
        return out, None
    state = prev
    if _read(findings):
        state = replace(prev, clear=prev.clear + 1)
        if state.clear >= clear_sweeps and (not prev.sent or reached):
            return out, None                    # the episode is over: the findings stand as read
    held = state.finding
    off = state.power_off
    note = (f" (held: leak since {_clock(state.since)}, came back {state.flaps} time(s); "
            f"ends after {clear_sweeps} clear readings in a row, {state.clear} so far"
            + (f"; powered off {_clock(off.at if off else None)}, ends once it is powered on again" if state.sent
               else "") + ")")
    out = [f for f in out if f.check != LEAK]
    out.append(replace(held, message=held.message + note,
                       details={**held.details, "held": True, "clear_readings": state.clear}))
    return out, state


def drain_now(findings: Sequence[Finding]) -> list[Finding]:
    """The critical leak findings that drain the tray at once (held ones included)."""
    return _critical(findings)


def power_off_due(episode: LeakEpisode | None, *, excluded: bool, enabled: bool, after_s: float,
                  now: float) -> str | None:
    """Why the tray is powered off now, or None. Any tray with an open episode — drained by mctl, by an
    operator, or DOWN; whatever the circuit breaker or the safety budget say — unless the inventory
    excludes it by name (`health.leak.exclude`); never twice an episode."""
    if episode is None or episode.sent or not enabled or excluded:
        return None
    since = episode.since
    if now < since + after_s:
        return None
    return f"critical leak since {_clock(since)}, {now - since:.0f}s >= health.leak.power_off_after {after_s:g}s"


def blocked(episode: LeakEpisode | None, *, excluded: bool, enabled: bool) -> str | None:
    """Why an open episode will not power the tray off (said in the action log once), or None."""
    if episode is None or episode.sent:
        return None
    if not enabled:
        return "health.leak.power_off is false: the tray stays on"
    if excluded:
        return "the inventory excludes it from automatic power-off (health.leak.exclude)"
    return None


def sent(episode: LeakEpisode, *, at: float, result: str, power_state: str | None) -> LeakEpisode:
    """The episode once its power-off was sent (or found done): never sent again this episode."""
    return replace(episode, sent=True, power_off=PowerOffNote(at, result, power_state))


def powered_off_for_leak(episode: LeakEpisode | None) -> bool:
    """The tray was powered off for a leak and not yet powered on by a person: nothing in mctl may power it
    on (the recovery ladder's power cycle included)."""
    return bool(episode and episode.sent)
