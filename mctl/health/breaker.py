"""The circuit breaker: mctl stops draining before it empties a rack.

A fault that hits many trays at once (a coolant loop, a switch tray, a bad
driver push, a bug in a check) must not let automation drain the fleet. Every
automatic drain is recorded with its time and rack; a drain that would take
mctl's drains within the window above the configured share of the rack (or of
the site) trips the breaker instead. Once tripped it stays tripped, across
restarts (it is part of the persisted state), until an operator runs
`mctl health breaker reset`. Resumes are never blocked: returning capacity is
always safe. Pure: the caller persists the state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping


@dataclass(frozen=True)
class BreakerState:
    tripped: bool = False
    tripped_at: float | None = None
    reason: str | None = None
    drains: tuple[tuple[float, str, str | None], ...] = ()     # (time, tray, rack) of automatic drains

    def to_dict(self) -> dict[str, Any]:
        return {"tripped": self.tripped, "tripped_at": self.tripped_at, "reason": self.reason,
                "drains": [{"time": t, "host": h, "rack": r} for t, h, r in self.drains]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "BreakerState":
        """From the persisted state; store.check_breaker_shape has checked the types (a damaged file is
        named there), this only refuses what it cannot read."""
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError(f"breaker must be an object, not {type(data).__name__}")
        drains = data.get("drains") or ()
        if not isinstance(drains, (list, tuple)) or not all(isinstance(d, Mapping) for d in drains):
            raise ValueError("breaker.drains must be a list of objects")
        return cls(bool(data.get("tripped")), data.get("tripped_at"), data.get("reason"),
                   tuple((float(d["time"]), str(d["host"]), d.get("rack")) for d in drains))

    def recent(self, now: float, window_s: float) -> tuple[tuple[float, str, str | None], ...]:
        return tuple(d for d in self.drains if now - d[0] <= window_s)

    def pruned(self, now: float, window_s: float) -> "BreakerState":
        return replace(self, drains=self.recent(now, window_s))


@dataclass(frozen=True)
class Admission:
    allowed: bool
    state: BreakerState
    why: str = ""
    tripped_now: bool = False
    waits: bool = False             # not decided yet: only the drains asked and not answered yet would pass the share


def admit(state: BreakerState, host: str, rack: str | None, sizes: Mapping[str, int], *, max_share: float,
          window_s: float, scope: str, now: float | None = None, asked: Collection[str] = ()) -> Admission:
    """May mctl drain *host* now? Allowed drains are recorded in the returned state.

    *asked*: the trays among the state's drains that were admitted in this same pass and that the
    scheduler has not answered yet (the site's safety budget may still refuse them). They count
    against the share, so one pass never asks more than the share; but the breaker trips only on
    drains that happened: when *host* would pass the share only with the drains still asked, the
    answer `waits` (not allowed, not tripped) and the caller decides it again once they are answered."""
    now = time.time() if now is None else now
    if state.tripped:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.tripped_at or now))
        return Admission(False, state, f"circuit breaker tripped at {since} ({state.reason}); "
                                       "reset it with 'mctl health breaker reset'")
    recent = state.recent(now, window_s)
    if scope == "site":
        counted = {d[1] for d in recent}
        size = sum(sizes.values())
        where = "the site"
    else:
        counted = {d[1] for d in recent if d[2] == rack}
        size = sizes.get(rack or "", 0)
        where = f"rack {rack}"
    if size <= 0:
        return Admission(False, state, f"no tray count known for {where}; not draining")
    # A share of trays: a tray drained twice in the window counts once.
    after = len(counted | {host})
    share = after / size
    window = _fmt_window(window_s)
    if share > max_share:
        pending = (counted & set(asked)) - {host}
        done = len((counted - pending) | {host})
        if pending and done / size <= max_share:
            return Admission(False, state, f"waits for the scheduler's answer to the {len(pending)} drain(s) asked "
                                           f"before it: with them {after} of {size} trays of {where} would be drained "
                                           f"by mctl within {window} ({share:.0%} > {max_share:.0%}), with the drains "
                                           f"done so far {done}", waits=True)
        # The trip counts the drains that happened (and this one), never those still asked.
        reason = (f"draining {host} would make {done} of {size} trays of {where} drained by mctl within {window} "
                  f"({done / size:.0%} > {max_share:.0%})")
        tripped = BreakerState(True, now, reason, recent)
        return Admission(False, tripped, reason, tripped_now=True)
    return Admission(True, BreakerState(False, None, None, recent + ((now, host, rack),)),
                     f"{after} of {size} trays of {where} drained by mctl within {window}")


def count(state: BreakerState, host: str, rack: str | None, now: float) -> BreakerState:
    """Record a drain that the breaker does not decide (a critical leak's): it counts in the window all the
    same, so the drains it admits after it are fewer; a tripped breaker stays tripped."""
    return replace(state, drains=state.drains + ((now, host, rack),))


def discard(state: BreakerState, host: str, at: float) -> BreakerState:
    """Forget a drain that was admitted but did not happen (the scheduler refused it)."""
    return replace(state, drains=tuple(d for d in state.drains if not (d[1] == host and d[0] == at)))


def reset(state: BreakerState) -> BreakerState:
    """An operator looked and lets automation continue: the count starts afresh."""
    return BreakerState()


def _fmt_window(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
