"""What `mctl partition list|show` report: the inventory's partitions next to what NMX-M holds (no printing).

    partition_report(site, racks, offline=False) -> PartitionReport   every rack's rows, and the racks whose
                                                                      NMX-M could not be asked
    partition_detail(site, rack, name) -> dict                        one partition, its members per tray
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from mctl.errors import UsageError

if TYPE_CHECKING:
    from mctl.fabric.partitions import PartitionRow
    from mctl.model.site import Rack, Site


@dataclass
class PartitionReport:
    racks: list["Rack"]
    rows: list["PartitionRow"] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)          # rack -> why NMX-M could not be asked
    endpoints: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"racks": [{"rack": r.name, "nmx": self.endpoints[r.name], "error": self.errors.get(r.name),
                           "partitions": [row.to_dict() for row in self.rows if row.rack == r.name]}
                          for r in self.racks]}


def partition_report(site: "Site", racks: Sequence["Rack"], *, offline: bool = False) -> PartitionReport:
    """The rows of *racks*: NMX-M asked for each rack with an endpoint (not with *offline*); a rack whose
    NMX-M does not answer is shown as the inventory declares it, and named in `errors`."""
    from mctl.fabric.nmx import NMXClient, NMXError
    from mctl.fabric.partitions import desired_from_rack, partition_rows
    from mctl.fabric.reconcile import discover

    out = PartitionReport(list(racks))
    for r in racks:
        desired = desired_from_rack(r)
        out.endpoints[r.name] = r.nmx.url if r.nmx else None
        if offline or r.nmx is None:
            out.rows += [replace(row, state="declared") for row in partition_rows(r, desired, None, None)]
            continue
        client = NMXClient.for_rack(site, r)        # bad credentials file or URL: a usage error, raised
        try:
            state = discover(client, r)
            out.rows += partition_rows(r, desired, state.fabric, state.partitions)
        except NMXError as exc:
            out.errors[r.name] = exc.message
            out.rows += [replace(row, state="declared") for row in partition_rows(r, desired, None, None)]
    return out


def partition_detail(site: "Site", r: "Rack", name: str) -> dict[str, Any]:
    """One partition: the inventory's trays and, from NMX-M, its ID, health and members (UsageError: nowhere)."""
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover

    declared = next((p for p in r.partitions if p.name == name), None)
    found = None
    state = None
    if r.nmx is not None:
        state = discover(NMXClient.for_rack(site, r), r)
        found = next((p for p in state.partitions if p.name == name), None)
    if declared is None and found is None:
        known = sorted({p.name for p in r.partitions} | ({p.name for p in state.partitions} if state else set()))
        raise UsageError(f"rack {r.name} has no partition {name!r}",
                         hint=f"partitions: {', '.join(known) if known else 'none'}")
    members: list[dict] = []
    if found is not None and state is not None:
        have, foreign = state.fabric.resolve(found)
        for g in sorted(have):
            members.append({"tray": g.tray, "gpu": g.device_id, "gpu_id": g.gpu_id, "location": g.location.to_nmx()})
        members += [{"tray": None, "gpu": None, "gpu_id": f, "location": None} for f in foreign]
    return {"rack": r.name, "name": name, "nmx": r.nmx.url if r.nmx else None,
            "inventory_trays": list(declared.trays) if declared else None,
            "partition_id": found.partition_id if found else None, "id": found.id if found else None,
            "type": found.type if found else None, "health": found.health if found else None,
            "members": members, "found": found is not None}
