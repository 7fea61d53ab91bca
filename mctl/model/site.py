"""The site as mctl sees it once the inventory validated: racks, trays, partitions, settings.

Plain frozen objects with no I/O, built once by mctl.inventory.loader. Host lists are
ClusterShell node sets; the settings are mctl.model.settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

from ClusterShell.NodeSet import NodeSet

from mctl.model.settings import (BMCSettings, HealthSettings, NMXSettings, SafetySettings, SchedulerSettings,
                                 SSHSettings)

Role = Literal["compute", "switch", "head"]

# What each rack model holds when fully populated.
MODEL_SHAPES: dict[str, tuple[int, int]] = {"nvl72": (18, 9)}
GPUS_PER_TRAY: dict[str, int] = {"nvl72": 4}


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    role: Role
    rack: str | None
    bmc: str | None = None
    image: str | None = None
    vars: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Partition:
    """Desired NVLink partition: a named set of whole trays inside one rack."""

    name: str
    rack: str
    trays: tuple[str, ...]

    @property
    def nodeset(self) -> str:
        return str(NodeSet.fromlist(self.trays))


@dataclass(frozen=True)
class Rack:
    name: str
    model: str
    compute_trays: int
    switch_trays: int
    nvlink_domain: str | None
    nmx: NMXSettings | None
    head: Host | None
    compute: tuple[Host, ...]
    switches: tuple[Host, ...]
    partitions: tuple[Partition, ...]

    @property
    def gpus_per_tray(self) -> int:
        return GPUS_PER_TRAY[self.model]

    @property
    def hosts(self) -> tuple[Host, ...]:
        return ((self.head,) if self.head else ()) + self.compute + self.switches

    def partition_of(self, tray: str) -> Partition | None:
        for part in self.partitions:
            if tray in part.trays:
                return part
        return None


@dataclass(frozen=True)
class Site:
    name: str
    file: Path
    ssh: SSHSettings
    racks: dict[str, Rack]
    scheduler: SchedulerSettings | None
    health: HealthSettings
    images_dir: Path | None
    vars: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    bmc: BMCSettings | None = None
    safety: SafetySettings = field(default_factory=SafetySettings)

    @property
    def root(self) -> Path:
        return self.file.parent

    @property
    def known_hosts(self) -> Path:
        return (self.root / Path(self.ssh.known_hosts).expanduser()).resolve()

    @property
    def identity_file(self) -> Path | None:
        if not self.ssh.identity_file:
            return None
        return (self.root / Path(self.ssh.identity_file).expanduser()).resolve()

    def hosts(self) -> list[Host]:
        return [h for rack in self.racks.values() for h in rack.hosts]

    def host(self, name: str) -> Host | None:
        for h in self.hosts():
            if h.name == name:
                return h
        return None

    def compute_trays(self) -> list[Host]:
        return [h for rack in self.racks.values() for h in rack.compute]

    def rack_of(self, host: str) -> Rack | None:
        for rack in self.racks.values():
            if any(h.name == host for h in rack.hosts):
                return rack
        return None


def fold(names: Iterable[str]) -> str:
    """Fold host names into a node set string (rack-a-tray[01-04,07])."""
    return str(NodeSet.fromlist(list(names)))
