"""Hysteresis for findings that flap (pure): a flapping NVLink or an XID storm must not drain and resume a
tray over and over.

One rule, in one place, per tray and per check in `HysteresisSettings.checks` (default: NVLink links,
XIDs, fabric state):

- a critical finding *latches*: while latched, the check stays critical in every sweep, even when this
  sweep's probe saw it clear (the held finding says so: "held: ...");
- the latch is released once the check has been clear for `hold` consecutive sweeps; after its release
  it is remembered for `window_sweeps` more sweeps, and `flaps` counts how often the finding came back
  (while latched or remembered). `hold` is `clear_sweeps` for a steady fault (flaps 0: with the default
  1, released on its first clear sweep, exactly as without hysteresis), and once it came back
  `window_sweeps * 2**(flaps-1)`, at most `max_hold_sweeps` (route flap dampening). A flapping link is
  therefore drained, resumed at most once more (its first return cannot be told from a new fault), and
  from its first return on held critical while it flaps; it clears once it has been up for the hold, and
  the policy's usual `resume_after_healthy_sweeps` resumes it once;
- sweeps that did not reach the tray change nothing.

The state is a typed Latch per check (mctl.health.record), kept in the tray's record across sweeps and restarts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from mctl.health.record import Latch
from mctl.model.findings import Finding, Severity
from mctl.model.settings import HysteresisSettings


def step(latches: Mapping[str, Latch] | None, findings: Sequence[Finding],
         settings: HysteresisSettings, *, reached: bool = True) -> tuple[list[Finding], dict[str, Latch]]:
    """(findings with the held ones, the new latches) for one sweep of one tray (check -> Latch)."""
    state = dict(latches or {})
    if not reached:
        return list(findings), state
    out = list(findings)
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        by_check.setdefault(f.check, []).append(f)
    for check in sorted(settings.checks | set(state)):
        current = [f for f in by_check.get(check, []) if f.severity is Severity.CRITICAL]
        latch = state.get(check)
        if current:
            if latch is None:
                state[check] = Latch(current[0])
            else:
                flaps = latch.flaps + (1 if latch.absent > 0 else 0)
                state[check] = Latch(current[0], latch.seen + 1, 0, flaps)
            continue
        if latch is None or check not in settings.checks:
            state.pop(check, None)
            continue
        absent = latch.absent + 1
        flaps = latch.flaps
        hold = settings.hold(flaps)
        if absent >= hold + settings.window_sweeps:
            del state[check]                      # forgotten: a later return is a new fault
            continue
        state[check] = replace(latch, absent=absent)
        if absent >= hold:
            continue                              # released (remembered): the check's own finding stands
        held = latch.finding
        note = (f" (held: seen critical in {latch.seen} sweeps, came back {flaps} time(s); "
                f"clears after {hold} clear sweeps in a row, {absent} so far)")
        out = [f for f in out if f.check != check]
        out.append(replace(held, message=held.message + note,
                           details={**held.details, "held": True, "absent_sweeps": absent, "hold_sweeps": hold,
                                    "flaps": flaps}))
    return out, state
