"""Partitions and IMEX as service functions: what `mctl partition`, `mctl imex` and `mctl rack bring-up` share.

One path for every caller: plan against what NMX-M or the trays hold now, show
the plan through a callback (the CLI prints it, bring-up journals it), then
apply. Nothing here prints, and nothing here takes the rack lock: the caller
holds it (the CLI per command, bring-up for the whole run), because an fcntl
lock taken twice by one process refuses itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from mctl.fabric.nmx import NMXClient
    from mctl.model.fabric import DesiredPartition, ImexDomainHealth, PartitionChange, PartitionPlan
    from mctl.model.imex import ImexSettings
    from mctl.model.site import Rack, Site
    from mctl.transport.results import HostResult


def kind_of(by_location: bool) -> str:
    return "LOCATION_BASED" if by_location else "ID_BASED"


# ------------------------------------------------------------------ partitions

@dataclass
class PartitionsResult:
    rack: str
    plan: "PartitionPlan"
    applied: bool
    warnings: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.applied and not self.plan.empty

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "plan": self.plan.to_dict(), "applied": self.applied,
                "warnings": list(self.warnings)}


def plan_partitions_for(site: "Site", rack: "Rack", desired: Sequence["DesiredPartition"] | None = None, *,
                        prune: bool = False, kind: str = "ID_BASED") -> tuple["NMXClient", "PartitionPlan"]:
    """Ask the rack's NMX-M and plan the changes towards *desired* (default: the inventory's partitions)."""
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.partitions import desired_from_rack
    from mctl.fabric.reconcile import plan_rack

    client = NMXClient.for_rack(site, rack)
    plan, _ = plan_rack(client, rack, desired_from_rack(rack) if desired is None else desired, prune=prune,
                        kind=kind)
    return client, plan


def apply_partitions(site: "Site", rack: "Rack", desired: Sequence["DesiredPartition"] | None = None, *,
                     prune: bool = False, kind: str = "ID_BASED", dry_run: bool = False,
                     on_plan: Callable[["PartitionPlan"], None] | None = None,
                     on_step: Callable[[int, "PartitionChange"], None] | None = None) -> PartitionsResult:
    """Make the rack's NMX-M hold *desired* (default: the inventory's partitions); the caller holds the rack lock.

    Raises UsageError for partitions that cannot be (before anything changes), NMXError when
    NMX-M fails (PartialFailure when some steps already applied).
    """
    from mctl.errors import UsageError
    from mctl.fabric.partitions import desired_from_rack, validate_desired
    from mctl.fabric.reconcile import apply_plan

    if rack.nmx is None:
        raise UsageError(f"rack {rack.name} has no NMX-Manager endpoint",
                         hint=f"add racks.{rack.name}.nmx with url and credentials_file to the inventory")
    wanted = desired_from_rack(rack) if desired is None else tuple(desired)
    warnings = validate_desired(rack, wanted, site=site)
    client, plan = plan_partitions_for(site, rack, wanted, prune=prune, kind=kind)
    if on_plan is not None:
        on_plan(plan)
    if not dry_run:
        apply_plan(client, plan, rack.gpus_per_tray, on_step=on_step)
    return PartitionsResult(rack.name, plan, not dry_run, tuple(warnings) + tuple(plan.warnings))


# ------------------------------------------------------------------ IMEX

def imex_settings(site: "Site") -> "ImexSettings":
    from mctl.model.imex import ImexSettings

    return ImexSettings.from_vars((site.vars or {}).get("imex"))


@dataclass
class ImexApplyResult:
    rack: str
    changes: dict[str, list[str]]                 # tray -> files that differ (written unless dry-run)
    restart: list[str]                            # trays whose daemon is (to be) restarted
    unreachable: list[str]
    failed: dict[str, str] = field(default_factory=dict)    # tray -> why the push failed
    applied: bool = False
    held: dict[str, list[str]] = field(default_factory=dict)  # domain left unchanged -> its unreachable trays
    held_trays: list[str] = field(default_factory=list)       # the reachable trays of those domains (not touched)

    @property
    def changed(self) -> bool:
        return self.applied and bool(self.restart)

    @property
    def not_applied(self) -> list[str]:
        return sorted(set(self.unreachable) | set(self.failed) | set(self.held_trays))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rack": self.rack, "changes": self.changes, "restart": self.restart,
                               "unreachable": self.unreachable, "applied": self.applied, "held": self.held}
        if self.applied:
            out["failed"] = self.failed
        return out


def apply_imex(site: "Site", rack: "Rack", settings: "ImexSettings | None" = None, *, restart: bool = False,
               dry_run: bool = False, on_plan: Callable[[ImexApplyResult], None] | None = None,
               on_push: Callable[["HostResult"], None] | None = None, reach_wait: float = 0.0,
               on_wait: Callable[[dict[str, list[str]], float], None] | None = None,
               sleep: Callable[[float], None] = time.sleep) -> ImexApplyResult:
    """Push each tray's rendered IMEX files where they differ and restart its daemon; the rest is left alone.

    A tray whose files are right but whose daemon does not answer is restarted too (with no file written).

    A domain with a tray that cannot be reached is not touched at all (no file written, no
    daemon restarted: restarting the others would split it): it is asked again for up to
    *reach_wait* seconds (on_wait is told once, with the held domains and the seconds left),
    then left unchanged and reported in `held`. Replaced files are kept
    beside them as `<file>.mctl-bak` (imex_remote.push_command).
    """
    from mctl.fabric.imex import expected_files, imex_domains, plan_domains, trays_needing, trays_not_running
    from mctl.fabric.imex_remote import collect, push

    settings = settings or imex_settings(site)
    expected = expected_files(rack, settings)
    reports, held = collect(site, rack.compute, settings)
    domains = imex_domains(rack)
    deadline = time.monotonic() + max(0.0, reach_wait)
    while True:
        unreachable = [t for t, rep in reports.items() if not rep.reachable]
        plan = trays_needing(expected, {t: held.get(t, {}) for t in expected if t not in unreachable})
        stopped = trays_not_running(reports, expected)
        touched, blocked = plan_domains(domains, {**{t: [] for t in stopped}, **plan}, unreachable, restart=restart)
        left = deadline - time.monotonic()
        if not blocked or dry_run or left <= 0:
            break
        if on_wait is not None:
            on_wait(blocked, left)
            on_wait = None
        sleep(min(2.0, max(0.1, left)))
        again, files = collect(site, [h for h in rack.compute if h.name in unreachable], settings)
        reports.update(again)
        held.update(files)
    held_trays = sorted({t for d in domains if d.name in blocked for t in d.trays if t not in unreachable},
                        key=lambda t: [h.name for h in rack.compute].index(t))
    targets = [h for h in rack.compute if h.name in touched]
    result = ImexApplyResult(rack.name, {t: files for t, files in plan.items() if t in touched},
                             [h.name for h in targets], unreachable, held=blocked, held_trays=held_trays)
    if on_plan is not None:
        on_plan(result)
    if not dry_run and targets:
        results = push(site, targets, {t: {p: expected[t][p] for p in plan[t]} for t in plan if t in touched},  # stopped: restart only
                       settings.restart_command)
        result.failed = {x.host: x.summary() for x in results if not x.ok}
        result.applied = True
        if on_push is not None:
            for x in results:
                on_push(x)
    return result


def imex_status(site: "Site", racks: Sequence["Rack"], settings: "ImexSettings | None" = None
                ) -> tuple[list["ImexDomainHealth"], list[str]]:
    """Every IMEX domain of *racks* as the trays report it, and the trays that could not be asked."""
    from mctl.fabric.imex import assess_rack
    from mctl.fabric.imex_remote import collect

    settings = settings or imex_settings(site)
    healths: list["ImexDomainHealth"] = []
    unreachable: list[str] = []
    for r in racks:
        reports, _ = collect(site, r.compute, settings)
        unreachable += [t for t, rep in reports.items() if not rep.reachable]
        healths += list(assess_rack(r, reports))
    return healths, unreachable


def wait_for_imex(site: "Site", racks: Sequence["Rack"], settings: "ImexSettings | None" = None, *,
                  wait: float, sleep: Callable[[float], None] = time.sleep) -> list["ImexDomainHealth"]:
    """Ask until every domain of *racks* is UP or *wait* seconds passed; the last answer."""
    settings = settings or imex_settings(site)
    deadline = time.monotonic() + wait
    while True:
        healths, _ = imex_status(site, racks, settings)
        if all(h.state == "UP" for h in healths) or time.monotonic() >= deadline:
            return healths
        sleep(min(2.0, max(0.1, deadline - time.monotonic())))
