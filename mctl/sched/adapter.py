"""The site's scheduler adapter: Slurm (mctl.sched.slurm.adapter) or Kubernetes (mctl.sched.k8s.cordon)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.transport import SSHPool


def adapter_for(site: "Site", pool: "SSHPool", names: Sequence[str] = (), who: str = "mctl"):
    """The site's scheduler adapter, or None when mctl has nothing to drain through. *who* is named in
    the annotations of a Kubernetes cordon (the action log's actor)."""
    if site.scheduler is None:
        return None
    if site.scheduler.type == "slurm":
        from mctl.sched.slurm.adapter import slurm_adapter

        return slurm_adapter(site, pool)
    if site.scheduler.type == "k8s":
        from mctl.sched.k8s.cordon import k8s_adapter
        from mctl.sched.k8s.evict import after_drain

        adapter = k8s_adapter(site, names or [h.name for h in site.compute_trays()], who)
        if site.health.k8s_evict:           # per site, off by default: a drained node's GPU pods evicted
            adapter.on_drained = after_drain
        return adapter
    return None
