"""Blocks from NVLink partitions and BlockSizes, checked against Slurm's own aggregation rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mctl.inventory import load_site
from mctl.sched.slurm import block_sizes, blocks_for, render_topology
from mctl.sched.slurm.topology import Block

REPO = Path(__file__).resolve().parents[2]


def site_with(tmp_path: Path, racks: dict[str, list | None], trays: int = 8):
    doc = {"plugin": "mctl", "site": "t", "racks": {}, "scheduler": {"type": "slurm"}}
    for i, (name, parts) in enumerate(racks.items(), start=1):
        rack = {"shape": {"compute_trays": trays, "switch_trays": 0},
                "head": {"name": f"{name}-head", "address": f"10.0.{i}.100"},
                "compute": {"nodes": f"{name}-tray[01-{trays:02d}]", "addresses": f"10.0.{i}.[1-{trays}]"}}
        if parts:
            rack["partitions"] = parts
        doc["racks"][name] = rack
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_site(tmp_path)


def blocks(*sizes: int) -> list[Block]:
    return [Block(f"b{i}", "r", "partition", tuple(f"n{i}-{j}" for j in range(s))) for i, s in enumerate(sizes)]


@pytest.mark.parametrize("sizes, expected", [
    ((9, 9), [9, 18]),                 # reference/slurm.md: two 9-tray partitions -> BlockSizes=9,18
    ((18,), [18]),                     # one rack, no partitions
    ((9, 9, 18), [9, 18, 36]),         # levels until one spans all three blocks
    ((32, 32, 32, 32), [32, 64, 128]),
    ((6, 6, 6), [6, 12, 24]),
    ((3, 1), [1, 2]),                  # base is the smallest block: every block holds at least the base
])
def test_block_sizes(sizes, expected):
    got = block_sizes(blocks(*sizes))
    assert got == expected
    assert all(s % got[0] == 0 and (s // got[0]) & (s // got[0] - 1) == 0 for s in got)   # powers of two x base
    assert all(size >= got[0] for size in sizes)


def test_rack_without_partitions_is_one_block(tmp_path):
    site = site_with(tmp_path, {"ra": None, "rb": [{"name": "x", "trays": "rb-tray[01-04]"},
                                                   {"name": "y", "trays": "rb-tray[05-08]"}]})
    got = [(b.name, b.kind, b.nodeset) for b in blocks_for(site)]
    assert got == [("ra", "rack", "ra-tray[01-08]"), ("rb-x", "partition", "rb-tray[01-04]"),
                   ("rb-y", "partition", "rb-tray[05-08]")]


def test_trays_outside_partitions_form_the_default_block(tmp_path):
    site = site_with(tmp_path, {"ra": [{"name": "late", "trays": "ra-tray[05-08]"},
                                       {"name": "early", "trays": "ra-tray[01-02]"}]})
    got = [(b.name, b.kind, b.nodeset) for b in blocks_for(site)]
    # ordered by their first tray so neighbouring partitions aggregate; leftovers last
    assert got == [("ra-early", "partition", "ra-tray[01-02]"), ("ra-late", "partition", "ra-tray[05-08]"),
                   ("ra-unpartitioned", "unpartitioned", "ra-tray[03-04]")]
    text = render_topology(blocks_for(site), "block")
    assert text.splitlines()[-1] == "BlockSizes=2,4,8"
    assert sum(1 for ln in text.splitlines() if ln.startswith("BlockName=")) == 3


def test_leftover_name_never_collides(tmp_path):
    site = site_with(tmp_path, {"ra": [{"name": "unpartitioned", "trays": "ra-tray[01-04]"}]})
    names = [b.name for b in blocks_for(site)]
    assert names == ["ra-unpartitioned", "ra-unpartitioned_"]


def test_tree_has_a_top_switch_only_for_several_leaves():
    one = render_topology(blocks(4), "tree")
    assert "Switches=" not in one and "SwitchName=b0 Nodes=n0-[0-3]" in one
    two = render_topology(blocks(4, 4), "tree", top_switch="top")
    assert two.splitlines()[-1] == "SwitchName=top Switches=b0,b1"
