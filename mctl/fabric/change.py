"""A partition change in the fabric's terms (pure): the partitions before and after, the trays it moves,
the IMEX domains that follow, the jobs rule, and the order of its steps.

The cross-layer plan (mctl.change.plan) composes these with the Slurm blocks and Kubernetes
labels the scheduler layer renders; the change service (mctl.change) runs it. Nothing here does I/O.

A tray is affected when its partition changes: its name or its set of trays
(so its IMEX domain's node list). Only affected trays get IMEX files rewritten,
daemons restarted, labels changed, and only work on them matters to the change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence

# the jobs rule's words (DRAIN, FORCE, GO, REFUSE) are read from here by the change service and its tests
from mctl.model.change import DRAIN, FORCE, GO, REFUSE, ChangePlan, ImexDomainChange, TrayChange, work_rule  # noqa: F401

if TYPE_CHECKING:
    from mctl.fabric.imex import ImexSettings
    from mctl.model.fabric import PartitionPlan
    from mctl.model.site import Partition, Rack, Site


def with_partitions(site: "Site", rack: "Rack", partitions: Sequence["Partition"]) -> tuple["Site", "Rack"]:
    """The site and rack as they are once *partitions* replace the rack's."""
    new_rack = replace(rack, partitions=tuple(partitions))
    racks = dict(site.racks)
    racks[rack.name] = new_rack
    return replace(site, racks=racks), new_rack


def before_from_plan(rack: "Rack", plan: "PartitionPlan | None") -> tuple["Partition", ...]:
    """The rack's partitions as NMX-M holds them, as far as the plan tells: the inventory's, corrected by
    each change's members before (a partition the plan creates did not exist; one it updates or deletes
    held the trays it lists before). Partitions that split a tray are left out (IMEX and Slurm follow trays)."""
    from mctl.model.site import Partition

    parts = {p.name: tuple(p.trays) for p in rack.partitions}
    if plan is not None:
        for c in plan.changes:
            if c.action == "create":
                parts.pop(c.name, None)
                continue
            by_tray: dict[str, int] = {}
            for g in c.before:
                by_tray[g.tray] = by_tray.get(g.tray, 0) + 1
            whole = tuple(t for t, n in by_tray.items() if n >= rack.gpus_per_tray)
            if whole:
                parts[c.name] = whole
            else:
                parts.pop(c.name, None)
    order = {h.name: i for i, h in enumerate(rack.compute)}
    return tuple(Partition(n, rack.name, tuple(sorted(t, key=lambda x: order.get(x, len(order)))))
                 for n, t in parts.items() if t)


def tray_changes(rack: "Rack", before: Sequence["Partition"], after: Sequence["Partition"]) -> tuple[TrayChange, ...]:
    everyone = tuple(h.name for h in rack.compute)

    def where(parts: Sequence["Partition"], tray: str) -> tuple[str | None, tuple[str, ...]]:
        if not parts:       # no partition declared: the whole rack is one IMEX domain and one Slurm block
            return None, everyone
        for p in parts:
            if tray in p.trays:
                return p.name, tuple(p.trays)
        return None, ()

    out = []
    for h in rack.compute:
        b, bt = where(before, h.name)
        a, at = where(after, h.name)
        if (b, set(bt)) != (a, set(at)):
            out.append(TrayChange(h.name, b, a, bt, at))
    return tuple(out)


def imex_changes(rack_before: "Rack", rack_after: "Rack", settings: "ImexSettings",
                 affected: Iterable[str]) -> tuple[ImexDomainChange, ...]:
    """The IMEX domains of the affected trays after the change: node lists before/after, files that change."""
    from mctl.fabric.imex import CONFIG_FILE, expected_files, imex_domains, render_nodes_config

    nodes_file = settings.node_config_file
    before = expected_files(rack_before, settings)
    after = expected_files(rack_after, settings)
    wanted = set(affected)
    out: list[ImexDomainChange] = []
    groups = [(d.name, d.trays, render_nodes_config(d)) for d in imex_domains(rack_after)]
    seen = {t for _, trays, _ in groups for t in trays}
    left = tuple(t for t in (h.name for h in rack_after.compute) if t in wanted and t not in seen)
    if left:        # trays that leave every IMEX domain: no files are rendered for them afterwards
        groups.append(("(none)", left, ""))
    for name, trays, nodes in groups:
        mine = [t for t in trays if t in wanted]
        if not mine:
            continue
        files: dict[str, tuple[str, ...]] = {}
        for t in mine:
            old, new = before.get(t, {}), after.get(t, {})
            changed = tuple(p for p in (CONFIG_FILE, nodes_file) if p in new and old.get(p) != new.get(p))
            if changed:
                files[t] = changed
        out.append(ImexDomainChange(name, tuple(trays), {t: before.get(t, {}).get(nodes_file, "") for t in mine},
                                    nodes, files, tuple(files)))
    return tuple(out)


# ------------------------------------------------------------------ the jobs rule

def decide(plan: ChangePlan, *, drain: bool, force: bool) -> str:
    """What a change does about the work on its trays (mctl.model.change.work_rule, the one jobs rule)."""
    return work_rule(bool(plan.affected), plan.work, plan.work_known, drain=drain, force=force,
                     drains=("slurm", "k8s"))


# ------------------------------------------------------------------ the steps of a change, in their safe order

# Every partition change runs these steps in this order (mctl.change.run journals each):
# hold the affected trays (Slurm: drain; Kubernetes: cordon), record the inventory, NMX-M, wait for the
# GPUs' cliques, IMEX files, IMEX restart, IMEX domains UP, Slurm topology.conf + reconfigure, verify `scontrol show topology`,
# Kubernetes labels, release the holds. See docs/decisions.md (D46).
HOLD, RECORD, NMX, CLIQUES, IMEX_FILES, IMEX_RESTART, IMEX_UP, SLURM_TOPOLOGY, SLURM_VERIFY, LABELS, RELEASE = (
    "hold", "record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up", "slurm-topology", "slurm-verify",
    "labels", "release")
STEPS = (HOLD, RECORD, NMX, CLIQUES, IMEX_FILES, IMEX_RESTART, IMEX_UP, SLURM_TOPOLOGY, SLURM_VERIFY, LABELS, RELEASE)
STEP_TITLES = {
    HOLD: "hold the affected trays (Slurm drain, Kubernetes cordon)", RECORD: "record the partitions in the inventory",
    NMX: "NMX-M partition operations", CLIQUES: "wait for the GPUs' cliques to change",
    IMEX_FILES: "IMEX files (affected trays, previous kept as .mctl-bak)",
    IMEX_RESTART: "restart nvidia-imex (affected trays)", IMEX_UP: "wait for the IMEX domains to be UP",
    SLURM_TOPOLOGY: "Slurm topology.conf and scontrol reconfigure", SLURM_VERIFY: "verify scontrol show topology",
    LABELS: "Kubernetes node labels", RELEASE: "release the holds",
}
UNDO = "undo-"
# Which forward step put a layer in place, and the steps that undo it (in the same safe order).
_LAYER_OF = {NMX: (NMX, CLIQUES), CLIQUES: (NMX, CLIQUES), IMEX_FILES: (IMEX_FILES, IMEX_RESTART, IMEX_UP),
             IMEX_RESTART: (IMEX_FILES, IMEX_RESTART, IMEX_UP), IMEX_UP: (IMEX_FILES, IMEX_RESTART, IMEX_UP),
             SLURM_TOPOLOGY: (SLURM_TOPOLOGY, SLURM_VERIFY), SLURM_VERIFY: (SLURM_TOPOLOGY, SLURM_VERIFY),
             LABELS: (LABELS,), RECORD: (RECORD,)}


def step_applies(step: str, *, scheduler: str | None, has_nmx: bool, record: bool, affected: bool) -> str | None:
    """None when *step* applies to the change; else why not (shown as 'not applicable', never skipped silently)."""
    if not affected and step not in (RECORD, NMX):
        return "no tray changes partition"
    if step in (HOLD, RELEASE) and scheduler not in ("slurm", "k8s"):
        return "the site runs no scheduler (no Slurm, no Kubernetes: nothing to hold)"
    if step == RECORD and not record:
        return "the inventory already declares the partitions (partition apply)"
    if step in (NMX, CLIQUES) and not has_nmx:
        return "the rack has no NMX-M endpoint"
    if step in (SLURM_TOPOLOGY, SLURM_VERIFY) and scheduler != "slurm":
        return "the site runs no Slurm"
    if step == LABELS and scheduler != "k8s":
        return "the site runs no Kubernetes"
    return None


def rollback_steps(failed: str, done: Sequence[str]) -> tuple[str, ...]:
    """The undo steps after *failed* failed, *done* (forward steps) having finished: every layer that was or
    may have been changed goes back, in the forward order, then the holds are released.

    A failed hold releases what it held; a failed release undoes nothing (the change is complete); a step
    that failed may have half-changed its layer, so its layer is undone with the finished ones."""
    if failed == RELEASE:
        return ()
    touched: list[str] = []
    for step in list(done) + [failed]:
        for s in _LAYER_OF.get(step, ()):
            if s not in touched:
                touched.append(s)
    order = [s for s in STEPS if s in touched and s != RECORD] + ([RECORD] if RECORD in touched else [])
    return tuple(UNDO + s for s in order) + (UNDO + RELEASE,)


def forward_name(step: str) -> str:
    """The forward step an undo step runs backwards ('undo-nmx' -> 'nmx')."""
    return step[len(UNDO):] if step.startswith(UNDO) else step


def plan_steps(plan: ChangePlan, *, has_nmx: bool, record: bool) -> list[tuple[str, str, str | None]]:
    """(step, title, why not applicable or None) for --dry-run and the printed plan."""
    return [(s, STEP_TITLES[s], step_applies(s, scheduler=plan.scheduler, has_nmx=has_nmx, record=record,
                                              affected=bool(plan.affected)))
            for s in STEPS]


# ------------------------------------------------------------------ around a failed tray (isolate / restore)

QUARANTINE_PREFIX = "quarantine-"
ISOLATE_TO = ("quarantine", "default")


def quarantine_name(tray: str) -> str:
    """The one-tray partition an isolated tray is moved to (a partition name: at most 63 characters)."""
    return (QUARANTINE_PREFIX + tray)[:63]


def isolate_partitions(rack: "Rack", tray: str, *, to: str = "quarantine") -> tuple["Partition", ...]:
    """The rack's partitions once *tray* leaves its partition: into a one-tray quarantine partition, or into
    NMX-M's default partition (to="default"). A rack without partitions is one partition of every tray ('all')."""
    from mctl.errors import UsageError
    from mctl.model.site import Partition

    if to not in ISOLATE_TO:
        raise UsageError(f"--to must be one of {', '.join(ISOLATE_TO)}, not {to!r}")
    if tray not in {h.name for h in rack.compute}:
        raise UsageError(f"{tray} is not a compute tray of rack {rack.name}")
    parts = list(rack.partitions) or [Partition("all", rack.name, tuple(h.name for h in rack.compute))]
    mine = next((p for p in parts if tray in p.trays), None)
    if mine is not None and mine.trays == (tray,) and mine.name.startswith(QUARANTINE_PREFIX):
        raise UsageError(f"{tray} is isolated already (partition {mine.name})",
                         hint=f"'mctl partition restore {tray}' puts it back")
    if mine is None and to == "default":
        raise UsageError(f"{tray} is in no partition of rack {rack.name} already (NMX-M's default partition)")
    out = []
    for p in parts:
        if tray in p.trays:
            rest = tuple(t for t in p.trays if t != tray)
            if rest:
                out.append(Partition(p.name, rack.name, rest))
        else:
            out.append(p)
    if to == "quarantine":
        out.append(Partition(quarantine_name(tray), rack.name, (tray,)))
    return tuple(out)


def restore_partitions(rack: "Rack", tray: str, isolated: "tuple[Sequence[Partition], Sequence[Partition]] | None"
                       ) -> tuple["Partition", ...]:
    """The partitions that put *tray* back where it was before `isolate`: *isolated* is that change's (before,
    after). The rack as the isolation left it goes back exactly; if its partitions changed since, the tray joins
    its former partition by name (UsageError when there is none to join)."""
    from mctl.errors import UsageError
    from mctl.model.site import Partition

    if isolated is None:
        raise UsageError(f"no finished 'mctl partition isolate {tray}' of rack {rack.name} is on record",
                         hint=f"put the tray into a partition with 'mctl partition create {rack.name} ...'")
    before, after = isolated
    key = lambda parts: sorted((p.name, tuple(sorted(p.trays))) for p in parts)    # noqa: E731
    now = [p for p in rack.partitions]
    if key(now) == key(after):
        return tuple(before)
    was = next((p.name for p in before if tray in p.trays), None)
    current = [p for p in now if not (p.trays == (tray,) and p.name.startswith(QUARANTINE_PREFIX))]
    if any(tray in p.trays for p in current):
        raise UsageError(f"{tray} is in partition {next(p.name for p in current if tray in p.trays)} already")
    target = next((p for p in current if p.name == was), None)
    if target is None:
        raise UsageError(f"the partitions of rack {rack.name} changed since {tray} was isolated, and its former "
                         f"partition {was!r} is gone", hint=f"put it into a partition with 'mctl partition create'")
    order = {h.name: i for i, h in enumerate(rack.compute)}
    return tuple(Partition(p.name, rack.name, tuple(sorted(p.trays + (tray,), key=order.__getitem__)))
                 if p.name == was else p for p in current)
