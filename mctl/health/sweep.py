"""One health sweep over a site: probe, scheduler and BMC reads, the check catalogue -> one result.

A sweep sends the probe to every tray and asks the scheduler for its node states at the same
time (one round trip per tray and one to the controller), takes the trays' BMC views (out of
band: `mctl health check` reads every BMC beside the probes; the watch's reader reads them on its
own cadence and the sweep takes what it has when the probes are in, never waiting for a BMC:
mctl.health.oob), then runs the check catalogue on each tray, the rack-wide checks and each
switch tray's BMC checks (its leak detectors: `switch_bmcs`, findings of their own). It decides
nothing and acts on nothing: what mctl does about the result is the responders' work
(mctl.health.engine runs them after the sweep, through one actuator). `on_tray` is told each
tray's facts as its answer arrives, so a responder can act on a tray before the slowest one
answered (docs/health.md, "Drains as the answers arrive").
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from mctl import checks
from mctl.facts.probe import HEALTH, from_result, probe_command
from mctl.health import store
from mctl.health.breaker import BreakerState
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import Decision, NodeView, SchedulerUnreachable
from mctl.model.findings import Finding, Severity, sort_findings, worst
from mctl.model.tray import TrayFacts, dcgm_timeout_for, smi_timeout_for

# The out-of-band read of the trays' BMCs (leaks, power) gets at least this long (docs/health.md, "Leaks and power").
BMC_DEADLINE_MIN = 10.0


@dataclass
class SweepResult:
    number: int
    started: float
    elapsed: float
    facts: dict[str, TrayFacts]
    findings: list[Finding]
    verdicts: list[TrayVerdict]
    nodes: dict[str, NodeView] | None
    scheduler: str | None                       # slurm | None
    scheduler_error: str | None = None
    remediate: bool = False
    dry_run: bool = False
    decisions: list[Decision] = field(default_factory=list)
    logged: list[store.ActionEntry] = field(default_factory=list)   # action-log entries of this sweep
    breaker: BreakerState = field(default_factory=BreakerState)
    records: dict[str, TrayRecord] = field(default_factory=dict)
    # Each switch tray's BMC view (its leak detectors), by switch tray name; their findings are in `findings`
    # (host: the switch tray, details: its rack). What to do about them is the rack policy's, not the sweep's.
    switch_bmcs: dict[str, Any] = field(default_factory=dict)
    switch_racks: dict[str, str | None] = field(default_factory=dict)
    # Each rack's switch side as its NMX-M said it this sweep (mctl.health.nmx_watch), by rack name; the findings
    # are in `findings` (nmx.switch_side on the rack, nmx.switch_tray/switch_port/tray_partition on its trays).
    switch_side: dict[str, Any] = field(default_factory=dict)
    # Each event sink's running counts (delivered, dropped, dead_lettered, retried), for the metrics.
    event_counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def worst(self) -> Severity:
        return worst(self.findings)

    def tray_status(self, host: str) -> str:
        """healthy, warn, critical, unreachable, drained (by mctl), held (drained by someone else)."""
        rec = self.records.get(host)
        node = (self.nodes or {}).get(host)
        if rec is not None and rec.drained and not self.dry_run:
            return "drained"
        if node is not None and node.drained:
            return "held"
        v = next((v for v in self.verdicts if v.host == host), None)
        if v is None:
            return "unknown"
        return {"ok": "healthy"}.get(v.status, v.status)

    def to_dict(self) -> dict[str, Any]:
        nodes = self.nodes or {}
        return {
            "sweep": self.number, "started": self.started, "elapsed": round(self.elapsed, 3),
            "worst": self.worst().value, "scheduler": self.scheduler, "scheduler_error": self.scheduler_error,
            "remediate": self.remediate, "dry_run": self.dry_run,
            "trays": [{"host": v.host, "rack": v.rack, "reach": v.reach, "worst": v.worst.value,
                       "status": self.tray_status(v.host),
                       "scheduler_state": nodes[v.host].state if nodes.get(v.host) else None,
                       "scheduler_reason": nodes[v.host].reason if nodes.get(v.host) else None,
                       "elapsed": round(self.facts[v.host].elapsed, 3) if v.host in self.facts else None}
                      for v in self.verdicts],
            "findings": [f.to_dict() for f in self.findings],
            "decisions": [d.to_dict() for d in self.decisions],
            "actions": [e.to_dict() for e in self.logged],
            "breaker": self.breaker.to_dict(),
            **({"switch_trays": [{"host": name, "rack": self.switch_racks.get(name), "bmc": bmc.to_dict()}
                                 for name, bmc in self.switch_bmcs.items()]} if self.switch_bmcs else {}),
            **({"switch_side": [v.to_dict() for v in self.switch_side.values()]} if self.switch_side else {}),
        }


class Sweeper:
    """The sweep's code over the site view the engine keeps for days (mctl.health.engine.Engine: the trays
    and their SSH targets, what each should be, the rack plans, the scheduler adapter, the BMC settings,
    the boot memory and every deadline)."""

    def __init__(self, engine):
        self.e = engine

    async def read_scheduler(self):
        e = self.e
        if e.scheduler is None:
            return None, None, None
        try:
            async with asyncio.timeout(e.timeout):
                views, states = await e.scheduler.read(deadline=e.timeout)
            return views, states, None
        except SchedulerUnreachable as exc:
            return None, None, str(exc)
        except TimeoutError:
            return None, None, f"{e.scheduler.where} did not answer within the {e.timeout:g}s deadline"

    async def read_bmcs(self) -> dict[str, Any] | None:
        """host -> mctl.checks.leak.BmcHealth, every BMC read now, each within the BMC deadline (`health check`:
        there is no earlier view); None: not configured."""
        e = self.e
        if e.oob_settings is None and e.oob_problem is None:
            return None
        from mctl.checks.leak import BmcHealth
        from mctl.health import oob

        hosts = e.bmc_hosts
        if e.oob_problem:
            return {h.name: BmcHealth(error=f"the inventory's bmc settings: {e.oob_problem}", error_kind="config",
                                      power_asked=h.role == "compute") for h in hosts}
        deadline = e.bmc_deadline
        try:
            async with asyncio.timeout(deadline + 2.0):
                return await asyncio.to_thread(oob.read, hosts, e.oob_settings, deadline)
        except TimeoutError:
            return {h.name: BmcHealth(error=f"no answer within {deadline:g}s", error_kind="timeout",
                                      power_asked=h.role == "compute") for h in hosts}

    async def probe(self, on_facts=None) -> list[TrayFacts]:
        """Every tray's facts, in scope order; *on_facts* is called with each tray's facts as its answer
        arrives (the watch judges a tray then, not when the slowest tray has answered)."""
        e = self.e
        nonce = secrets.token_hex(8)
        smi_timeout = smi_timeout_for(e.timeout)
        dcgm_timeout = None if e.settings.dcgm == "off" else dcgm_timeout_for(e.timeout)
        paths = e.settings.disk_paths
        command = probe_command(HEALTH, nonce, smi_timeout=smi_timeout, disk_paths=paths, dcgm_timeout=dcgm_timeout)
        seen: dict[str, TrayFacts] = {}

        def arrived(r) -> None:
            f = from_result(HEALTH, r, nonce, smi_timeout=smi_timeout, disk_paths=paths, dcgm_timeout=dcgm_timeout)
            seen[f.host] = f
            if on_facts is not None:
                on_facts(f)

        # The deadline covers the whole of each tray's work; a tray that misses it comes back as
        # timeout (the probe hung) or unreachable (no session) and its connection is reopened
        # in the background, so the next sweep is not delayed by it.
        results = await e.pool.run(e.targets, command, deadline=e.timeout, on_result=arrived)
        for r in results:               # a pool that does not call on_result (stand-ins) still gives every tray
            if r.host not in seen:
                arrived(r)
        return [seen[r.host] for r in results]

    def tray_verdict(self, facts: TrayFacts) -> TrayVerdict:
        """One tray's verdict from its own checks (without the rack-wide ones, which need every tray)."""
        e = self.e
        fs = checks.run_tray(facts, e.expect[facts.host], e.settings)
        rack = next(h.rack for h in e.scope.hosts if h.name == facts.host)
        return TrayVerdict(facts.host, rack, facts.reach, worst(fs), tuple(fs))

    async def sweep(self, number: int, state: store.HealthState,
                    on_tray: Callable[[TrayFacts, "asyncio.Future"], None] | None = None) -> SweepResult:
        """One sweep (records and breaker are the engine's to fill in); *state* is the health state as it was
        when the sweep began (each tray's XID acknowledgement). *on_tray* gets each reached tray's facts and
        the scheduler read in flight."""
        e = self.e
        started = time.time()
        t0 = time.monotonic()
        seen: dict[str, TrayFacts] = {}
        read = asyncio.ensure_future(self.read_scheduler())
        # out of band: read now beside the SSH probes (health check), or taken from the watch's reader below
        bmc_read = asyncio.ensure_future(self.read_bmcs()) if e.bmc_watch is None else None
        # the switch side: one NMX-M read per rack beside the probes (mctl.health.nmx_watch: never past the deadline)
        nmx_started = e.nmx_watch.begin() if e.nmx_watch is not None else None
        nmx_read = None

        def arrived(f: TrayFacts) -> None:
            # Once per tray and sweep (BootMemory remembers what it saw), as the tray's answer arrives.
            rec = state.records.get(f.host)
            seen[f.host] = e.signals.see(e.boots.see(f).without_xids_before(rec.xid_ack if rec else None))
            if on_tray is not None and f.reached:
                on_tray(seen[f.host], read)

        try:
            facts_list = await self.probe(arrived)
            views, states, sched_error = await read
            # the watch: each BMC's view as it is now, never waited for (a hung BMC is bmc.stale in time)
            bmcs = await bmc_read if bmc_read is not None else e.bmc_watch.views()
            if nmx_started is not None:
                nmx_read = asyncio.ensure_future(e.nmx_watch.collect(nmx_started, until=t0 + e.timeout))
            switch_side = await nmx_read if nmx_read is not None else {}
        finally:
            read.cancel()
            if bmc_read is not None:
                bmc_read.cancel()
            if nmx_read is not None:
                nmx_read.cancel()
        facts: dict[str, TrayFacts] = {}
        for f in facts_list:
            facts[f.host] = seen[f.host].with_slurm_node((states or {}).get(f.host))
            if bmcs is not None:
                facts[f.host] = replace(facts[f.host], bmc=bmcs.get(f.host))
        per_host: dict[str, list[Finding]] = {h.name: checks.run_tray(facts[h.name], e.expect[h.name], e.settings)
                                              for h in e.scope.hosts}
        for rack in e.scope.racks:
            trays = [facts[h.name] for h in e.scope.hosts if h.rack == rack]
            for f in checks.run_rack(rack, trays, e.plans.get(rack, {})):
                per_host.setdefault(f.host, []).append(f)
        from mctl.checks import switch_fabric
        for h in e.scope.hosts:
            per_host[h.name] += switch_fabric.judge_tray(h.name, switch_side.get(h.rack))
        verdicts = [TrayVerdict(h.name, h.rack, facts[h.name].reach, worst(per_host.get(h.name, [])),
                                tuple(per_host.get(h.name, []))) for h in e.scope.hosts]
        findings = [f for fs in per_host.values() for f in fs]
        switch_bmcs = {h.name: bmcs[h.name] for h in e.switch_trays if bmcs is not None and h.name in bmcs}
        for h in e.switch_trays:
            if h.name in switch_bmcs:
                findings += checks.run_switch_tray(h.name, h.rack, switch_bmcs[h.name])
        for view in switch_side.values():
            findings += switch_fabric.judge_view(view, e.nmx_watch.stale_after_s)
        if sched_error:
            findings.append(Finding(Severity.WARN, None, "scheduler.reachable", sched_error,
                                    "drains and resumes are queued until the scheduler answers"))
        elif e.scheduler_problem:
            findings.append(Finding(Severity.WARN, None, "scheduler.reachable",
                                    f"scheduler not read: {e.scheduler_problem}"))
        result = SweepResult(number, started, 0.0, facts, sort_findings(findings), verdicts, views,
                             e.scheduler.kind if e.scheduler else None, sched_error,
                             remediate=e.remediate, dry_run=e.dry_run, switch_bmcs=switch_bmcs,
                             switch_racks={h.name: h.rack for h in e.switch_trays if h.name in switch_bmcs},
                             switch_side=switch_side)
        result.elapsed = time.monotonic() - t0
        return result
