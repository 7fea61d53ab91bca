"""Apply the rendered objects through the Kubernetes API: check everything first, then change.

Preflight refuses before any write: the API must answer, the ComputeDomain CRD
(installed by the DRA driver chart) must be served, every compute tray must be a
Node, and no existing ComputeDomain or KAI Topology may differ in its spec
(both are immutable). Then objects are created or merge-patched in order
(namespace, node labels, ComputeDomains, Topology); an object that already
matches is left alone, so a second run changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mctl.errors import EnvironmentProblem, UsageError
from mctl.model.site import fold
from mctl.sched.k8s.client import ApiError, KubeClient
from mctl.sched.k8s.manifests import LABEL_PREFIX, K8sBundle

IMMUTABLE_SPEC = ("ComputeDomain", "Topology")


@dataclass
class Change:
    kind: str
    name: str
    namespace: str | None
    action: str                       # create | update | unchanged | skip
    detail: str = ""
    obj: dict = field(default_factory=dict, repr=False)
    patch: dict | None = field(default=None, repr=False)
    done: bool = False

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "namespace": self.namespace, "action": self.action,
                "detail": self.detail, "done": self.done}


@dataclass
class K8sPlan:
    server: str
    context: str
    server_version: str
    changes: list[Change]
    warnings: list[str] = field(default_factory=list)

    @property
    def pending(self) -> list[Change]:
        return [c for c in self.changes if c.action in ("create", "update")]

    def to_dict(self) -> dict:
        return {"server": self.server, "context": self.context, "server_version": self.server_version,
                "changes": [c.to_dict() for c in self.changes], "pending": len(self.pending),
                "warnings": self.warnings}


def _label_patch(current: dict, desired: dict) -> dict | None:
    """Merge patch for labels: set ours, drop mctl.io labels we no longer want; None if nothing to do."""
    have = (current.get("metadata") or {}).get("labels") or {}
    patch: dict[str, Any] = {k: v for k, v in desired.items() if have.get(k) != v}
    patch.update({k: None for k in have if k.startswith(LABEL_PREFIX) and k not in desired})
    return patch or None


def _holds(stored: Any, rendered: Any) -> bool:
    """Whether the stored spec says what mctl rendered: the server adds defaults (a CRD's `default:`, such
    as ComputeDomain's allocationMode), so a stored map may carry more keys; lists must match item by item."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(_holds(stored.get(k), v) for k, v in rendered.items())
    if isinstance(rendered, list):
        return (isinstance(stored, list) and len(stored) == len(rendered)
                and all(_holds(a, b) for a, b in zip(stored, rendered)))
    return stored == rendered


def _minor(text: str | None) -> tuple[int, int] | None:
    """(1, 32) from '1.32', '1.32+', 'v1.32.3'; None when it is not a version."""
    m = re.match(r"^v?(\d+)\.(\d+)", str(text or ""))
    return (int(m[1]), int(m[2])) if m else None


def plan_k8s(bundle: K8sBundle, client: KubeClient) -> K8sPlan:
    version = client.version()
    server_version = str(version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}")
    if not client.has_api("resource.nvidia.com", "v1beta1", "computedomains"):
        raise EnvironmentProblem(f"the cluster at {client.conn.server} does not serve ComputeDomains "
                                 "(resource.nvidia.com/v1beta1): the DRA driver is not installed; nothing was applied",
                                 hint="install it first: mctl deploy k8s --render DIR, then sh DIR/helm/install.sh")
    kai = client.has_api("kai.scheduler", "v1alpha1", "topologies")
    warnings: list[str] = []
    named = _minor(bundle.kubernetes_version)
    running = _minor(f"{version.get('major')}.{version.get('minor')}") or _minor(server_version.lstrip("v"))
    if named and running and running < named:
        warnings.append(f"the cluster runs Kubernetes {server_version}, older than the {bundle.kubernetes_version} "
                        "the inventory names (scheduler.k8s.kubernetes_version); ComputeDomains need DRA, "
                        "Kubernetes >= 1.32")
    changes: list[Change] = []
    missing_nodes: list[str] = []
    conflicts: list[str] = []
    for obj in bundle.objects:
        kind, meta = obj["kind"], obj["metadata"]
        name, ns = meta["name"], meta.get("namespace")
        if kind == "Topology" and not kai:
            warnings.append("KAI Scheduler is not installed (no kai.scheduler/v1alpha1 topologies): "
                            "the Topology is skipped")
            changes.append(Change(kind, name, ns, "skip", "KAI Scheduler not installed", obj))
            continue
        current = client.get(kind, name, ns)
        if current is None:
            if kind == "Node":
                missing_nodes.append(name)
                continue
            changes.append(Change(kind, name, ns, "create", "", obj))
            continue
        if kind in IMMUTABLE_SPEC and not _holds(current.get("spec"), obj.get("spec")):
            conflicts.append(f"{kind} {name}: spec {current.get('spec')} != rendered {obj.get('spec')}")
            continue
        patch = _label_patch(current, meta.get("labels") or {})
        if patch:
            detail = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in patch.items())
            changes.append(Change(kind, name, ns, "update", f"labels {detail}", obj,
                                  {"metadata": {"labels": patch}}))
        else:
            changes.append(Change(kind, name, ns, "unchanged", "", obj))
    if missing_nodes:
        raise EnvironmentProblem(f"{len(missing_nodes)} compute tray(s) are not Nodes of the cluster: "
                                 f"{fold(missing_nodes)}; nothing was applied",
                                 hint="join them (the Node name must be the tray's inventory name), then run again")
    if conflicts:
        raise UsageError("existing objects differ in an immutable spec: " + "; ".join(conflicts[:4])
                         + "; nothing was applied",
                         hint="delete them (and the workloads using them) to have them re-created from the inventory")
    return K8sPlan(client.conn.server, client.conn.context, server_version, changes, warnings)


def apply_k8s(plan: K8sPlan, client: KubeClient) -> K8sPlan:
    """In order; a refused write stops there, and the error says how many were applied before it."""
    pending = plan.pending
    for n, change in enumerate(pending):
        try:
            if change.action == "create":
                client.create(change.obj)
            else:
                client.merge_patch(change.kind, change.name, change.namespace, change.patch or {})
        except ApiError as exc:
            raise ApiError(exc.status, f"{exc.message}; {n} of {len(pending)} change(s) applied before "
                                       f"(mctl deploy k8s --dry-run shows what is left)", exc.hint) from None
        change.done = True
    return plan
