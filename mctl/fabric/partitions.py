"""Partition planning: desired partitions (inventory) vs what NMX-Manager holds -> ordered changes.

Pure. Operators partition at tray granularity because IMEX domains and Slurm
blocks follow trays; GPU granularity exists only behind an explicit flag.
A partition's name is its identity: NMX-M cannot rename, and PUT replaces the
whole member list, so a changed partition is one PUT (or two, see below).

Ordering makes every step valid on its own, since NMX-M refuses a member that
another partition still holds (409): deletes first, then partitions that only
give GPUs away, then partitions that take GPUs, then new partitions. A partition
that both gives and takes is first shrunk to what it keeps, then grown; one
that keeps nothing is deleted and created again (its PartitionID changes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSet, RangeSetParseError

from mctl.errors import MctlError, UsageError
from mctl.model.fabric import (DEFAULT_PARTITION_NAME, MEMBER_KINDS, DesiredPartition, FabricGpu, GpuLocation,
                               NmxComputeNode, NmxGpu, NmxPartition, PartitionChange, PartitionPlan,
                               describe_members)
from mctl.model.names import PARTITION_GRAMMAR, is_partition_name
from mctl.model.site import Partition

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

# Template name -> number of equal partitions. Named after the full 18-tray rack;
# on a partly populated rack they divide the trays it has.
TEMPLATES: dict[str, int] = {"all": 1, "2x9": 2, "3x6": 3, "6x3": 6, "18x1": 18}


class FabricMismatch(MctlError):
    """NMX-M's view of the rack does not match the inventory (missing trays, several domains)."""


# ------------------------------------------------------------------ templates

def template_partitions(rack: "Rack", template: str) -> tuple[Partition, ...]:
    """The partitions a template makes of this rack's trays, in rack order."""
    if template not in TEMPLATES:
        raise UsageError(f"unknown partition template {template!r}",
                         hint=f"templates: {', '.join(TEMPLATES)} (see 'mctl partition templates')")
    count = TEMPLATES[template]
    trays = [h.name for h in rack.compute]
    if not trays:
        raise UsageError(f"rack {rack.name} has no compute trays to partition")
    if len(trays) % count:
        fit = [t for t, c in TEMPLATES.items() if len(trays) % c == 0]
        raise UsageError(f"template {template} makes {count} equal partitions, but rack {rack.name} has "
                         f"{len(trays)} compute trays, which do not divide by {count}",
                         hint=f"templates that fit this rack: {', '.join(fit)}; or name trays with --trays")
    size = len(trays) // count
    names = ["all"] if count == 1 else [f"p{i}" for i in range(count)]
    return tuple(Partition(names[i], rack.name, tuple(trays[i * size:(i + 1) * size])) for i in range(count))


def template_table(rack: "Rack") -> list[dict]:
    """What each template would make of this rack (or why it does not fit)."""
    rows = []
    n = len(rack.compute)
    for name, count in TEMPLATES.items():
        fits = n > 0 and n % count == 0
        rows.append({"template": name, "partitions": count, "trays_each": n // count if fits else None,
                     "fits": fits,
                     "result": (f"{count} partition{'s' if count > 1 else ''} of {n // count} tray"
                                f"{'s' if n // count > 1 else ''}" if fits
                                else f"does not fit: {n} trays do not divide by {count}")})
    return rows


# ------------------------------------------------------------- desired state

def desired_from_rack(rack: "Rack") -> tuple[DesiredPartition, ...]:
    return tuple(DesiredPartition(p.name, rack.name, tuple(p.trays)) for p in rack.partitions)


def parse_trays(rack: "Rack", spec: str) -> tuple[str, ...]:
    from mctl.model.names import nodeset_too_big

    big = nodeset_too_big(spec)
    if big:
        raise UsageError(big, hint="a partition holds trays of one rack, e.g. rack-a-tray[01-09]")
    try:
        return tuple(NodeSet(spec))
    except (NodeSetParseError, RangeSetParseError) as exc:
        raise UsageError(f"bad node-set syntax in {spec!r}: {exc}",
                         hint=f"use ClusterShell syntax, e.g. {rack.compute[0].name if rack.compute else 'rack-a-tray01'}"
                              " or rack-a-tray[01-09]") from None


def parse_gpu_members(rack: "Rack", specs: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """`TRAYS:DEVICES` groups (e.g. `rack-a-tray01:0-1`, `rack-a-tray[02-03]`) -> (tray, device) pairs.

    A group without `:DEVICES` means every GPU of those trays. Groups are separate
    arguments or separated by `;` or spaces.
    """
    out: list[tuple[str, int]] = []
    for spec in specs:
        for group in re.split(r"[;\s]+", spec.strip()):
            if not group:
                continue
            trays_part, _, devs_part = group.partition(":")
            trays = parse_trays(rack, trays_part)
            if devs_part:
                try:
                    devs = [int(d) for d in RangeSet(devs_part.strip("[]"))]
                except (RangeSetParseError, ValueError) as exc:
                    raise UsageError(f"bad GPU list {devs_part!r} in {group!r}: {exc}",
                                     hint="give GPU indexes as a range set, e.g. rack-a-tray01:0-1 or :0,2") from None
            else:
                devs = list(range(rack.gpus_per_tray))
            out.extend((t, d) for t in trays for d in devs)
    return tuple(dict.fromkeys(out))


def check_partition_name(name: str) -> None:
    """The partition grammar of mctl.model.names; NMX-M's own default partition is not a name to give."""
    if not is_partition_name(name) or name == DEFAULT_PARTITION_NAME:
        raise UsageError(f"invalid partition name {name!r}",
                         hint=f"use {PARTITION_GRAMMAR}; 'Default Partition' is NMX-M's own")


def validate_desired(rack: "Rack", desired: Sequence[DesiredPartition], *, site: "Site | None" = None,
                     allow_gpu_granularity: bool = False) -> tuple[str, ...]:
    """Refuse what cannot be a set of NVLink partitions of this rack; return warnings for what merely hurts."""
    own = {h.name for h in rack.compute}
    elsewhere = {h.name: r.name for r in (site.racks.values() if site else ()) if r.name != rack.name
                 for h in r.compute}
    per_tray = rack.gpus_per_tray
    warnings: list[str] = []
    owner: dict[tuple[str, int], str] = {}
    names: set[str] = set()
    for d in desired:
        check_partition_name(d.name)
        if d.name in names:
            raise UsageError(f"partition {d.name!r} is given twice for rack {rack.name}",
                             hint="a partition's name is its identity on NMX-M; give each partition its own")
        names.add(d.name)
        members = d.members(per_tray)
        if not members:
            raise UsageError(f"partition {d.name!r} has no trays", hint="name at least one tray of the rack")
        for tray in d.touched_trays():
            if tray in elsewhere:
                raise UsageError(f"tray {tray} belongs to rack {elsewhere[tray]}: partition {d.name!r} of rack "
                                 f"{rack.name} cannot hold it",
                                 hint="an NVLink partition lives inside one NVLink domain (one rack)")
            if tray not in own:
                raise UsageError(f"unknown tray {tray} in partition {d.name!r}",
                                 hint=f"trays of {rack.name}: {NodeSet.fromlist(sorted(own)) if own else 'none'}")
        bad = sorted(dev for _, dev in members if not 0 <= dev < per_tray)
        if bad:
            raise UsageError(f"partition {d.name!r} names GPU {bad[0]}, but a {rack.model} tray has GPUs "
                             f"0-{per_tray - 1}")
        by_tray: dict[str, set[int]] = {}
        for tray, dev in members:
            by_tray.setdefault(tray, set()).add(dev)
        partial = sorted((t for t, devs in by_tray.items() if len(devs) < per_tray), key=_natural)
        if partial:
            tray = partial[0]
            if not allow_gpu_granularity:
                raise UsageError(f"partition {d.name!r} holds only GPUs {sorted(by_tray[tray])} of tray {tray}: "
                                 "smaller than one tray",
                                 hint="partition whole trays (IMEX domains and Slurm blocks follow trays), or pass "
                                      "--gpu-granularity to split a tray on purpose")
            warnings.append(f"partition {d.name!r} splits tray{'s' if len(partial) > 1 else ''} "
                            f"{NodeSet.fromlist(partial)}: IMEX domains and Slurm blocks cannot follow it")
        for member in sorted(members):
            if member in owner:
                raise UsageError(f"tray {member[0]} (GPU {member[1]}) is in partitions {owner[member]!r} and "
                                 f"{d.name!r}: partitions overlap", hint="a GPU belongs to exactly one partition")
            owner[member] = d.name
    return tuple(warnings)


# ------------------------------------------------------------ discovered state

@dataclass(frozen=True)
class FabricMap:
    """The rack's trays matched to NMX-M compute nodes, and every GPU under both names."""

    rack: str
    domain_uuid: str | None
    trays: dict[str, tuple[FabricGpu, ...]]
    missing: tuple[str, ...]                 # inventory trays NMX-M does not list
    unmatched: tuple[str, ...]               # NMX-M compute nodes of the domain no tray matched
    matched_by: str                          # how trays were matched (for messages)

    def __post_init__(self) -> None:
        by_id: dict[str, FabricGpu] = {}
        by_loc: dict[tuple, FabricGpu] = {}
        for gpus in self.trays.values():
            for g in gpus:
                by_id[g.gpu_id] = g
                by_loc[g.location.key()] = g
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_by_loc", by_loc)

    def resolve(self, partition: NmxPartition) -> tuple[frozenset[FabricGpu], tuple[str, ...]]:
        """Members of an NMX-M partition as this rack's GPUs, plus the ones that are not this rack's."""
        have: set[FabricGpu] = set()
        foreign: list[str] = []
        for m in partition.members:
            g = self._by_loc.get(m.key()) if isinstance(m, GpuLocation) else self._by_id.get(m)  # type: ignore
            if g is None:
                foreign.append(str(m.to_nmx()) if isinstance(m, GpuLocation) else m)
            else:
                have.add(g)
        return frozenset(have), tuple(foreign)

    def gpus_for(self, d: DesiredPartition, endpoint: str | None = None) -> frozenset[FabricGpu]:
        out: set[FabricGpu] = set()
        for tray in d.touched_trays():
            if tray in self.missing or tray not in self.trays:
                raise FabricMismatch(
                    f"tray {tray} of partition {d.name!r} is not among NMX-M's compute nodes"
                    f"{' at ' + endpoint if endpoint else ''} (trays matched {self.matched_by})",
                    hint="check the tray is cabled and discovered by NMX-M ('mctl partition list' shows the "
                         "nodes), or map it with the tray's host var nmx_name or tray_index")
        if d.gpus is None:
            for tray in d.trays:
                out.update(self.trays[tray])
            return frozenset(out)
        for tray, dev in d.gpus:
            g = next((g for g in self.trays[tray] if g.device_id == dev), None)
            if g is None:
                raise FabricMismatch(f"NMX-M lists no GPU {dev} on tray {tray}",
                                     hint=f"GPUs NMX-M lists there: {sorted(x.device_id for x in self.trays[tray])}")
            out.add(g)
        return frozenset(out)


def map_fabric(rack: "Rack", nodes: Sequence[NmxComputeNode], gpus: Sequence[NmxGpu] = ()) -> FabricMap:
    """Match the rack's trays to NMX-M compute nodes of its NVLink domain.

    A tray matches, in this order: its host var `nmx_name` (node Name), its host
    var `tray_index` (LocationInfo.TrayIndex), a node named like the tray. When no
    tray matches by name at all, trays match by position: the Nth tray of the
    inventory is TrayIndex N-1 (how NVL72 trays are numbered top to bottom).
    """
    domain = rack.nvlink_domain.lower() if rack.nvlink_domain else None
    if domain:
        nodes = [n for n in nodes if n.domain_uuid.lower() == domain]
    else:
        domains = sorted({n.domain_uuid.lower() for n in nodes if n.domain_uuid})
        if len(domains) > 1:
            raise FabricMismatch(f"NMX-M manages {len(domains)} NVLink domains ({', '.join(domains)}) and rack "
                                 f"{rack.name} does not say which is its own",
                                 hint=f"set racks.{rack.name}.nvlink_domain in the inventory")
        domain = domains[0] if domains else None
    by_name = {n.name: n for n in nodes}
    by_index = {n.tray_index: n for n in nodes if n.tray_index is not None}
    named = any(h.name in by_name or h.name.split(".")[0] in by_name for h in rack.compute)
    explicit = any("nmx_name" in (h.vars or {}) or "tray_index" in (h.vars or {}) for h in rack.compute)
    matched_by = "by name" if named else ("by host vars" if explicit else "by position (TrayIndex)")
    gpu_records = {g.id: g for g in gpus}
    trays: dict[str, tuple[FabricGpu, ...]] = {}
    missing: list[str] = []
    used: dict[str, str] = {}
    for position, host in enumerate(rack.compute):
        hv = host.vars or {}
        if "nmx_name" in hv:
            node = by_name.get(str(hv["nmx_name"]))
        elif "tray_index" in hv:
            node = by_index.get(int(hv["tray_index"]))
        elif named:
            node = by_name.get(host.name) or by_name.get(host.name.split(".")[0])
        else:
            node = by_index.get(position)
        if node is None:
            missing.append(host.name)
            continue
        if node.id in used:
            raise FabricMismatch(f"trays {used[node.id]} and {host.name} both match NMX-M compute node "
                                 f"{node.name!r}", hint="set distinct nmx_name or tray_index host vars")
        used[node.id] = host.name
        out = []
        for position_in_node, gid in enumerate(node.gpu_ids):
            rec = gpu_records.get(gid)
            dev = rec.device_id if rec is not None and rec.device_id is not None else position_in_node
            loc = GpuLocation(node.domain_uuid, node.chassis_id or 0, node.slot_id or 0, node.host_id or 0, dev)
            out.append(FabricGpu(host.name, dev, gid, loc))
        trays[host.name] = tuple(sorted(out))
    unmatched = tuple(sorted((n.name for n in nodes if n.id not in used), key=_natural))
    return FabricMap(rack.name, domain, trays, tuple(missing), unmatched, matched_by)


# --------------------------------------------------------------------- planner

def plan_partitions(rack: "Rack", desired: Sequence[DesiredPartition], fabric: FabricMap,
                    existing: Sequence[NmxPartition], *, prune: bool = False, kind: str = "ID_BASED",
                    endpoint: str | None = None) -> PartitionPlan:
    """The ordered NMX-M changes that turn *existing* into *desired* (empty when they already match)."""
    if kind not in MEMBER_KINDS:
        raise UsageError(f"unknown member kind {kind!r}", hint=f"one of {', '.join(MEMBER_KINDS)}")
    warnings: list[str] = []
    for tray, gpus in fabric.trays.items():
        if len(gpus) != rack.gpus_per_tray:
            warnings.append(f"NMX-M lists {len(gpus)} GPUs on tray {tray} (a {rack.model} tray has "
                            f"{rack.gpus_per_tray})")
    want = {d.name: fabric.gpus_for(d, endpoint) for d in desired}
    claimed: set[FabricGpu] = set().union(*want.values()) if want else set()
    current = [p for p in existing if not p.is_default]
    by_name = {p.name: p for p in current}
    resolved = {p.name: fabric.resolve(p) for p in current}

    deletes: list[PartitionChange] = []
    shrinks: list[PartitionChange] = []
    grows: list[PartitionChange] = []
    creates: list[PartitionChange] = []
    unchanged: list[str] = []
    unmanaged: list[str] = []

    for p in sorted(current, key=lambda p: p.partition_id):
        if p.name in want:
            continue
        have, _ = resolved[p.name]
        takers = sorted({d for d, gs in want.items() if gs & have})
        if takers:
            deletes.append(_change("delete", p, p.type, (), have,
                                   f"not in the inventory; holds GPUs that {', '.join(map(repr, takers))} "
                                   f"need{'s' if len(takers) == 1 else ''}"))
        elif prune:
            deletes.append(_change("delete", p, p.type, (), have, "not in the inventory (--prune)"))
        else:
            unmanaged.append(p.name)

    for d in desired:
        target = want[d.name]
        p = by_name.get(d.name)
        if p is None:
            creates.append(PartitionChange("create", d.name, kind, tuple(sorted(target)), (), "in the inventory, "
                                           "not on NMX-M"))
            continue
        have, foreign = resolved[d.name]
        if have == target and not foreign:
            unchanged.append(d.name)
            continue
        keep = have & target
        if not keep:
            deletes.append(_change("delete", p, p.type, (), have, "no GPU in common with the inventory: recreated"))
            creates.append(PartitionChange("create", d.name, kind, tuple(sorted(target)), (),
                                           "recreated with the inventory's trays"))
            continue
        lose = bool(have - target) or bool(foreign)
        gain = bool(target - have)
        if lose and gain:
            shrinks.append(_change("update", p, p.type, keep, have, "first gives up GPUs another partition needs"))
            grows.append(_change("update", p, p.type, target, keep, "members as in the inventory"))
        elif lose:
            shrinks.append(_change("update", p, p.type, target, have, "members as in the inventory"))
        else:
            grows.append(_change("update", p, p.type, target, have, "members as in the inventory"))

    kept = set().union(*(resolved[n][0] for n in unmanaged)) if unmanaged else set()
    held = set().union(*(have for have, _ in resolved.values())) if resolved else set()
    released = tuple(sorted(held - claimed - kept))
    return PartitionPlan(rack=rack.name, endpoint=endpoint, changes=tuple(deletes + shrinks + grows + creates),
                         unchanged=tuple(unchanged), unmanaged=tuple(unmanaged), released=released,
                         warnings=tuple(warnings))


def _change(action: str, p: NmxPartition, kind: str, members: Iterable[FabricGpu], before: Iterable[FabricGpu],
            reason: str) -> PartitionChange:
    return PartitionChange(action, p.name, kind, tuple(sorted(members)), tuple(sorted(before)), reason,  # type: ignore[arg-type]
                           nmx_id=p.id, partition_id=p.partition_id)


def describe_change(change: PartitionChange, gpus_per_tray: int) -> str:
    """One line per change, in trays: what an operator reads before saying yes."""
    after = describe_members(change.members, gpus_per_tray)
    before = describe_members(change.before, gpus_per_tray)
    pid = f" (PartitionID {change.partition_id})" if change.partition_id else ""
    if change.action == "create":
        return f"create {change.name}: {after} ({len(change.members)} GPUs, {change.kind})"
    if change.action == "delete":
        return f"delete {change.name}{pid}: {before} back to the default partition ({change.reason})"
    return f"update {change.name}{pid}: {before} -> {after} ({change.reason})"


# ------------------------------------------------------------------ list view

@dataclass(frozen=True)
class PartitionRow:
    """One line of `mctl partition list`: desired and actual side by side."""

    rack: str
    name: str
    state: str                  # in-sync | differs | missing | unmanaged | default | not-applied
    trays: str                  # what NMX-M holds (or the inventory's, when not on NMX-M)
    gpus: int
    desired: str | None = None
    partition_id: int | None = None
    nmx_id: str | None = None
    health: str | None = None

    def to_dict(self) -> dict:
        return {"rack": self.rack, "name": self.name, "state": self.state, "trays": self.trays, "gpus": self.gpus,
                "desired_trays": self.desired, "partition_id": self.partition_id, "id": self.nmx_id,
                "health": self.health}


def partition_rows(rack: "Rack", desired: Sequence[DesiredPartition], fabric: FabricMap | None,
                   existing: Sequence[NmxPartition] | None) -> list[PartitionRow]:
    per = rack.gpus_per_tray
    want = {d.name: d for d in desired}
    rows: list[PartitionRow] = []
    if fabric is None or existing is None:
        for d in desired:
            members = d.members(per)
            rows.append(PartitionRow(rack.name, d.name, "not-applied", describe_members(members, per), len(members),
                                     describe_members(members, per)))
        return rows
    seen: set[str] = set()
    for p in sorted(existing, key=lambda p: p.partition_id):
        have, foreign = fabric.resolve(p)
        trays = describe_members(have, per) + (f" +{len(foreign)} foreign" if foreign else "")
        gpus = len(have) + len(foreign)
        if p.is_default:
            rows.append(PartitionRow(rack.name, p.name, "default", trays, gpus, None, p.partition_id, p.id, p.health))
            continue
        d = want.get(p.name)
        seen.add(p.name)
        if d is None:
            rows.append(PartitionRow(rack.name, p.name, "unmanaged", trays, gpus, None, p.partition_id, p.id,
                                     p.health))
            continue
        try:
            target = fabric.gpus_for(d)
            state = "in-sync" if target == have and not foreign else "differs"
        except FabricMismatch:
            state = "differs"
        rows.append(PartitionRow(rack.name, p.name, state, trays, gpus, describe_members(d.members(per), per),
                                 p.partition_id, p.id, p.health))
    for d in desired:
        if d.name not in seen:
            members = d.members(per)
            rows.append(PartitionRow(rack.name, d.name, "missing", "-", 0, describe_members(members, per)))
    return rows


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
