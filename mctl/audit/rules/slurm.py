"""Slurm against the inventory and the partitions: nodes, the partition, topology (live and topology.conf).

The topology is compared twice because they can disagree: `scontrol show
topology` is what slurmctld schedules with now, topology.conf is what it will
use after the next reconfigure or restart. Both must hold one block per NVLink
partition (mctl.sched.slurm.topology.blocks_for), tray for tray.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ClusterShell.NodeSet import NodeSet

from mctl.model.findings import Finding, Severity
from mctl.model.site import fold
from mctl.sched.slurm.facts import NodeState, TopologyEntry, parse_show_topology
from mctl.sched.slurm.topology import Block

FAMILY = "slurm"
NODES = "slurm.nodes"
ADDRESS = "slurm.node_address"
PARTITION = "slurm.partition"
TOPOLOGY = "slurm.topology"
TOPOLOGY_CONF = "slurm.topology_conf"

_DEPLOY = "run 'mctl deploy slurm' (a partition change alone: 'mctl deploy slurm --topology-only')"
_TOPO_FIX = "run 'mctl deploy slurm --topology-only' to put the partitions' blocks back"


def check_nodes(trays: Sequence[tuple[str, str]], site_trays: Iterable[str], nodes: Sequence[NodeState],
                *, controller: str) -> list[Finding]:
    """Every tray (name, address) a Slurm node at its address; Slurm nodes the inventory does not know."""
    by_name = {n.name: n for n in nodes}
    out: list[Finding] = []
    for name, address in trays:
        node = by_name.get(name)
        details = {"subject": "node"}
        if node is None:
            out.append(Finding(Severity.CRITICAL, name, NODES, "not a Slurm node (slurmctld does not know it)",
                               _DEPLOY, details))
            continue
        out.append(Finding(Severity.OK, name, NODES, f"Slurm node, {node.state}", None, details))
        if node.address and node.address != address:
            out.append(Finding(Severity.CRITICAL, name, ADDRESS,
                               f"Slurm reaches it at NodeAddr={node.address}, the inventory says {address}",
                               _DEPLOY, {"subject": "address"}))
        else:
            out.append(Finding(Severity.OK, name, ADDRESS, f"NodeAddr {node.address or address}", None,
                               {"subject": "address"}))
    known = set(site_trays)
    extra = sorted(n.name for n in nodes if n.name not in known)
    if extra:
        out.append(Finding(Severity.WARN, controller, NODES,
                           f"Slurm has node{'s' if len(extra) > 1 else ''} {fold(extra)} that the inventory does "
                           "not list", "add them to the inventory or redeploy Slurm without them",
                           {"subject": "extra nodes", "nodes": extra}))
    return out


def check_partition(name: str, trays: Sequence[str], partitions: Mapping[str, Mapping[str, str]] | None,
                    *, host: str) -> list[Finding]:
    """The Slurm partition mctl renders exists, is UP and holds every tray."""
    details = {"subject": name}
    if partitions is None:
        return []
    got = partitions.get(name)
    if got is None:
        return [Finding(Severity.CRITICAL, host, PARTITION, f"Slurm has no partition {name!r}", _DEPLOY, details)]
    out: list[Finding] = []
    state = got.get("State", "?")
    members = set(NodeSet(got.get("Nodes") or "")) if got.get("Nodes") not in (None, "(null)") else set()
    absent = [t for t in trays if t not in members]
    if state != "UP":
        out.append(Finding(Severity.CRITICAL, host, PARTITION, f"partition {name} is {state}, not UP",
                           f"scontrol update PartitionName={name} State=UP, once it is safe", details))
    if absent:
        out.append(Finding(Severity.CRITICAL, host, PARTITION,
                           f"partition {name} lacks {fold(absent)}", _DEPLOY, details))
    if not out:
        out.append(Finding(Severity.OK, host, PARTITION, f"partition {name} is UP with the trays", None, details))
    return out


def found_blocks(entries: Iterable[TopologyEntry], plugin: str) -> dict[str, str]:
    """Blocks (or tree leaf switches) with their folded nodes."""
    if plugin == "block":
        return {e.name: str(NodeSet(e.nodes or "")) for e in entries if e.kind == "block"}
    return {e.name: str(NodeSet(e.nodes)) for e in entries if e.kind == "switch" and e.nodes}


def _compare(check: str, where: str, expected: Sequence[Block], found: Mapping[str, str],
             rack_trays: Mapping[str, Sequence[str]], *, fix: str, site_wide: bool, controller: str
             ) -> list[Finding]:
    """Expected blocks of the audited racks against what *found* holds; each finding on its rack."""
    out: list[Finding] = []
    rack_of = {t: r for r, ts in rack_trays.items() for t in ts}
    wanted = {b.name: b for b in expected}
    for b in expected:
        want = str(NodeSet(b.nodeset))
        what = f"partition {b.partition}" if b.partition else ("the rack" if b.kind == "rack" else
                                                                  "the trays in no partition")
        have = found.get(b.name)
        details = {"subject": b.name, "expected": want, "found": have}
        if have is None:
            out.append(Finding(Severity.CRITICAL, b.rack, check, f"{where} has no block {b.name} ({what}: {want})",
                               fix, details))
        elif set(NodeSet(have)) != set(NodeSet(want)):
            out.append(Finding(Severity.CRITICAL, b.rack, check,
                               f"{where}: block {b.name} holds {have or 'no trays'}, {what} is {want}", fix, details))
        else:
            out.append(Finding(Severity.OK, b.rack, check, f"{where}: block {b.name} = {what} ({want})", None,
                               details))
    for name, have in sorted(found.items()):
        if name in wanted:
            continue
        racks = sorted({rack_of[n] for n in NodeSet(have) if n in rack_of})
        if not racks and not site_wide:
            continue            # another rack's block, not part of this audit
        for rack in racks or [controller]:
            out.append(Finding(Severity.CRITICAL, rack, check,
                               f"{where} has block {name} ({have or 'no trays'}) that no partition makes", fix,
                               {"subject": name, "expected": None, "found": have}))
    return out


def check_topology_live(expected: Sequence[Block], plugin_expected: str, entries: Sequence[TopologyEntry] | None,
                        plugin_running: str | None, rack_trays: Mapping[str, Sequence[str]], *, site_wide: bool,
                        controller: str, error: str | None = None) -> list[Finding]:
    """`scontrol show topology` against the partitions' blocks (site-wide problems on the controller)."""
    plugin = {"subject": "TopologyPlugin"}
    if plugin_running is not None and plugin_running != f"topology/{plugin_expected}":
        return [Finding(Severity.CRITICAL, controller, TOPOLOGY,
                        f"slurmctld runs TopologyPlugin={plugin_running}; the partitions need "
                        f"topology/{plugin_expected}", "run 'mctl deploy slurm' (a plugin change needs a full "
                        "deploy and a slurmctld restart)", plugin)]
    if entries is None:
        return [Finding(Severity.WARN, controller, TOPOLOGY, f"the live topology could not be read: {error}",
                        "check slurmctld on the controller", {"subject": "live"})]
    out = [Finding(Severity.OK, controller, TOPOLOGY, f"slurmctld runs topology/{plugin_expected}", None, plugin)]
    return out + _compare(TOPOLOGY, "Slurm (scontrol show topology)", expected,
                          found_blocks(entries, plugin_expected), rack_trays, fix=_TOPO_FIX, site_wide=site_wide,
                          controller=controller)


def check_topology_conf(expected: Sequence[Block], plugin_expected: str, sizes: Sequence[int], text: str | None,
                        rack_trays: Mapping[str, Sequence[str]], *, path: str, site_wide: bool, controller: str,
                        error: str | None = None) -> list[Finding]:
    """The controller's topology.conf against the partitions' blocks (and BlockSizes)."""
    if text is None:
        why = f"could not be read: {error}" if error else "is missing"
        return [Finding(Severity.CRITICAL, controller, TOPOLOGY_CONF, f"{path} {why}", _TOPO_FIX,
                        {"subject": path})]
    out = [Finding(Severity.OK, controller, TOPOLOGY_CONF, f"{path} is there", None, {"subject": path})]
    out += _compare(TOPOLOGY_CONF, path, expected, found_blocks(parse_show_topology(text), plugin_expected),
                    rack_trays, fix=_TOPO_FIX, site_wide=site_wide, controller=controller)
    if plugin_expected == "block" and sizes:
        line = next((l.strip() for l in text.splitlines() if l.strip().startswith("BlockSizes=")), None)
        have = line.partition("=")[2].strip() if line else None
        want = ",".join(str(s) for s in sizes)
        if have != want:
            out.append(Finding(Severity.WARN, controller, TOPOLOGY_CONF,
                               f"{path} has BlockSizes={have or '(unset)'}, the partitions give {want}",
                               _TOPO_FIX, {"subject": "BlockSizes"}))
        else:
            out.append(Finding(Severity.OK, controller, TOPOLOGY_CONF, f"BlockSizes={want}", None,
                               {"subject": "BlockSizes"}))
    return out
