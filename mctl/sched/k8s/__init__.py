"""Kubernetes for NVL72 racks: render (Helm values, labels, ComputeDomains, KAI Topology), check, apply.

Public API:
    render_k8s(site) -> K8sBundle                   pure; .files for --render, .objects to apply
    kubeconfig.load(path, context) -> Connection     refuses missing files and exec plugins
    KubeClient(connection)                           stdlib HTTP client (get, create, merge-patch)
    plan_k8s(bundle, client) -> K8sPlan              preflight; raises before any write
    apply_k8s(plan, client) -> K8sPlan
"""

from mctl.sched.k8s.apply import Change, K8sPlan, apply_k8s, plan_k8s
from mctl.sched.k8s.client import ApiError, ClusterUnreachable, KubeClient
from mctl.sched.k8s.manifests import K8sBundle, render_k8s

__all__ = ["Change", "K8sPlan", "apply_k8s", "plan_k8s", "ApiError", "ClusterUnreachable", "KubeClient",
           "K8sBundle", "render_k8s"]
