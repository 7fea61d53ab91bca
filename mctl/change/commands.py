"""What each partition command changes, planned and committed: create, apply, delete (nothing printed).

Each command has two steps so that the change service (mctl.change.service) can show the plan
and apply the jobs rule in between: plan_* reads the inventory and NMX-M and returns an object
saying what would change (nothing written); commit_* writes mctl.yml and applies the NMX-M plan
(the `--nmx-only` and `--no-apply` paths), filling in the same object, whose to_dict() is the
command's --json answer. The service adds the cross-layer plan (mctl.change.plan) as `change`,
holds the rack lock, and runs the journaled change (mctl.change.run) everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.errors import MctlError, UsageError

if TYPE_CHECKING:
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.record import InventoryEdit
    from mctl.model.change import ChangePlan
    from mctl.model.fabric import DesiredPartition, PartitionChange, PartitionPlan
    from mctl.model.site import Partition, Rack, Site

OnPlan = Callable[["PartitionPlan"], None]
OnStep = Callable[[int, "PartitionChange"], None]


# ------------------------------------------------------------------ apply (the inventory's partitions)

@dataclass
class PartitionApply:
    """`partition apply` on one rack: NMX-M made to hold the inventory's partitions."""

    rack: "Rack"
    client: "NMXClient"
    plan: "PartitionPlan"
    change: "ChangePlan | None" = None
    applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack.name, "plan": self.plan.to_dict(), "change": self.change.to_dict(),
                "applied": self.applied}


def plan_apply(site: "Site", rack: "Rack", desired: Sequence["DesiredPartition"], *, prune: bool, kind: str,
               on_plan: OnPlan | None = None) -> PartitionApply:
    """Ask NMX-M for the plan towards *desired* (on_plan is told it); the service adds the change across layers."""
    from mctl.fabric.service import plan_partitions_for

    client, plan = plan_partitions_for(site, rack, desired, prune=prune, kind=kind)
    if on_plan is not None:
        on_plan(plan)
    return PartitionApply(rack, client, plan)


def commit_apply(op: PartitionApply, *, on_step: OnStep | None = None) -> PartitionApply:
    """Apply the NMX-M plan; under the caller's lock."""
    from mctl.fabric.reconcile import apply_plan

    apply_plan(op.client, op.plan, op.rack.gpus_per_tray, on_step=on_step)
    op.applied = True
    return op


# ------------------------------------------------------------------ create

@dataclass
class PartitionCreate:
    """`partition create` of whole-tray partitions: recorded in the inventory, then applied on NMX-M."""

    rack: "Rack"
    before: tuple["Partition", ...]
    partitions: tuple["Partition", ...]         # the rack's partitions after the change
    desired: tuple["DesiredPartition", ...]
    warnings: tuple[str, ...]
    edit: "InventoryEdit"
    apply: bool                                 # NMX-M is asked and changed (not --no-apply, an endpoint)
    dry_run: bool
    client: "NMXClient | None" = None
    plan: "PartitionPlan | None" = None
    change: "ChangePlan | None" = None
    applied: bool = False

    def to_dict(self, error: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"rack": self.rack.name, "inventory": str(self.edit.path),
                               "inventory_changed": self.edit.changed,
                               "partitions": [{"name": p.name, "trays": str(p.nodeset)} for p in self.partitions],
                               "plan": self.plan.to_dict() if self.plan else None, "applied": self.applied,
                               "dry_run": self.dry_run}
        if self.change is not None:
            out["change"] = self.change.to_dict()
        if error is not None:
            out["error"] = error
        return out


def whole_trays(site: "Site", rack: "Rack", name: str, members: Sequence[tuple[str, int]], *,
                gpu_granularity: bool) -> tuple[str, ...] | None:
    """--gpus members that cover whole trays: those trays (an ordinary, recorded partition).

    Otherwise None with --gpu-granularity (a partition of single GPUs), else the UsageError
    that the rack's validation gives for a partition splitting a tray.
    """
    from mctl.fabric.partitions import validate_desired
    from mctl.model.fabric import DesiredPartition

    per_tray: dict[str, int] = {}
    for tray, _ in members:
        per_tray[tray] = per_tray.get(tray, 0) + 1
    if all(n == rack.gpus_per_tray for n in per_tray.values()):
        return tuple(per_tray)
    if not gpu_granularity:
        validate_desired(rack, [DesiredPartition(name, rack.name, (), tuple(members))], site=site)
    return None


def plan_create(site: "Site", rack: "Rack", *, name: str | None, template: str | None, trays: Sequence[str],
                no_apply: bool, dry_run: bool) -> PartitionCreate:
    """The rack's partitions after a --template or NAME --trays, checked, and the inventory's new text."""
    from mctl.fabric.partitions import template_partitions, validate_desired
    from mctl.fabric.record import edit_partitions
    from mctl.model.fabric import DesiredPartition
    from mctl.model.site import Partition

    if template:
        partitions = tuple(template_partitions(rack, template))
    else:
        if any(p.name == name for p in rack.partitions):
            raise UsageError(f"rack {rack.name} already has a partition {name!r}",
                             hint=f"delete it first ('mctl partition delete {rack.name} {name}') or pick another name")
        partitions = tuple(rack.partitions) + (Partition(name or "", rack.name, tuple(trays)),)
    desired = tuple(DesiredPartition(p.name, rack.name, tuple(p.trays)) for p in partitions)
    warnings = validate_desired(rack, desired, site=site)
    edit = edit_partitions(site, rack.name, partitions)
    return PartitionCreate(rack, tuple(rack.partitions), partitions, desired, tuple(warnings), edit,
                           apply=not no_apply and rack.nmx is not None, dry_run=dry_run)


def plan_create_on_nmx(site: "Site", op: PartitionCreate, *, kind: str, on_plan: OnPlan | None = None) -> "PartitionPlan":
    """Ask NMX-M for the plan towards the new partitions (on_plan is told it)."""
    from mctl.fabric.service import plan_partitions_for

    op.client, op.plan = plan_partitions_for(site, op.rack, op.desired, kind=kind)
    if on_plan is not None:
        on_plan(op.plan)
    return op.plan


def record_create(op: PartitionCreate) -> None:
    """Write the inventory (previous copy in mctl.yml.bak); under the caller's lock."""
    from mctl.fabric.record import write_edit

    write_edit(op.edit)


def apply_create(op: PartitionCreate, *, on_step: OnStep | None = None) -> PartitionCreate:
    """Apply the NMX-M plan once the inventory is written; an error's hint says how to go on."""
    from mctl.fabric.reconcile import apply_plan

    if op.apply and op.client is not None and op.plan is not None:
        try:
            apply_plan(op.client, op.plan, op.rack.gpus_per_tray, on_step=on_step)
        except MctlError as exc:
            exc.hint = ((exc.hint + "; ") if exc.hint else "") + \
                f"the inventory is updated; run 'mctl partition apply {op.rack.name}' once fixed"
            raise
        op.applied = True
    return op


# ------------------------------------------------------------------ create, GPU granularity

@dataclass
class GpuPartitionCreate:
    """`partition create --gpus ... --gpu-granularity`: on NMX-M only, never recorded in the inventory."""

    rack: "Rack"
    partition: "DesiredPartition"
    warnings: tuple[str, ...]
    dry_run: bool
    client: "NMXClient | None" = None
    plan: "PartitionPlan | None" = None
    applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack.name, "name": self.partition.name,
                "plan": self.plan.to_dict() if self.plan else None, "applied": self.applied, "recorded": False,
                "dry_run": self.dry_run}


def check_gpu_partition(site: "Site", rack: "Rack", name: str, members: Sequence[tuple[str, int]], *,
                        no_apply: bool, dry_run: bool) -> GpuPartitionCreate:
    """The GPU-granularity partition checked against the rack's declared ones (NMX-M not asked yet)."""
    from mctl.fabric.partitions import validate_desired
    from mctl.model.fabric import DesiredPartition

    if no_apply:
        raise UsageError("a GPU-granularity partition cannot be recorded in the inventory (it holds whole trays)",
                         hint="drop --no-apply to create it on NMX-M, or partition whole trays with --trays")
    if rack.nmx is None:
        raise UsageError(f"rack {rack.name} has no NMX-Manager endpoint",
                         hint=f"add racks.{rack.name}.nmx with url and credentials_file to the inventory")
    new = DesiredPartition(name, rack.name, (), tuple(members))
    declared = [DesiredPartition(p.name, rack.name, tuple(p.trays)) for p in rack.partitions]
    if any(d.name == name for d in declared):
        raise UsageError(f"rack {rack.name} already declares a partition {name!r}")
    warnings = validate_desired(rack, declared + [new], site=site, allow_gpu_granularity=True)
    return GpuPartitionCreate(rack, new, tuple(warnings), dry_run)


def plan_gpu_partition(site: "Site", op: GpuPartitionCreate, *, kind: str) -> "PartitionPlan":
    """Ask NMX-M and plan the new partition alone (the others are left as they are)."""
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.partitions import plan_partitions
    from mctl.fabric.reconcile import discover

    op.client = NMXClient.for_rack(site, op.rack)
    state = discover(op.client, op.rack)
    op.plan = plan_partitions(op.rack, [op.partition], state.fabric, state.partitions, kind=kind,
                              endpoint=op.client.url)
    return op.plan


def commit_gpu_partition(op: GpuPartitionCreate, *, on_step: OnStep | None = None) -> GpuPartitionCreate:
    from mctl.fabric.reconcile import apply_plan

    if op.client is not None and op.plan is not None:
        apply_plan(op.client, op.plan, op.rack.gpus_per_tray, on_step=on_step)
        op.applied = True
    return op


# ------------------------------------------------------------------ delete

@dataclass
class PartitionDelete:
    """`partition delete`: out of the inventory and off NMX-M; its GPUs return to the default partition."""

    rack: "Rack"
    name: str
    after: tuple["Partition", ...]              # the rack's partitions without it
    edit: "InventoryEdit | None"                # None: the inventory does not declare it
    asked_nmx: bool                             # NMX-M was asked (not --no-apply, an endpoint)
    dry_run: bool
    client: "NMXClient | None" = None
    plan: "PartitionPlan | None" = None         # None: NMX-M holds no such partition (or was not asked)
    change: "ChangePlan | None" = None

    @property
    def applied(self) -> bool:
        return self.plan is not None and not self.dry_run

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack.name, "name": self.name, "inventory_changed": self.edit is not None,
                "plan": self.plan.to_dict() if self.plan else None,
                "change": self.change.to_dict() if self.change else None,
                "applied": self.applied, "dry_run": self.dry_run}


def delete_plan(rack: str, endpoint: str, partition, members: Sequence) -> "PartitionPlan":
    """The one-step NMX-M plan that deletes *partition* (its *members* go back to the default partition)."""
    from mctl.model.fabric import PartitionChange, PartitionPlan

    have = tuple(sorted(members))
    return PartitionPlan(rack, endpoint, (PartitionChange("delete", partition.name, partition.type, (), have,
                                                          "deleted by the operator", nmx_id=partition.id,
                                                          partition_id=partition.partition_id),),
                         released=have)


def plan_delete(site: "Site", rack: "Rack", name: str, *, no_apply: bool, dry_run: bool) -> PartitionDelete:
    """Where the partition is (inventory, NMX-M) and what deleting it changes; UsageError when it is nowhere."""
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover
    from mctl.fabric.record import edit_partitions

    after = tuple(p for p in rack.partitions if p.name != name)
    declared = any(p.name == name for p in rack.partitions)
    op = PartitionDelete(rack, name, after, edit_partitions(site, rack.name, after) if declared else None,
                         asked_nmx=not no_apply and rack.nmx is not None, dry_run=dry_run)
    if op.asked_nmx:
        op.client = NMXClient.for_rack(site, rack)
        state = discover(op.client, rack)
        found = next((p for p in state.partitions if p.name == name and not p.is_default), None)
        if found is not None:
            have, _ = state.fabric.resolve(found)
            op.plan = delete_plan(rack.name, op.client.url, found, have)
    if op.edit is None and op.plan is None:
        raise UsageError(f"rack {rack.name} has no partition {name!r}" + ("" if not op.asked_nmx
                                                                          else " in the inventory or on NMX-M"),
                         hint=f"see 'mctl partition list {rack.name}'")
    return op


def commit_delete(op: PartitionDelete, *, on_step: OnStep | None = None) -> PartitionDelete:
    """Write the inventory without the partition, then delete it on NMX-M; under the caller's lock."""
    from mctl.fabric.reconcile import apply_plan
    from mctl.fabric.record import write_edit

    if op.edit is not None:
        write_edit(op.edit)
    if op.plan is not None and op.client is not None:
        apply_plan(op.client, op.plan, op.rack.gpus_per_tray, on_step=on_step)
    return op
