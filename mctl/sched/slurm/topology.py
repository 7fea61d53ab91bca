"""Slurm topology from NVLink partitions: one block per partition (pure).

A job that stays inside one NVLink partition gets multi-node NVLink and one IMEX
domain, so Slurm's blocks are the partitions, never hand-written. A rack with no
partitions in the inventory is one NVLink domain, so one block. Trays of a
partitioned rack that no partition names sit in the fabric's Default Partition
together; they form one more block instead of being left out of every block
(Slurm cannot place jobs on nodes outside all blocks).

BlockSizes: the base is the smallest block (every block must hold at least the
base), then each power-of-two multiple of it up to the first that covers every
block, which is how Slurm aggregates neighbouring blocks (its own default when
BlockSizes is absent, spelled out here so `scontrol show topology` matches
what was rendered).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Sequence

from mctl.model.site import Site, fold

Plugin = Literal["block", "tree"]
BlockKind = Literal["partition", "rack", "unpartitioned"]
MAX_LEVELS = 16            # Slurm's MAX_BLOCK_LEVELS

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Block:
    name: str
    rack: str
    kind: BlockKind
    nodes: tuple[str, ...]
    partition: str | None = None

    @property
    def nodeset(self) -> str:
        return fold(self.nodes)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def to_dict(self) -> dict:
        return {"name": self.name, "rack": self.rack, "kind": self.kind, "partition": self.partition,
                "nodes": self.nodeset, "size": self.size}


def _name(*parts: str) -> str:
    return _UNSAFE.sub("_", "-".join(parts))


def blocks_for(site: Site) -> list[Block]:
    """The blocks of the site, rack by rack (neighbouring blocks aggregate first, so a rack's stay together)."""
    blocks: list[Block] = []
    for rack in site.racks.values():
        trays = [h.name for h in rack.compute]
        if not trays:
            continue
        if not rack.partitions:
            blocks.append(Block(_name(rack.name), rack.name, "rack", tuple(trays)))
            continue
        order = {t: i for i, t in enumerate(trays)}
        parts = sorted(rack.partitions, key=lambda p: min(order.get(t, len(order)) for t in p.trays))
        taken = {t for p in parts for t in p.trays}
        names = set()
        for p in parts:
            name = _name(rack.name, p.name)
            names.add(name)
            blocks.append(Block(name, rack.name, "partition", tuple(sorted(p.trays, key=order.__getitem__)),
                                p.name))
        rest = tuple(t for t in trays if t not in taken)
        if rest:
            name = _name(rack.name, "unpartitioned")
            while name in names:
                name += "_"
            blocks.append(Block(name, rack.name, "unpartitioned", rest))
    return blocks


def block_sizes(blocks: Sequence[Block]) -> list[int]:
    """BlockSizes for *blocks*: base = smallest block, doubling until one level spans every block."""
    if not blocks:
        return []
    base = min(b.size for b in blocks)
    sizes = [base]
    level = 1
    while (1 << (level - 1)) < len(blocks) and level < MAX_LEVELS:
        sizes.append(base << level)
        level += 1
    return sizes


def render_topology(blocks: Sequence[Block], plugin: Plugin, *, with_block_sizes: bool = True,
                    top_switch: str = "nvlink-fabric") -> str:
    """topology.conf for the block plugin, or the tree fallback (one leaf switch per block)."""
    lines = ["# Managed by mctl (mctl deploy slurm): one block per NVLink partition, derived from the",
             "# inventory's racks.<rack>.partitions (a rack without partitions is one block).",
             "# Edit the partitions and run 'mctl deploy slurm --topology-only', not this file."]
    if plugin == "block":
        for b in blocks:
            lines.append(f"BlockName={b.name} Nodes={b.nodeset}")
        if with_block_sizes and blocks:
            lines.append("BlockSizes=" + ",".join(str(s) for s in block_sizes(blocks)))
    else:
        lines.append("# topology/tree fallback (this Slurm has no topology/block): a leaf switch per NVLink")
        lines.append("# partition, joined by one top switch so larger jobs can still span partitions.")
        for b in blocks:
            lines.append(f"SwitchName={b.name} Nodes={b.nodeset}")
        if len(blocks) > 1:
            lines.append(f"SwitchName={top_switch} Switches={','.join(b.name for b in blocks)}")
    return "\n".join(lines) + "\n"
