"""One health sweep over a site, and (optionally) the remediation that follows it.

A sweep sends the probe to every tray and asks the scheduler for its node
states at the same time (one round trip per tray and one to the controller),
runs the check catalogue, then, when remediating, lets the policy decide and
the scheduler adapter act. When it acts, a tray whose own answer decides a
drain is drained as that answer arrives (_EarlyDrains), so a frozen tray's
deadline never delays another tray's drain; everything else is decided once
every tray has answered (docs/health.md, "Drains as the answers arrive").
`mctl health check` runs one sweep with a fresh
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
from mctl.health import breaker as breakerlib
from mctl.health.breaker import BreakerState
from mctl.model.tray import TrayFacts, smi_timeout_for
from mctl.health.record import PowerOffNote, TrayRecord, TrayVerdict
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
    records: dict[str, TrayRecord] = field(default_factory=dict)

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
        # Isolating trays drained for a hardware fault from their partition (docs/health.md, D51).
        self.isolator = None
        if settings.isolate:
            from mctl.health.isolate_run import IsolationRunner
            self.isolator = IsolationRunner(site)
        self._inventory_stamp = _stamp_of(site.file)
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

    async def _probe(self, on_facts=None) -> list[TrayFacts]:
        """Every tray's facts, in scope order; *on_facts* is called with each tray's facts as its answer
        arrives (the watch judges a tray then, not when the slowest tray has answered)."""
        nonce = secrets.token_hex(8)
        smi_timeout = smi_timeout_for(self.timeout)
        paths = self.settings.disk_paths
        command = probe_command(HEALTH, nonce, smi_timeout=smi_timeout, disk_paths=paths)
        seen: dict[str, TrayFacts] = {}

        def arrived(r) -> None:
            f = from_result(HEALTH, r, nonce, smi_timeout=smi_timeout, disk_paths=paths)
            seen[f.host] = f
            if on_facts is not None:
                on_facts(f)

        # The deadline covers the whole of each tray's work; a tray that misses it comes back as
        # timeout (the probe hung) or unreachable (no session) and its connection is reopened
        # in the background, so the next sweep is not delayed by it.
        results = await self.pool.run(self.targets, command, deadline=self.timeout, on_result=arrived)
        for r in results:               # a pool that does not call on_result (stand-ins) still gives every tray
            if r.host not in seen:
                arrived(r)
        return [seen[r.host] for r in results]

    def _load_state(self) -> store.HealthState:
        if self.dry_run and self._dry_state is not None:
            return self._dry_state
        return store.load_state(self.state_dir)

    async def sweep(self) -> SweepResult:
        self.sweeps += 1
        if self.isolator is not None:
            self._follow_partitions()
        started = time.time()
        t0 = time.monotonic()
        before = self._load_state()           # for each tray's XID acknowledgement, read once per sweep
        seen: dict[str, TrayFacts] = {}
        read = asyncio.ensure_future(self._read_scheduler())
        bmc_read = asyncio.ensure_future(self._read_bmcs())     # out of band, beside the SSH probes
        early = _EarlyDrains(self, read, seen) if self.remediate and not self.dry_run and self.scheduler else None

        def arrived(f: TrayFacts) -> None:
            # Once per tray and sweep (BootMemory remembers what it saw), as the tray's answer arrives.
            rec = before.records.get(f.host)
            seen[f.host] = self.boots.see(f).without_xids_before(rec.xid_ack if rec else None)
            if early is not None and f.reached:
                early.offer(f.host)

        try:
            facts_list = await self._probe(arrived)
            views, states, sched_error = await read
            if early is not None:
                await early.close()
            bmcs = await bmc_read
        finally:
            read.cancel()
            bmc_read.cancel()
            if early is not None:
                early.cancel()
        state = self._load_state()
        facts: dict[str, TrayFacts] = {}
        for f in facts_list:
            facts[f.host] = seen[f.host].with_slurm_node((states or {}).get(f.host))
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
            await self._remediate(result, early)
        if self.ladder is not None:
            result.findings = sort_findings(result.findings + self.ladder.findings(result.records))
        if not self.dry_run:
            self.boots.save(self.state_dir)
        result.elapsed = time.monotonic() - t0
        return result

    # --- decide + act -----------------------------------------------------------------------------

    def _tray_verdict(self, facts: TrayFacts) -> TrayVerdict:
        """One tray's verdict from its own checks (without the rack-wide ones, which need every tray)."""
        host = self.expect[facts.host]
        fs = checks.run_tray(facts, host, self.settings)
        rack = next(h.rack for h in self.scope.hosts if h.name == facts.host)
        return TrayVerdict(facts.host, rack, facts.reach, worst(fs), tuple(fs))

    async def _drain_early(self, hosts: list[str], facts: dict[str, TrayFacts], nodes: dict[str, NodeView],
                           states: dict, early: "_EarlyDrains") -> None:
        """Drain now the trays among *hosts* whose own answer already decides a drain (docs/health.md,
        "Drains as the answers arrive"); every other tray waits for the end of the sweep.

        A tray is drained here only when the policy, on its record and its own findings, wants a
        drain and the circuit breaker admits it, threaded through the same breaker state as the
        end-of-sweep pass; one the breaker refuses is left to that pass (which skips it with the
        breaker's reason, or trips it), so no sweep drains more than deciding all trays at once
        would. Intents are fsynced before scontrol, as at the end of the sweep."""
        with store.state_lock(self.state_dir):
            state = store.load_state(self.state_dir)
            reconciled: list[store.ActionEntry] = []
            if not self._reconciled:
                reconciled = self._reconcile(state, nodes)
                self._reconciled = True
            now = time.time()
            breaker = state.breaker if state.breaker.tripped else state.breaker.pruned(
                now, self.settings.breaker_window_s)
            records = dict(state.records)
            actions: list[Decision] = []
            decisions: list[Decision] = []
            notes: list[Decision] = []
            verdicts: dict[str, TrayVerdict] = {}
            for host in sorted(hosts):
                v = self._tray_verdict(facts[host].with_slurm_node(states.get(host)))
                prev = records.get(host) or TrayRecord(host, v.rack)
                step = policy.decide_tray(prev, v, nodes.get(host), self.settings, answered=True, now=now)
                if step.want is None:
                    continue
                adm = breakerlib.admit(breaker, host, v.rack, self.sizes, max_share=self.settings.breaker_max_share,
                                       window_s=self.settings.breaker_window_s, scope=self.settings.breaker_scope,
                                       now=now)
                if not adm.allowed:
                    continue        # not tripped here: the end of the sweep decides it with every other tray
                breaker = adm.state
                reason, full = step.want
                d = Decision(host, DRAIN, adm.why, reason=reason, full=full, rack=v.rack, at=now)
                early.before[host] = prev
                verdicts[host] = v
                records[host] = replace(step.record, drained=True, reason=reason, full_reason=full, drained_at=now,
                                        note=None, healthy_streak=0)
                decisions += step.decisions + [d]
                notes += step.notes
                actions.append(d)
            if not actions:
                if reconciled:
                    store.append_actions(self.state_dir, reconciled)
                    store.save_state(self.state_dir, state)
                    early.logged += reconciled
                return
            ids = {d.host: f"{d.host}@{d.at:.3f}:{secrets.token_hex(4)}" for d in actions}
            store.append_actions(self.state_dir, reconciled + [
                store.intent_entry(d, who=self.who, intent_id=ids[d.host], scheduler=self.scheduler.where)
                for d in actions])
            if reconciled:
                store.save_state(self.state_dir, state)         # the reconciled records, before acting
            outcome = policy.Outcome(records, decisions, breaker, notes)
            applied = await self.scheduler.apply(actions, deadline=self.act_deadline)
            entries: list[store.ActionEntry] = []
            for r in applied:
                policy.settle(outcome, r)
                v = verdicts[r.decision.host]
                entries.append(store.result_entry(
                    r, who=self.who, scheduler=self.scheduler.where, intent_id=ids[r.decision.host],
                    findings=[f.to_dict() for f in v.findings if f.severity is not Severity.OK]))
            entries += [store.note_entry(n, who=self.who) for n in notes]
            state.records = outcome.records
            state.breaker = outcome.breaker
            state.site = self.site.name
            store.append_actions(self.state_dir, entries)
            store.save_state(self.state_dir, state)
            early.decisions += decisions
            early.logged += reconciled + entries

    async def _remediate(self, result: SweepResult, early: "_EarlyDrains | None" = None) -> None:
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
            if self.isolator is not None:
                result.decisions = result.decisions + self.isolator.dry_run(self, result, self._dry_state)
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
            acted = early.before if early is not None else {}
            outcome = policy.decide(state.records, [v for v in result.verdicts if v.host not in acted],
                                    result.nodes, self.settings, state.breaker, self.sizes, now=now)
            for v in result.verdicts:
                if v.host in acted:
                    # Drained earlier in this sweep: its record advances once, on the whole verdict (the
                    # rack-wide checks included), and keeps what the drain made of it.
                    step = policy.decide_tray(acted[v.host], v, (result.nodes or {}).get(v.host), self.settings,
                                              answered=result.nodes is not None, now=now)
                    outcome.records[v.host] = _with_drain_of(step.record, state.records[v.host])
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
            if self.isolator is not None and result.nodes is not None:
                # isolating trays drained for a hardware fault (mctl.health.isolate), after the ladder
                entries += await self.isolator.run(self, result, state)
                outcome.records, outcome.breaker = state.records, state.breaker
        result.decisions = (early.decisions if early else []) + outcome.decisions
        result.logged = (early.logged if early else []) + reconciled + entries
        result.records = dict(outcome.records)
        result.breaker = outcome.breaker

    def _follow_partitions(self) -> None:
        """With isolation on, a person restores trays while the watch runs (`mctl partition restore`): when
        the inventory file changed, its racks' partitions are the plan the checks judge by from now on.
        An inventory that does not load keeps the plan the watch has (the next change is read again)."""
        from mctl.errors import MctlError
        from mctl.inventory import load_site

        stamp = _stamp_of(self.site.file)
        if stamp is None or stamp == self._inventory_stamp:
            return
        self._inventory_stamp = stamp
        try:
            fresh = load_site(self.site.file)
        except MctlError:
            return
        for name, r in fresh.racks.items():
            mine = self.site.racks.get(name)
            if mine is not None and mine.partitions != r.partitions:
                self.partitions_changed(name, r.partitions)

    def partitions_changed(self, rack: str, after) -> None:
        """An isolation changed *rack*'s partitions (and recorded them in the inventory): the checks judge the
        cliques and IMEX against the new plan from now on (the Site's racks are shared with the watch)."""
        r = self.site.racks.get(rack)
        if r is None:
            return
        self.site.racks[rack] = replace(r, partitions=tuple(after))
        self.plans = {name: partition_plan(rk) for name, rk in self.site.racks.items()}
        self.expect = expectations(self.site, list(self.scope.hosts))

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
            if ep is None or ep.sent or name not in hosts:
                continue
            if now < ep.since + s.leak_power_off_after_s:
                continue
            why = leaks.power_off_due(ep, drained=rec.drained, breaker_tripped=outcome.breaker.tripped,
                                      enabled=s.leak_power_off, after_s=s.leak_power_off_after_s, now=now)
            if why is None:
                blocked = leaks.blocked(ep, drained=rec.drained, breaker_tripped=outcome.breaker.tripped,
                                        enabled=s.leak_power_off)
                if blocked and ep.blocked != blocked:
                    d = Decision(name, "skip", f"leak: not powered off: {blocked}", reason=rec.reason, rack=rec.rack,
                                 at=now)
                    outcome.decisions.append(d)
                    outcome.notes.append(d)
                    outcome.records[name] = replace(rec, leak=replace(ep, blocked=blocked))
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
            ep = rec.leak
            if ep is None:
                continue
            if r.sent or r.ok:
                ep = leaks.sent(ep, at=now, result=r.result, power_state=r.power_state)
            else:                                   # nothing was POSTed: tried again next sweep
                ep = replace(ep, power_off=PowerOffNote(now, r.result, r.power_state))
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


def _stamp_of(path) -> int | None:
    try:
        return Path(path).stat().st_mtime_ns
    except (OSError, TypeError):
        return None


class _EarlyDrains:
    """The drains of one sweep that are decided as the trays' answers arrive (watch with remediation).

    One task takes the trays offered since its last batch, once the scheduler's view is in, and
    drains those whose own answer decides it (Engine._drain_early); batches follow each other, so
    the state lock is taken by one at a time. close() lets the batch in progress finish and leaves
    the trays not taken yet to the end of the sweep."""

    def __init__(self, engine: Engine, read: "asyncio.Future", facts: dict[str, TrayFacts]):
        self.engine = engine
        self.read = read
        self.facts = facts
        self.offered: list[str] = []
        self.wake = asyncio.Event()
        self.closed = False
        self.before: dict[str, TrayRecord] = {}      # tray drained early -> its record before this sweep
        self.decisions: list[Decision] = []
        self.logged: list[store.ActionEntry] = []
        self.task = asyncio.ensure_future(self._run())

    def offer(self, host: str) -> None:
        self.offered.append(host)
        self.wake.set()

    async def _run(self) -> None:
        views, states, error = await asyncio.shield(self.read)
        if views is None or error:
            return              # the scheduler did not answer: the end of the sweep queues the actions
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.closed:
                return
            batch, self.offered = self.offered, []
            if batch:
                await self.engine._drain_early(batch, self.facts, views, states or {}, self)

    async def close(self) -> None:
        self.closed = True
        self.wake.set()
        await self.task

    def cancel(self) -> None:
        """Stop the task if the sweep ends another way (it failed, or a second Ctrl-C cancelled it)."""
        if not self.task.done():
            self.task.cancel()
        elif not self.task.cancelled():
            self.task.exception()       # retrieved: the sweep's own error is the one reported


def _with_drain_of(advanced: TrayRecord, drained: TrayRecord) -> TrayRecord:
    """*advanced* (this sweep's record from the whole verdict) with what an early drain made of the tray."""
    return replace(advanced, drained=drained.drained, reason=drained.reason, full_reason=drained.full_reason,
                   drained_at=drained.drained_at, pending=drained.pending, note=drained.note,
                   healthy_streak=drained.healthy_streak)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()
