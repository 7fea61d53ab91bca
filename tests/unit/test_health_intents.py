"""A watch killed between scontrol and its action-log line (issue 15): the intent line written before
the action lets the next start find the drain and log it, so no tray is drained without a line."""

from __future__ import annotations

import asyncio
import time

from mctl.health import store
from mctl.health.sweep import SweepResult
from mctl.model.tray import TrayFacts
from mctl.health.record import TrayVerdict
from mctl.model.drain import DRAIN, NodeView
from mctl.model.findings import Finding, Severity
from tests.helpers import example_engine

XID = Finding(Severity.CRITICAL, None, "gpu.xid", "XID 79 on gpu0: GPU has fallen off the bus", None,
              {"short": "xid 79 gpu0 (fell off bus)"})


class _Killed(BaseException):
    """kill -9: nothing after it runs (no result line, no state saved)."""


class _Slurm:
    kind = "slurm"
    where = "slurmctld on a stand-in"

    def __init__(self, nodes: dict[str, NodeView], *, kill: bool = False, apply_first: bool = True):
        self.nodes = nodes
        self.kill = kill
        self.apply_first = apply_first
        self.applied: list[str] = []

    async def read(self, *, deadline=None):
        return dict(self.nodes), {}

    async def apply(self, decisions, *, deadline=None):
        from mctl.model.drain import ActResult

        if self.kill and not self.apply_first:
            raise _Killed()
        for d in decisions:
            self.applied.append(f"{d.action} {d.host}")
            self.nodes[d.host] = NodeView(d.host, drained=True, reason=d.reason, state="IDLE+DRAIN")
        if self.kill:
            raise _Killed()
        return [ActResult(d, True) for d in decisions]


def _remediate(tmp_path, scheduler: _Slurm, host: str, rack: str) -> SweepResult:
    engine, _ = example_engine(tmp_path)
    engine.remediate = True
    engine.scheduler = scheduler
    verdict = TrayVerdict(host, rack, "ok", Severity.CRITICAL, (Finding(Severity.CRITICAL, host, XID.check,
                                                                        XID.message, None, XID.details),))
    nodes = dict(scheduler.nodes)
    result = SweepResult(1, time.time(), 0.0, {host: TrayFacts(host)}, list(verdict.findings), [verdict],
                         nodes, "slurm", remediate=True)
    asyncio.run(engine.respond(result))
    return result


def _site_tray(tmp_path):
    engine, _ = example_engine(tmp_path)
    h = engine.scope.hosts[0]
    return h.name, h.rack


def test_a_drain_done_before_the_kill_is_found_and_logged_on_the_next_start(tmp_path):
    host, rack = _site_tray(tmp_path)
    slurm = _Slurm({host: NodeView(host, state="IDLE")}, kill=True)
    try:
        _remediate(tmp_path, slurm, host, rack)
        raise AssertionError("the stand-in kill did not happen")
    except _Killed:
        pass
    assert slurm.nodes[host].drained                         # drained in Slurm ...
    (intent,) = store.read_actions(tmp_path)                # ... and only the intent is logged
    assert intent.action == "intent" and intent.intent == DRAIN and intent.tray == host
    assert not store.load_state(tmp_path).records.get(host)  # the state was never saved
    assert [e.intent_id for e in store.unresolved_intents(tmp_path)] == [intent.intent_id]

    again = _Slurm(slurm.nodes)                              # the next start
    result = _remediate(tmp_path, again, host, rack)
    assert again.applied == []                               # no second drain: the first one is mctl's
    log = store.read_actions(tmp_path)
    (done,) = [e for e in log if e.action == DRAIN]
    assert done.result == "ok" and done.intent_id == intent.intent_id and "reconciled" in done.why
    assert done.reason == intent.reason and done in result.logged
    rec = store.load_state(tmp_path).records[host]
    assert rec.drained and rec.reason == intent.reason
    assert any(d[1] == host for d in store.load_state(tmp_path).breaker.drains)   # counted by the breaker
    assert store.unresolved_intents(tmp_path) == []


def test_a_drain_the_kill_cut_off_is_logged_as_not_applied_and_decided_again(tmp_path):
    host, rack = _site_tray(tmp_path)
    slurm = _Slurm({host: NodeView(host, state="IDLE")}, kill=True, apply_first=False)
    try:
        _remediate(tmp_path, slurm, host, rack)
    except _Killed:
        pass
    assert not slurm.nodes[host].drained
    again = _Slurm(slurm.nodes)
    _remediate(tmp_path, again, host, rack)
    assert again.applied == [f"drain {host}"]               # still critical: drained now
    drains = [e for e in store.read_actions(tmp_path) if e.action == DRAIN]
    assert [e.result.split(" (")[0] for e in drains] == ["failed: not applied", "ok"]
    assert store.unresolved_intents(tmp_path) == []
    assert store.load_state(tmp_path).records[host].drained


def test_every_drain_has_an_intent_line_before_it_and_the_same_id_after(tmp_path):
    host, rack = _site_tray(tmp_path)
    _remediate(tmp_path, _Slurm({host: NodeView(host, state="IDLE")}), host, rack)
    intent, drain = store.read_actions(tmp_path)
    assert (intent.action, drain.action, drain.result) == ("intent", DRAIN, "ok")
    assert intent.intent_id == drain.intent_id and intent.to_dict()["result"] == "pending"
