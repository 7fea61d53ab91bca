"""The cross-layer rule: one finding per partition, naming the layer that is behind (each layer in turn)."""

from __future__ import annotations

import pytest

from mctl.audit.rules import layers
from mctl.audit.rules.layers import LayerView, blocks_view, clique_view, imex_view, labels_view
from mctl.model.findings import Severity

TRAYS = ["t1", "t2", "t3", "t4"]
PLAN = [("p0", ("t1", "t2")), ("p1", ("t3", "t4"))]
ADDR = {"10.0.0.1": "t1", "10.0.0.2": "t2", "10.0.0.3": "t3", "10.0.0.4": "t4"}
P0, P1 = frozenset({"t1", "t2"}), frozenset({"t3", "t4"})


def _in_step() -> dict[str, LayerView]:
    return {
        "nmx": LayerView("nmx", {"t1": P0, "t2": P0, "t3": P1, "t4": P1}),
        "cliques": clique_view({"t1": "u.1", "t2": "u.1", "t3": "u.2", "t4": "u.2"}),
        "imex": imex_view({"t1": ("10.0.0.1", "10.0.0.2"), "t2": ("10.0.0.1", "10.0.0.2"),
                           "t3": ("10.0.0.3", "10.0.0.4"), "t4": ("10.0.0.3", "10.0.0.4")}, ADDR),
        "topology.conf": blocks_view("topology.conf", TRAYS, {"b0": ["t1", "t2"], "b1": ["t3", "t4"]}),
        "topology": blocks_view("topology", TRAYS, {"b0": ["t1", "t2"], "b1": ["t3", "t4"]}),
        "labels": labels_view({"t1": "u.1", "t2": "u.1", "t3": "u.2", "t4": "u.2"}),
    }


# Each layer still holding the whole rack as one group (the change before the partition split).
BEHIND = {
    "nmx": LayerView("nmx", {t: frozenset(TRAYS) for t in TRAYS}),
    "cliques": clique_view({t: "u.0" for t in TRAYS}),
    "imex": imex_view({t: tuple(ADDR) for t in TRAYS}, ADDR),
    "topology.conf": blocks_view("topology.conf", TRAYS, {"rack": TRAYS}),
    "topology": blocks_view("topology", TRAYS, {"rack": TRAYS}),
    "labels": labels_view({t: "u.0" for t in TRAYS}),
}


def test_every_layer_in_step_is_one_ok_finding_per_partition():
    found = layers.check_rack("r1", PLAN, list(_in_step().values()))
    assert [(f.severity, f.details["subject"]) for f in found] == [(Severity.OK, "p0"), (Severity.OK, "p1")]
    assert found[0].message == ("partition p0 (t[1-2]): every layer follows the plan (in step: NMX-M, GPU cliques, "
                                "IMEX node lists, Slurm topology.conf, Slurm live topology, Kubernetes clique labels)")


@pytest.mark.parametrize("layer", layers.ORDER)
def test_each_layer_behind_in_turn_is_named_in_one_finding_per_partition(layer):
    views = dict(_in_step(), **{layer: BEHIND[layer]})
    found = layers.check_rack("r1", PLAN, list(views.values()))
    assert len(found) == 2
    for f in found:
        assert f.severity is Severity.CRITICAL and f.check == layers.CHECK
        assert f.details["behind"] == [layer]
        assert f.details["in_step"] == [l for l in layers.ORDER if l != layer]
        assert f"{layers.NAMES[layer]} behind" in f.message
        assert f.action == layers._FIX[layer].format(rack="r1")


def test_a_half_done_change_names_every_layer_behind_and_fixes_the_first():
    views = dict(_in_step(), imex=BEHIND["imex"], topology=BEHIND["topology"])
    (p0, _p1) = layers.check_rack("r1", PLAN, list(views.values()))
    assert p0.details["behind"] == ["imex", "topology"]
    assert p0.message.startswith("partition p0 (t[1-2]): IMEX node lists behind (t[1-2] lists t[1-4]); "
                                 "Slurm live topology behind (t[1-2] in one block with t[1-4]); in step: NMX-M")
    assert p0.action == "run 'mctl imex apply r1'"


def test_one_stale_node_list_is_one_finding_on_its_partition_only():
    imex = imex_view({"t1": ("10.0.0.1", "10.0.0.2"), "t2": ("10.0.0.1", "10.0.0.2", "10.0.0.3"),
                      "t3": ("10.0.0.3", "10.0.0.4"), "t4": ("10.0.0.3", "10.0.0.4")}, ADDR)
    p0, p1 = layers.check_rack("r1", PLAN, list(dict(_in_step(), imex=imex).values()))
    assert p0.severity is Severity.CRITICAL and "IMEX node lists behind (t2 lists t[1-3])" in p0.message
    assert p1.severity is Severity.OK
    missing = imex_view({"t1": ("10.0.0.1", "10.0.0.2"), "t2": None}, ADDR)
    (p0, _) = layers.check_rack("r1", PLAN, [missing])
    assert "t2 list no tray" in p0.message


def test_unread_trays_and_layers_are_not_judged_but_said():
    views = _in_step()
    views["cliques"] = clique_view({"t1": "u.1", "t2": None, "t3": "u.2", "t4": None})    # t2, t4 not reached
    views["topology"] = blocks_view("topology", TRAYS, None, "scontrol show topology: timed out")
    views.pop("labels")
    found = layers.check_rack("r1", PLAN, list(views.values()), {"labels": "not read"})
    assert all(f.severity is Severity.OK for f in found)
    assert "not compared: Slurm live topology (scontrol show topology: timed out); Kubernetes clique labels " \
           "(not read)" in found[0].message
    nothing = layers.check_rack("r1", PLAN, [LayerView("nmx", {}, error="refused")])
    assert nothing[0].severity is Severity.WARN and "no layer could be compared" in nothing[0].message


def test_a_tray_in_no_block_or_an_unknown_address_is_behind():
    conf = blocks_view("topology.conf", TRAYS, {"b0": ["t1"], "b1": ["t3", "t4"]})
    (p0, p1) = layers.check_rack("r1", PLAN, [conf])
    assert p0.details["behind"] == ["topology.conf"] and "t2 in no group" in p0.message and p1.details["behind"] == []
    imex = imex_view({t: ("10.0.0.1", "10.0.0.2", "10.9.9.9") for t in ("t1", "t2")}, ADDR)
    (p0, _) = layers.check_rack("r1", PLAN, [imex])
    assert p0.message == "partition p0 (t[1-2]): IMEX node lists behind (t[1-2] lists 10.9.9.9,t[1-2])"
    assert p0.details["behind"] == ["imex"]


# ------------------------------------------------------------ the clique labels read from Node objects

def _nodes(cliques: dict[str, str | None]) -> list[dict]:
    """Node objects as the kubelet and GPU Feature Discovery leave them (tests/kube_apiserver.gb200_node)."""
    from tests.kube_apiserver import gb200_node

    return [gb200_node(t, c) for t, c in cliques.items()]


def test_node_labels_in_step_and_one_relabelled_node_is_the_labels_layer_behind():
    from mctl.audit.rules.layers import node_clique_labels

    nodes = _nodes({"t1": "u.1", "t2": "u.1", "t3": "u.2", "t4": "u.2", "other-node": "v.9"})
    labels = node_clique_labels(TRAYS, nodes)
    assert labels == {"t1": "u.1", "t2": "u.1", "t3": "u.2", "t4": "u.2"}
    views = dict(_in_step(), labels=labels_view(labels))
    assert [f.severity for f in layers.check_rack("r1", PLAN, list(views.values()))] == [Severity.OK, Severity.OK]
    nodes[1]["metadata"]["labels"]["nvidia.com/gpu.clique"] = "u.2"        # t2 relabelled (GFD not yet run)
    views["labels"] = labels_view(node_clique_labels(TRAYS, nodes))
    p0, p1 = layers.check_rack("r1", PLAN, list(views.values()))
    assert p0.severity is Severity.CRITICAL and p0.details["behind"] == ["labels"]
    assert "Kubernetes clique labels behind (t1 labelled alike with t1; t2 labelled alike with t[2-4])" in p0.message
    assert "GPU Feature Discovery" in p0.action
    assert p1.details["behind"] == ["labels"]                          # t3, t4 now share a label with t2


def test_a_node_without_the_label_is_behind_a_tray_without_a_node_is_not_judged():
    from mctl.audit.rules.layers import node_clique_labels

    nodes = _nodes({"t1": "u.1", "t2": None, "t3": "u.2"})
    nodes[2]["metadata"]["name"] = "t3.cluster.example"                # named otherwise, found by its hostname
    nodes[2]["metadata"]["labels"]["kubernetes.io/hostname"] = "t3"
    labels = node_clique_labels(TRAYS, nodes + [{"kind": "Node"}, {"metadata": "junk"}])
    assert labels == {"t1": "u.1", "t2": None, "t3": "u.2"}
    p0, p1 = layers.check_rack("r1", PLAN, [labels_view(labels)])
    assert p0.details["behind"] == ["labels"] and "t2 in no group" in p0.message
    assert p1.severity is Severity.CRITICAL and "t3 labelled alike with t3" in p1.message   # t4 not judged


def test_unreadable_nodes_are_not_compared_never_in_step():
    (p0, _p1) = layers.check_rack("r1", PLAN, [labels_view({}, error="cannot reach the Kubernetes API")])
    assert p0.details["not_compared"] == ["labels"] and p0.details["in_step"] == []
    assert "Kubernetes clique labels (cannot reach the Kubernetes API)" in p0.message


def test_the_audit_of_a_kubernetes_site_compares_the_labels_and_a_failed_read_is_a_gap(tmp_path):
    import yaml

    from mctl.audit.collect import Actual, NodesView
    from mctl.audit.service import AuditSettings, evaluate, plan_audit
    from mctl.inventory import load_site
    from tests.helpers import captured_lab_site

    folder = captured_lab_site(tmp_path / "site", nmx=False)
    doc = yaml.safe_load((folder / "mctl.yml").read_text())
    doc["scheduler"] = {"type": "k8s"}
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc))
    site = load_site(folder)
    plan = plan_audit(site, list(site.racks.values()))
    settings = AuditSettings(health=False)
    trays = [f"lab-r1-tray0{n}" for n in range(1, 5)]
    good = _nodes({t: f"u.{1 if t < 'lab-r1-tray03' else 2}" for t in trays})

    def layer_findings(nodes):
        from mctl.model.tray import TrayFacts

        unreached = {t: TrayFacts(t, "127.0.0.1", "unreachable", error="not asked") for t in trays}
        entries, gaps, _ = evaluate(site, plan, Actual(unreached, None, {}, nodes=nodes), settings)
        return {e.subject: e.finding for e in entries if e.family == "layers"}, gaps

    found, gaps = layer_findings(NodesView(tuple(good)))
    assert {s: f.details["in_step"] for s, f in found.items()} == {"p0": ["labels"], "p1": ["labels"]}
    assert not [g for g in gaps if g.family == "layers"]
    good[0]["metadata"]["labels"]["nvidia.com/gpu.clique"] = "u.2"
    found, _ = layer_findings(NodesView(tuple(good)))
    assert found["p0"].details["behind"] == ["labels"] and found["p0"].severity is Severity.CRITICAL
    found, gaps = layer_findings(NodesView(error="cannot reach the Kubernetes API at https://127.0.0.1:1"))
    assert found["p0"].details["not_compared"][-1] == "labels"
    assert [(g.family, g.reason) for g in gaps if g.family == "layers"] == [
        ("layers", "Kubernetes nodes: cannot reach the Kubernetes API at https://127.0.0.1:1")]
