"""One health sweep over a site, and (optionally) the responses that follow it.

`Engine.sweep()` runs the sweep (mctl.health.sweep: probe, scheduler and BMC reads, the check
catalogue), then, when remediating, the responders (mctl.health.responders) in their order under
the state lock — drains and resumes, leaks' power-offs, the recovery ladder, isolation — each
acting through the one actuator (mctl.health.actuator). With remediation a tray whose own answer
decides a drain is drained as that answer arrives (the drain responder's early drains), so a
frozen tray's deadline never delays another tray's drain (docs/health.md, "Drains as the answers
arrive"). `mctl health check` runs one sweep with a fresh connection pool; `mctl health watch`
keeps one Engine (and its pool) for days.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mctl.errors import MctlError
from mctl.health import store
from mctl.health.actuator import Actuator
from mctl.health.responders import Context
from mctl.health.responders.drain import DrainResponder, EarlyDrains, scheduler_batch
from mctl.health.responders.escalation import EscalationResponder
from mctl.health.responders.leak import POWER_OFF_DEADLINE_MIN, LeakResponder, power_off_batch
from mctl.health.site_view import Scope, expectations, partition_plan, rack_sizes
from mctl.health.sweep import BMC_DEADLINE_MIN, SweepResult, Sweeper
from mctl.model.findings import sort_findings
from mctl.model.settings import HealthSettings

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.transport import SSHPool

# The scheduler's actions of one sweep get at least this long (drains must not be cut for a short interval).
ACT_DEADLINE_MIN = 5.0


class Engine:
    """The site view a watch keeps for days (trays, targets, expectations, plans, the scheduler adapter, the
    BMC settings, deadlines), one sweep at a time, and the responders after each."""

    def __init__(self, site: "Site", scope: Scope, settings: HealthSettings, state_dir: Path, pool: "SSHPool", *,
                 remediate: bool = False, dry_run: bool = False, timeout: float | None = None,
                 who: str | None = None, interval: float | None = None, bmc_watch: bool = False,
                 fence: Callable[[], int] | None = None):
        from mctl.sched.adapter import adapter_for
        from mctl.transport import targets_for

        self.site = site
        self.scope = scope
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.pool = pool
        self.remediate = remediate
        self.dry_run = dry_run
        self.fence = fence              # the leader lease's check before every act (mctl.health.failover)
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
        # Leaks and power, read from each tray's BMC out of band (mctl/health/oob.py, docs/health.md): the compute
        # trays of the scope and the switch trays of its racks that have a BMC address. `health check` reads them
        # once in its sweep; the watch (bmc_watch) reads them beside its sweeps, on their own cadence.
        self.oob_settings, self.oob_problem = None, None
        self.switch_trays = [h for r in scope.racks if r in site.racks for h in site.racks[r].switches if h.bmc]
        self.bmc_hosts = list(scope.hosts) + self.switch_trays
        # A GB200 BMC answers a GET in 0.22 s on average, 2.9 s at worst (shared/reference/redfish.md): a read gets
        # the tray deadline, but at least BMC_DEADLINE_MIN (at most bmc.deadline_s).
        self.bmc_deadline = self.timeout
        self.bmc_watch = None
        if settings.bmc_checks != "off":
            from mctl.health import oob
            self.oob_settings, self.oob_problem = oob.settings_of(site)
            if self.oob_settings is not None:
                self.bmc_deadline = max(self.timeout, min(self.oob_settings.deadline_s, BMC_DEADLINE_MIN))
            if bmc_watch and self.oob_settings is not None:
                every = oob.leak_interval(settings.leak_interval,
                                          interval if interval is not None else settings.interval)
                power_every = oob.bmc_interval(settings.bmc_interval, every)
                events = settings.bmc_events if settings.bmc_events.enabled else None
                self.bmc_watch = oob.BmcWatch(self.bmc_hosts, self.oob_settings, interval=every,
                                              power_interval=power_every,
                                              stale_after=settings.bmc_stale_after * every,
                                              deadline=self.bmc_deadline, events=events,
                                              subscribed_interval=oob.subscribed_interval(events, every, power_every)
                                              if events is not None else None).start()
        # The switch side (mctl/health/nmx_watch.py): each rack's NMX-M read beside every sweep, within its deadline.
        from mctl.health.nmx_watch import watch_for
        self.nmx_watch = watch_for(site, scope.racks, deadline=self.timeout,
                                   interval=interval if interval is not None else settings.interval)
        from mctl.health.boots import BootMemory
        self.boots = BootMemory.load(self.state_dir)     # a reboot between sweeps (tray.boot, gpu.xid)
        from mctl.health.signals import SignalMemory
        # NVLink error counters as rates, clock-event streaks (nvlink.errors, gpu.clocks)
        self.signals = SignalMemory.load(self.state_dir, settings.nvlink_error_window_s)
        # --dry-run keeps its records in memory only, so it never writes the state directory.
        self._dry_state: store.HealthState | None = None
        # The recovery ladder, when the site turned a rung on (docs/health.md "The recovery ladder").
        self.ladder = None
        if settings.ladder.enabled:
            from mctl.health.responders.ladder import LadderResponder
            self.ladder = LadderResponder(site, settings)
        # Isolating trays drained for a hardware fault from their partition (docs/health.md, D51).
        self.isolator = None
        if settings.isolate:
            from mctl.health.responders.isolation import IsolationResponder
            self.isolator = IsolationResponder(site)
        self._inventory_stamp = _stamp_of(site.file)
        self.sweeper = Sweeper(self)
        # What the watch does about a sweep, in this order (mctl.health.responders): a new responder plugs in here.
        self.escalation = EscalationResponder()
        self.drains = DrainResponder()
        # The degraded-fabric mark (nvl_degraded) on the Slurm trays of a degraded partition (D107).
        self.fabric = None
        if self.nmx_watch is not None:
            from mctl.health.responders.fabric import FabricLimitResponder
            self.fabric = FabricLimitResponder(settings.resume_after_healthy_sweeps)
        self.leaks = LeakResponder()
        # Events out (mctl/health/events.py, docs/events.md): every finding change and every action, from here;
        # a dry run sends nothing anywhere. What the last sweep saw per tray, to tell the changes.
        from mctl.health import events
        self.bus = events.Bus(site.name, []) if dry_run else \
            events.Bus.for_settings(site.name, settings.events, self.state_dir, getattr(site, "root", None))
        self._seen: dict | None = None

    async def sweep(self) -> SweepResult:
        self.sweeps += 1
        if self.isolator is not None:
            self._follow_partitions()
        t0 = time.monotonic()
        before = self._load_state()           # for each tray's XID acknowledgement, read once per sweep
        early = EarlyDrains(self.drains, lambda: self._context(None), self.sweeper.tray_verdict) \
            if self.remediate and not self.dry_run and self.scheduler else None
        try:
            result = await self.sweeper.sweep(self.sweeps, before, on_tray=early.offer if early else None)
            if early is not None:
                await early.close()
        finally:
            if early is not None:
                early.cancel()
        self._finding_events(result)
        state = self._load_state()
        result.breaker, result.records = state.breaker, dict(state.records)
        if self.remediate:
            await self.respond(result, early)
        if self.ladder is not None:
            result.findings = sort_findings(result.findings + self.ladder.findings(result.records))
        if not self.dry_run:
            self.boots.save(self.state_dir)
            self.signals.save(self.state_dir)
        result.elapsed = time.monotonic() - t0
        result.event_counts = self.bus.counts()
        return result

    def _finding_events(self, result: SweepResult) -> None:
        """Each tray whose findings changed since the last sweep (this process's, or the last one's on disk),
        out to the event sinks; what this sweep saw is kept for the next."""
        if not self.bus or self.dry_run:
            return
        from mctl.health import events

        if self._seen is None:
            self._seen = events.load_seen(self.state_dir)
        seen = events.seen_of(result)
        try:
            self.bus.emit(events.finding_events(seen, self._seen, site=self.site.name, who=self.who,
                                                sweep=result.number, at=result.started,
                                                racks={v.host: v.rack for v in result.verdicts}))
        except Exception:  # noqa: BLE001 - a memory file a person edited never breaks a sweep: told afresh
            pass
        self._seen = {**self._seen, **seen}
        try:
            events.save_seen(self.state_dir, self._seen)
        except OSError:
            pass                        # told again after a restart: at-least-once, never a failed sweep

    def close(self) -> None:
        """Stop what runs beside the sweeps (the BMC reads of a watch) and close its connections; the event
        sinks get their deadline to deliver what is queued."""
        if self.bmc_watch is not None:
            self.bmc_watch.close()
            self.bmc_watch = None
        self.bus.close()

    def _load_state(self) -> store.HealthState:
        if self.dry_run and self._dry_state is not None:
            return self._dry_state
        return store.load_state(self.state_dir)

    def _context(self, result: SweepResult | None) -> Context:
        hosts = {h.name: h for r in self.site.racks.values() for h in (*r.compute, *r.switches)}
        actuator = Actuator(self.state_dir, self.who, {
            "scheduler": scheduler_batch(self.scheduler, self.act_deadline),
            "power-off": power_off_batch(lambda: hosts, self.oob_settings, self.oob_problem,
                                         max(self.act_deadline, POWER_OFF_DEADLINE_MIN)),
            **({"fabric": self.fabric.batch(self.scheduler, self.act_deadline)} if self.fabric is not None else {})},
            emit=self.bus.actions, fence=self.fence)
        return Context(self.site, self.scope, self.settings, self.sizes, self.state_dir, self.who, actuator,
                       result, time.time(), self.pool, self.targets, self.scheduler, self.oob_settings,
                       self.oob_problem, self.partitions_changed)

    def responders(self) -> list:
        """What mctl does about a sweep, in this order: a rack's hold first (rack escalation: its trays are then
        the hold's, not the drains'), drains and resumes (a critical leak's drain too), then the leaks'
        power-offs, the recovery ladder, isolation, the degraded-fabric mark."""
        return [r for r in (self.escalation, self.drains, self.leaks, self.ladder, self.isolator, self.fabric)
                if r is not None]

    async def respond(self, result: SweepResult, early: EarlyDrains | None = None) -> None:
        """What mctl does about the sweep: every responder, in order, under the state lock."""
        if self.scheduler is None:
            result.decisions = []
            return
        ctx = self._context(result)
        if self.dry_run:
            state = self._load_state()
            decisions = []
            for r in self.responders():
                decisions += r.dry_run(ctx, state)
            self._dry_state = store.HealthState(self.site.name, state.records, state.breaker,
                                                escalations=state.escalations, rack_watch=state.rack_watch)
            result.decisions, result.records, result.breaker = decisions, state.records, state.breaker
            return
        self.drains.early = early
        lines = []
        with store.state_lock(self.state_dir):
            state = store.load_state(self.state_dir)
            for r in self.responders():
                lines += await r.respond(ctx, state)
            store.save_state(self.state_dir, state)
        result.decisions = (early.decisions if early else []) + ctx.decisions
        result.logged = (early.logged if early else []) + lines
        result.records = dict(state.records)
        result.breaker = state.breaker

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


def _stamp_of(path) -> int | None:
    try:
        return Path(path).stat().st_mtime_ns
    except (OSError, TypeError):
        return None
