"""One partition change across every layer that follows the NVLink partition (pure data, no I/O).

A `ChangePlan` is what `mctl partition create|apply|delete` shows with --dry-run and
acts on: per affected tray the partition before and after, the NMX-M operations, the
IMEX node lists that change (and so the daemons restarted), the Slurm blocks before
and after, the Kubernetes clique labels, and the work running on the affected trays.
Built by mctl.change.plan (the change service); rendered by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from mctl.model.fabric import PartitionPlan

# Slurm job states that hold a tray's GPUs (squeue's compact codes): running, completing, suspended.
BUSY_JOB_STATES = ("R", "CG", "S")


@dataclass(frozen=True)
class TrayChange:
    """One tray's partition before and after (None: the fabric's default partition)."""

    tray: str
    before: str | None
    after: str | None
    before_trays: tuple[str, ...] = ()     # the trays of its partition (its IMEX domain) before
    after_trays: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"tray": self.tray, "before": self.before, "after": self.after,
                "before_trays": list(self.before_trays), "after_trays": list(self.after_trays)}


@dataclass(frozen=True)
class ImexDomainChange:
    """An IMEX domain whose node list changes: its nodes_config before and after, and the daemons restarted."""

    domain: str
    trays: tuple[str, ...]                 # the trays of the domain after the change
    nodes_before: dict[str, str]           # tray -> nodes_config.cfg content before (per tray: they may differ)
    nodes_after: str
    files: dict[str, tuple[str, ...]]      # tray -> the IMEX files that change on it
    restart: tuple[str, ...]               # daemons restarted (trays)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "trays": list(self.trays), "nodes_before": dict(self.nodes_before),
                "nodes_after": self.nodes_after, "files": {t: list(f) for t, f in self.files.items()},
                "restart": list(self.restart)}


@dataclass(frozen=True)
class SlurmChange:
    blocks_before: tuple[dict[str, Any], ...]
    blocks_after: tuple[dict[str, Any], ...]
    reconfigure: bool                      # topology.conf changes: `scontrol reconfigure` on the controller

    def to_dict(self) -> dict[str, Any]:
        return {"blocks_before": list(self.blocks_before), "blocks_after": list(self.blocks_after),
                "reconfigure": self.reconfigure}


@dataclass(frozen=True)
class LabelChange:
    node: str
    label: str
    before: str | None
    after: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "label": self.label, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class RunningWork:
    """A Slurm job or a Kubernetes pod on trays of the change."""

    kind: str                              # slurm | k8s
    id: str                                # job ID, or namespace/pod
    user: str | None
    name: str
    state: str
    nodes: tuple[str, ...]                 # every node of the job (not only the affected ones)
    why: str = ""                          # for a pod: GPUs or a ComputeDomain claim

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "user": self.user, "name": self.name, "state": self.state,
                "nodes": list(self.nodes), "why": self.why}

    def describe(self) -> str:
        from mctl.model.site import fold

        who = f" user {self.user}" if self.user else ""
        what = "job" if self.kind == "slurm" else "pod"
        extra = f" ({self.why})" if self.why else ""
        return f"{what} {self.id}{who} name {self.name!r} {self.state} on {fold(self.nodes)}{extra}"


@dataclass(frozen=True)
class ChangePlan:
    rack: str
    scheduler: str | None                  # slurm | k8s | None
    trays: tuple[TrayChange, ...]          # affected trays only
    nmx: PartitionPlan | None              # None: the rack has no NMX-M endpoint (or the change is not applied)
    imex: tuple[ImexDomainChange, ...]
    slurm: SlurmChange | None
    labels: tuple[LabelChange, ...]
    work: tuple[RunningWork, ...]          # running on affected trays
    work_known: bool = True                # False: the scheduler could not be asked (see work_error)
    work_error: str | None = None
    unaffected: tuple[str, ...] = field(default=())

    @property
    def affected(self) -> tuple[str, ...]:
        return tuple(t.tray for t in self.trays)

    @property
    def empty(self) -> bool:
        return not self.trays and (self.nmx is None or self.nmx.empty)

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "scheduler": self.scheduler, "affected_trays": list(self.affected),
                "unaffected_trays": list(self.unaffected), "trays": [t.to_dict() for t in self.trays],
                "nmx": self.nmx.to_dict() if self.nmx else None, "imex": [d.to_dict() for d in self.imex],
                "slurm": self.slurm.to_dict() if self.slurm else None, "labels": [x.to_dict() for x in self.labels],
                "work": [w.to_dict() for w in self.work], "work_known": self.work_known,
                "work_error": self.work_error}


# ------------------------------------------------------------------ the jobs rule (partition changes, provisioning)

REFUSE, DRAIN, FORCE, GO = "refuse", "drain", "force", "go"


def work_rule(touches: bool, work: Iterable[RunningWork], work_known: bool, *, drain: bool, force: bool,
              drains: tuple[str, ...] = ("slurm",)) -> str:
    """What a change does about the work on the trays it would disrupt: go (none), refuse, drain first, or
    force through. Work that could not be read counts as work (a change never goes ahead blind) unless
    --force, so unreadable work is refused with --drain too. --drain drains the work of the schedulers the
    caller can drain (*drains*): a partition change holds Slurm trays and waits for their jobs, or cordons
    Kubernetes nodes and evicts their pods; provisioning drains Slurm only."""
    work = tuple(work)
    if not touches or (work_known and not work):
        return GO
    if force:
        return FORCE
    if drain and work_known and len({w.kind for w in work}) == 1 and work[0].kind in drains:
        return DRAIN
    return REFUSE


def work_on(work: Iterable[RunningWork], trays: Iterable[str]) -> tuple[RunningWork, ...]:
    """The jobs and pods that run on at least one of *trays*."""
    wanted = set(trays)
    return tuple(w for w in work if wanted.intersection(w.nodes))
