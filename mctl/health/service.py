"""Health as service functions the CLI calls: one sweep, mctl's drains, resume by hand, the breaker."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mctl.errors import EnvironmentProblem, PartialFailure, UsageError
from mctl.health import events, store
from mctl.health.breaker import reset as breaker_reset_state
from mctl.health.record import TrayRecord
from mctl.health.site_view import resolve_scope, settings_of
from mctl.model.drain import RESUME, Decision, SchedulerUnreachable, resume_refusal

if TYPE_CHECKING:
    from mctl.health.sweep import SweepResult
    from mctl.model.site import Site


def run_check(site: "Site", expr: str | None, state_dir: Path, *, remediate: bool = False, dry_run: bool = False,
              timeout: float | None = None) -> "SweepResult":
    """One sweep; with remediate, one round of the policy too (under the watch lock unless dry-run)."""
    from mctl.health.engine import Engine
    from mctl.transport import SSHConfig, SSHPool

    scope = resolve_scope(site, expr)
    settings = settings_of(site)
    if remediate and site.scheduler is None:
        raise UsageError("--remediate needs a scheduler to drain through; the inventory names none",
                         hint="add a scheduler: section (slurm or k8s) to mctl.yml")

    async def main() -> "SweepResult":
        # a one-shot sweep: each tray's deadline from its slot (D124); the watch's sweeps end within the interval
        async with SSHPool(SSHConfig.from_site(site), waves=True) as pool:
            engine = Engine(site, scope, settings, state_dir, pool, remediate=remediate, dry_run=dry_run,
                            timeout=timeout)
            try:
                return await engine.sweep()
            finally:
                await asyncio.to_thread(engine.close)      # the event sinks flush, within their deadline

    if remediate and not dry_run:
        with store.watch_lock(state_dir, "mctl health check --remediate"):
            store.load_state(state_dir)         # a damaged state file is named before any tray is asked
            return asyncio.run(main())
    return asyncio.run(main())


# --- mctl's drains ---------------------------------------------------------------------------------

@dataclass
class DrainRow:
    host: str
    rack: str | None
    state: str | None
    reason: str | None
    owner: str                      # this-mctl | mctl (node check or another watch) | record-only
    drained_at: float | None = None
    full_reason: str | None = None
    healthy_streak: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "rack": self.rack, "state": self.state, "reason": self.reason,
                "owner": self.owner, "drained_at": self.drained_at, "full_reason": self.full_reason,
                "healthy_streak": self.healthy_streak}


@dataclass
class DrainReport:
    rows: list[DrainRow]
    scheduler_error: str | None = None
    breaker: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] | None = None          # the site's safety budget (budget_summary), None: not kept here

    def to_dict(self) -> dict[str, Any]:
        out = {"drains": [r.to_dict() for r in self.rows], "scheduler_error": self.scheduler_error,
               "breaker": self.breaker}
        if self.budget is not None:
            out["budget"] = self.budget
        return out


def budget_summary(site: "Site", view) -> dict[str, Any]:
    """The site's safety budget: per rack and for the site the limit and the trays holding its grants,
    whether it is tripped and why (*view*: mctl.model.budget.BudgetView as the scheduler holds it)."""
    from mctl.sched.slurm.budget import site_caps

    b = site.safety.budget
    racks = {h.name: h.rack for h in site.compute_trays()}
    held = view.held_by(racks)
    per_rack = {name: len(r.compute) for name, r in site.racks.items()}
    return {"tripped": view.tripped, "tripped_at": view.tripped_at,
            "site": {"limit": b.site_limit(sum(per_rack.values())), "held": sorted(view.grants)},
            "racks": {name: {"limit": b.rack_limit(n), "held": held.get(name, [])} for name, n in per_rack.items()},
            "grants": view.to_dict()["grants"], "drift": view.drift(site_caps(site))}


def _on_scheduler(site: "Site", names: list[str], work):
    """Run `work(adapter)` (async) against the site's scheduler adapter, with a pool for Slurm's SSH."""
    from mctl.sched.adapter import adapter_for
    from mctl.transport import SSHConfig, SSHPool

    if site.scheduler is None:
        raise UsageError("mctl's drains live in the scheduler; the inventory names none",
                         hint="add a scheduler: section (slurm or k8s) to mctl.yml")

    async def main():
        async with SSHPool(SSHConfig.from_site(site)) as pool:
            return await work(adapter_for(site, pool, names, store.actor()))

    return asyncio.run(main())


def _read_nodes(site: "Site", names: list[str]):
    """(views, states, the safety budget's view or None) from the site's scheduler."""
    async def read(adapter):
        views, states = await adapter.read()
        return views, states, getattr(adapter, "budget", None)

    return _on_scheduler(site, names, read)


def list_drains(site: "Site", state_dir: Path) -> DrainReport:
    state = store.load_state(state_dir)
    racks = {h.name: h.rack for h in site.compute_trays()}
    budget = None
    try:
        views, _, budget = _read_nodes(site, list(racks))
        error = None
    except SchedulerUnreachable as exc:
        views, error = None, str(exc)
    rows: list[DrainRow] = []
    seen = set()
    for host, rec in sorted(state.records.items()):
        if rec.drained:
            node = (views or {}).get(host)
            rows.append(DrainRow(host, rec.rack, node.state if node else None, node.reason if node else rec.reason,
                                 "this-mctl" if views is None or (node and node.mctl_drain) else "record-only",
                                 rec.drained_at, rec.full_reason, rec.healthy_streak))
            seen.add(host)
    from mctl.sched.slurm.holds import ESCALATION

    for host, node in sorted((views or {}).items()):
        if host not in seen and node.mctl_drain:
            held = racks.get(host) in state.escalations and (node.reason or "").startswith(ESCALATION.prefix)
            rows.append(DrainRow(host, racks.get(host), node.state, node.reason,
                                 "rack escalation (this mctl)" if held else "mctl (node check or another watch)"))
    return DrainReport(rows, error, state.breaker.to_dict(), budget_summary(site, budget) if budget else None)


# --- resume by hand --------------------------------------------------------------------------------

@dataclass
class ResumeRow:
    host: str
    result: str                     # resumed | would-resume | skipped | refused | failed
    detail: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "result": self.result, "detail": self.detail, "reason": self.reason}


def resume_by_hand(site: "Site", expr: str, state_dir: Path, *, dry_run: bool = False) -> list[ResumeRow]:
    """Resume trays mctl drained (any `mctl:` reason); refuses others' drains and down nodes.

    Also records the time: XIDs logged before it no longer count, since an operator dealt with them.
    """
    scope = resolve_scope(site, expr)
    try:
        views, _, _ = _read_nodes(site, scope.names)
    except SchedulerUnreachable as exc:
        raise EnvironmentProblem(f"cannot resume: {exc}", hint="try again once slurmctld answers") from None
    rows: list[ResumeRow] = []
    todo: list[Decision] = []
    now = time.time()
    # The watch's guards (mctl.model.drain.resume_refusal); the scheduler re-checks them right before acting.
    words = {"unknown": ("refused", "not a node of the scheduler"),
             "down": ("refused", "node is {v.state}; mctl never touches down nodes"),
             "not-drained": ("skipped", "not drained ({v.state})"),
             "not-ours": ("refused", "drained by someone else: {v.reason!r}; lift it with the scheduler's own tools "
                                     "if that is what you mean")}
    for host in scope.names:
        node = views.get(host)
        refusal = resume_refusal(node)
        if refusal is not None:
            result, detail = words[refusal.kind]
            rows.append(ResumeRow(host, result, detail.format(v=node),
                                  node.reason if refusal.kind in ("down", "not-ours") else None))
        else:
            todo.append(Decision(host, RESUME, "resumed by hand", reason=node.reason,
                                 rack=(site.host(host).rack if site.host(host) else None), at=now))
    if dry_run or not todo:
        rows += [ResumeRow(d.host, "would-resume", "dry run" if dry_run else "", d.reason) for d in todo]
        return _ordered(rows, scope.names)

    async def apply(adapter):
        return await adapter.apply(todo)

    send = events.outbox(site, state_dir)         # the event sinks (a bad headers file stops it here)
    who = store.actor()
    with store.state_lock(state_dir):
        results = _on_scheduler(site, scope.names, apply)
        state = store.load_state(state_dir)
        entries = []
        for r in results:
            d = r.decision
            if r.ok:
                rec = state.records.get(d.host) or TrayRecord(d.host, d.rack)
                # a person resumed it: a recovery in flight, or a mark for repair, ends here (mctl.health.ladder)
                state.records[d.host] = rec.resumed_by_mctl(now, xid_ack=now, note=None, bad_streak=0, ladder=None)
                rows.append(ResumeRow(d.host, "resumed", "", d.reason))
            else:
                rows.append(ResumeRow(d.host, "refused" if r.refused else "failed", r.error or "", d.reason))
            entries.append(store.action_entry("resume", d.host, d.reason, who=who, at=d.at, manual=True,
                                              result="ok" if r.ok else f"failed: {r.error}"))
        store.append_actions(state_dir, entries)
        store.save_state(state_dir, state)
    send(entries)
    failed = [r for r in rows if r.result == "failed"]
    if failed and len(failed) < len(rows):
        raise PartialFailure(f"{len(failed)} of {len(rows)} trays not resumed: "
                             + "; ".join(f"{r.host}: {r.detail}" for r in failed[:4]),
                             hint="see 'mctl health drains'")
    return _ordered(rows, scope.names)


def _ordered(rows: list[ResumeRow], names: list[str]) -> list[ResumeRow]:
    order = {n: i for i, n in enumerate(names)}
    return sorted(rows, key=lambda r: order.get(r.host, 0))


# --- breaker ----------------------------------------------------------------------------------------

def breaker_status(state_dir: Path, site: "Site") -> dict[str, Any]:
    """The watch's circuit breaker, and the site's safety budget as the scheduler keeps it."""
    state = store.load_state(state_dir)           # a damaged state file is named before the scheduler is asked
    settings = settings_of(site)
    now = time.time()
    recent = state.breaker.recent(now, settings.breaker_window_s)
    out = {**state.breaker.to_dict(), "recent_drains": len(recent), "max_drained_share": settings.breaker_max_share,
           "window_s": settings.breaker_window_s, "scope": settings.breaker_scope}
    out["budget"], out["budget_error"] = _budget_of(site)
    return out


def _budget_of(site: "Site") -> tuple[dict[str, Any] | None, str | None]:
    """(budget_summary, None), or (None, why it was not read); (None, None) where no scheduler keeps one."""
    from mctl.errors import MctlError

    if site.scheduler is None or site.scheduler.type != "slurm":
        return None, None
    try:
        _, _, view = _read_nodes(site, [h.name for h in site.compute_trays()])
    except SchedulerUnreachable as exc:
        return None, str(exc)
    except MctlError as exc:                   # no SSH key here, say: the breaker is still the state's
        return None, exc.message
    return (budget_summary(site, view) if view is not None else None), None


def breaker_reset(state_dir: Path, *, dry_run: bool = False, site: "Site | None" = None) -> dict[str, Any]:
    """Close the watch's circuit breaker and lift the site's safety budget's trip (its grants stay: they are
    trays still out of service). Both are a person's call, logged."""
    store.load_state(state_dir)                   # a damaged state file is named before the scheduler is asked
    budget, budget_error = _budget_of(site) if site is not None else (None, None)
    budget_tripped = budget.get("tripped") if budget else None
    with store.state_lock(state_dir):
        state = store.load_state(state_dir)
        before = state.breaker
        out = {"was_tripped": before.tripped, "reason": before.reason, "dry_run": dry_run,
               "budget_was_tripped": budget_tripped, "budget_error": budget_error}
        if dry_run:
            return out
        send = events.outbox(site, state_dir) if site is not None else (lambda lines: None)
        state.breaker = breaker_reset_state(before)
        lines = [store.action_entry("breaker-reset", None, before.reason, who=store.actor(), result="ok",
                                    was_tripped=before.tripped, cleared_drains=len(before.drains))]
        if budget_tripped:
            result = _lift_budget_trip(site)
            lines.append(store.action_entry("budget-reset", None, None, who=store.actor(), result=result,
                                            why=f"a person lifted the trip ({budget_tripped})"))
            out["budget_reset"] = result
        store.append_actions(state_dir, lines)
        store.save_state(state_dir, state)
    send(lines)
    return out


def _lift_budget_trip(site: "Site") -> str:
    from mctl.sched.slurm.budget import reset_script
    from mctl.sched.slurm.control import run_on_controller

    r = run_on_controller(site, reset_script(), timeout=30.0, deadline=40.0)
    return "ok" if r.status.reached and r.ok else f"failed: {r.summary()}"


def evidence_on_demand(site: "Site", target: str | None, state_dir: Path, *, reason: str, deadline_s: float,
                       max_bytes: int, dry_run: bool = False, who: str | None = None) -> dict:
    """`mctl health evidence`: a bundle per tray (mctl.health.evidence), the index and the action log."""
    from mctl.health import evidence
    from mctl.health.site_view import resolve_scope

    evidence.check_limits(deadline_s, max_bytes)
    evidence.check_reason(reason)
    hosts = list(resolve_scope(site, target).hosts)
    if dry_run:
        return {"dry_run": True, "bundles": evidence.plan(hosts, state_dir, reason=reason, deadline_s=deadline_s,
                                                          max_bytes=max_bytes)}
    send = events.outbox(site, state_dir)
    bundles = evidence.collect(site, hosts, state_dir, reason=reason, deadline_s=deadline_s, max_bytes=max_bytes)
    lines = evidence.log_entries(bundles, state_dir, who=who or store.actor())
    store.append_actions(state_dir, lines)
    send(lines)
    return {"dry_run": False, "index": str(evidence.index_path(state_dir)),
            "bundles": [b.to_dict(state_dir) for b in bundles]}


def catalogue() -> list[dict]:
    """`mctl health catalogue`: every check id with its severity, purposes, source, thresholds and lab fault."""
    from mctl.checks import catalogue as cat

    return [cat.to_dict(c) for c in cat.entries()]


# ------------------------------------------------------------------ rack escalation (mctl.health.escalation)

def escalation_status(site: "Site", state_dir: Path) -> dict[str, Any]:
    """Every rack held by escalation (its cause, failed trays, what the hold did), and every rack whose trays
    are failing without a hold yet (their count against the rule's threshold)."""
    s = settings_of(site).escalation
    state = store.load_state(state_dir)
    held = {r: h.to_dict() for r, h in sorted(state.escalations.items())}
    watching = {}
    for r, w in sorted(state.rack_watch.items()):
        if r in state.escalations or r not in site.racks:
            continue
        watching[r] = {"failing": sorted(w.failing), "compute_trays": len(site.racks[r].compute),
                       "switch_trays_critical": sorted(w.switch), "lifted_at": w.lifted_at}
    return {"enabled": s.enabled, "rack_share": s.rack_share, "window_s": s.window_s, "min_trays": s.min_trays,
            "on_switch_tray": s.on_switch_tray, "count_unreachable": s.count_unreachable,
            "held": held, "watching": watching}


def escalation_lift(site: "Site", rack: str, state_dir: Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Lift rack escalation's hold on *rack*: every tray still holding its reason is resumed (only while the
    reason is still the escalation's; its grant of the safety budget goes back; Kubernetes: mctl's rack taint
    removed from the nodes that carry it, nothing else), the hold leaves the state,
    and the failures seen so far never escalate the rack again. Idempotent: a rack not held lifts nothing;
    trays holding the reason in Slurm without a hold in the state (a state moved aside) are lifted too.
    PartialFailure (exit 3) when a tray could not be resumed: the hold stays, a second lift tries again."""
    from mctl.health.escalation import LIFT, RackWatch
    from mctl.model.site import fold
    from mctl.sched.slurm import drain as sd
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import controller_run

    if rack not in site.racks:
        raise UsageError(f"no rack {rack!r} in the inventory", hint=f"racks: {', '.join(sorted(site.racks))}")
    if site.scheduler is None or site.scheduler.type not in ("slurm", "k8s"):
        raise UsageError("rack escalation holds trays in Slurm or Kubernetes, and this site has neither",
                         hint="see docs/health.md, \"Rack escalation\"")
    trays = [h.name for h in site.racks[rack].compute]
    store.load_state(state_dir)                   # a damaged state file is named before the scheduler is asked
    if site.scheduler.type == "k8s":
        from mctl.sched.k8s.cordon import k8s_adapter

        adapter = k8s_adapter(site, trays, store.actor())
        try:
            holding = adapter.rack_holds(trays)
        except SchedulerUnreachable as exc:
            raise EnvironmentProblem(f"the Kubernetes API did not answer: {exc}") from None
        states: dict = {}

        def release(names):
            try:
                return adapter.lift_rack(names)[1]
            except SchedulerUnreachable as exc:
                return {t: f"the Kubernetes API did not answer: {exc}" for t in names}
    else:
        _, states = sd.read_nodes(controller_run(site, sd.show_node_command(trays)).stdout)
        holding = [t for t in trays if t in states and holds.ESCALATION.holds(states[t])]

        def release(names):
            return holds.release(site, names, holds.ESCALATION)
    with store.state_lock(state_dir):
        state = store.load_state(state_dir)
        hold = state.escalations.get(rack)
        out: dict[str, Any] = {"rack": rack, "dry_run": dry_run, "held": hold.to_dict() if hold else None,
                               "trays": holding, "lifted": [], "left": {}}
        if dry_run or (hold is None and not holding):
            out["result"] = "not held" if hold is None and not holding else "would lift"
            return out
        left = release(holding) if holding else {}
        lifted = [t for t in holding if t not in left]
        now = time.time()
        for t in lifted + [t for t in trays if states and (t not in states or not states[t].drained)]:
            rec = state.records.get(t)
            if rec is not None and rec.drained and (rec.reason or "").startswith(holds.ESCALATION.prefix):
                state.records[t] = rec.released(note=None)
        if not left:
            state.escalations.pop(rack, None)
            seen = state.rack_watch.get(rack) or RackWatch()
            state.rack_watch[rack] = RackWatch(seen.failing, seen.switch, lifted_at=now)   # those never count again
        result = "ok" if not left else f"partial: {fold(sorted(left))} not lifted"
        why = (f"a person lifted the rack hold ({hold.cause})" if hold is not None
               else "a person lifted the rack hold (none in the state; the scheduler still had it)")
        line = store.action_entry(LIFT, None, hold.reason if hold else None, who=store.actor(), result=result,
                                  why=why, rack=rack, trays=lifted, left=left)
        store.append_actions(state_dir, [line])
        store.save_state(state_dir, state)
    events.outbox(site, state_dir)([line])
    out.update(lifted=lifted, left=left, result=result)
    if left:
        raise PartialFailure(f"rack {rack}: {fold(sorted(left))} not lifted: {'; '.join(sorted(set(left.values())))}",
                             hint=f"run 'mctl health escalation lift {rack}' again once the controller answers")
    return out
