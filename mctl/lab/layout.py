"""Names, addresses and identities of a lab's hosts (pure; no I/O).

Everything here follows the lab contract (notes/lab-contract.md) so the lab's
hosts, the GPU emulator and the per-rack services agree without talking:
racks lab-r1.., trays lab-rR-trayNN at 127.77.R.N, head lab-rR-head at
127.77.R.100, rack services at 127.77.R.200, and a rack's NVLink domain is
uuid5(NAMESPACE_URL, "mctl-lab/<lab>/<rack>").

The second octet (77) can be moved (`--net`) so two labs, say an operator's
and a test run's, can be up at once; everything downstream reads addresses
from the lab's inventory, never from this rule.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

MAX_RACKS = 99
MAX_TRAYS = 18          # an NVL72 rack holds 18 compute trays
HEAD_OCTET = 100
SERVICE_OCTET = 200
BMC_RACK_OFFSET = 100   # tray N of rack R has its BMC at 127.net.(100+R).N (docs/lab.md, "BMCs")
MAX_SWITCH_TRAYS = 9    # an NVL72 rack holds 9 NVLink switch trays
SWITCH_OCTET = 60       # switch tray S of rack R: NVOS at 127.net.R.(60+S), its BMC at 127.net.(100+R).(60+S)
DEFAULT_NET = 77

Kind = Literal["tray", "head"]


@dataclass(frozen=True)
class LabHost:
    name: str
    address: str
    kind: Kind
    rack: str
    rack_index: int          # 1-based
    slot: int                # tray number in the rack (1-based); 0 for the head

    @property
    def tray_index(self) -> int:
        return self.slot - 1


@dataclass(frozen=True)
class LabSwitchTray:
    """An NVLink switch tray of the lab: only its BMC runs (mctl never logs in to NVOS, so no host stands
    behind *address*, the NVOS management address the inventory lists)."""

    name: str
    address: str
    rack: str
    rack_index: int          # 1-based
    index: int               # switch tray number in the rack (1-based)


@dataclass(frozen=True)
class LabLayout:
    name: str
    racks: int
    trays: int
    net: int = DEFAULT_NET
    switch_trays: int = 0    # per rack; each is a BMC only (docs/lab.md, "Switch trays")

    def __post_init__(self) -> None:
        if not 1 <= self.net <= 254:
            raise ValueError("net must be 1..254")
        if not 1 <= self.racks <= MAX_RACKS:
            raise ValueError(f"racks must be 1..{MAX_RACKS}")
        if not 1 <= self.trays <= MAX_TRAYS:
            raise ValueError(f"trays must be 1..{MAX_TRAYS}")
        if not 0 <= self.switch_trays <= MAX_SWITCH_TRAYS:
            raise ValueError(f"switch trays must be 0..{MAX_SWITCH_TRAYS}")

    def rack_names(self) -> list[str]:
        return [rack_name(r) for r in range(1, self.racks + 1)]

    def hosts(self) -> list[LabHost]:
        out: list[LabHost] = []
        for r in range(1, self.racks + 1):
            rack = rack_name(r)
            out.append(LabHost(f"{rack}-head", f"127.{self.net}.{r}.{HEAD_OCTET}", "head", rack, r, 0))
            for n in range(1, self.trays + 1):
                out.append(LabHost(tray_name(r, n), f"127.{self.net}.{r}.{n}", "tray", rack, r, n))
        return out

    def trays_of(self, rack: str) -> list[LabHost]:
        return [h for h in self.hosts() if h.rack == rack and h.kind == "tray"]

    def host(self, name: str) -> LabHost | None:
        return next((h for h in self.hosts() if h.name == name), None)

    def switches_of(self, rack: str) -> list[LabSwitchTray]:
        if rack not in self.rack_names():
            return []
        r = self.rack_names().index(rack) + 1
        return [LabSwitchTray(switch_name(r, s), f"127.{self.net}.{r}.{SWITCH_OCTET + s}", rack, r, s)
                for s in range(1, self.switch_trays + 1)]

    def switches(self) -> list[LabSwitchTray]:
        return [sw for rack in self.rack_names() for sw in self.switches_of(rack)]

    def switch(self, name: str) -> LabSwitchTray | None:
        return next((sw for sw in self.switches() if sw.name == name), None)

    def switch_bmc_address(self, sw: LabSwitchTray) -> str:
        return f"127.{self.net}.{BMC_RACK_OFFSET + sw.rack_index}.{SWITCH_OCTET + sw.index}"

    def nvlink_domain(self, rack: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"mctl-lab/{self.name}/{rack}"))

    def bmc_address(self, host: LabHost) -> str:
        """The tray's BMC: its own loopback address, as a real BMC has its own port and address."""
        return f"127.{self.net}.{BMC_RACK_OFFSET + host.rack_index}.{host.slot}"

    def service_address(self, rack_index: int) -> str:
        return f"127.{self.net}.{rack_index}.{SERVICE_OCTET}"


def rack_name(r: int) -> str:
    return f"lab-r{r}"


def tray_name(r: int, n: int) -> str:
    return f"lab-r{r}-tray{n:02d}"


def switch_name(r: int, s: int) -> str:
    return f"lab-r{r}-sw{s:02d}"


def etc_hosts(layout: LabLayout) -> str:
    """/etc/hosts for every lab host, so lab names resolve as on a real site."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", "ff02::1\tip6-allnodes",
             "ff02::2\tip6-allrouters", "", "# mctl virtual lab " + layout.name]
    for h in layout.hosts():
        lines.append(f"{h.address}\t{h.name}")
    for r in range(1, layout.racks + 1):
        lines.append(f"{layout.service_address(r)}\t{rack_name(r)}-nmx")
    return "\n".join(lines) + "\n"
