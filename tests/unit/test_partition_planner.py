"""Partition planner: templates, validation, tray<->NMX-M matching, and plans that NMX-M would accept."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.fabric.partitions import (TEMPLATES, FabricMismatch, describe_change, map_fabric, parse_gpu_members,
                                    plan_partitions, template_partitions, template_table, validate_desired)
from mctl.model.fabric import (DEFAULT_PARTITION_ID, DesiredPartition, GpuLocation, NmxComputeNode, NmxGpu,
                               NmxPartition)
from mctl.model.site import Rack, Site
from tests.helpers import PLANNER_DOMAIN, make_nodes, make_rack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def desired(rack: Rack, template: str) -> list[DesiredPartition]:
    return [DesiredPartition(p.name, rack.name, p.trays) for p in template_partitions(rack, template)]


class FakeNMX:
    """NMX-M's partition rules in memory: unique names, a GPU in one partition, fixed member kind."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.parts: dict[str, tuple[str, set]] = {}
        self.next_id = 1

    def load(self, partitions: list[NmxPartition]) -> None:
        for p in partitions:
            self.parts[p.name] = (p.type, {m if isinstance(m, str) else m for m in p.members})

    def _keys(self, kind, members):
        return {m if kind == "ID_BASED" else json.dumps(m, sort_keys=True) for m in members}

    def apply(self, change) -> None:
        members = self._keys(change.kind, change.payload_members())
        gpu_ids = {g.gpu_id for g in change.members}
        if change.action == "delete":
            assert change.name in self.parts
            del self.parts[change.name]
            return
        for name, (kind, held) in self.parts.items():
            if name == change.name:
                continue
            held_ids = {g.gpu_id for g in self._gpus(kind, held)}
            assert not (held_ids & gpu_ids), f"{change.action} {change.name}: overlaps {name}"
        if change.action == "create":
            assert change.name not in self.parts
        else:
            assert change.name in self.parts and self.parts[change.name][0] == change.kind
        self.parts[change.name] = (change.kind, members)

    def _gpus(self, kind, held):
        out = []
        for m in held:
            if kind == "ID_BASED":
                out += [g for t in self.fabric.trays.values() for g in t if g.gpu_id == m]
            else:
                key = GpuLocation.from_nmx(json.loads(m) if isinstance(m, str) else m.to_nmx()).key()
                out += [g for t in self.fabric.trays.values() for g in t if g.location.key() == key]
        return out

    def partitions(self) -> list[NmxPartition]:
        out = []
        for i, (name, (kind, held)) in enumerate(sorted(self.parts.items()), start=1):
            members = tuple(held) if kind == "ID_BASED" else tuple(GpuLocation.from_nmx(json.loads(m))
                                                                    for m in held)
            out.append(NmxPartition(f"id-{name}", i, name, kind, "HEALTHY", members))
        return out


# ------------------------------------------------------------------ templates

def test_templates_on_a_full_rack():
    rack = make_rack()
    two = template_partitions(rack, "2x9")
    assert [(p.name, p.nodeset) for p in two] == [("p0", "r1-tray[01-09]"), ("p1", "r1-tray[10-18]")]
    assert [len(p.trays) for p in template_partitions(rack, "6x3")] == [3] * 6
    assert template_partitions(rack, "all")[0].name == "all"
    assert len(template_partitions(rack, "18x1")) == 18


def test_templates_divide_a_partly_populated_rack_or_refuse():
    rack = make_rack(16)
    assert [p.nodeset for p in template_partitions(rack, "2x9")] == ["r1-tray[01-08]", "r1-tray[09-16]"]
    with pytest.raises(UsageError) as exc:
        template_partitions(rack, "3x6")
    assert "16 compute trays, which do not divide by 3" in exc.value.message
    assert "all, 2x9" in exc.value.hint
    table = {row["template"]: row for row in template_table(rack)}
    assert table["2x9"]["fits"] and table["2x9"]["trays_each"] == 8
    assert not table["6x3"]["fits"] and not table["18x1"]["fits"]


def test_unknown_template():
    with pytest.raises(UsageError) as exc:
        template_partitions(make_rack(), "4x4")
    assert "2x9" in exc.value.hint


# ----------------------------------------------------------------- validation

def test_validation_refuses_overlap_foreign_and_unknown_trays():
    r1, r2 = make_rack(name="r1"), make_rack(name="r2")
    site = Site("s", Path("/x/mctl.yml"), None, {"r1": r1, "r2": r2}, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="partitions overlap"):
        validate_desired(r1, [DesiredPartition("a", "r1", ("r1-tray01", "r1-tray02")),
                              DesiredPartition("b", "r1", ("r1-tray02",))], site=site)
    with pytest.raises(UsageError, match="belongs to rack r2"):
        validate_desired(r1, [DesiredPartition("a", "r1", ("r2-tray01",))], site=site)
    with pytest.raises(UsageError, match="unknown tray r1-tray19"):
        validate_desired(r1, [DesiredPartition("a", "r1", ("r1-tray19",))], site=site)
    with pytest.raises(UsageError, match="given twice"):
        validate_desired(r1, [DesiredPartition("a", "r1", ("r1-tray01",)), DesiredPartition("a", "r1",
                                                                                             ("r1-tray02",))])
    with pytest.raises(UsageError, match="invalid partition name"):
        validate_desired(r1, [DesiredPartition("Default Partition", "r1", ("r1-tray01",))])


def test_partial_tray_needs_gpu_granularity():
    rack = make_rack()
    members = parse_gpu_members(rack, ["r1-tray01:0-1"])
    assert members == (("r1-tray01", 0), ("r1-tray01", 1))
    part = DesiredPartition("half", "r1", (), members)
    with pytest.raises(UsageError) as exc:
        validate_desired(rack, [part])
    assert "smaller than one tray" in exc.value.message and "--gpu-granularity" in exc.value.hint
    warnings = validate_desired(rack, [part], allow_gpu_granularity=True)
    assert warnings and "splits tray r1-tray01" in warnings[0]
    with pytest.raises(UsageError, match="GPU 7"):
        validate_desired(rack, [DesiredPartition("x", "r1", (), (("r1-tray01", 7),))], allow_gpu_granularity=True)


def test_gpu_member_spec_forms():
    rack = make_rack()
    assert len(parse_gpu_members(rack, ["r1-tray[01-02]"])) == 8
    assert parse_gpu_members(rack, ["r1-tray03:0,2; r1-tray04:[3]"]) == (
        ("r1-tray03", 0), ("r1-tray03", 2), ("r1-tray04", 3))
    with pytest.raises(UsageError, match="bad GPU list"):
        parse_gpu_members(rack, ["r1-tray01:x"])


# ---------------------------------------------------------- matching to NMX-M

def test_map_fabric_on_the_real_compute_node_sample_by_position():
    sample = json.loads((FIXTURES / "nmx-m-compute-nodes.json").read_text())
    nodes = [NmxComputeNode.from_nmx(d) for d in sample]
    assert nodes[0].name == "node1" and nodes[0].tray_index == 4 and nodes[1].slot_id == 22
    rack = make_rack()
    fabric = map_fabric(rack, nodes)
    # Names do not match the inventory, so TrayIndex N is the inventory's N+1-th tray.
    assert set(fabric.trays) == {"r1-tray05", "r1-tray13"}
    assert [g.gpu_id for g in fabric.trays["r1-tray13"]] == list(nodes[1].gpu_ids)
    assert fabric.trays["r1-tray05"][0].location == GpuLocation(PLANNER_DOMAIN, 1, 5, 1, 0)
    assert len(fabric.missing) == 16 and fabric.matched_by.startswith("by position")


def test_map_fabric_prefers_names_and_filters_other_domains():
    rack = make_rack(4)
    other = make_nodes(make_rack(4, name="r9"), domain="11111111-2222-3333-4444-555555555555")
    fabric = map_fabric(rack, list(reversed(make_nodes(rack))) + other)
    assert list(fabric.trays) == [h.name for h in rack.compute] and not fabric.missing
    undeclared = make_rack(4, domain=None)
    with pytest.raises(FabricMismatch, match="2 NVLink domains"):
        map_fabric(undeclared, make_nodes(undeclared) + other)


def test_map_fabric_uses_device_ids_from_the_gpu_listing():
    rack = make_rack(1)
    nodes = make_nodes(rack)
    gpus = [NmxGpu(gid, 3 - i, PLANNER_DOMAIN, DEFAULT_PARTITION_ID, "HEALTHY") for i, gid in enumerate(nodes[0].gpu_ids)]
    fabric = map_fabric(rack, nodes, gpus)
    by_dev = {g.device_id: g.gpu_id for g in fabric.trays["r1-tray01"]}
    assert by_dev[3] == nodes[0].gpu_ids[0] and by_dev[0] == nodes[0].gpu_ids[3]


def test_missing_tray_is_a_clear_error():
    rack = make_rack(4)
    fabric = map_fabric(rack, make_nodes(rack)[:3])
    with pytest.raises(FabricMismatch, match="tray r1-tray04 of partition 'all'"):
        plan_partitions(rack, desired(rack, "all"), fabric, [])


# -------------------------------------------------------------------- planning

def test_plan_from_scratch_then_no_op():
    rack = make_rack()
    fabric = map_fabric(rack, make_nodes(rack))
    plan = plan_partitions(rack, desired(rack, "2x9"), fabric, [])
    assert [(c.action, c.name, len(c.members)) for c in plan.changes] == [("create", "p0", 36), ("create", "p1", 36)]
    nmx = FakeNMX(fabric)
    for c in plan.changes:
        nmx.apply(c)
    again = plan_partitions(rack, desired(rack, "2x9"), fabric, nmx.partitions())
    assert again.empty and again.unchanged == ("p0", "p1")
    assert "create p0: r1-tray[01-09] (36 GPUs, ID_BASED)" == describe_change(plan.changes[0], 4)


@pytest.mark.parametrize("before,after", list(itertools.product(TEMPLATES, repeat=2)))
def test_every_template_transition_is_a_valid_sequence(before, after):
    rack = make_rack()
    fabric = map_fabric(rack, make_nodes(rack))
    nmx = FakeNMX(fabric)
    for c in plan_partitions(rack, desired(rack, before), fabric, []).changes:
        nmx.apply(c)
    plan = plan_partitions(rack, desired(rack, after), fabric, nmx.partitions())
    for c in plan.changes:
        nmx.apply(c)          # asserts NMX-M would accept each step
    final = {name: {g for g in nmx._gpus(kind, held)} for name, (kind, held) in nmx.parts.items()}
    want = {d.name: fabric.gpus_for(d) for d in desired(rack, after)}
    assert {n: {g.gpu_id for g in s} for n, s in final.items()} == {n: {g.gpu_id for g in s} for n, s in want.items()}
    assert plan_partitions(rack, desired(rack, after), fabric, nmx.partitions()).empty


def test_swap_of_trays_recreates_instead_of_conflicting():
    rack = make_rack(4)
    fabric = map_fabric(rack, make_nodes(rack))
    nmx = FakeNMX(fabric)
    first = [DesiredPartition("a", "r1", ("r1-tray01", "r1-tray02")), DesiredPartition("b", "r1", ("r1-tray03",))]
    for c in plan_partitions(rack, first, fabric, []).changes:
        nmx.apply(c)
    swapped = [DesiredPartition("a", "r1", ("r1-tray03",)), DesiredPartition("b", "r1", ("r1-tray01",))]
    plan = plan_partitions(rack, swapped, fabric, nmx.partitions())
    assert [c.action for c in plan.changes] == ["delete", "delete", "create", "create"]
    for c in plan.changes:
        nmx.apply(c)
    assert plan.released and {g.tray for g in plan.released} == {"r1-tray02"}


def test_partial_overlap_shrinks_before_growing():
    rack = make_rack(6)
    fabric = map_fabric(rack, make_nodes(rack))
    nmx = FakeNMX(fabric)
    start = [DesiredPartition("a", "r1", ("r1-tray01", "r1-tray02", "r1-tray03")),
             DesiredPartition("b", "r1", ("r1-tray04", "r1-tray05", "r1-tray06"))]
    for c in plan_partitions(rack, start, fabric, []).changes:
        nmx.apply(c)
    shifted = [DesiredPartition("a", "r1", ("r1-tray02", "r1-tray03", "r1-tray04")),
               DesiredPartition("b", "r1", ("r1-tray05", "r1-tray06", "r1-tray01"))]
    plan = plan_partitions(rack, shifted, fabric, nmx.partitions())
    assert [c.action for c in plan.changes] == ["update"] * 4
    assert "first gives up GPUs" in plan.changes[0].reason
    for c in plan.changes:
        nmx.apply(c)


def test_undeclared_partitions_are_left_alone_unless_in_the_way_or_pruned():
    rack = make_rack(4)
    fabric = map_fabric(rack, make_nodes(rack))
    nmx = FakeNMX(fabric)
    for c in plan_partitions(rack, [DesiredPartition("x", "r1", ("r1-tray01",)),
                                    DesiredPartition("y", "r1", ("r1-tray04",))], fabric, []).changes:
        nmx.apply(c)
    want = [DesiredPartition("p", "r1", ("r1-tray01", "r1-tray02"))]
    plan = plan_partitions(rack, want, fabric, nmx.partitions())
    assert [(c.action, c.name) for c in plan.changes] == [("delete", "x"), ("create", "p")]
    assert "holds GPUs that 'p' needs" in plan.changes[0].reason and plan.unmanaged == ("y",)
    pruned = plan_partitions(rack, want, fabric, nmx.partitions(), prune=True)
    assert [(c.action, c.name) for c in pruned.changes] == [("delete", "x"), ("delete", "y"), ("create", "p")]


def test_location_based_partitions_keep_their_kind():
    rack = make_rack(3)
    fabric = map_fabric(rack, make_nodes(rack))
    nmx = FakeNMX(fabric)
    for c in plan_partitions(rack, [DesiredPartition("a", "r1", ("r1-tray01",))], fabric, [],
                             kind="LOCATION_BASED").changes:
        assert c.payload_members()[0] == {"DomainUUID": PLANNER_DOMAIN, "ChassisID": 1, "SlotID": 1, "HostID": 1,
                                          "DeviceID": 0}
        nmx.apply(c)
    assert plan_partitions(rack, [DesiredPartition("a", "r1", ("r1-tray01",))], fabric, nmx.partitions()).empty
    grow = plan_partitions(rack, [DesiredPartition("a", "r1", ("r1-tray01", "r1-tray02"))], fabric, nmx.partitions())
    assert [(c.action, c.kind) for c in grow.changes] == [("update", "LOCATION_BASED")]
    nmx.apply(grow.changes[0])


def test_default_partition_is_never_planned():
    rack = make_rack(2)
    fabric = map_fabric(rack, make_nodes(rack))
    default = NmxPartition("d", DEFAULT_PARTITION_ID, "Default Partition", "ID_BASED", "HEALTHY",
                           tuple(g.gpu_id for t in fabric.trays.values() for g in t))
    plan = plan_partitions(rack, [], fabric, [default], prune=True)
    assert plan.empty and not plan.unmanaged
