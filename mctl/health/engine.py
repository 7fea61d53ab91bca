"""One health sweep over a site, and (optionally) the remediation that follows it.

A sweep sends the probe to every tray and asks the scheduler for its node
states at the same time (one round trip per tray and one to the controller),
runs the check catalogue, then, when remediating, lets the policy decide and
the scheduler adapter act. `mctl health check` runs one sweep with a fresh
connection pool; `mctl health watch` keeps one Engine (and its pool) for days.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mctl.errors import MctlError
from mctl import checks
from mctl.health import policy, store
from mctl.health.breaker import BreakerState
from mctl.model.tray import TrayFacts, smi_timeout_for
from mctl.health.policy import TrayVerdict
from mctl.facts.probe import HEALTH, from_result, probe_command
from mctl.model.settings import HealthSettings
from mctl.health.site_view import Scope, expectations, partition_plan, rack_sizes
from mctl.model.drain import DRAIN, RESUME, Decision, NodeView, SchedulerUnreachable
from mctl.model.findings import Finding, Severity, sort_findings, worst

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.transport import SSHPool

# The scheduler's actions of one sweep get at least this long (drains must not be cut for a short interval).
ACT_DEADLINE_MIN = 5.0
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
    records: dict[str, policy.TrayRecord] = field(default_factory=dict)

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
        return {
            "sweep": self.number, "started": self.started, "elapsed": round(self.elapsed, 3),
            "worst": self.worst().value, "scheduler": self.scheduler, "scheduler_error": self.scheduler_error,
            "remediate": self.remediate, "dry_run": self.dry_run,
            "trays": [{"host": v.host, "rack": v.rack, "reach": v.reach, "worst": v.worst.value,
                       "status": self.tray_status(v.host),
                       "scheduler_state": (self.nodes or {}).get(v.host).state if (self.nodes or {}).get(v.host)
                       else None,
                       "scheduler_reason": (self.nodes or {}).get(v.host).reason if (self.nodes or {}).get(v.host)
                       else None,
                       "elapsed": round(self.facts[v.host].elapsed, 3) if v.host in self.facts else None}
                      for v in self.verdicts],
            "findings": [f.to_dict() for f in self.findings],
            "decisions": [d.to_dict() for d in self.decisions],
            "actions": [e.to_dict() for e in self.logged],
            "breaker": self.breaker.to_dict(),
        }


class Engine:
    def __init__(self, site: "Site", scope: Scope, settings: HealthSettings, state_dir: Path, pool: "SSHPool", *,
                 remediate: bool = False, dry_run: bool = False, timeout: float | None = None,
                 who: str | None = None, interval: float | None = None):
        from mctl.sched.adapter import adapter_for
        from mctl.transport import targets_for

        self.site = site
        self.scope = scope
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.pool = pool
        self.remediate = remediate
        self.dry_run = dry_run
        from mctl.transport.ssh import per_tray_deadline

        # Every wait of a sweep is bounded by this (docs/health.md, "Deadlines"): each tray's probe,
        # the scheduler read beside them; the scheduler's actions get act_deadline after them.
        self.timeout = per_tray_deadline(configured=getattr(site.health, "tray_deadline", None),
                                         interval=interval if interval is not None else settings.interval,
                                         command_timeout=pool.config.command_timeout, override=timeout)
        self.act_deadline = max(ACT_DEADLINE_MIN, self.timeout)
        self.who = who or store.actor()
        self.targets = targets_for(site, list(scope.hosts))
        self.expect = expectations(site, list(scope.hosts))
        self.plans = {name: partition_plan(rack) for name, rack in site.racks.items()}
        self.sizes = rack_sizes(site)
        self.scheduler_problem: str | None = None
        try:
            self.scheduler = adapter_for(site, pool, [h.name for h in scope.hosts], self.who)
        except MctlError as exc:
            if remediate:
                raise
            # Reporting still works without the scheduler (e.g. no kubeconfig where an audit runs).
            self.scheduler = None
            self.scheduler_problem = exc.message
        self.sweeps = 0
        # Leaks and power, read from each tray's BMC beside the probe (mctl/health/oob.py, docs/health.md).
        self.oob_settings, self.oob_problem = None, None
        if settings.bmc_checks != "off":
            from mctl.health import oob
            self.oob_settings, self.oob_problem = oob.settings_of(site)
        from mctl.health.boots import BootMemory
        self.boots = BootMemory.load(self.state_dir)     # a reboot between sweeps (tray.boot, gpu.xid)
        # --dry-run keeps its records in memory only, so it never writes the state directory.
        self._dry_state: store.HealthState | None = None
        # The recovery ladder, when the site turned a rung on (docs/health.md "The recovery ladder").
        self.ladder = None
        if settings.ladder.enabled:
            from mctl.health.ladder_run import LadderRunner
            self.ladder = LadderRunner(site, settings)
        # Intents a killed mctl left without a result are reconciled once, on the first sweep that reads
        # the scheduler (docs/health.md, "Action log").
        self._reconciled = False

    # --- discover + check ------------------------------------------------------------------------

    async def _read_scheduler(self):
        if self.scheduler is None:
            return None, None, None
        try:
            async with asyncio.timeout(self.timeout):
                views, states = await self.scheduler.read(deadline=self.timeout)
            return views, states, None
        except SchedulerUnreachable as exc:
            return None, None, str(exc)
        except TimeoutError:
            return None, None, f"{self.scheduler.where} did not answer within the {self.timeout:g}s deadline"

    async def _read_bmcs(self) -> dict[str, Any] | None:
        """host -> mctl.checks.leak.BmcHealth, each BMC within the tray deadline; None: not configured."""
        if self.oob_settings is None and self.oob_problem is None:
            return None
        from mctl.checks.leak import BmcHealth
        from mctl.health import oob

        hosts = list(self.scope.hosts)
        if self.oob_problem:
            return {h.name: BmcHealth(error=f"the inventory's bmc settings: {self.oob_problem}", error_kind="config")
                    for h in hosts}
        # A GB200 BMC answers a GET in 0.22 s on average, 2.9 s at worst (shared/reference/redfish.md): its 7
        # GETs get the tray deadline, but at least BMC_DEADLINE_MIN (at most bmc.deadline_s).
        deadline = max(self.timeout, min(self.oob_settings.deadline_s, BMC_DEADLINE_MIN))
        try:
            async with asyncio.timeout(deadline + 2.0):
                return await asyncio.to_thread(oob.read, hosts, self.oob_settings, deadline)
        except TimeoutError:
            return {h.name: BmcHealth(error=f"no answer within {deadline:g}s", error_kind="timeout")
                    for h in hosts}

    async def _probe(self) -> list[TrayFacts]:
        nonce = secrets.token_hex(8)
        smi_timeout = smi_timeout_for(self.timeout)
        paths = self.settings.disk_paths
        command = probe_command(HEALTH, nonce, smi_timeout=smi_timeout, disk_paths=paths)
        # The deadline covers the whole of each tray's work; a tray that misses it comes back as
        # timeout (the probe hung) or unreachable (no session) and its connection is reopened
        # in the background, so the next sweep is not delayed by it.
        results = await self.pool.run(self.targets, command, deadline=self.timeout)
        return [from_result(HEALTH, r, nonce, smi_timeout=smi_timeout, disk_paths=paths) for r in results]

    def _load_state(self) -> store.HealthState:
        if self.dry_run and self._dry_state is not None:
            return self._dry_state
        return store.load_state(self.state_dir)

    async def sweep(self) -> SweepResult:
        self.sweeps += 1
        started = time.time()
        t0 = time.monotonic()
        (facts_list, (views, states, sched_error), bmcs) = await asyncio.gather(
            self._probe(), self._read_scheduler(), self._read_bmcs())
        state = self._load_state()
        facts: dict[str, TrayFacts] = {}
        for f in facts_list:
            rec = state.records.get(f.host)
            f = self.boots.see(f)
            f = f.without_xids_before(rec.xid_ack if rec else None)
            facts[f.host] = f.with_slurm_node((states or {}).get(f.host))
            if bmcs is not None:
                facts[f.host] = replace(facts[f.host], bmc=bmcs.get(f.host))
        findings: list[Finding] = []
        verdicts: list[TrayVerdict] = []
        per_host: dict[str, list[Finding]] = {}
        for h in self.scope.hosts:
            fs = checks.run_tray(facts[h.name], self.expect[h.name], self.settings)
            per_host[h.name] = fs
        for rack in self.scope.racks:
            trays = [facts[h.name] for h in self.scope.hosts if h.rack == rack]
            for f in checks.run_rack(rack, trays, self.plans.get(rack, {})):
                per_host.setdefault(f.host, []).append(f)
        for h in self.scope.hosts:
            fs = per_host.get(h.name, [])
            verdicts.append(TrayVerdict(h.name, h.rack, facts[h.name].reach, worst(fs), tuple(fs)))
        for fs in per_host.values():
            findings.extend(fs)
        if sched_error:
            findings.append(Finding(Severity.WARN, None, "scheduler.reachable", sched_error,
                                    "drains and resumes are queued until the scheduler answers"))
        elif self.scheduler_problem:
            findings.append(Finding(Severity.WARN, None, "scheduler.reachable",
                                    f"scheduler not read: {self.scheduler_problem}"))
        result = SweepResult(self.sweeps, started, 0.0, facts, sort_findings(findings), verdicts, views,
                             self.scheduler.kind if self.scheduler else None, sched_error,
                             remediate=self.remediate, dry_run=self.dry_run, breaker=state.breaker,
                             records=dict(state.records))
        if self.remediate:
            await self._remediate(result)
        if self.ladder is not None:
            result.findings = sort_findings(result.findings + self.ladder.findings(result.records))
        if not self.dry_run:
            self.boots.save(self.state_dir)
        result.elapsed = time.monotonic() - t0
        return result

    # --- decide + act -----------------------------------------------------------------------------

    async def _remediate(self, result: SweepResult) -> None:
        if self.scheduler is None:
            result.decisions = []
            return
        if self.dry_run:
            state = self._load_state()
            outcome = policy.decide(state.records, result.verdicts, result.nodes, self.settings, state.breaker,
                                    self.sizes, now=time.time())
            self._dry_state = store.HealthState(self.site.name, outcome.records, outcome.breaker)
            result.decisions = outcome.decisions + [d for d, _h in self._leak_power_due(outcome, time.time())]
            if self.ladder is not None:
                result.decisions = result.decisions + self.ladder.dry_run(self, result, self._dry_state)
                outcome.records, outcome.breaker = self._dry_state.records, self._dry_state.breaker
            result.records = outcome.records
            result.breaker = outcome.breaker
            return
        with store.state_lock(self.state_dir):
            state = store.load_state(self.state_dir)
            entries: list[store.ActionEntry] = []
            if not self._reconciled and result.nodes is not None:
                entries += self._reconcile(state, result.nodes)
                self._reconciled = True
            tripped_before = state.breaker.tripped
            now = time.time()
            outcome = policy.decide(state.records, result.verdicts, result.nodes, self.settings, state.breaker,
                                    self.sizes, now=now)
            actions = outcome.actions
            reconciled: list[store.ActionEntry] = []
            if actions:
                # The intents go to the log (fsynced) before scontrol runs: killed in between, the
                # next start finds them without a result and asks the scheduler what happened.
                ids = {d.host: f"{d.host}@{d.at:.3f}:{secrets.token_hex(4)}" for d in actions}
                store.append_actions(self.state_dir, entries + [
                    store.intent_entry(d, who=self.who, intent_id=ids[d.host], scheduler=self.scheduler.where)
                    for d in actions])
                if entries:
                    store.save_state(self.state_dir, state)     # the reconciled records, before acting
                reconciled, entries = entries, []
                applied = await self.scheduler.apply(actions, deadline=self.act_deadline)
                by_host = {v.host: v for v in result.verdicts}
                for r in applied:
                    policy.settle(outcome, r)
                    v = by_host.get(r.decision.host)
                    entries.append(store.result_entry(
                        r, who=self.who, scheduler=self.scheduler.where, intent_id=ids[r.decision.host],
                        findings=[f.to_dict() for f in v.findings if f.severity is not Severity.OK] if v and
                        r.decision.action == DRAIN else None))
            entries += [store.note_entry(n, who=self.who) for n in outcome.notes]
            entries += await self._leak_power_off(outcome, now)
            if outcome.breaker.tripped and not tripped_before:
                entries.append(store.action_entry("breaker-trip", None, outcome.breaker.reason, who=self.who,
                                                  at=outcome.breaker.tripped_at, result="tripped",
                                                  scope=self.settings.breaker_scope))
            state.records = outcome.records
            state.breaker = outcome.breaker
            state.site = self.site.name
            store.append_actions(self.state_dir, entries)
            store.save_state(self.state_dir, state)
            if self.ladder is not None:
                # the recovery ladder (mctl.health.ladder) after the sweep's drains and resumes
                entries += await self.ladder.climb(self, result, state)
                outcome.records, outcome.breaker = state.records, state.breaker
        result.decisions = outcome.decisions
        result.logged = reconciled + entries
        result.records = dict(outcome.records)
        result.breaker = outcome.breaker

    # --- leaks: the power-off after the timeout (mctl/health/leaks.py) -----------------------------

    def _leak_power_due(self, outcome: policy.Outcome, now: float) -> list[tuple[Decision, Any]]:
        """(power-off decision, host) for every tray whose leak timeout passed; notes why one is blocked
        (once per change, in the episode) into outcome.notes."""
        from mctl.health import leaks

        s = self.settings
        hosts = {h.name: h for h in self.scope.hosts}
        out = []
        for name, rec in sorted(outcome.records.items()):
            ep = rec.leak
            if ep is None or ep.get("sent") or name not in hosts:
                continue
            if now < float(ep.get("since", now)) + s.leak_power_off_after_s:
                continue
            why = leaks.power_off_due(ep, drained=rec.drained, breaker_tripped=outcome.breaker.tripped,
                                      enabled=s.leak_power_off, after_s=s.leak_power_off_after_s, now=now)
            if why is None:
                blocked = leaks.blocked(ep, drained=rec.drained, breaker_tripped=outcome.breaker.tripped,
                                        enabled=s.leak_power_off)
                if blocked and ep.get("blocked") != blocked:
                    d = Decision(name, "skip", f"leak: not powered off: {blocked}", reason=rec.reason, rack=rec.rack,
                                 at=now)
                    outcome.decisions.append(d)
                    outcome.notes.append(d)
                    outcome.records[name] = replace(rec, leak={**ep, "blocked": blocked})
                continue
            out.append((Decision(name, leaks.POWER_OFF, why, reason=rec.reason, full=rec.full_reason, rack=rec.rack,
                                 at=now), hosts[name]))
        return out

    async def _leak_power_off(self, outcome: policy.Outcome, now: float) -> list[store.ActionEntry]:
        """Power off, through the BMC, every drained tray whose leak timeout passed: ForceOff sent once."""
        from mctl.health import leaks, oob

        due = self._leak_power_due(outcome, now)
        entries = [store.note_entry(n, who=self.who) for n in outcome.notes if n.why.startswith("leak: not powered")]
        outcome.notes = [n for n in outcome.notes if not n.why.startswith("leak: not powered")]
        if not due:
            return entries
        deadline = max(self.act_deadline, 20.0)
        if self.oob_settings is None:
            results = {h.name: oob.PowerOffResult(h.name, False, False, None,
                                                  f"no BMC settings ({self.oob_problem or 'no bmc section'})")
                       for _d, h in due}
        else:
            results = await asyncio.to_thread(oob.power_off, [h for _d, h in due], self.oob_settings, deadline)
        for d, h in due:
            r = results[h.name]
            rec = outcome.records[h.name]
            ep = rec.leak or {}
            if r.sent or r.ok:
                ep = leaks.sent(ep, at=now, result=r.result, power_state=r.power_state)
            else:                                   # nothing was POSTed: tried again next sweep
                ep = {**ep, "power_off": {"at": now, "result": r.result, "power_state": r.power_state}}
            outcome.records[h.name] = replace(rec, leak=ep)
            outcome.decisions.append(d)
            entries.append(store.action_entry(leaks.POWER_OFF, h.name, d.reason, who=self.who, full=d.full, at=now,
                                              result=r.result, why=d.why, rack=d.rack, power_state=r.power_state,
                                              sent=r.sent))
        return entries

    def _reconcile(self, state: store.HealthState, nodes: dict[str, NodeView]) -> list[store.ActionEntry]:
        """Settle the intents a killed mctl left without a result against the scheduler's view now:
        one action-log line each (the action, `ok` or `failed`, reconciled) and records to match."""
        out = []
        for intent in store.unresolved_intents(self.state_dir):
            host = intent.tray
            if not host or intent.intent not in (DRAIN, RESUME):
                continue
            at = _epoch(intent.time)
            d = Decision(host, intent.intent, intent.why or "", reason=intent.reason, full=intent.full_reason,
                         rack=intent.rack, at=at)
            rec, state.breaker, applied = policy.reconcile(state.records.get(host), state.breaker, d, nodes.get(host))
            if rec is not None:
                state.records[host] = rec
            node = nodes.get(host)
            seen = f"{node.state}, reason {node.reason!r}" if node else "not a node of the scheduler"
            out.append(store.action_entry(
                d.action, host, d.reason, who=self.who, full=d.full, at=at,
                result="ok" if applied else f"failed: not applied (the scheduler shows {seen})",
                why=f"reconciled after an interrupted run ({seen}): {intent.why or d.action}", rack=d.rack, scheduler=self.scheduler.where if self.scheduler else None,
                intent_id=intent.intent_id))
        return out


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()
