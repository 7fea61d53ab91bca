"""One NVLink partition across every layer that follows it, as ONE finding per partition.

The partition plan (the inventory's partitions; the whole rack when none is
declared) is followed, in this order, by NMX-M's partitions, the GPUs' cliques
(what NMX-M programs into each GPU), the IMEX node lists, Slurm's topology.conf
and live topology (`scontrol show topology`), and on Kubernetes sites the
`nvidia.com/gpu.clique` node labels. Each layer is read as "which trays does it
put this tray with"; a layer is *behind* for a partition when, for a tray of
the partition, that set is not the partition's trays. The per-layer families
(nmx, imex, slurm, health) keep their detailed findings; this one says, per
partition, which layers are behind and which are in step, so a half-done
partition change reads as one line naming the layer to fix first.

Pure: the views are built from what the audit gathered (views_from_actual).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from mctl.model.findings import Finding, Severity
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.fabric.reconcile import FabricState
    from mctl.model.site import Rack

FAMILY = "layers"
CHECK = "partition.layers"

# chain order: a layer follows the ones before it
ORDER = ("nmx", "cliques", "imex", "topology.conf", "topology", "labels")
NAMES = {"nmx": "NMX-M", "cliques": "GPU cliques", "imex": "IMEX node lists", "topology.conf": "Slurm topology.conf",
         "topology": "Slurm live topology", "labels": "Kubernetes clique labels"}
_FIX = {"nmx": "run 'mctl partition apply {rack}'",
        "cliques": "the GPUs have not taken NMX-M's partition: check 'mctl partition show {rack}' and the trays' "
                   "fabric state (nvidia-smi -q), then 'mctl partition apply {rack}'",
        "imex": "run 'mctl imex apply {rack}'",
        "topology.conf": "run 'mctl deploy slurm --topology-only'",
        "topology": "run 'scontrol reconfigure' on the controller (or 'mctl deploy slurm --topology-only')",
        "labels": "GPU Feature Discovery sets nvidia.com/gpu.clique from each node's GPUs: wait for its next "
                  "pass (--sleep-interval, 60 s by default) or restart its pod on the nodes behind; 'kubectl get "
                  "nodes -L nvidia.com/gpu.clique' shows them"}


@dataclass(frozen=True)
class LayerView:
    """One layer's grouping of the trays.

    groups: tray -> the trays this layer puts it with (itself included when it is
    in a group; an empty set: in none). A tray absent from groups could not be
    read there and is not judged. among_read: the layer only knows the trays it
    read (the cliques of reached trays), so a group is compared with the
    partition's read trays only.
    """

    layer: str
    groups: Mapping[str, frozenset[str]]
    among_read: bool = False
    error: str | None = None          # the layer could not be read at all


def _where(layer: str, trays: Sequence[str], group: frozenset[str]) -> str:
    who = fold(list(trays))
    if not group:
        return {"imex": f"{who} list no tray", "nmx": f"{who} in no partition"}.get(layer, f"{who} in no group")
    verb = {"imex": "lists", "nmx": "in one NMX-M partition with", "cliques": "in one clique with",
            "topology.conf": "in one block with", "topology": "in one block with",
            "labels": "labelled alike with"}.get(layer, "with")
    return f"{who} {verb} {fold(sorted(group))}"


def check_partition(rack: str, name: str, trays: Sequence[str], views: Sequence[LayerView],
                    not_compared: Mapping[str, str] | None = None) -> Finding:
    """The one finding of partition *name* (its planned *trays*) across *views*."""
    want = frozenset(trays)
    behind: dict[str, str] = {}
    in_step: list[str] = []
    unknown: dict[str, str] = dict(not_compared or {})
    for v in sorted(views, key=lambda v: ORDER.index(v.layer) if v.layer in ORDER else len(ORDER)):
        if v.error is not None:
            unknown[v.layer] = v.error
            continue
        read = frozenset(v.groups)
        judged = [t for t in trays if t in v.groups]
        if not judged:
            unknown[v.layer] = f"none of {fold(list(trays))} could be read"
            continue
        expect = want & read if v.among_read else want
        wrong: dict[frozenset[str], list[str]] = {}
        for t in judged:
            got = v.groups[t] & read if v.among_read else v.groups[t]
            if got != expect:
                wrong.setdefault(got, []).append(t)
        if wrong:
            behind[v.layer] = "; ".join(_where(v.layer, ts, g) for g, ts in wrong.items())
        else:
            in_step.append(v.layer)
    rank = {l: i for i, l in enumerate(ORDER)}
    unknown = dict(sorted(unknown.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))
    head = f"partition {name} ({fold(list(trays))})"
    tail = []
    if in_step:
        tail.append("in step: " + ", ".join(NAMES.get(l, l) for l in in_step))
    if unknown:
        tail.append("not compared: " + "; ".join(f"{NAMES.get(l, l)} ({why})" for l, why in unknown.items()))
    details = {"subject": name, "trays": fold(list(trays)), "behind": list(behind), "in_step": in_step,
               "not_compared": list(unknown)}
    if not behind:
        what = "every layer follows the plan" if in_step else "no layer could be compared"
        return Finding(Severity.OK if in_step else Severity.WARN, rack, CHECK,
                       f"{head}: {what}" + (f" ({'; '.join(tail)})" if tail else ""),
                       None if in_step else "see the audit's incomplete list", details)
    first = next(iter(behind))
    said = "; ".join(f"{NAMES.get(l, l)} behind ({why})" for l, why in behind.items())
    return Finding(Severity.CRITICAL, rack, CHECK, f"{head}: {said}" + (f"; {'; '.join(tail)}" if tail else ""),
                   _FIX.get(first, "re-apply the partition plan").format(rack=rack), details)


def check_rack(rack: str, partitions: Sequence[tuple[str, Sequence[str]]], views: Sequence[LayerView],
               not_compared: Mapping[str, str] | None = None) -> list[Finding]:
    return [check_partition(rack, name, trays, views, not_compared) for name, trays in partitions]


# ------------------------------------------------------------ building the views (pure)

def _grouping(trays: Sequence[str], sets: Sequence[frozenset[str]]) -> dict[str, frozenset[str]]:
    """Every tray with the union of the sets it is in (empty: in none)."""
    out: dict[str, frozenset[str]] = {t: frozenset() for t in trays}
    for s in sets:
        for t in s:
            if t in out:
                out[t] = out[t] | s
    return out


def nmx_view(rack: "Rack", state: "FabricState") -> LayerView:
    """NMX-M's partitions; trays in none of them are together in the default partition."""
    fabric = state.fabric
    known = [t for t in (h.name for h in rack.compute) if t in fabric.trays]
    sets = []
    for p in state.partitions:
        if p.is_default:
            continue
        have, _foreign = fabric.resolve(p)
        sets.append(frozenset(g.tray for g in have))
    groups = _grouping(known, sets)
    default = frozenset(t for t, g in groups.items() if not g)
    groups = {t: (g or default) for t, g in groups.items()}
    return LayerView("nmx", groups, among_read=bool(fabric.missing))


def clique_view(labels: Mapping[str, str | None]) -> LayerView:
    """tray -> its GPUs' `<clusterUUID>.<cliqueID>` (None: unreadable or split: not judged)."""
    known = {t: lab for t, lab in labels.items() if lab}
    by_label: dict[str, set[str]] = {}
    for t, lab in known.items():
        by_label.setdefault(lab, set()).add(t)
    return LayerView("cliques", {t: frozenset(by_label[lab]) for t, lab in known.items()}, among_read=True)


def imex_view(lists: Mapping[str, Sequence[str] | None], tray_of: Mapping[str, str]) -> LayerView:
    """tray -> the addresses of its nodes_config.cfg (None: the file is absent), named as trays where known."""
    groups = {t: frozenset(tray_of.get(a, a) for a in (listed or ())) for t, listed in lists.items()}
    return LayerView("imex", groups)


def blocks_view(layer: str, trays: Sequence[str], blocks: Mapping[str, Sequence[str]] | None,
                error: str | None = None) -> LayerView:
    """Slurm's blocks (name -> nodes); a tray in no block is in no group."""
    if blocks is None:
        return LayerView(layer, {}, error=error or "not read")
    return LayerView(layer, _grouping(trays, [frozenset(ns) for ns in blocks.values()]))


def labels_view(labels: Mapping[str, str | None], error: str | None = None) -> LayerView:
    """tray -> its `nvidia.com/gpu.clique` node label (None: no label, in no group; a tray absent: no Node
    object, not judged). *error*: the nodes could not be read at all."""
    if error is not None:
        return LayerView("labels", {}, error=error)
    by_label: dict[str, set[str]] = {}
    for t, lab in labels.items():
        if lab:
            by_label.setdefault(lab, set()).add(t)
    return LayerView("labels", {t: frozenset(by_label[lab]) if lab else frozenset() for t, lab in labels.items()})


def node_labels(trays: Sequence[str], nodes: Sequence[Mapping]) -> dict[str, Mapping]:
    """Each tray's Node labels from the Node objects (GET /api/v1/nodes items): the Node named as the tray,
    else the one whose `kubernetes.io/hostname` label is the tray. A tray with no Node is left out (not judged);
    a Node without labels maps to {}."""
    from mctl.sched.k8s.manifests import HOSTNAME_LABEL

    by_name: dict[str, Mapping] = {}
    by_host: dict[str, Mapping] = {}
    for node in nodes:
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        if not isinstance(meta, Mapping):
            continue
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        if isinstance(meta.get("name"), str):
            by_name[meta["name"]] = labels
        host = labels.get(HOSTNAME_LABEL)
        if isinstance(host, str):
            by_host.setdefault(host, labels)
    out: dict[str, Mapping] = {}
    for t in trays:
        labels = by_name.get(t, by_host.get(t))
        if labels is not None:
            out[t] = labels
    return out


def node_clique_labels(trays: Sequence[str], nodes: Sequence[Mapping]) -> dict[str, str | None]:
    """Each tray's `nvidia.com/gpu.clique` (node_labels): a Node without the label (or an empty one) maps to None."""
    from mctl.sched.k8s.manifests import CLIQUE_LABEL

    out: dict[str, str | None] = {}
    for t, labels in node_labels(trays, nodes).items():
        value = labels.get(CLIQUE_LABEL)
        out[t] = value if isinstance(value, str) and value else None
    return out
