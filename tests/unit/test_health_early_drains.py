"""The watch drains a tray as its answer arrives, not when the slowest tray has answered (issue 15).

Stand-ins, no network: a pool whose trays answer after their own delays (a frozen one only at the
deadline), a scheduler that answers at once and records when each action arrived, and the check
catalogue replaced by a table of who is critical (the decision logic is what is under test here;
the checks have their own tests).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mctl.health import engine as engine_mod
from mctl.health import sweep as sweep_mod
from mctl.health import policy, store
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import DRAIN, SKIP, ActResult, NodeView
from mctl.model.findings import Finding, Severity
from mctl.model.tray import TrayFacts
from mctl.transport import HostResult, HostStatus, SSHConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "example-gb200"
DEADLINE = 1.5
FROZEN = "rack-a-tray18"


class _Pool:
    """Each tray answers after delays[tray] seconds (default at once); a tray in *frozen* never answers
    and comes back unreachable at the deadline, as the real pool reports it."""

    def __init__(self, delays: dict[str, float], frozen: set[str]):
        self.config = SSHConfig(known_hosts=Path("/nonexistent"), command_timeout=60.0)
        self.delays = delays
        self.frozen = frozen

    async def run(self, targets, command, *, timeout=None, deadline=None, on_result=None):
        async def one(t):
            if t.name in self.frozen:
                await asyncio.sleep(deadline)
                r = HostResult(t.name, t.address, HostStatus.UNREACHABLE, phase="connect",
                               error="no session within the deadline (frozen host?)")
            else:
                await asyncio.sleep(self.delays.get(t.name, 0.0))
                r = HostResult(t.name, t.address, HostStatus.OK, stdout="stand-in", exit_code=0)
            if on_result is not None:
                on_result(r)
            return r

        return list(await asyncio.gather(*(one(t) for t in targets)))


class _Scheduler:
    kind = "slurm"
    where = "slurmctld (stand-in)"

    def __init__(self, hosts, *, answers: bool = True, log: Path | None = None):
        self.nodes = {h: NodeView(h, state="IDLE") for h in hosts}
        self.answers = answers
        self.applied: list[tuple[float, list[str]]] = []     # (monotonic, hosts) per apply call
        self.log = log
        self.intents_seen: list[set[str]] = []

    async def read(self, *, deadline=None):
        from mctl.model.drain import SchedulerUnreachable

        await asyncio.sleep(0.01)
        if not self.answers:
            raise SchedulerUnreachable("slurmctld is down (stand-in)")
        return dict(self.nodes), {}

    async def apply(self, decisions, *, deadline=None):
        self.applied.append((time.monotonic(), [d.host for d in decisions]))
        if self.log is not None:       # what the action log holds when scontrol would run
            self.intents_seen.append({e["tray"] for e in _log(self.log) if e.get("intent") == DRAIN})
        out = []
        for d in decisions:
            if d.action == DRAIN:
                self.nodes[d.host] = NodeView(d.host, drained=True, reason=d.reason, state="IDLE+DRAIN")
            out.append(ActResult(d, True))
        return out


def _log(state_dir: Path) -> list[dict]:
    path = state_dir / "health" / "actions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _critical(host: str) -> list[Finding]:
    return [Finding(Severity.CRITICAL, host, "gpu.xid", "XID 79 on GPU 0 (fell off the bus)",
                    details={"short": "xid 79 gpu0"})]


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """An Engine over rack-a of the example (18 trays) with remediation on, the stand-ins in place."""
    from mctl.health.site_view import resolve_scope, settings_of
    from mctl.inventory import load_site

    critical: set[str] = set()
    rack_findings: dict[str, list[Finding]] = {}

    monkeypatch.setattr(sweep_mod, "from_result", lambda purpose, r, nonce, **kw: TrayFacts(
        r.host, address=r.address, reach=r.status.value if r.status is not HostStatus.OK else "ok",
        error=r.error))

    def run_tray(facts, expect, settings):
        if not facts.reached:
            return [Finding(Severity.CRITICAL, facts.host, "tray.reachable", facts.error or "unreachable")]
        return _critical(facts.host) if facts.host in critical else []

    monkeypatch.setattr(sweep_mod.checks, "run_tray", run_tray)
    monkeypatch.setattr(sweep_mod.checks, "run_rack",
                        lambda rack, trays, plan: [f for fs in rack_findings.values() for f in fs])

    def make(delays=None, frozen=(FROZEN,), answers=True, **settings):
        site = load_site(EXAMPLE)
        scope = resolve_scope(site, "rack-a")
        s = replace(settings_of(site), **settings)
        pool = _Pool(delays or {}, set(frozen))
        eng = engine_mod.Engine(site, scope, s, tmp_path, pool, remediate=True, timeout=DEADLINE)
        eng.scheduler = _Scheduler([h.name for h in scope.hosts], answers=answers, log=tmp_path)
        return eng

    return make, critical, rack_findings, tmp_path


def test_a_critical_tray_is_drained_when_it_answers_not_at_the_frozen_trays_deadline(rig):
    make, critical, _, state_dir = rig
    critical.add("rack-a-tray02")
    eng = make(delays={"rack-a-tray02": 0.05})
    t0 = time.monotonic()
    result = asyncio.run(eng.sweep())
    took = time.monotonic() - t0
    (at, hosts), = eng.scheduler.applied
    assert hosts == ["rack-a-tray02"]
    assert at - t0 < DEADLINE - 0.5, "the drain waited for the frozen tray's deadline"
    assert DEADLINE - 0.1 <= took < DEADLINE + 1.0          # the sweep still ends at the deadline
    # the intent was in the action log (fsynced) before scontrol ran, the result after it
    assert eng.scheduler.intents_seen == [{"rack-a-tray02"}]
    lines = [e for e in _log(state_dir) if e.get("tray") == "rack-a-tray02"]
    assert [("intent" in e, e.get("result")) for e in lines] == [(True, "pending"), (False, "ok")]
    # the sweep reports it as any other drain, and the frozen tray in the same sweep
    assert [d.host for d in result.decisions if d.action == DRAIN] == ["rack-a-tray02"]
    assert result.tray_status("rack-a-tray02") == "drained"
    assert result.tray_status(FROZEN) == "unreachable"
    assert [e.action for e in result.logged] == [DRAIN]


def test_the_early_drained_trays_record_advances_once_per_sweep(rig):
    make, critical, _, state_dir = rig
    critical.add("rack-a-tray03")
    eng = make()
    asyncio.run(eng.sweep())
    rec = store.load_state(state_dir).records["rack-a-tray03"]
    assert rec.drained and rec.reason.startswith("mctl: xid 79 gpu0")
    assert (rec.bad_streak, rec.healthy_streak, rec.misses) == (1, 0, 0)
    frozen = store.load_state(state_dir).records[FROZEN]
    assert frozen.misses == 1 and not frozen.drained
    asyncio.run(eng.sweep())                      # still critical, already drained: no second drain
    rec = store.load_state(state_dir).records["rack-a-tray03"]
    assert rec.bad_streak == 2 and rec.drained
    assert len(eng.scheduler.applied) == 1


def test_a_rack_finding_seen_at_the_end_still_counts_once(rig):
    """The clique check needs the whole rack: it runs at the end; a tray drained early for its own
    findings gets the rack finding in its verdict, and its record still advances once."""
    make, critical, rack_findings, state_dir = rig
    critical.add("rack-a-tray04")
    rack_findings["rack-a-tray04"] = [Finding(Severity.CRITICAL, "rack-a-tray04", "fabric.clique",
                                              "in clique 2, its partition p0 is in clique 1")]
    eng = make()
    result = asyncio.run(eng.sweep())
    v = next(v for v in result.verdicts if v.host == "rack-a-tray04")
    assert {f.check for f in v.findings} == {"gpu.xid", "fabric.clique"}
    rec = store.load_state(state_dir).records["rack-a-tray04"]
    assert rec.drained and rec.bad_streak == 1
    assert [d.host for d in result.decisions if d.action == DRAIN] == ["rack-a-tray04"]


@pytest.mark.parametrize("share", [0.1, 0.25])
def test_the_breaker_admits_no_more_drains_than_deciding_all_trays_at_once(rig, share):
    """Five trays critical in one sweep, answering one after another: the breaker (share of 18) admits
    as many as policy.decide over the whole sweep does, and the rest are skipped with its reason."""
    make, critical, _, state_dir = rig
    bad = [f"rack-a-tray{n:02d}" for n in (2, 5, 7, 9, 11)]
    critical.update(bad)
    eng = make(delays={h: 0.05 * i for i, h in enumerate(bad)}, breaker_max_share=share)
    result = asyncio.run(eng.sweep())
    drained = [d.host for d in result.decisions if d.action == DRAIN]
    # the same sweep decided all at once, as before early drains
    from mctl.health.breaker import BreakerState
    verdicts = [TrayVerdict(h.name, h.rack, "ok", Severity.CRITICAL if h.name in critical else Severity.OK,
                                   tuple(_critical(h.name)) if h.name in critical else ())
                for h in eng.scope.hosts]
    nodes = {h.name: NodeView(h.name, state="IDLE") for h in eng.scope.hosts}
    batch = policy.decide({}, verdicts, nodes, eng.settings, BreakerState(), eng.sizes, now=time.time())
    policy.resolve(batch, eng.settings, eng.sizes, now=time.time())       # every drain asked was done
    allowed = [d.host for d in batch.decisions if d.action == DRAIN]
    assert len(drained) == len(allowed) == int(share * 18)
    assert sum(len(h) for _, h in eng.scheduler.applied) == len(drained)
    skipped = {d.host for d in result.decisions if d.action == SKIP}
    assert skipped == set(bad) - set(drained)
    assert result.breaker.tripped and batch.breaker.tripped
    assert [e.action for e in result.logged].count("breaker-trip") == 1
    state = store.load_state(state_dir)
    assert {h for _, h, _ in state.breaker.drains} == set(drained)
    assert {h for h, r in state.records.items() if r.drained} == set(drained)


def test_a_tripped_breaker_stops_early_drains(rig):
    make, critical, _, state_dir = rig
    from mctl.health.breaker import BreakerState

    store.save_state(state_dir, store.HealthState("example", {}, BreakerState(True, time.time(), "tripped before")))
    critical.add("rack-a-tray02")
    eng = make()
    result = asyncio.run(eng.sweep())
    assert eng.scheduler.applied == []
    assert [d.action for d in result.decisions if d.host == "rack-a-tray02"] == [SKIP]


def test_no_early_drain_when_the_scheduler_does_not_answer(rig):
    make, critical, _, state_dir = rig
    critical.add("rack-a-tray02")
    eng = make(answers=False)
    result = asyncio.run(eng.sweep())
    assert eng.scheduler.applied == []
    assert result.scheduler_error
    rec = store.load_state(state_dir).records["rack-a-tray02"]
    assert rec.pending is not None and rec.pending.action == DRAIN and not rec.drained


def test_unreachable_trays_are_decided_at_the_end_in_one_action_with_the_others(rig):
    """Trays that answer at the deadline (frozen, hung) gain nothing from an early decision: their
    drains go with the end of the sweep's actions, one scheduler call."""
    make, critical, _, state_dir = rig
    eng = make(frozen=(FROZEN, "rack-a-tray17"), unreachable_sweeps_before_drain=1)
    critical.add("rack-a-tray01")
    asyncio.run(eng.sweep())
    assert [sorted(h) for _, h in eng.scheduler.applied] == [["rack-a-tray01"], ["rack-a-tray17", FROZEN]]
    state = store.load_state(state_dir)
    assert all(state.records[h].drained for h in ("rack-a-tray01", "rack-a-tray17", FROZEN))


def test_an_interrupted_early_drain_is_reconciled_on_the_next_start(rig):
    """Killed after the intent and scontrol, before the result: the next start reads Slurm and logs it."""
    make, critical, _, state_dir = rig
    critical.add("rack-a-tray06")
    eng = make()
    real_apply = eng.scheduler.apply

    async def killed(decisions, *, deadline=None):
        await real_apply(decisions, deadline=deadline)
        raise asyncio.CancelledError          # the process dies here (kill -9 as seen from the state files)

    eng.scheduler.apply = killed
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(eng.sweep())
    assert [e.get("intent") for e in _log(state_dir) if e.get("tray") == "rack-a-tray06"] == [DRAIN]
    fresh = make()
    fresh.scheduler.nodes = eng.scheduler.nodes             # Slurm as the killed run left it
    critical.clear()
    result = asyncio.run(fresh.sweep())
    done = [e for e in _log(state_dir) if e.get("tray") == "rack-a-tray06" and e.get("action") == DRAIN]
    assert len(done) == 1 and done[0]["result"] == "ok" and "reconciled" in done[0]["why"]
    rec = store.load_state(state_dir).records["rack-a-tray06"]
    assert rec.drained
    assert result.logged[0].action == DRAIN
