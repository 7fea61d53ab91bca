"""One partition change, one plan: NMX-M, IMEX, Slurm blocks, Kubernetes labels and the work on the trays.

`plan_change` (pure) takes the rack's partitions before and after (whole trays, as the inventory
holds them), the NMX-M plan already computed by mctl.fabric.partitions.plan_partitions, and the
work the schedulers run, and derives every layer from the same two partition lists with the code
that renders it: IMEX files from mctl.fabric, Slurm blocks from mctl.sched.slurm.topology, labels
from mctl.sched.k8s.manifests. `change_plan` adds the work found on the trays the change touches
(mctl.sched.work, asked only when a tray moves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from mctl.fabric.change import before_from_plan, imex_changes, tray_changes, with_partitions
from mctl.model.change import ChangePlan, LabelChange, RunningWork, SlurmChange, work_on

if TYPE_CHECKING:
    from mctl.model.imex import ImexSettings
    from mctl.model.fabric import PartitionPlan
    from mctl.model.site import Partition, Rack, Site


def slurm_change(site_before: "Site", site_after: "Site", rack: str) -> SlurmChange:
    from mctl.sched.slurm.topology import blocks_for

    b = tuple(x.to_dict() for x in blocks_for(site_before) if x.rack == rack)
    a = tuple(x.to_dict() for x in blocks_for(site_after) if x.rack == rack)
    strip = lambda blocks: [(x["name"], x["nodes"]) for x in blocks]    # noqa: E731
    return SlurmChange(b, a, strip(b) != strip(a))


def label_changes(site_before: "Site", site_after: "Site", affected: Iterable[str]) -> tuple[LabelChange, ...]:
    from mctl.sched.k8s.manifests import PARTITION_LABEL, node_objects
    from mctl.sched.slurm.topology import blocks_for

    def labels(site: "Site") -> dict[str, str | None]:
        return {o["metadata"]["name"]: o["metadata"]["labels"].get(PARTITION_LABEL)
                for o in node_objects(site, blocks_for(site))}

    b, a = labels(site_before), labels(site_after)
    return tuple(LabelChange(t, PARTITION_LABEL, b.get(t), a.get(t)) for t in affected if b.get(t) != a.get(t))


def plan_change(site: "Site", rack: "Rack", after: Sequence["Partition"], nmx: "PartitionPlan | None", *,
                settings: "ImexSettings", work: Sequence[RunningWork] = (), work_known: bool = True,
                work_error: str | None = None) -> ChangePlan:
    """Everything a partition change of *rack* to *after* does, layer by layer (pure)."""
    before = before_from_plan(rack, nmx)
    site_b, rack_b = with_partitions(site, rack, before)
    site_a, rack_a = with_partitions(site, rack, after)
    trays = tray_changes(rack, before, after)
    affected = [t.tray for t in trays]
    scheduler = site.scheduler.type if site.scheduler else None
    return ChangePlan(
        rack=rack.name, scheduler=scheduler, trays=trays, nmx=nmx,
        imex=imex_changes(rack_b, rack_a, settings, affected) if affected else (),
        slurm=slurm_change(site_b, site_a, rack.name) if scheduler == "slurm" else None,
        labels=label_changes(site_b, site_a, affected) if scheduler == "k8s" else (),
        work=work_on(work, affected), work_known=work_known, work_error=work_error,
        unaffected=tuple(h.name for h in rack.compute if h.name not in set(affected)))


def change_plan(site: "Site", rack: "Rack", after: Sequence["Partition"], nmx: "PartitionPlan | None") -> ChangePlan:
    """The plan with the work discovered on the trays it touches (the scheduler is asked only when needed)."""
    from mctl.fabric.service import imex_settings
    from mctl.sched.work import discover

    settings = imex_settings(site)
    first = plan_change(site, rack, after, nmx, settings=settings)
    if not first.affected:
        return first
    work, error = discover(site, first.affected)
    return plan_change(site, rack, after, nmx, settings=settings, work=work, work_known=error is None,
                       work_error=error)


def busy_trays(cp: ChangePlan) -> list[str]:
    """The affected trays that run work now."""
    affected = set(cp.affected)
    return sorted({n for w in cp.work for n in w.nodes if n in affected})
