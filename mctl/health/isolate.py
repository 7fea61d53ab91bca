"""Isolating a tray the watch drained for a hardware fault from its NVLink partition (docs/health.md).

`mctl partition isolate TRAY` moves a drained tray out of its partition so the other trays keep a
healthy IMEX domain and a Slurm block that matches them. With `health.isolate.enabled` (off by
default; decision D51) the watch with remediation does the same on its own, for a tray it drained
whose findings this sweep include a HARDWARE fault (HARDWARE_CHECKS): a GPU off the bus, an XID
that drains, uncorrectable ECC, row-remap or memory-repair failures, a recovery action the driver
asks for, NVLinks down, a leak. Not for a service that is down, a tray that does not answer, a full
disk or a partition/clique mismatch (the partition change itself could cause those).

Each isolation passes the circuit breaker as a drain does (mctl.health.breaker.admit: counted in its
window, a tripped breaker stops it), is logged in the action log (an intent line first) and in the
metrics, and is shown by `--dry-run`. It runs only when the change touches no running work (the
jobs rule of a partition change without --drain or --force): otherwise it waits, noted once, and
is tried again on a later sweep. A change that failed (and rolled back) is not retried by the watch.
Restore stays manual (`mctl partition restore TRAY`; D51 says why).

`decide` is pure: the time is given. mctl.health.responders.isolation sends what it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping, Sequence

from mctl.health.record import IsolationState
from mctl.model.findings import Severity

if TYPE_CHECKING:
    from mctl.health.breaker import BreakerState
    from mctl.health.record import TrayRecord, TrayVerdict
    from mctl.model.settings import HealthSettings
    from mctl.model.site import Rack

# The catalogue checks (mctl.checks.catalogue) whose CRITICAL finding is a hardware fault of the tray.
HARDWARE_CHECKS = frozenset({
    "gpu.count",            # a GPU fell off the bus (the driver counts fewer)
    "gpu.xid",              # an XID that drains (reset, reboot or RMA in NVIDIA's catalogue)
    "gpu.ecc",              # uncorrectable ECC since the driver loaded
    "gpu.remapped-rows",    # a row-remap failure
    "gpu.memory-repair",    # an unrepairable memory or SRAM threshold
    "gpu.recovery",         # the driver asks for a recovery action (reset, reboot, drain and reset)
    "nvlink.links",         # NVLinks down
    "leak.detectors",       # a leak detector reports Critical
})

SENDING, DONE, FAILED, WAITING = "sending", "done", "failed", "waiting"
STATES = (SENDING, DONE, FAILED, WAITING)


def hardware_faults(verdict: "TrayVerdict") -> list[str]:
    """`check: message` of each critical hardware finding of the verdict (empty: none)."""
    return [f"{f.check}: {f.message}" for f in verdict.findings
            if f.severity is Severity.CRITICAL and f.check in HARDWARE_CHECKS]


def isolated_already(rack: "Rack", tray: str) -> str | None:
    """Why *tray* needs no isolation in *rack*'s plan (None: it is in a partition with other trays)."""
    from mctl.fabric.change import QUARANTINE_PREFIX

    if not rack.partitions:
        return None
    mine = next((p for p in rack.partitions if tray in p.trays), None)
    if mine is None:
        return "in no partition (NMX-M's default partition)"
    if mine.trays == (tray,):
        return f"alone in partition {mine.name}" + (" (isolated)" if mine.name.startswith(QUARANTINE_PREFIX) else "")
    return None


@dataclass(frozen=True)
class Isolation:
    host: str
    rack: str
    why: str
    at: float
    to: str


@dataclass(frozen=True)
class Event:
    host: str
    rack: str | None
    action: str          # isolate-wait | breaker-trip
    why: str
    at: float
    result: str = "noted"


@dataclass
class Outcome:
    records: dict[str, "TrayRecord"]
    breaker: "BreakerState"
    isolations: list[Isolation] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def state_of(rec: "TrayRecord | None") -> IsolationState:
    return rec.isolation if rec is not None and rec.isolation is not None else IsolationState()


def decide(records: Mapping[str, "TrayRecord"], verdicts: Sequence["TrayVerdict"], hs: "HealthSettings",
           breaker: "BreakerState", rack_sizes: Mapping[str, int], racks: Mapping[str, "Rack"], *,
           now: float) -> Outcome:
    """The isolations this sweep asks for: a tray mctl drained, with a hardware fault now, not isolated
    yet (nor being isolated, nor failed), admitted by the circuit breaker (which counts it); a breaker
    that refuses is noted once per change of its reason. The runner marks each as being sent
    (mark_sending) once the jobs rule lets it go."""
    from mctl.health import breaker as breakerlib

    out = Outcome(dict(records), breaker)
    if not hs.isolate:
        return out
    for v in verdicts:
        rec = out.records.get(v.host)
        if rec is None or not v.rack or v.rack not in racks:
            continue
        st = state_of(rec)
        already = isolated_already(racks[v.rack], v.host)
        if st.state == DONE and already is None:
            # a person restored it (or the partitions changed since): a later fault isolates it again
            rec = out.records[v.host] = replace(rec, isolation=None)
            st = IsolationState()
        elif st.state == SENDING:
            # a watch killed during its change: finished (the inventory says so), or left to a person
            if already is not None:
                out.records[v.host] = replace(rec, isolation=replace(st, state=DONE, note=None))
            elif not rec.drained:
                out.records[v.host] = replace(rec, isolation=None)     # resumed since: a new fault starts afresh
            else:
                note = (f"the isolation of {v.host} was interrupted; finish it with 'mctl partition apply "
                        f"{v.rack} --resume'")
                if st.note != note:
                    out.events.append(Event(v.host, v.rack, "isolate-wait", note, now))
                    out.records[v.host] = replace(rec, isolation=replace(st, note=note))
            continue
        if st.state in (FAILED, WAITING) and not rec.drained:
            rec = out.records[v.host] = replace(rec, isolation=None)      # resumed: a new fault starts afresh
            st = IsolationState()
        if not rec.drained or st.state in (DONE, FAILED):
            continue
        faults = hardware_faults(v)
        if not faults or already is not None:
            continue
        why = "; ".join(faults[:2])[:300]
        adm = breakerlib.admit(out.breaker, v.host, v.rack, rack_sizes, max_share=hs.breaker_max_share,
                               window_s=hs.breaker_window_s, scope=hs.breaker_scope, now=now)
        out.breaker = adm.state
        if not adm.allowed:
            note = f"isolate not taken: {adm.why}"
            if st.note != note:
                out.events.append(Event(v.host, v.rack, "isolate-wait", note, now))
            out.records[v.host] = replace(rec, isolation=replace(st, state=WAITING, note=note))
            if adm.tripped_now:
                out.events.append(Event(v.host, v.rack, "breaker-trip", adm.why, now, result="tripped"))
            continue
        out.isolations.append(Isolation(v.host, v.rack, why, now, hs.isolate_to))
    return out


def mark_sending(records: dict[str, "TrayRecord"], iso: Isolation) -> None:
    """The change is about to run (the jobs rule let it): saved before it starts, never started twice."""
    rec = records.get(iso.host)
    if rec is not None:
        records[iso.host] = replace(rec, isolation=replace(state_of(rec), state=SENDING, at=iso.at, why=iso.why,
                                                           to=iso.to))


def settle(records: dict[str, "TrayRecord"], iso: Isolation, outcome: str, text: str) -> str | None:
    """Fold one isolation's outcome back ("ok" | "failed" | "waiting"); the note to log for a wait that
    is new (None: not new, or not a wait)."""
    rec = records.get(iso.host)
    if rec is None:
        return None
    st = state_of(rec)
    if outcome == "ok":
        records[iso.host] = replace(rec, isolation=replace(st, state=DONE, done_at=iso.at, note=None))
        return None
    if outcome == "failed":
        records[iso.host] = replace(rec, isolation=replace(st, state=FAILED, note=text[:300]))
        return None
    note = f"isolate waits: {text}"[:300]
    records[iso.host] = replace(rec, isolation=IsolationState(state=WAITING, note=note))
    return note if st.note != note else None


def metric_samples(records: Mapping[str, "TrayRecord"], site: str) -> list[tuple[str, str, str, list]]:
    """`mctl_health_isolated` per tray the watch isolated (1) or is trying to (0); none while it never acted."""
    rows = []
    for host, rec in sorted(records.items()):
        st = state_of(rec)
        if st.state:
            rows.append(({"site": site, "rack": rec.rack, "tray": host, "state": st.state},
                         1 if st.state == DONE else 0))
    if not rows:
        return []
    return [("mctl_health_isolated", "gauge",
             "1 when the watch isolated the tray from its NVLink partition (state: done); 0 while it is "
             "being isolated, waits or failed (state says which).", rows)]
