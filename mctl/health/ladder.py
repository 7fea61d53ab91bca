"""The recovery ladder: what the watch does for a tray it drained, beyond the drain (docs/health.md).

    drain -> GPU reset (idle tray, its XIDs say reset) -> reboot through the OS -> power cycle through
    the BMC (the OS does not answer, or its reboot did not help) -> the checks (and burn-in) pass
    again -> the policy resumes it.  N failed recoveries within a window: marked for repair.

Every rung is off unless the site turns it on (`health.ladder`, mctl.model.settings.LadderSettings).
A rung is *sent* once and then *judged* by the sweeps that follow, each against its deadline: a reset
or a reboot never blocks the sweep of the other trays, and the state of a recovery lives in the tray's
record (`TrayRecord.ladder`), so a restarted watch goes on where the last one stopped and never sends
a rung twice (it is written, with an intent line, before it is sent).

`step` (one tray, one sweep) and `decide` (every tray, through the circuit breaker) are pure: the
time is given. The engine (mctl.health.engine) sends what `decide` asks for and folds the results
back with `settle`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mctl.health.record import LADDER_PHASES, LadderState
from mctl.model.settings import LADDER_RUNGS, HealthSettings, LadderSettings

if TYPE_CHECKING:
    from mctl.health.breaker import BreakerState
    from mctl.health.record import TrayVerdict
    from mctl.health.record import TrayRecord
    from mctl.model.drain import NodeView
    from mctl.model.tray import TrayFacts

GPU_RESET, REBOOT, POWER_CYCLE = LADDER_RUNGS
VERIFY, BURN_IN, PASSED, REPAIR = "verify", "burn-in", "passed", "repair"
PHASES = (*LADDER_RUNGS, VERIFY, BURN_IN, PASSED, REPAIR)
assert PHASES == LADDER_PHASES
# Slurm's word for a node that rebooted without being asked (ReturnToService=1 marks it DOWN).
SLURM_REBOOTED = "Node unexpectedly rebooted"
# Findings no rung can fix: a full disk, the wrong driver, a tray in the wrong NVLink domain or partition.
NOT_FIXED_BY_A_RUNG = frozenset({"host.disk", "gpu.driver", "fabric.domain", "fabric.clique", "gpu.temperature",
                                 "leak.detectors"})
# Findings a tray just back from a reboot shows until its services are up (slurmd, the IMEX daemon start
# after boot): a verify counts them against its deadline only, never as a rung that did not fix it.
SETTLING_AT_BOOT = frozenset({"slurm.slurmd", "imex.daemon", "imex.domain", "fabric.state", "tray.reachable"})
# nvidia-smi's documented reset; -i takes the GPUs' PCI bus ids (run with NVIDIA's preconditions: health/gpu_reset.py)
RESET_COMMAND = "nvidia-smi --gpu-reset -i"
# Trays whose GPUs are reset together: on GB200/GB300 every GPU shares the Grace CPU's coherent NVLink-C2C memory
# and the rack's NVLink fabric (nvidia-smi: NVLink-connected GPUs are reset in the same command)
WHOLE_TRAY_PRODUCTS = ("GB200", "GB300")
REBOOT_COMMAND = "systemctl reboot"


def state_of(rec: "TrayRecord | None") -> LadderState:
    return rec.ladder if rec is not None and rec.ladder is not None else LadderState()


@dataclass(frozen=True)
class Observation:
    """What one sweep tells the ladder about one tray (built by `observe`)."""

    host: str
    rack: str | None
    drained: bool                          # mctl owns a drain on the tray (after this sweep's actions)
    reach: str                             # ok | unreachable | timeout | host-key-mismatch
    critical: bool
    healthy_streak: int
    boot_id: str | None = None
    idle: bool | None = None               # no running work on the node (None: the scheduler was not read)
    reset_gpus: tuple[str, ...] = ()       # PCI bus ids whose XIDs say "reset GPU"; () when a reset does not fit
    fixable: bool = True                   # some critical finding a rung could fix
    has_bmc: bool = False
    why: str = ""                          # the critical findings, short
    settling: bool = False                 # every critical finding is one a booting tray shows for a while
    reset_note: str | None = None          # why the reset takes more GPUs than the XIDs named (the whole tray)

    @property
    def failing(self) -> bool:
        """Critical in a way that counts against a rung: reached, and not only services still starting."""
        return self.reached and self.critical and not self.settling

    @property
    def reached(self) -> bool:
        return self.reach == "ok"


@dataclass(frozen=True)
class Rung:
    """A rung to send now."""

    host: str
    rack: str | None
    rung: str
    why: str
    at: float
    gpus: tuple[str, ...] = ()             # the GPUs to reset (gpu-reset)

    @property
    def action(self) -> str:
        return self.rung


@dataclass(frozen=True)
class Event:
    """A line for the action log: a phase judged, a recovery done or failed, a tray marked for repair."""

    host: str
    rack: str | None
    action: str                            # ladder (a phase judged) | recovered | recovery-failed | repair | ladder-wait
    why: str
    at: float
    result: str = "ok"
    seconds: float | None = None           # how long the phase (or the whole recovery) took
    phase: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrayStep:
    state: LadderState
    rungs: list[Rung] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    repair: bool = False                   # marked for repair this sweep (the hook runs)


# ------------------------------------------------------------------ pure: one tray

def _prune(failures: Sequence[float], now: float, window_s: float) -> tuple[float, ...]:
    return tuple(t for t in failures if now - t <= window_s)


def _pick(obs: Observation, ls: LadderSettings, after: str | None) -> tuple[str | None, str | None]:
    """(the lowest enabled rung above *after* that fits the tray now, why none does)."""
    floor = LADDER_RUNGS.index(after) + 1 if after in LADDER_RUNGS else 0
    waiting = None
    for rung in LADDER_RUNGS[floor:]:
        if not ls.rung_on(rung):
            continue
        if rung == GPU_RESET:
            if not obs.reached or not obs.reset_gpus:
                continue
        elif rung == REBOOT:
            if obs.reach not in ("ok", "timeout"):        # a hung tray may still take a reboot over SSH
                continue
        elif rung == POWER_CYCLE:
            if not obs.has_bmc:
                waiting = waiting or "no BMC address for the tray in the inventory: it cannot be power-cycled"
                continue
            answered = obs.reached
            lower_failed = after in (GPU_RESET, REBOOT)
            if answered and not lower_failed and ls.power_cycle_when != "unfixed":
                continue
        if obs.idle is not True:
            return None, ("the scheduler's view of the node was not read" if obs.idle is None else
                          "waiting for the jobs on the node to end (the drain lets them finish)")
        return rung, None
    return None, waiting


def _start_rung(st: LadderState, obs: Observation, ls: LadderSettings, rung: str, why: str,
                now: float, out: TrayStep) -> None:
    out.state = replace(st, phase=rung, since=now, deadline=now + ls.deadline_s(rung), boot=st.last_boot,
                        rung=rung, tried=st.tried + (rung,), sent=None, bad=0, note=None)
    if rung == GPU_RESET and obs.reset_note:
        why = f"{why} ({obs.reset_note})"
    out.rungs.append(Rung(obs.host, obs.rack, rung, why, now, obs.reset_gpus if rung == GPU_RESET else ()))


def _climb(st: LadderState, obs: Observation, ls: LadderSettings, hs: HealthSettings, now: float,
           out: TrayStep, after: str | None, why: str) -> None:
    """Take the next rung above *after*; when there is none, the recovery failed."""
    rung, waiting = _pick(obs, ls, after)
    if rung is not None:
        _start_rung(st, obs, ls, rung, why, now, out)
        return
    if after is None:
        # nothing fits yet (busy, no rung for this fault): wait as a plain drain does, said once
        note = waiting or "no rung of the ladder is on for this fault"
        if st.note != note:
            out.events.append(Event(obs.host, obs.rack, "ladder-wait", note, now, result="noted"))
        out.state = replace(st, note=note)
        return
    if waiting and waiting.startswith(("waiting for", "the scheduler")):
        note = f"{why}; next rung {waiting}"
        if st.note != note:
            out.events.append(Event(obs.host, obs.rack, "ladder-wait", note, now, result="noted"))
        out.state = replace(st, note=note)
        return
    _failed(st, obs, ls, hs, now, out, f"{why}; no rung above {after}" + (f" ({waiting})" if waiting else ""))


def _failed(st: LadderState, obs: Observation, ls: LadderSettings, hs: HealthSettings, now: float,
            out: TrayStep, why: str) -> None:
    failures = _prune(st.failures + (now,), now, ls.failure_window_s)
    took = round(now - st.started, 3) if st.started is not None else None
    out.events.append(Event(obs.host, obs.rack, "recovery-failed", why, now, result="failed", seconds=took,
                            extra={"tried": list(st.tried), "times": dict(st.times),
                                   "failures": len(failures), "max_failures": ls.max_failures}))
    if len(failures) >= ls.max_failures:
        window = _fmt(ls.failure_window_s)
        text = f"{len(failures)} failed recoveries within {window} (last: {why}); not retried: a person must look"
        out.state = LadderState(phase=REPAIR, since=now, last_boot=st.last_boot, failures=failures,
                                repair_at=now, repair_why=text, times=dict(st.times), tried=st.tried)
        out.events.append(Event(obs.host, obs.rack, "repair", text, now, result="marked",
                                extra={"failures": [round(t, 3) for t in failures]}))
        out.repair = True
        return
    # another recovery, from the lowest rung again, once the tray had retry_after to settle
    fresh = LadderState(last_boot=st.last_boot, failures=failures, tried=st.tried, times=dict(st.times),
                        retry_at=now + ls.retry_after_s)
    if ls.retry_after_s > 0:
        out.state = fresh
        return
    _climb(replace(fresh, started=now, tried=(), times={}), obs, ls, hs, now, out, None,
           f"recovery {len(failures) + 1} of at most {ls.max_failures}: {obs.why}")


def _judged(st: LadderState, obs: Observation, now: float, out: TrayStep, result: str, why: str) -> LadderState:
    took = round(now - st.since, 3) if st.since is not None else None
    times = dict(st.times)
    if took is not None and st.phase:
        times[st.phase] = took
    out.events.append(Event(obs.host, obs.rack, "ladder", why, now, result=result, seconds=took, phase=st.phase))
    return replace(st, times=times)


def step(st: LadderState, obs: Observation, ls: LadderSettings, hs: HealthSettings, *, now: float,
         burn_in: str | None = None) -> TrayStep:
    """One tray's sweep. *burn_in*: None (not running), "running", "ok" or "failed: ..." (the engine's run)."""
    if obs.reached and obs.boot_id:
        st = replace(st, last_boot=obs.boot_id)
    st = replace(st, failures=_prune(st.failures, now, ls.failure_window_s))
    out = TrayStep(st)
    if not obs.drained:
        if st.phase == PASSED:
            took = round(now - st.started, 3) if st.started is not None else None
            out.events.append(Event(obs.host, obs.rack, "recovered",
                                    f"resumed after {' -> '.join(st.tried) or 'its checks'}", now, seconds=took,
                                    extra={"tried": list(st.tried), "times": dict(st.times)}))
            out.state = LadderState(last_boot=st.last_boot, failures=st.failures, tried=st.tried, times=dict(st.times))
        elif st.phase not in (None, REPAIR):
            out.events.append(Event(obs.host, obs.rack, "ladder", f"recovery ended in {st.phase}: the drain was "
                                    "lifted outside mctl", now, result="abandoned", phase=st.phase))
            out.state = LadderState(last_boot=st.last_boot, failures=st.failures)
        elif st.phase == REPAIR:
            out.state = st                  # the mark stays until `mctl health resume` clears it
        return out
    if st.phase == REPAIR:
        return out
    if st.phase is None:
        if not (obs.critical or not obs.reached):
            if st.note:
                out.state = replace(st, note=None)
            return out                      # healthy again by itself: the plain resume
        if not obs.fixable:
            note = f"no rung fixes {obs.why}"
            if st.note != note:
                out.events.append(Event(obs.host, obs.rack, "ladder-wait", note, now, result="noted"))
            out.state = replace(st, note=note)
            return out
        if st.retry_at is not None and now < st.retry_at:
            return out                      # the last recovery failed moments ago: let the tray settle
        fresh = replace(st, started=now, tried=(), times={}, rung=None, retry_at=None)
        why = obs.why or "critical"
        if st.failures:
            why = f"recovery {len(st.failures) + 1} of at most {ls.max_failures}: {why}"
        _climb(fresh, obs, ls, hs, now, out, None, why)
        return out
    if st.phase in LADDER_RUNGS:
        if st.sent is False:
            st = _judged(st, obs, now, out, "failed", f"{st.phase} was not carried out")
            _climb(st, obs, ls, hs, now, out, st.phase, f"{st.phase} failed")
            return out
        back = obs.reached and (st.phase == GPU_RESET or st.boot is None or (obs.boot_id and obs.boot_id != st.boot))
        if back:
            st = _judged(st, obs, now, out, "ok", f"{st.phase}: the tray answers again"
                         + (f" (boot id {str(obs.boot_id)[:8]})" if st.phase != GPU_RESET else ""))
            out.state = st = replace(st, phase=VERIFY, since=now, deadline=now + ls.verify_deadline_s,
                                     bad=1 if obs.failing else 0)
            _verify(st, obs, ls, hs, now, out, burn_in)
            return out
        if st.deadline is not None and now >= st.deadline:
            st = _judged(st, obs, now, out, "failed", f"{st.phase}: the tray did not come back within "
                         f"{_fmt(ls.deadline_s(st.phase))}")
            _climb(st, obs, ls, hs, now, out, st.phase, f"{st.phase} timed out")
        return out
    if st.phase == VERIFY:
        out.state = st = replace(st, bad=st.bad + 1 if obs.failing else st.bad)
        _verify(st, obs, ls, hs, now, out, burn_in)
        return out
    if st.phase == BURN_IN:
        if burn_in in (None, "running"):
            if st.deadline is not None and now >= st.deadline:
                st = _judged(st, obs, now, out, "failed", f"burn-in did not finish within {_fmt(ls.burn_in_deadline_s)}")
                _failed(st, obs, ls, hs, now, out, "burn-in timed out")
            return out
        if burn_in == "ok":
            st = _judged(st, obs, now, out, "ok", "burn-in passed")
            out.state = replace(st, phase=PASSED, since=now, deadline=None)
            return out
        st = _judged(st, obs, now, out, "failed", burn_in)
        _failed(st, obs, ls, hs, now, out, burn_in)
        return out
    if st.phase == PASSED and obs.reached and obs.critical:
        # critical again before the resume: the rung did not hold
        st = replace(st, phase=VERIFY, since=now, deadline=now + ls.verify_deadline_s, bad=1 if obs.failing else 0)
        out.state = st
    return out


def _verify(st: LadderState, obs: Observation, ls: LadderSettings, hs: HealthSettings, now: float, out: TrayStep,
            burn_in: str | None) -> None:
    if obs.reached and not obs.critical and obs.healthy_streak >= hs.resume_after_healthy_sweeps:
        st = _judged(st, obs, now, out, "ok", f"checks passed for {obs.healthy_streak} sweeps")
        if ls.burn_in != "off":
            out.state = replace(st, phase=BURN_IN, since=now, deadline=now + ls.burn_in_deadline_s, bad=0)
        else:
            out.state = replace(st, phase=PASSED, since=now, deadline=None, bad=0)
        return
    last = st.rung
    if st.bad >= ls.fail_after_sweeps:
        st = _judged(st, obs, now, out, "failed", f"still critical {st.bad} sweeps after {last}: {obs.why}")
        _climb(st, obs, ls, hs, now, out, last, f"{last} did not fix it")
    elif st.deadline is not None and now >= st.deadline:
        st = _judged(st, obs, now, out, "failed", f"checks did not pass within {_fmt(ls.verify_deadline_s)} "
                     f"after {last}")
        _climb(st, obs, ls, hs, now, out, last, f"{last} did not fix it")


# ------------------------------------------------------------------ what the policy asks

def holds_resume(rec: "TrayRecord") -> str | None:
    """Why the policy must not resume this tray now (None: it may): a recovery runs, or it waits for repair."""
    st = state_of(rec)
    if st.phase in (None, PASSED):
        return None
    if st.phase == REPAIR:
        return f"marked for repair: {st.repair_why}; 'mctl health resume' once it is fixed"
    return f"held by the recovery ladder ({st.phase})"


def rebooted_by_us(rec: "TrayRecord", node: "NodeView | None") -> bool:
    """Slurm's view of the node is what a rung of mctl's own made of it: a reboot or power cycle of this
    recovery, and the node DOWN (ReturnToService=1 marks an unexpected reboot DOWN) with mctl's drain
    reason or Slurm's `Node unexpectedly rebooted`. Such a node is still mctl's drain."""
    st = state_of(rec)
    if node is None or not node.down or st.phase not in (*LADDER_RUNGS, VERIFY, BURN_IN, PASSED):
        return False
    if not any(r in (REBOOT, POWER_CYCLE) for r in st.tried):
        return False
    reason = (node.reason or "").strip()
    return reason == (rec.reason or "").strip() or reason == SLURM_REBOOTED


def down_is_ours(rec: "TrayRecord", node: "NodeView | None") -> bool:
    """A DOWN node mctl may resume all the same: its recovery passed and the DOWN is its own reboot's."""
    return state_of(rec).phase == PASSED and rebooted_by_us(rec, node)


# ------------------------------------------------------------------ from a sweep to observations

def reset_targets(facts: "TrayFacts", settings: HealthSettings) -> tuple[str, ...]:
    """The GPUs whose current drain-worthy XIDs all say "reset GPU" (NVIDIA's catalogue, or XID 154's
    recovery action); () when any says something else or there is none."""
    from mctl.model.xid import RESET_GPU, judge, recovery_change

    gpus: list[str] = []
    for x in facts.xids:
        if x.this_boot is False or (x.age_s is not None and x.age_s > settings.xid_window_s):
            continue
        ev = x.event
        if not judge(ev.code, ev.message, settings.drain_xids, nvlink5_mode=settings.nvlink5_drain,
                     nvlink5_no_drain=settings.nvlink5_no_drain).drains:
            continue
        if ev.code == 154:
            change = recovery_change(ev.code, ev.message)
            says_reset = change is not None and "reset" in (change.new_name or "").lower()
        else:
            says_reset = ev.info is not None and ev.info.bucket == RESET_GPU
        if not says_reset:
            return ()
        if ev.pci not in gpus:
            gpus.append(ev.pci)
    return tuple(gpus)


def reset_scope(facts: "TrayFacts", named: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """The GPUs a reset of *named* (kernel-log PCI addresses) must take, as nvidia-smi spells them, and why when
    that is more than *named*: on a GB200/GB300 tray every GPU of the tray (NVLink-connected, reset together)."""
    from mctl.model.gpu import pci_key

    if not named or facts.gpus is None or not facts.gpus.gpus:
        return named, None
    gpus = facts.gpus.gpus
    keys = {pci_key(p) for p in named if _pci_ok(p)}
    picked = tuple(g.pci_bus_id for g in gpus if _pci_ok(g.pci_bus_id) and pci_key(g.pci_bus_id) in keys)
    if len(picked) != len(keys):
        return named, None                       # a GPU the facts do not show (lost): as the XIDs named it
    product = " ".join(g.product_name or "" for g in gpus)
    if any(p in product for p in WHOLE_TRAY_PRODUCTS) and len(picked) < len(gpus):
        whole = tuple(g.pci_bus_id for g in gpus)
        return whole, (f"{next(p for p in WHOLE_TRAY_PRODUCTS if p in product)}: the tray's {len(whole)} GPUs are "
                       "NVLink-connected and reset together, not only " + ", ".join(picked))
    return picked, None


def _pci_ok(text: str) -> bool:
    from mctl.model.gpu import pci_key

    try:
        pci_key(text)
        return True
    except ValueError:
        return False


def _idle(node: "NodeView | None") -> bool | None:
    if node is None:
        return None
    flags = {f.rstrip("*~#!%$@^-") for f in (node.state or "").upper().split("+")}
    return not (flags & {"ALLOCATED", "MIXED", "COMPLETING", "ALLOC", "MIX", "COMP"})


def observe(rec: "TrayRecord", verdict: "TrayVerdict", facts: "TrayFacts | None", node: "NodeView | None",
            settings: HealthSettings, *, has_bmc: bool) -> Observation:
    from mctl.model.findings import Severity

    critical = [f for f in verdict.findings if f.severity is Severity.CRITICAL]
    fixable = not verdict.reached or any(f.check not in NOT_FIXED_BY_A_RUNG for f in critical)
    reset: tuple[str, ...] = ()
    note = None
    if verdict.reached and facts is not None and critical and \
            all(f.check in ("gpu.xid", "gpu.recovery") for f in critical):
        reset, note = reset_scope(facts, reset_targets(facts, settings))
    why = "; ".join(f"{f.check}: {f.message}" for f in critical[:2]) or verdict.reach
    settling = bool(critical) and all(f.check in SETTLING_AT_BOOT for f in critical)
    return Observation(verdict.host, verdict.rack, rec.drained, verdict.reach, bool(critical),
                       rec.healthy_streak, facts.boot_id if facts is not None and verdict.reached else None,
                       _idle(node), reset, fixable, has_bmc, why[:300], settling, reset_note=note)


# ------------------------------------------------------------------ every tray, through the breaker

@dataclass
class Outcome:
    records: dict[str, "TrayRecord"]
    breaker: "BreakerState"
    rungs: list[Rung] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)


def decide(records: Mapping[str, "TrayRecord"], observations: Sequence[Observation], hs: HealthSettings,
           breaker: "BreakerState", rack_sizes: Mapping[str, int], *, now: float,
           burn_ins: Mapping[str, str] | None = None) -> Outcome:
    """Every tray's step; each rung passes the circuit breaker as a drain does (counted in its window).
    A rung the breaker refuses is not taken: the tray waits, drained, and says why once."""
    from mctl.health import breaker as breakerlib

    ls = hs.ladder
    out = Outcome(dict(records), breaker)
    for obs in observations:
        rec = out.records.get(obs.host)
        if rec is None or rec.leak:
            # a leak episode (mctl.health.leaks) owns the tray: no reset, reboot or power cycle of a leaking
            # tray, and one powered off for its leak stays off until a person powers it on
            continue
        before = state_of(rec)
        ts = step(before, obs, ls, hs, now=now, burn_in=(burn_ins or {}).get(obs.host))
        for rung in list(ts.rungs):
            adm = breakerlib.admit(out.breaker, obs.host, obs.rack, rack_sizes, max_share=hs.breaker_max_share,
                                   window_s=hs.breaker_window_s, scope=hs.breaker_scope, now=now)
            out.breaker = adm.state
            if adm.allowed:
                continue
            ts.rungs.remove(rung)
            note = f"{rung.rung} not taken: {adm.why}"
            # the phase stays where it was: the rung is tried again once the breaker admits it
            ts.state = replace(before, last_boot=ts.state.last_boot, failures=ts.state.failures, note=note)
            ts.events = [Event(obs.host, obs.rack, "ladder-wait", note, now, result="noted")] \
                if before.note != note else []
            ts.repair = False
            if adm.tripped_now:
                out.events.append(Event(obs.host, obs.rack, "breaker-trip", adm.why, now, result="tripped"))
        out.rungs += ts.rungs
        out.events += ts.events
        if ts.repair:
            out.repairs.append(obs.host)
        out.records[obs.host] = replace(rec, ladder=ts.state if ts.state != LadderState() else None)
    return out


def settle(records: dict[str, "TrayRecord"], rung: Rung, sent: bool | None) -> None:
    """Fold a rung's send back into its tray's record: True sent, False not carried out (judged failed
    on the next sweep), None not known (treated as sent: never sent twice)."""
    rec = records.get(rung.host)
    if rec is None:
        return
    st = state_of(rec)
    if st.phase != rung.rung:
        return
    records[rung.host] = replace(rec, ladder=replace(st, sent=sent))


def not_taken(records: dict[str, "TrayRecord"], rung: Rung, before: LadderState | None, why: str) -> None:
    """The rung could not even be tried (the rack is locked by another command, no BMC credentials):
    the tray's recovery goes back to where it was, to try again on a later sweep."""
    rec = records.get(rung.host)
    if rec is None:
        return
    st = before or LadderState()
    records[rung.host] = replace(rec, ladder=replace(st, note=f"{rung.rung} not sent: {why}"))


def repair_argv(ls: LadderSettings, host: str, rack: str | None, why: str, failures: int) -> list[str]:
    """The hook's argv, placeholders filled per argument ({tray} {rack} {reason} {failures}); no shell runs it."""
    return fill_argv(ls.repair_hook, host, rack, why, failures)


def fill_argv(command, host: str, rack: str | None, why: str, failures: int) -> list[str]:
    """An exec sink's argv (the repair hook is one), placeholders filled per argument; no shell runs it."""
    values = {"tray": host, "rack": rack or "", "reason": why, "failures": str(failures)}
    out = []
    for arg in command:
        for k, v in values.items():
            arg = arg.replace("{" + k + "}", v)
        out.append(arg)
    return out


def metric_samples(records: Mapping[str, "TrayRecord"], site: str) -> list[tuple[str, str, str, list]]:
    """The ladder's Prometheus series (none while no record carries ladder state, i.e. the ladder is off):
    the phase each tray's recovery is in, the seconds each phase of its current or last recovery took, and
    per tray whether it is marked for repair."""
    phase, seconds, repair = [], [], []
    for host, rec in sorted(records.items()):
        if not rec.ladder:
            continue
        st = state_of(rec)
        if st.phase:
            phase.append(({"site": site, "rack": rec.rack, "tray": host, "phase": st.phase}, 1))
        seconds += [({"site": site, "rack": rec.rack, "tray": host, "phase": p}, t) for p, t in sorted(st.times.items())]
        repair.append(({"site": site, "rack": rec.rack, "tray": host}, 1 if st.phase == REPAIR else 0))
    if not repair:
        return []
    return [("mctl_health_ladder_phase", "gauge", "1 for the phase of a tray's recovery (ladder).", phase),
            ("mctl_health_ladder_phase_seconds", "gauge",
             "Seconds each phase (rung, verify, burn-in) of the tray's current or last recovery took.", seconds),
            ("mctl_health_marked_for_repair", "gauge",
             "1 when the ladder marked the tray for repair (not retried until resumed by hand).", repair)]


def _fmt(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
