"""Discover a rack's partitions on NMX-M, plan against the desired ones, apply the plan step by step.

The adapter half of the partition work: the planner (partitions.py) stays pure,
this module talks to NMX-M through NMXClient. A failed step stops the run and
says which steps already applied, because NMX-M has no transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from mctl.errors import MctlError, PartialFailure
from mctl.fabric.partitions import FabricMap, describe_change, map_fabric, plan_partitions
from mctl.model.fabric import DesiredPartition, NmxComputeNode, NmxGpu, NmxPartition, PartitionChange, PartitionPlan

if TYPE_CHECKING:
    from mctl.fabric.nmx import NMXClient
    from mctl.model.site import Rack


@dataclass(frozen=True)
class FabricState:
    """What NMX-M says about one rack's NVLink domain, matched to the inventory's trays."""

    nodes: tuple[NmxComputeNode, ...]
    gpus: tuple[NmxGpu, ...]
    partitions: tuple[NmxPartition, ...]
    fabric: FabricMap


def discover(client: "NMXClient", rack: "Rack") -> FabricState:
    nodes = tuple(client.compute_nodes())
    gpus = tuple(client.gpus())
    fabric = map_fabric(rack, nodes, gpus)
    domain_gpus = {g.gpu_id for tray in fabric.trays.values() for g in tray}
    # NMX-M may manage several domains: keep the partitions that touch this rack (and the default one).
    parts = []
    for p in client.partitions():
        have, foreign = fabric.resolve(p)
        if p.is_default or have or not p.members or not domain_gpus:
            parts.append(p)
    return FabricState(nodes, gpus, tuple(parts), fabric)


def plan_rack(client: "NMXClient", rack: "Rack", desired: Sequence[DesiredPartition], *, prune: bool = False,
              kind: str = "ID_BASED") -> tuple[PartitionPlan, FabricState]:
    state = discover(client, rack)
    plan = plan_partitions(rack, desired, state.fabric, state.partitions, prune=prune, kind=kind,
                           endpoint=client.url)
    return plan, state


def apply_plan(client: "NMXClient", plan: PartitionPlan, gpus_per_tray: int, *,
               on_step: Callable[[int, PartitionChange], None] | None = None) -> list[PartitionChange]:
    """Run the plan's changes in order, each waited to completion; stop at the first failure."""
    done: list[PartitionChange] = []
    total = len(plan.changes)
    for number, change in enumerate(plan.changes, start=1):
        if on_step is not None:
            on_step(number, change)
        try:
            if change.action == "create":
                client.create_partition(change.name, change.payload_members())
            elif change.action == "update":
                client.replace_members(change.nmx_id or change.name, change.payload_members(), name=change.name)
            else:
                client.delete_partition(change.nmx_id or change.name, name=change.name)
        except MctlError as exc:
            where = f"rack {plan.rack}: step {number}/{total} ({describe_change(change, gpus_per_tray)}) failed"
            if not done:
                exc.message = f"{where}: {exc.message} (no earlier step)"
                raise
            raise PartialFailure(f"{where}: {exc.message}; steps 1-{number - 1} of {total} applied",
                                 hint=exc.hint) from None
        done.append(change)
    return done
