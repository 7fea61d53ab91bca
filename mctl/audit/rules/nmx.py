"""NMX-M's partitions against the inventory's, and their health.

The same comparison `mctl partition list` shows (mctl.fabric.partitions.
partition_rows): a declared partition NMX-M lacks or holds with other trays is
drift, one NMX-M holds that the inventory does not declare is left by hand,
and a partition NMX-M calls DEGRADED or UNHEALTHY is trouble whatever its
members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.fabric.reconcile import FabricState
    from mctl.model.site import Rack

FAMILY = "nmx"
PARTITION = "nmx.partition"
HEALTH = "nmx.partition_health"
NODES = "nmx.compute_nodes"
LIMIT = "nmx.fabric_limit"


def check_rack(rack: "Rack", state: "FabricState") -> list[Finding]:
    from mctl.checks.switch_fabric import partition_level
    from mctl.fabric.partitions import desired_from_rack, partition_rows

    apply = f"run 'mctl partition apply {rack.name}'"
    out: list[Finding] = []
    for row in partition_rows(rack, desired_from_rack(rack), state.fabric, state.partitions):
        details = {"subject": row.name, "partition_id": row.partition_id, "trays": row.trays,
                   "desired": row.desired}
        where = f"partition {row.name}" + (f" (PartitionID {row.partition_id})" if row.partition_id else "")
        if row.state == "in-sync":
            out.append(Finding(Severity.OK, rack.name, PARTITION, f"{where} holds {row.trays} as declared", None,
                               details))
        elif row.state == "differs":
            out.append(Finding(Severity.CRITICAL, rack.name, PARTITION,
                               f"{where} holds {row.trays} on NMX-M, the inventory declares {row.desired}", apply,
                               details))
        elif row.state == "missing":
            out.append(Finding(Severity.CRITICAL, rack.name, PARTITION,
                               f"partition {row.name} ({row.desired}) is declared but NMX-M does not have it", apply,
                               details))
        elif row.state == "unmanaged":
            out.append(Finding(Severity.WARN, rack.name, PARTITION,
                               f"NMX-M holds {where} ({row.trays}) that the inventory does not declare",
                               f"declare it in mctl.yml, or remove it with 'mctl partition apply {rack.name} "
                               "--prune'", details))
        elif row.state == "default":
            out.append(Finding(Severity.OK, rack.name, PARTITION, f"default partition holds {row.trays or 'nothing'}",
                               None, details))
        if row.health is not None and row.state != "missing":
            level = partition_level(row.health)
            text = f"{where} is {row.health} on NMX-M"
            out.append(Finding(level, rack.name, HEALTH, text if level is not Severity.OK else f"{where} is healthy",
                               None if level is Severity.OK else
                               f"see 'mctl partition show {rack.name} {row.name}' and the NVLink switch trays' state",
                               {"subject": row.name}))
    fabric = state.fabric
    if fabric.missing:
        from mctl.model.site import fold

        out.append(Finding(Severity.WARN, rack.name, NODES,
                           f"NMX-M lists no compute node for {fold(fabric.missing)} (trays matched "
                           f"{fabric.matched_by})", "check the trays are cabled and discovered by NMX-M, or set their "
                           "nmx_name / tray_index host vars", {"subject": "trays", "missing": list(fabric.missing)}))
    else:
        out.append(Finding(Severity.OK, rack.name, NODES, f"NMX-M lists every tray ({fabric.matched_by})", None,
                           {"subject": "trays"}))
    return out


def check_fabric_limit(rack: "Rack", state: "FabricState", nodes: dict) -> list[Finding]:
    """The degraded-fabric mark in Slurm (`nvl_degraded`, mctl.sched.slurm.features) against NMX-M's partition
    health now (see _limit); *nodes*: Slurm's node records by name."""
    from mctl.sched.slurm.features import FEATURE, marked

    return _limit(rack, state, {name: marked(node) for name, node in nodes.items()}, FEATURE, "jobs asking for a "
                  "whole fabric keep off it", f"no {FEATURE}", {"feature": FEATURE})


def check_fabric_label(rack: "Rack", state: "FabricState", labels: dict[str, Mapping]) -> list[Finding]:
    """The degraded-fabric mark on Kubernetes (mctl's node label `mctl.io/nvlink-degraded`,
    mctl.sched.k8s.cordon) against NMX-M's partition health now (see _limit); *labels*: each tray's Node labels
    (mctl.audit.rules.layers.node_labels; a tray with no Node is not judged)."""
    from mctl.sched.k8s.cordon import FABRIC_LABEL

    return _limit(rack, state, {t: FABRIC_LABEL in lab for t, lab in labels.items()}, f"the label {FABRIC_LABEL}",
                  f"pods with the node affinity '{FABRIC_LABEL} DoesNotExist' keep off it", f"no label {FABRIC_LABEL}",
                  {"label": FABRIC_LABEL})


def _limit(rack: "Rack", state: "FabricState", marks: dict[str, bool], mark: str, effect: str, unmarked: str,
           detail: dict) -> list[Finding]:
    """A tray of a degraded partition unmarked, or a tray marked in a healthy one, warns (the watch with
    --remediate marks at once and clears after its healthy sweeps); a degraded partition marked warns too (the
    fabric is degraded and work is kept off). The watch also marks for an unhealthy switch tray or a GPU fabric
    flag, which this rule does not read: such a mark reads as 'marked, NMX-M healthy'. A tray the scheduler
    does not list (no key in *marks*) is not judged here (the scheduler's own rules report it)."""
    from mctl.checks.switch_fabric import degraded

    want: dict[str, str] = {}
    for p in state.partitions:
        have, _ = state.fabric.resolve(p)
        if degraded(p.health):
            for g in have:
                want.setdefault(g.tray, f"partition {p.name or 'default'} is {p.health} on NMX-M")
    out: list[Finding] = []
    for host in rack.compute:
        if host.name not in marks:
            continue
        on = marks[host.name]
        details = {"subject": host.name, **detail, "marked": on}
        if host.name in want and on:
            out.append(Finding(Severity.WARN, host.name, LIMIT, f"{want[host.name]}: the tray carries {mark}, "
                               f"{effect}", None, details))
        elif host.name in want:
            out.append(Finding(Severity.WARN, host.name, LIMIT, f"{want[host.name]} but the tray does not carry "
                               f"{mark}", "run 'mctl health watch --remediate' (it marks the partition's trays)",
                               details))
        elif on:
            out.append(Finding(Severity.WARN, host.name, LIMIT, f"the tray carries {mark} while NMX-M reports its "
                               "partition healthy", "the watch clears it after its healthy sweeps (or a switch tray "
                               "or fabric flag still holds it)", details))
        else:
            out.append(Finding(Severity.OK, host.name, LIMIT, f"{unmarked}, its partition healthy", None, details))
    return out
