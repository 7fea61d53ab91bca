"""A partition change on the lab with `scheduler.type: k8s`: the lab's trays registered as Node objects
on the real kube-apiserver (tests/kube_apiserver.py), the fabric on an NMX-M emulator.

With a GPU pod on an affected tray, `partition create --drain` cordons the affected nodes, evicts the
pod through the Eviction API (its PodDisruptionBudget allowing one disruption), waits until it is gone
(the test plays the kubelet that finishes the deletion), changes every layer, and uncordons. The labels
step moves mctl's partition label and the GPUs' clique label, and the audit finds the labels layer in
step. The test puts the rack back to the default partition at the end.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import lab_nmx
from tests.kube_apiserver import Kubelet, add_budget, add_pods, clear_pods, gb200_node, gpu_pod, pod_names, \
    set_budget_status

CLIQUE_LABEL = "nvidia.com/gpu.clique"
PARTITION_LABEL = "mctl.io/nvlink-partition"


@pytest.fixture
def site(lab, kube_apiserver, tmp_path):
    kube = kube_apiserver
    kube.reset([gb200_node(t, None) for t in lab.trays])
    clear_pods(kube)
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["racks"][lab.rack].pop("partitions", None)
    emulator = lab_nmx(lab, doc, tmp_path)
    config = kube.kubeconfig(tmp_path / "kube" / "config", ca="file", token="file")
    doc["scheduler"] = {"type": "k8s", "k8s": {"kubeconfig": str(config)}}
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    base = ["-i", str(folder), "--state-dir", str(tmp_path / "state")]
    try:
        yield {"base": base, "dir": folder, "kube": kube}
    finally:
        clear_pods(kube)
        for name in ("p1", "p0"):           # back to the default partition: one IMEX domain for the rack
            if f"name: {name}" in (folder / "mctl.yml").read_text():
                lab.mctl(*base, "partition", "delete", lab.rack, name, "--force", "--yes", timeout=300)
        if emulator is not None:
            emulator.stop()


def _mctl(lab, site, *args):
    return lab.mctl(*site["base"], *args, timeout=300)


def test_drain_evicts_the_pod_changes_every_layer_and_moves_the_labels(lab, site):
    kube, t = site["kube"], lab.trays
    add_pods(kube, [gpu_pod("train-0", t[0]), gpu_pod("web-0", t[1], gpus=0, labels={"app": "web"})])
    add_budget(kube, "train-pdb", {"app": "train"}, 0)
    set_budget_status(kube, "train-pdb", allowed=1, healthy=1, desired=0, expected=1)
    refused = _mctl(lab, site, "partition", "create", lab.rack, "--template", "2x9")
    assert refused.returncode == 2 and "pod default/train-0" in refused.stderr, refused.stderr
    kube.mark()
    with Kubelet(kube):
        out = _mctl(lab, site, "--json", "partition", "create", lab.rack, "--template", "2x9", "--drain",
                    "--wait", "120")
    assert out.returncode == 0, out.stderr + out.stdout[-3000:]
    run = json.loads(out.stdout)["run"]
    steps = {s["step"]: s for s in run["steps"]}
    assert run["status"] == "succeeded" and all(s["status"] == "done" for n, s in steps.items()
                                                if not n.startswith("slurm-")), steps
    assert "cordoned in Kubernetes" in steps["hold"]["summary"] and "read back" in steps["labels"]["summary"]
    assert "uncordoned" in steps["release"]["summary"]
    # the GPU pod was evicted (not deleted), the other stays; no node is left cordoned
    assert pod_names(kube) == ["web-0"]
    writes = kube.writes()
    assert "create /api/v1/namespaces/default/pods/train-0/eviction 201" in writes
    assert not [w for w in writes if w.startswith("delete")]
    assert not any(kube.node(n)["spec"].get("unschedulable") or kube.node(n)["spec"].get("taints") for n in t)
    # the labels: mctl's partition label per block, the GPUs' clique per partition (two cliques, one per pair)
    labels = {n: kube.node(n)["metadata"]["labels"] for n in t}
    assert [labels[n].get(PARTITION_LABEL) for n in t[:4]] == [f"{lab.rack}-p0"] * 2 + [f"{lab.rack}-p1"] * 2
    cliques = [labels[n].get(CLIQUE_LABEL) for n in t[:4]]
    assert cliques[0] == cliques[1] and cliques[2] == cliques[3] and cliques[0] != cliques[2] and None not in cliques
    # the audit reads the Nodes: the labels layer is in step with the partitions
    audit = _mctl(lab, site, "audit", "--json", "--no-health", "--no-history")
    report = json.loads(audit.stdout)
    assert "layers" in report["coverage"], report["coverage"]
    assert not [f for f in report["findings"] if f["family"] == "layers" and "labels" in f["details"]["behind"]]
