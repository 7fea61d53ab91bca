"""Everything an operator needs for GB200 on Kubernetes, rendered from the inventory (pure).

- Helm values for the GPU Operator and NVIDIA's DRA driver, with the known pitfalls
  handled: `nvidiaDriverRoot` follows who installs the driver (`/run/nvidia/driver`
  when the operator does, `/` when the image does); ComputeDomains only means
  `resources.gpus.enabled=false`; GPUs through DRA need `gpuResourcesEnabledOverride`.
- Node labels for rack, NVLink partition and NVLink domain (the partition label
  uses the same names as the Slurm blocks: both follow the partitions).
- One ComputeDomain per NVLink partition and an example Job per partition whose
  pods join it (resource claim) and stay in one partition (podAffinity on
  `nvidia.com/gpu.clique`, which GPU Feature Discovery sets).
- A KAI Scheduler Topology: `nvidia.com/gpu.clique` above `kubernetes.io/hostname`.

`objects` are what `mctl deploy k8s` applies; examples and Helm files are only
written with `--render`.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from mctl.model.settings import K8sSettings
from mctl.model.site import Site
from mctl.sched.slurm.topology import Block, blocks_for

LABEL_PREFIX = "mctl.io/"
RACK_LABEL = LABEL_PREFIX + "rack"
PARTITION_LABEL = LABEL_PREFIX + "nvlink-partition"
DOMAIN_LABEL = LABEL_PREFIX + "nvlink-domain"
CD_LABEL = LABEL_PREFIX + "compute-domain"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TOPOLOGY_NAME = "gb200-nvlink"
OPERATOR_CHART = "gpu-operator"
DRA_CHART = "nvidia-dra-driver-gpu"
HEADER = "# Managed by mctl (mctl deploy k8s) from the site inventory.\n"


def settings_of(site: Site) -> K8sSettings:
    return site.scheduler.k8s if site.scheduler else K8sSettings()


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-_.")
    if len(v) > 63:
        v = v[:54].rstrip("-_.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return v


def dns_name(text: str) -> str:
    """An RFC 1123 name (lower case, '-' and '.'; <= 63 chars so it also fits labels)."""
    v = re.sub(r"[^a-z0-9.-]", "-", text.lower()).strip("-.")
    if len(v) > 63:
        v = v[:54].rstrip("-.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return v


@dataclass
class K8sBundle:
    files: dict[str, str]                       # relative path -> text (everything --render writes)
    objects: list[dict[str, Any]]               # what `mctl deploy k8s` applies, in order
    blocks: list[Block]
    warnings: list[str] = field(default_factory=list)
    kubernetes_version: str = "1.32"            # what the site names (scheduler.k8s.kubernetes_version)

    def to_dict(self) -> dict:
        return {"files": sorted(self.files), "objects": [describe(o) for o in self.objects],
                "partitions": [b.to_dict() for b in self.blocks], "warnings": self.warnings}


def describe(obj: dict) -> dict:
    meta = obj.get("metadata", {})
    return {"kind": obj["kind"], "name": meta.get("name"), "namespace": meta.get("namespace")}


class _Dumper(yaml.SafeDumper):
    """Plain YAML for humans and kubectl: no &anchors/*aliases for repeated dicts."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(docs: list[dict], comment: str) -> str:
    return HEADER + comment + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=120)


def operator_values(s: K8sSettings) -> dict:
    return {"driver": {"enabled": s.operator_manages_driver}}


def dra_values(s: K8sSettings) -> dict:
    values: dict[str, Any] = {
        "nvidiaDriverRoot": "/run/nvidia/driver" if s.operator_manages_driver else "/",
        "resources": {"gpus": {"enabled": s.dra_gpu_resources}, "computeDomains": {"enabled": True}},
    }
    if s.dra_gpu_resources:
        values["gpuResourcesEnabledOverride"] = True
    return values


def node_objects(site: Site, blocks: list[Block]) -> list[dict]:
    block_of = {t: b for b in blocks for t in b.nodes}
    out = []
    for rack in site.racks.values():
        for tray in rack.compute:
            labels = {RACK_LABEL: label_value(rack.name)}
            if tray.name in block_of:
                labels[PARTITION_LABEL] = label_value(block_of[tray.name].name)
            if rack.nvlink_domain:
                labels[DOMAIN_LABEL] = rack.nvlink_domain.lower()
            out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": tray.name, "labels": labels}})
    return out


def compute_domain(block: Block, namespace: str) -> dict:
    name = dns_name(block.name)
    return {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {PARTITION_LABEL: label_value(block.name), RACK_LABEL: label_value(block.rack)}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"},
                                            "allocationMode": "Single"}},
    }


def example_job(block: Block, namespace: str, image: str, gpus: int) -> dict:
    cd = dns_name(block.name)
    selector = {"matchLabels": {CD_LABEL: cd}}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{cd}-example", "namespace": namespace, "labels": {CD_LABEL: cd}},
        "spec": {
            "completions": block.size, "parallelism": block.size, "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": {CD_LABEL: cd}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {PARTITION_LABEL: label_value(block.name)},
                    "affinity": {
                        # every pod in the same NVLink partition (clique) as the others
                        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": selector, "topologyKey": CLIQUE_LABEL}]},
                        # one pod per node per ComputeDomain (a DRA driver limit)
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": selector, "topologyKey": HOSTNAME_LABEL}]},
                    },
                    "containers": [{
                        "name": "worker", "image": image,
                        "command": ["bash", "-c", "nvidia-smi -L; ls -l /dev/nvidia-caps-imex-channels"],
                        "resources": {"limits": {"nvidia.com/gpu": gpus}, "claims": [{"name": "imex-channel"}]},
                    }],
                    "resourceClaims": [{"name": "imex-channel", "resourceClaimTemplateName": f"{cd}-channel"}],
                },
            },
        },
    }


def kai_topology() -> dict:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": TOPOLOGY_NAME},
            "spec": {"levels": [{"nodeLabel": CLIQUE_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}}


def install_script(s: K8sSettings) -> str:
    repo = f'"{s.helm_repo}"' if s.helm_repo else '"${NVIDIA_HELM_REPO:?set NVIDIA_HELM_REPO to NVIDIA\'s Helm repository URL, or scheduler.k8s.helm_repo in the inventory}"'
    # The inventory checked these (mctl.inventory.loader); quoted all the same, where the shell reads them.
    op_ver = f" --version {shlex.quote(s.gpu_operator_version)}" if s.gpu_operator_version else ""
    dra_ver = f" --version {shlex.quote(s.dra_driver_version)}" if s.dra_driver_version else ""
    return (
        "#!/bin/sh\n"
        "# Managed by mctl (mctl deploy k8s --render). Installs the GPU Operator, then NVIDIA's DRA driver\n"
        "# (ComputeDomains), with the values next to this script. mctl does not run Helm itself.\n"
        "set -eu\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f"helm repo add nvidia {repo} --force-update\n"
        "helm repo update nvidia\n"
        f"helm upgrade --install {OPERATOR_CHART} nvidia/{OPERATOR_CHART} --namespace {shlex.quote(s.namespace)} --create-namespace"
        f"{op_ver} --values \"$here/{OPERATOR_CHART}-values.yaml\" --wait\n"
        f"helm upgrade --install {DRA_CHART} nvidia/{DRA_CHART} --namespace {shlex.quote(s.dra_namespace)} --create-namespace"
        f"{dra_ver} --values \"$here/{DRA_CHART}-values.yaml\" --wait\n"
    )


def readme(site: Site, s: K8sSettings, blocks: list[Block]) -> str:
    parts = "\n".join(f"| `{dns_name(b.name)}` | {b.rack} | {b.nodeset} ({b.size}) |" for b in blocks)
    return f"""# Kubernetes for {site.name} (rendered by `mctl deploy k8s --render`)

Order:
1. Host IMEX off on every tray: the DRA driver runs its own IMEX daemons, so the host
   `nvidia-imex` service must be stopped, disabled and masked (`mctl provision` with
   `scheduler.type: k8s` stops and disables it; `systemctl mask nvidia-imex` masks it).
2. `sh helm/install.sh`: the GPU Operator ({'it installs the driver' if s.operator_manages_driver else 'the image delivers the driver, so driver.enabled=false'}),
   then the DRA driver with ComputeDomains on (`nvidiaDriverRoot: {dra_values(s)['nvidiaDriverRoot']}`).
   Needs Kubernetes >= 1.32 with DRA enabled (default from 1.34), CDI, driver >= 570.158.01.
3. `mctl deploy k8s` (or `kubectl apply -f manifests/`): node labels, one ComputeDomain per
   NVLink partition in namespace `{s.workload_namespace}`, the KAI Scheduler Topology.
4. `examples/`: one Job per partition; its pods claim the partition's IMEX channel and stay in
   one NVLink partition (podAffinity on `{CLIQUE_LABEL}`).

| ComputeDomain | rack | trays |
|---|---|---|
{parts}
"""


def render_k8s(site: Site) -> K8sBundle:
    s = settings_of(site)
    blocks = blocks_for(site)
    warnings = [f"rack {r.name} has no NVLink partitions in the inventory: one ComputeDomain for the whole rack"
                for r in site.racks.values() if r.compute and not r.partitions]
    gpus = {r.name: r.gpus_per_tray for r in site.racks.values()}
    nodes = node_objects(site, blocks)
    cds = [compute_domain(b, s.workload_namespace) for b in blocks]
    objects: list[dict] = []
    files: dict[str, str] = {}
    if s.workload_namespace != "default":
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.workload_namespace}}
        objects.append(ns)
        files["manifests/00-namespace.yaml"] = _dump([ns], "# Namespace of the ComputeDomains and workloads.\n")
    objects += nodes + cds + [kai_topology()]
    files["manifests/10-node-labels.yaml"] = _dump(
        nodes, "# Rack, NVLink partition and NVLink domain of every tray (kubectl apply merges the labels).\n")
    files["manifests/20-computedomains.yaml"] = _dump(
        cds, "# One ComputeDomain per NVLink partition (the spec is immutable once created).\n")
    files["manifests/30-kai-topology.yaml"] = _dump(
        [kai_topology()], "# KAI Scheduler: pack gangs into one NVLink partition, then by host.\n")
    for b in blocks:
        files[f"examples/{dns_name(b.name)}-job.yaml"] = _dump(
            [example_job(b, s.workload_namespace, s.example_image, gpus[b.rack])],
            f"# Example: one pod per tray of NVLink partition {b.name}, all in its ComputeDomain.\n")
    files[f"helm/{OPERATOR_CHART}-values.yaml"] = _dump([operator_values(s)], "# GPU Operator values.\n")
    files[f"helm/{DRA_CHART}-values.yaml"] = _dump([dra_values(s)], "# NVIDIA DRA driver values.\n")
    files["helm/install.sh"] = install_script(s)
    files["README.md"] = readme(site, s, blocks)
    return K8sBundle(files, objects, blocks, warnings, s.kubernetes_version)
