"""Health's Kubernetes adapter (cordon, taint, annotations, uncordon) against the real kube-apiserver,
in-process, for what the lab test (test_health_k8s.py) cannot arrange: a write by another
controller exactly between mctl's read and its patch (409 on the stale resourceVersion), and a
taint the server refuses (422). Writes are counted from the server's audit log.
"""

from __future__ import annotations

import pytest

from mctl.model.drain import DRAIN, RESUME, Decision
from mctl.sched.k8s.cordon import K8sAdapter
from mctl.sched.k8s import kubeconfig
from mctl.sched.k8s.client import KubeClient
from tests.kube_apiserver import gb200_node

TRAY = "rack-a-tray05"
THEIR_TAINT = {"key": "nvidia.com/gpu.health", "value": "degraded", "effect": "NoSchedule"}
OURS = {"key": "mctl.io/unhealthy", "value": "true", "effect": "NoSchedule"}
PATH = f"/api/v1/nodes/{TRAY}"


class Interleaved(KubeClient):
    """mctl's own client; `between(n)` runs after its n-th read of the Node, before mctl writes."""

    def __init__(self, conn, between):
        super().__init__(conn)
        self.between, self.reads = between, 0

    def get(self, kind, name, namespace=None):
        obj = super().get(kind, name, namespace)
        self.reads += 1
        self.between(self.reads)
        return obj


@pytest.fixture
def kube(kube_apiserver):
    kube_apiserver.reset([gb200_node(TRAY, "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1")])
    return kube_apiserver


def adapter(kube, tmp_path, between=lambda n: None, taint="mctl.io/unhealthy=true:NoSchedule") -> K8sAdapter:
    conn = kubeconfig.load(kube.kubeconfig(tmp_path / "kube" / "config"))
    return K8sAdapter(Interleaved(conn, between), [TRAY], taint, "root@head (pid 1, mctl health watch)")


def drain(reason: str = "mctl: nvlink gpu2 link11 down") -> Decision:
    return Decision(TRAY, DRAIN, "critical", reason=reason, full="nvlink.links: NVLinks not up: gpu2 link11",
                    at=1764547200.0)


def test_conflict_is_retried_and_keeps_the_other_controllers_taint(kube, tmp_path):
    def between(n):
        if n == 1:          # another controller taints the node after mctl read it
            kube.patch_node(TRAY, {"spec": {"taints": [THEIR_TAINT]}})

    result = adapter(kube, tmp_path, between)._apply_one(drain())
    assert result.ok, result.error
    assert kube.writes() == [f"patch {PATH} 409", f"patch {PATH} 200"]
    node = kube.node(TRAY)
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"] == [THEIR_TAINT, OURS]
    ann = node["metadata"]["annotations"]
    assert ann["mctl.io/cordon-reason"] == "mctl: nvlink gpu2 link11 down"
    assert ann["mctl.io/cordon-timestamp"] == "2025-12-01T00:00:00Z"


def test_an_operators_cordon_in_between_is_not_overwritten(kube, tmp_path):
    def between(n):
        if n == 1:          # kubectl cordon by someone else, after mctl read the node
            kube.patch_node(TRAY, {"spec": {"unschedulable": True}})

    result = adapter(kube, tmp_path, between)._apply_one(drain())
    assert not result.ok and result.refused and "already cordoned" in result.error
    assert kube.writes() == [f"patch {PATH} 409"]
    node = kube.node(TRAY)
    assert "taints" not in node["spec"] and not (node["metadata"].get("annotations") or {})


def test_conflicts_without_end_are_given_up_and_said(kube, tmp_path):
    def between(n):
        kube.patch_node(TRAY, {"metadata": {"labels": {"churn": str(n)}}})

    result = adapter(kube, tmp_path, between)._apply_one(drain())
    assert not result.ok and result.refused and "409 Conflict" in result.error
    assert kube.writes() == [f"patch {PATH} 409"] * 3
    assert not kube.node(TRAY)["spec"].get("unschedulable")


def test_resume_lifts_only_mctls_cordon_taint_and_annotations(kube, tmp_path):
    kube.patch_node(TRAY, {"spec": {"taints": [THEIR_TAINT]}})
    ad = adapter(kube, tmp_path)
    assert ad._apply_one(drain()).ok
    kube.patch_node(TRAY, {"metadata": {"annotations": {"team.example/owner": "ml"}}})
    kube.mark()
    result = ad._apply_one(Decision(TRAY, RESUME, "healthy", reason="mctl: nvlink gpu2 link11 down"))
    assert result.ok, result.error
    assert kube.writes() == [f"patch {PATH} 200"]
    node = kube.node(TRAY)
    assert not node["spec"].get("unschedulable") and node["spec"]["taints"] == [THEIR_TAINT]
    assert node["metadata"]["annotations"] == {"team.example/owner": "ml"}


def test_resume_of_a_cordon_that_is_not_mctls_is_refused(kube, tmp_path):
    kube.patch_node(TRAY, {"spec": {"unschedulable": True, "taints": [THEIR_TAINT]}})
    result = adapter(kube, tmp_path)._apply_one(Decision(TRAY, RESUME, "healthy", reason="mctl: x"))
    assert not result.ok and result.refused and result.not_ours
    assert kube.writes() == []
    assert kube.node(TRAY)["spec"] == {"unschedulable": True, "taints": [THEIR_TAINT]}


def test_a_taint_the_server_refuses_is_reported_with_its_field(kube, tmp_path):
    taint = "mctl.io/unhealthy=" + "x" * 64 + ":NoSchedule"        # label values: at most 63 characters
    result = adapter(kube, tmp_path, taint=taint)._apply_one(drain())
    assert not result.ok and not result.refused
    # (1.20 names the field metadata.taints[0].value)
    assert "(422 Invalid)" in result.error and "taints[0].value" in result.error and "63 characters" in result.error
    assert kube.writes() == [f"patch {PATH} 422"]
    assert not kube.node(TRAY)["spec"].get("unschedulable")


# ------------------------------------------------------------------ health.k8s_evict: a drained node's GPU pods

def test_a_drain_evicts_the_nodes_gpu_pods_leaves_daemonsets_and_says_so_in_one_event(kube, tmp_path):
    from mctl.sched.k8s.evict import EVENT_REASON, after_drain
    from tests.kube_apiserver import Kubelet, add_budget, add_pods, clear_pods, gpu_pod, pod_names, set_budget_status

    clear_pods(kube)
    add_pods(kube, [gpu_pod("train-0", TRAY), gpu_pod("serve-0", TRAY, labels={"app": "serve"}),
                    gpu_pod("dcgm-x1", TRAY, labels={"app": "dcgm"}, owner="dcgm-exporter"),
                    gpu_pod("web-0", TRAY, gpus=0, labels={"app": "web"}),
                    gpu_pod("train-9", "rack-a-tray06")])
    add_budget(kube, "serve-pdb", {"app": "serve"}, 1)
    set_budget_status(kube, "serve-pdb", allowed=0, healthy=1, desired=1, expected=1)
    kube.mark()
    try:
        ad = adapter(kube, tmp_path)
        ad.on_drained = after_drain
        with Kubelet(kube):
            result = ad._apply_one(drain())
            assert result.ok, result.error
            kube.wait_for(lambda: "train-0" not in pod_names(kube), "train-0 gone")
        ev = result.fields["evictions"]
        assert ev["evicted"] == ["default/train-0"] and ev["daemonset_pods_left"] == ["default/dcgm-x1"]
        assert ev["kept"] == {"default/serve-0": "kept by a PodDisruptionBudget: The disruption budget serve-pdb "
                                                 "needs 1 healthy pods and has 1 currently"}
        assert pod_names(kube) == ["dcgm-x1", "serve-0", "train-9", "web-0"]
        writes = kube.writes()
        assert writes[0] == f"patch {PATH} 200"
        assert "create /api/v1/namespaces/default/pods/train-0/eviction 201" in writes
        assert not [w for w in writes if "dcgm-x1" in w or "web-0" in w or "train-9" in w or w.startswith("delete")]
        # one Event for the tray, naming what was evicted and what not
        events = [e for e in kube.ok("GET", "/api/v1/namespaces/default/events")["items"]
                  if e["involvedObject"]["name"] == TRAY]
        assert len(events) == 1 and [w for w in writes if "/events " in w] == \
            ["create /api/v1/namespaces/default/events 201"]
        (e,) = events
        assert e["reason"] == EVENT_REASON and e["involvedObject"]["kind"] == "Node" and e["type"] == "Warning"
        assert e["message"].startswith(f"mctl drained {TRAY}: evicted 1 GPU pod (default/train-0); "
                                       "default/serve-0 not evicted: kept by a PodDisruptionBudget")
        assert "DaemonSet pods left: default/dcgm-x1" in e["message"]
    finally:
        clear_pods(kube)
        kube.ok("DELETE", "/api/v1/namespaces/default/events")


def test_evictions_are_per_site_and_off_by_default(tmp_path, kube):
    from mctl.sched.adapter import adapter_for
    from mctl.sched.k8s.evict import after_drain
    from tests.helpers import site_with

    config = kube.kubeconfig(tmp_path / "kube" / "config")
    (tmp_path / "a").mkdir()
    plain = site_with(tmp_path / "a", scheduler="k8s", k8s={"kubeconfig": str(config)})
    assert plain.health.k8s_evict is False and adapter_for(plain, None).on_drained is None
    (tmp_path / "b").mkdir()
    on = site_with(tmp_path / "b", scheduler="k8s", k8s={"kubeconfig": str(config)})
    doc = (tmp_path / "b" / "mctl.yml").read_text() + "health:\n  k8s_evict: true\n"
    (tmp_path / "b" / "mctl.yml").write_text(doc)
    from mctl.inventory import load_site

    on = load_site(tmp_path / "b")
    assert on.health.k8s_evict is True and adapter_for(on, None).on_drained is after_drain
