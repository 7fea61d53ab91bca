"""The switch side of a rack's NVLink fabric, as NMX-M reports it, in tray terms (the sweep reads it).

NMX-M lists the NVLink switch trays (`/switch-nodes`, each with the NVSwitch ASICs of
`SwitchIDList`), the ASICs (`/switches`, each with its `DeviceUID` and `PortIDList`), every
NVLink port (`/ports`) and the GPUs (`/gpus`, each with its `PortIDList` and `PartitionID`).
A link is tied to what it serves through the model's own references, never by position:

  GPU-end port:    GPU.PortIDList holds it; PeerPortDeviceUID is the ASIC's DeviceUID, PeerPortNum the
                   switch's port number;
  switch-end port: Switch.PortIDList holds it; PeerPortDeviceUID is the GPU's DeviceUID;
  ASIC -> tray:    the switch node whose SwitchIDList holds the ASIC's ID.

So a switch node that is not HEALTHY maps to every compute tray whose GPUs are cabled to its
ASICs and to those GPUs' partitions; a port that is down maps to the GPU at its other end.
An object that breaks the model (a missing required field, a value outside its enum) is
refused with the rack, the list, the item and the field named (NMXError, exit 3): a fault
view built on a guess would be worse than none.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

from mctl.fabric.nmx import NMXError
from mctl.model.fabric import (DEFAULT_PARTITION_NAME, FabricGpu, NmxGpu, NmxPartition, NmxPort, NmxShapeError,
                               NmxSwitch, NmxSwitchNode, PartitionFabric, SwitchFault, SwitchSideView)

if TYPE_CHECKING:
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.partitions import FabricMap
    from mctl.model.site import Rack

# Switch node health that is a fault (UNKNOWN is "not reported": neither healthy nor a fault).
FAULTY_SWITCH = ("UNHEALTHY", "MISSING_NVLINK")


class SwitchSideMalformed(NMXError):
    """NMX-M answered a switch-side list with an object that breaks the OpenAPI model."""


def parse_lists(rack: str, nodes: Sequence[Any], switches: Sequence[Any], ports: Sequence[Any]
                ) -> tuple[list[NmxSwitchNode], list[NmxSwitch], list[NmxPort]]:
    try:
        return ([NmxSwitchNode.parse(d, i) for i, d in enumerate(nodes)],
                [NmxSwitch.parse(d, i) for i, d in enumerate(switches)],
                [NmxPort.parse(d, i) for i, d in enumerate(ports)])
    except NmxShapeError as exc:
        raise SwitchSideMalformed(f"rack {rack}: NMX-M's {exc} (the OpenAPI model's {_model(exc.kind)})",
                                  hint="the switch side is not judged from this answer; check the NMX-M release "
                                       "against tests/fixtures/real/nmx-m/opennmxm.yaml") from None


def _model(kind: str) -> str:
    return {"switch-nodes": "SwitchNode", "switches": "Switch", "ports": "Port"}.get(kind, kind)


def map_switch_side(rack: str, fabric: "FabricMap", gpus: Sequence[NmxGpu], partitions: Sequence[NmxPartition],
                    nodes: Sequence[NmxSwitchNode], switches: Sequence[NmxSwitch], ports: Sequence[NmxPort], *,
                    read_at: float | None = None) -> SwitchSideView:
    """The rack's partitions (tray terms, NMX-M health) and its faulty switch trays and ports (pure)."""
    ours: dict[str, FabricGpu] = {g.gpu_id: g for tray in fabric.trays.values() for g in tray}
    gpu_of_port = {pid: g for g in gpus if g.id in ours for pid in g.port_ids}
    gpu_of_uid = {g.device_uid: g for g in gpus if g.id in ours and g.device_uid is not None}
    node_of_asic_id = {sid: n for n in nodes for sid in n.switch_ids}
    node_of_uid = {s.device_uid: node_of_asic_id[s.id] for s in switches if s.id in node_of_asic_id}
    node_of_switch_port = {pid: node_of_asic_id[s.id] for s in switches if s.id in node_of_asic_id
                           for pid in s.port_ids}
    part_of_pid: dict[int, NmxPartition] = {p.partition_id: p for p in partitions}

    served: dict[str, set[str]] = {}                       # node id -> GPU ids cabled to it
    down: dict[tuple[str, int], set[str]] = {}             # (node id, switch port) -> GPU ids
    states: dict[tuple[str, int], str] = {}
    for port in ports:
        if port.type == "GPU" or port.id in gpu_of_port:
            gpu = gpu_of_port.get(port.id)
            node = node_of_uid.get(port.peer_uid)
            number = port.peer_num
        elif port.id in node_of_switch_port:
            node = node_of_switch_port[port.id]
            gpu = gpu_of_uid.get(port.peer_uid)
            number = port.port_num
        else:
            continue
        if gpu is None or node is None:
            continue
        served.setdefault(node.id, set()).add(gpu.id)
        if port.down:
            down.setdefault((node.id, number), set()).add(gpu.id)
            states[(node.id, number)] = f"{port.physical}/{port.logical}"

    def trays_of(gpu_ids) -> tuple[str, ...]:
        return tuple(sorted({ours[g].tray for g in gpu_ids}, key=_natural))

    def partitions_of(gpu_ids) -> tuple[str, ...]:
        names = set()
        for g in gpus:
            if g.id in gpu_ids and g.partition_id is not None:
                p = part_of_pid.get(g.partition_id)
                names.add(p.name if p is not None else f"PartitionID {g.partition_id}")
        return tuple(sorted(names))

    faults: list[SwitchFault] = []
    for n in nodes:
        if n.health in FAULTY_SWITCH and served.get(n.id):
            faults.append(SwitchFault(n.name, "switch", n.health, trays_of(served[n.id]),
                                      partitions_of(served[n.id])))
    by_id = {n.id: n for n in nodes}
    for (node_id, number), gpu_ids in sorted(down.items(), key=lambda kv: (by_id[kv[0][0]].name, kv[0][1])):
        faults.append(SwitchFault(by_id[node_id].name, "port", states[(node_id, number)], trays_of(gpu_ids),
                                  partitions_of(gpu_ids), port=number,
                                  gpus=tuple(sorted(f"{ours[g].tray}:{ours[g].device_id}" for g in gpu_ids))))
    rows = []
    for p in partitions:
        have, _ = fabric.resolve(p)
        if have:
            rows.append(PartitionFabric(p.name or DEFAULT_PARTITION_NAME, p.partition_id, p.health,
                                        tuple(sorted({g.tray for g in have}, key=_natural))))
    return SwitchSideView(rack, tuple(rows), tuple(faults), switch_nodes=len(nodes), ports=len(ports),
                          read_at=read_at)


def read_switch_side(client: "NMXClient", rack: "Rack") -> SwitchSideView:
    """One read of the rack's NMX-M (compute nodes, GPUs, partitions, switch nodes, switches, ports; each list
    paged), mapped to its trays. Raises NMXError (unreachable, refused, malformed)."""
    from mctl.fabric.reconcile import discover

    at = time.time()
    state = discover(client, rack)
    raw_nodes, raw_switches, raw_ports = client.switch_side()
    nodes, switches, ports = parse_lists(rack.name, raw_nodes, raw_switches, raw_ports)
    return map_switch_side(rack.name, state.fabric, state.gpus, state.partitions, nodes, switches, ports,
                           read_at=at)


def _natural(name: str) -> tuple:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
