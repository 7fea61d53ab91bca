"""NVLink partitions and IMEX domains as mctl reasons about them (pure, no I/O).

Two vocabularies meet here. NMX-Manager speaks in GPU IDs, locations and
PartitionIDs; operators and the inventory speak in trays. A `FabricGpu` carries
both, so the planner can compare what the inventory wants with what NMX-M holds
without guessing, and a plan prints in the operator's words.

The NMX-M objects are read leniently (`from_nmx`): the field names follow the
documented API and the real compute-node sample; missing optional fields become
None instead of failing, because NetQ/NMX-M releases add and drop fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from ClusterShell.NodeSet import NodeSet

DEFAULT_PARTITION_ID = 32766
DEFAULT_PARTITION_NAME = "Default Partition"
MIN_PARTITION_ID = 1
MAX_PARTITION_ID = 32765          # user partitions; 32766 is the default one

MemberKind = Literal["ID_BASED", "LOCATION_BASED"]
MEMBER_KINDS: tuple[str, ...] = ("ID_BASED", "LOCATION_BASED")
# Enumerations of the NMX-M OpenAPI model (crates/libnmxm, docs/partitions.md).
PARTITION_HEALTH = ("HEALTHY", "DEGRADED", "DEGRADED_BANDWIDTH", "UNHEALTHY", "NEW", "UNKNOWN")
PARTITION_TYPES = ("ID_BASED", "LOCATION_BASED", "UNDEFINED")
GPU_HEALTH = ("UNKNOWN", "HEALTHY", "DEGRADED", "NO_NVLINK", "DEGRADED_BW")
COMPUTE_NODE_HEALTH = ("UNKNOWN", "HEALTHY", "DEGRADED", "UNHEALTHY")
SWITCH_NODE_HEALTH = ("UNKNOWN", "HEALTHY", "MISSING_NVLINK", "UNHEALTHY")
OPERATION_TERMINAL = ("completed", "failed", "cancelled")
OPERATION_STATES = ("pending", "in-progress") + OPERATION_TERMINAL

Granularity = Literal["tray", "gpu"]


def _int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- NMX-M objects

@dataclass(frozen=True, order=True)
class GpuLocation:
    """Where a GPU sits: what a LOCATION_BASED partition member names."""

    domain_uuid: str
    chassis_id: int
    slot_id: int
    host_id: int
    device_id: int

    def key(self) -> tuple[str, int, int, int, int]:
        return (self.domain_uuid.lower(), self.chassis_id, self.slot_id, self.host_id, self.device_id)

    def to_nmx(self) -> dict[str, Any]:
        return {"DomainUUID": self.domain_uuid, "ChassisID": self.chassis_id, "SlotID": self.slot_id,
                "HostID": self.host_id, "DeviceID": self.device_id}

    @classmethod
    def from_nmx(cls, data: dict[str, Any]) -> "GpuLocation":
        return cls(str(data.get("DomainUUID", "")), _int(data.get("ChassisID")) or 0, _int(data.get("SlotID")) or 0,
                   _int(data.get("HostID")) or 0, _int(data.get("DeviceID")) or 0)


@dataclass(frozen=True)
class NmxComputeNode:
    """One compute tray as NMX-M lists it under /compute-nodes."""

    id: str
    name: str
    domain_uuid: str
    gpu_ids: tuple[str, ...]
    health: str
    chassis_id: int | None
    chassis_serial: str | None
    host_id: int | None
    slot_id: int | None
    tray_index: int | None

    @classmethod
    def from_nmx(cls, data: dict[str, Any]) -> "NmxComputeNode":
        loc = data.get("LocationInfo") or {}
        return cls(id=str(data.get("ID", "")), name=str(data.get("Name", "")),
                   domain_uuid=str(data.get("DomainUUID", "")),
                   gpu_ids=tuple(str(g) for g in data.get("GpuIDList") or ()),
                   health=str(data.get("Health") or "UNKNOWN"),
                   chassis_id=_int(loc.get("ChassisID")), chassis_serial=loc.get("ChassisSerialNumber"),
                   host_id=_int(loc.get("HostID")), slot_id=_int(loc.get("SlotID")),
                   tray_index=_int(loc.get("TrayIndex")))


@dataclass(frozen=True)
class NmxGpu:
    """One GPU as NMX-M lists it under /gpus (it carries its PartitionID).

    `DeviceUID` and `SystemUID` are JSON numbers (uint64) in the NMX-M OpenAPI model; they
    are kept as ints (a string that holds digits, as older emulators wrote, is read too).
    """

    id: str
    device_id: int | None
    domain_uuid: str | None
    partition_id: int | None
    health: str
    device_uid: int | None = None
    system_uid: int | None = None
    port_ids: tuple[str, ...] = ()          # PortIDList: the GPU's NVLink ports (what ties a port to its GPU)

    @classmethod
    def from_nmx(cls, data: dict[str, Any]) -> "NmxGpu":
        loc = data.get("LocationInfo") or {}
        device = data.get("DeviceID", loc.get("DeviceID"))
        ports = data.get("PortIDList")
        return cls(id=str(data.get("ID", "")), device_id=_int(device),
                   domain_uuid=data.get("DomainUUID"), partition_id=_int(data.get("PartitionID")),
                   health=str(data.get("Health") or "UNKNOWN"), device_uid=_int(data.get("DeviceUID")),
                   system_uid=_int(data.get("SystemUID")),
                   port_ids=tuple(str(x) for x in ports) if isinstance(ports, list) else ())


# ------------------------------------------------- the switch side (NVLink switch trays)

PORT_TYPES = ("UNDEFINED", "GPU", "SWITCH_ACCESS", "SWITCH_TRUNK", "FNM", "HCA")
PORT_PHYSICAL_STATES = ("NO_CHANGE", "SLEEP", "POLLING", "DISABLED", "PORTCONFTRAIN", "LINKUP", "LINKERRRECOVER",
                        "PHYTEST")
PORT_LOGICAL_STATES = ("NO_CHANGE", "STATE_DOWN", "STATE_INIT", "STATE_ARMED", "STATE_ACTIVE", "STATE_ACT_DEFER")


class NmxShapeError(ValueError):
    """An NMX-M object that does not hold what the OpenAPI model says: names the list, the item and the field."""

    def __init__(self, kind: str, index: int, field_name: str, problem: str):
        super().__init__(f"{kind}[{index}].{field_name} {problem}")
        self.kind, self.index, self.field, self.problem = kind, index, field_name, problem


def _need_str(kind: str, i: int, data: Any, key: str, enum: tuple[str, ...] | None = None,
              required: bool = True) -> str | None:
    if not isinstance(data, dict):
        raise NmxShapeError(kind, i, "(item)", f"is {type(data).__name__}, not an object")
    value = data.get(key)
    if value is None:
        if required:
            raise NmxShapeError(kind, i, key, "is missing")
        return None
    if not isinstance(value, str):
        raise NmxShapeError(kind, i, key, f"is {type(value).__name__} {str(value)[:40]!r}, not a string")
    if enum is not None and value not in enum:
        raise NmxShapeError(kind, i, key, f"is {value[:40]!r}, not one of {', '.join(enum)}")
    return value


def _need_uint(kind: str, i: int, data: dict, key: str, required: bool = True) -> int | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NmxShapeError(kind, i, key, "is missing" if value is None else
                            f"is {str(value)[:40]!r}, not an unsigned integer")
    return value


def _need_ids(kind: str, i: int, data: dict, key: str) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise NmxShapeError(kind, i, key, "is not a list of IDs")
    return tuple(value)


@dataclass(frozen=True)
class NmxSwitchNode:
    """One NVLink switch tray as NMX-M lists it under /switch-nodes (the model's SwitchNode)."""

    id: str
    name: str
    health: str                             # UNKNOWN | HEALTHY | MISSING_NVLINK | UNHEALTHY
    switch_ids: tuple[str, ...]             # SwitchIDList: its NVSwitch ASICs (/switches)
    tray_index: int | None = None
    slot_id: int | None = None

    @classmethod
    def parse(cls, data: Any, i: int = 0) -> "NmxSwitchNode":
        kind = "switch-nodes"
        ident = _need_str(kind, i, data, "ID")
        health = _need_str(kind, i, data, "Health", SWITCH_NODE_HEALTH, required=False) or "UNKNOWN"
        loc = data.get("LocationInfo") if isinstance(data.get("LocationInfo"), dict) else {}
        return cls(ident or "", str(_need_str(kind, i, data, "Name", required=False) or ident), health,
                   _need_ids(kind, i, data, "SwitchIDList"), _int(loc.get("TrayIndex")), _int(loc.get("SlotID")))


@dataclass(frozen=True)
class NmxSwitch:
    """One NVSwitch ASIC under /switches (the model's Switch): its DeviceUID is what a GPU port's peer names."""

    id: str
    device_uid: int
    health: str
    port_ids: tuple[str, ...] = ()          # PortIDList: its own (switch-end) ports

    @classmethod
    def parse(cls, data: Any, i: int = 0) -> "NmxSwitch":
        kind = "switches"
        ident = _need_str(kind, i, data, "ID")
        return cls(ident or "", _need_uint(kind, i, data, "DeviceUID") or 0,
                   _need_str(kind, i, data, "Health", SWITCH_NODE_HEALTH, required=False) or "UNKNOWN",
                   _need_ids(kind, i, data, "PortIDList"))


@dataclass(frozen=True)
class NmxPort:
    """One NVLink port under /ports (the model's Port; its required fields are checked)."""

    id: str
    type: str
    port_num: int
    peer_uid: int                           # PeerPortDeviceUID: the device on the other end of the link
    peer_num: int                           # PeerPortNum: the port number on that device
    physical: str
    logical: str

    @property
    def down(self) -> bool:
        """Not up: physically not LINKUP, or logically not ACTIVE (NO_CHANGE, as the model's default, is neither)."""
        return (self.physical not in ("LINKUP", "NO_CHANGE")) or (self.logical not in ("STATE_ACTIVE", "NO_CHANGE"))

    @classmethod
    def parse(cls, data: Any, i: int = 0) -> "NmxPort":
        kind = "ports"
        ident = _need_str(kind, i, data, "ID")
        return cls(ident or "", _need_str(kind, i, data, "Type", PORT_TYPES, required=False) or "UNDEFINED",
                   _need_uint(kind, i, data, "PortNum") or 0, _need_uint(kind, i, data, "PeerPortDeviceUID") or 0,
                   _need_uint(kind, i, data, "PeerPortNum") or 0,
                   _need_str(kind, i, data, "PhysicalState", PORT_PHYSICAL_STATES) or "",
                   _need_str(kind, i, data, "LogicalState", PORT_LOGICAL_STATES) or "")


@dataclass(frozen=True)
class SwitchFault:
    """A switch tray (or one of its ports) that is not healthy, with what it serves in the rack."""

    switch: str                             # the switch node's Name (its ID when it has none)
    kind: Literal["switch", "port"]
    state: str                              # the node's Health, or the port's PhysicalState/LogicalState
    trays: tuple[str, ...]                  # the compute trays whose GPUs are cabled to it
    partitions: tuple[str, ...]             # the NMX-M partitions those GPUs are in
    port: int | None = None                 # the switch's port number (the GPU port's PeerPortNum)
    gpus: tuple[str, ...] = ()              # tray:device of the GPU ends of a port

    def to_dict(self) -> dict[str, Any]:
        return {"switch": self.switch, "kind": self.kind, "state": self.state, "trays": list(self.trays),
                "partitions": list(self.partitions), "port": self.port, "gpus": list(self.gpus)}


@dataclass(frozen=True)
class PartitionFabric:
    """One NMX-M partition of a rack, in tray terms, with its health as NMX-M says it."""

    name: str
    partition_id: int
    health: str
    trays: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "partition_id": self.partition_id, "health": self.health,
                "trays": list(self.trays)}


@dataclass(frozen=True)
class SwitchSideView:
    """What one read of a rack's NMX-M says about its switch side: partitions, faulty switch trays and ports.

    `error` is set when the read failed or NMX-M answered something malformed (then the lists are the last
    good read's, or empty); `read_at` is the wall-clock time of the read the lists come from (None: never)."""

    rack: str
    partitions: tuple[PartitionFabric, ...] = ()
    faults: tuple[SwitchFault, ...] = ()
    switch_nodes: int = 0
    ports: int = 0
    read_at: float | None = None
    error: str | None = None
    age_s: float | None = None              # how old the lists were when the sweep took them

    def for_tray(self, tray: str) -> tuple[list[PartitionFabric], list[SwitchFault]]:
        return ([p for p in self.partitions if tray in p.trays], [f for f in self.faults if tray in f.trays])

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "read_at": self.read_at, "age_s": self.age_s, "error": self.error,
                "switch_nodes": self.switch_nodes, "ports": self.ports,
                "partitions": [p.to_dict() for p in self.partitions], "faults": [f.to_dict() for f in self.faults]}


@dataclass(frozen=True)
class NmxPartition:
    """A partition as NMX-M holds it; `id` addresses it in URLs, `partition_id` is the fabric's number."""

    id: str
    partition_id: int
    name: str
    type: str
    health: str
    members: tuple[str | GpuLocation, ...]

    @property
    def is_default(self) -> bool:
        return self.partition_id == DEFAULT_PARTITION_ID or self.name == DEFAULT_PARTITION_NAME

    @classmethod
    def from_nmx(cls, data: dict[str, Any]) -> "NmxPartition":
        members: list[str | GpuLocation] = []
        for m in data.get("Members") or ():
            members.append(GpuLocation.from_nmx(m) if isinstance(m, dict) else str(m))
        kind = str(data.get("Type") or ("LOCATION_BASED" if members and isinstance(members[0], GpuLocation)
                                         else "ID_BASED"))
        pid = _int(data.get("PartitionID"))
        return cls(id=str(data.get("ID", "") or (pid if pid is not None else "")),
                   partition_id=pid if pid is not None else 0, name=str(data.get("Name", "")),
                   type=kind, health=str(data.get("Health") or "UNKNOWN"), members=tuple(members))


@dataclass(frozen=True)
class NmxOperation:
    """An asynchronous NMX-M operation (create, update or delete of a partition).

    The OpenAPI model: `ID, CreatedAt, UpdatedAt, Status, Percentage, CurrentStep,
    Request{Method, URI, Body, Cancellable}, Result{Data, Error, Details}`. A failed
    operation says why in `Result.Error` (a concise code) and `Result.Details` (text).
    """

    id: str
    status: str
    error: str | None = None                # Result.Error
    location: str | None = None             # the Location header of the 202, when NMX-M gave one
    details: str | None = None              # Result.Details
    percentage: float | None = None
    current_step: str | None = None
    cancellable: bool | None = None         # Request.Cancellable
    method: str | None = None               # Request.Method (lower case in the model)
    uri: str | None = None                  # Request.URI

    @property
    def terminal(self) -> bool:
        return self.status in OPERATION_TERMINAL

    @property
    def reason(self) -> str:
        """Why it ended as it did, in one line: `Error: Details`, either alone, or empty."""
        parts = [p for p in (self.error, self.details) if p]
        if len(parts) == 2 and parts[1].startswith(parts[0]):
            parts = parts[1:]
        return ": ".join(parts)

    @classmethod
    def from_nmx(cls, data: dict[str, Any]) -> "NmxOperation":
        status = str(data.get("Status") or data.get("status") or "").lower().replace("_", "-")
        result = data.get("Result") if isinstance(data.get("Result"), dict) else {}
        request = data.get("Request") if isinstance(data.get("Request"), dict) else {}
        err = result.get("Error") or data.get("Error") or data.get("error") or None
        details = result.get("Details") or None
        pct = data.get("Percentage")
        cancellable = request.get("Cancellable")
        return cls(id=str(data.get("ID") or data.get("operationId") or data.get("id") or ""), status=status,
                   error=None if err in (None, "") else str(err),
                   details=None if details in (None, "") else str(details),
                   percentage=float(pct) if isinstance(pct, (int, float)) and not isinstance(pct, bool) else None,
                   current_step=str(data["CurrentStep"]) if data.get("CurrentStep") else None,
                   cancellable=cancellable if isinstance(cancellable, bool) else None,
                   method=str(request["Method"]).lower() if request.get("Method") else None,
                   uri=str(request["URI"]) if request.get("URI") else None)


# ------------------------------------------------------- partitions, tray view

@dataclass(frozen=True, order=True)
class FabricGpu:
    """A GPU known both by its tray (inventory) and by its NMX-M identity."""

    tray: str
    device_id: int
    gpu_id: str = field(compare=False)
    location: GpuLocation = field(compare=False)

    def member(self, kind: str) -> str | dict[str, Any]:
        return self.location.to_nmx() if kind == "LOCATION_BASED" else self.gpu_id


@dataclass(frozen=True)
class DesiredPartition:
    """A partition the operator wants: whole trays (the default) or, explicitly, single GPUs."""

    name: str
    rack: str
    trays: tuple[str, ...] = ()
    gpus: tuple[tuple[str, int], ...] | None = None     # (tray, device) pairs; None = whole trays

    @property
    def granularity(self) -> Granularity:
        return "tray" if self.gpus is None else "gpu"

    def members(self, gpus_per_tray: int) -> frozenset[tuple[str, int]]:
        if self.gpus is not None:
            return frozenset(self.gpus)
        return frozenset((t, d) for t in self.trays for d in range(gpus_per_tray))

    def touched_trays(self) -> tuple[str, ...]:
        if self.gpus is None:
            return self.trays
        return tuple(dict.fromkeys(t for t, _ in self.gpus))


def describe_members(gpus: Iterable[tuple[str, int]] | Iterable[FabricGpu], gpus_per_tray: int) -> str:
    """Fold members into operator words: whole trays as a node set, partial trays as tray:[devices]."""
    by_tray: dict[str, set[int]] = {}
    for g in gpus:
        tray, dev = (g.tray, g.device_id) if isinstance(g, FabricGpu) else g
        by_tray.setdefault(tray, set()).add(dev)
    whole = [t for t, devs in by_tray.items() if len(devs) >= gpus_per_tray]
    parts = [str(NodeSet.fromlist(whole))] if whole else []
    for tray in sorted(set(by_tray) - set(whole), key=_natural):
        devs = sorted(by_tray[tray])
        parts.append(f"{tray}:[{','.join(str(d) for d in devs)}]")
    return " ".join(parts) if parts else "-"


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


ChangeAction = Literal["create", "update", "delete"]


@dataclass(frozen=True)
class PartitionChange:
    """One NMX-M call of a plan, with the members before and after in tray terms."""

    action: ChangeAction
    name: str
    kind: str
    members: tuple[FabricGpu, ...]          # after the change (empty for delete)
    before: tuple[FabricGpu, ...]           # before the change (empty for create)
    reason: str
    nmx_id: str | None = None               # URL id of an existing partition
    partition_id: int | None = None

    def payload_members(self) -> list[str | dict[str, Any]]:
        return [g.member(self.kind) for g in sorted(self.members)]

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "name": self.name, "type": self.kind, "reason": self.reason,
                "id": self.nmx_id, "partition_id": self.partition_id,
                "trays": sorted({g.tray for g in self.members}, key=_natural),
                "gpus": len(self.members), "before_trays": sorted({g.tray for g in self.before}, key=_natural),
                "members": self.payload_members()}


@dataclass(frozen=True)
class PartitionPlan:
    """The concrete NMX-M changes that make a rack's partitions match the desired ones, in a safe order."""

    rack: str
    endpoint: str | None
    changes: tuple[PartitionChange, ...]
    unchanged: tuple[str, ...] = ()
    unmanaged: tuple[str, ...] = ()         # on NMX-M, not in the inventory, left alone
    released: tuple[FabricGpu, ...] = ()    # GPUs that end in the default partition
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.changes

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "endpoint": self.endpoint, "changes": [c.to_dict() for c in self.changes],
                "unchanged": list(self.unchanged), "unmanaged": list(self.unmanaged),
                "released_trays": sorted({g.tray for g in self.released}, key=_natural),
                "warnings": list(self.warnings)}


# ---------------------------------------------------------------------- IMEX

# Connectivity letters of `nvidia-imex-ctl -N` and the words of its JSON form.
LINK_WORDS: dict[str, str] = {
    "C": "CONNECTED", "N": "NEVER_CONNECTED", "R": "RECOVERING", "D": "DISCONNECTED",
    "A": "AUTHENTICATING", "I": "INVALID", "!V!": "VERSION_MISMATCH", "!M!": "NODE_MAP_MISMATCH",
}
LINK_LETTERS: dict[str, str] = {word: letter for letter, word in LINK_WORDS.items()}
# DCGM's enum of `nvidia-imex-ctl -q` answers, in order (value = position).
DAEMON_STATES: tuple[str, ...] = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY",
                                  "INIT_GPU", "READY", "SHUTTING_DOWN", "UNAVAILABLE")
DOMAIN_STATES: tuple[str, ...] = ("UP", "DEGRADED", "DOWN")


@dataclass(frozen=True)
class ImexMember:
    tray: str
    address: str


@dataclass(frozen=True)
class ImexDomain:
    """The trays that form one IMEX domain; it always sits inside one NVLink partition."""

    name: str
    rack: str
    members: tuple[ImexMember, ...]         # sorted by tray name: identical order on every tray

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(m.address for m in self.members)

    @property
    def trays(self) -> tuple[str, ...]:
        return tuple(m.tray for m in self.members)


@dataclass(frozen=True)
class ImexNodeStatus:
    index: int
    address: str
    state: str
    version: str | None = None
    hostname: str | None = None
    links: tuple[str, ...] = ()             # connectivity letter towards node j, by index


@dataclass(frozen=True)
class ImexDomainStatus:
    """One daemon's view of its whole domain (`nvidia-imex-ctl -N`)."""

    state: str
    nodes: tuple[ImexNodeStatus, ...]
    timestamp: str | None = None

    def link(self, src: int, dst: int) -> str | None:
        for node in self.nodes:
            if node.index == src:
                return node.links[dst] if dst < len(node.links) else None
        return None

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(n.address for n in sorted(self.nodes, key=lambda n: n.index))

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "timestamp": self.timestamp,
                "nodes": [{"index": n.index, "address": n.address, "hostname": n.hostname, "state": n.state,
                           "version": n.version, "links": list(n.links)} for n in self.nodes]}


@dataclass(frozen=True)
class ImexReason:
    """Why a domain is not UP, pinned to a tray where one is to blame."""

    message: str
    tray: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tray": self.tray, "message": self.message}


@dataclass(frozen=True)
class ImexDomainHealth:
    domain: ImexDomain
    state: str                              # UP | DEGRADED | DOWN | UNKNOWN
    reasons: tuple[ImexReason, ...] = ()
    per_tray: tuple[tuple[str, str], ...] = ()   # (tray, daemon state as -q says)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain.name, "rack": self.domain.rack, "state": self.state,
                "trays": list(self.domain.trays), "addresses": list(self.domain.addresses),
                "daemons": dict(self.per_tray), "reasons": [r.to_dict() for r in self.reasons]}
