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
