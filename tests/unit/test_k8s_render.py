"""Kubernetes rendering: golden files, offline schema validation of every manifest, the Helm pitfalls.

Standard kinds are validated with kubernetes-validate (strict: unknown fields fail) for the
Kubernetes version the site names (scheduler.k8s.kubernetes_version, default 1.32; their CEL
rules: test_k8s_cel.py); ComputeDomain and KAI Topology against the
openAPIV3Schema of their published CRDs (tests/fixtures/golden/k8s/crds).

Regenerate the golden files after an intended change with:
    MCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_k8s_render.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from mctl.inventory import load_site
from mctl.sched.k8s import render_k8s
from mctl.sched.k8s.manifests import CLIQUE_LABEL, PARTITION_LABEL
from tests.helpers import k8s_site
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "k8s"
REGEN = os.environ.get("MCTL_REGEN_GOLDEN") == "1"
K8S_VERSION = "1.32.0"                # the default of scheduler.k8s.kubernetes_version
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in (GOLDEN / "crds").glob("*.yaml"):
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        for v in crd["spec"]["versions"]:
            out[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def manifests(files: dict[str, str]) -> list[tuple[str, dict]]:
    return [(path, doc) for path, text in files.items() if path.endswith(".yaml") and not path.startswith("helm/")
            for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return render_k8s(k8s_site(tmp_path_factory.mktemp("k8s")))


def test_golden(bundle):
    where = GOLDEN / "example"
    if REGEN:
        for rel, text in bundle.files.items():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            (where / rel).write_text(text)
    on_disk = sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file())
    assert on_disk == sorted(bundle.files)
    for rel, text in bundle.files.items():
        assert text == (where / rel).read_text(), f"{rel} differs (MCTL_REGEN_GOLDEN=1 to update)"


def test_every_manifest_passes_schema_validation(bundle):
    assert bundle.kubernetes_version == "1.32"           # the default
    crds = crd_schemas()
    kinds = set()
    for path, doc in manifests(bundle.files):
        kinds.add(doc["kind"])
        key = (doc["apiVersion"], doc["kind"])
        if key in crds:
            jsonschema.validate(doc, crds[key])
        else:
            kubernetes_validate.validate(doc, f"{bundle.kubernetes_version}.0", strict=True)
    assert kinds == {"Node", "ComputeDomain", "Topology", "Job"}      # no Deployment is rendered


@pytest.mark.parametrize("version", ["1.33", "1.35"])
def test_manifests_validate_for_the_version_the_site_names(tmp_path, version):
    named = render_k8s(k8s_site(tmp_path, kubernetes_version=version))
    assert named.kubernetes_version == version
    for _path, doc in manifests(named.files):
        if doc["kind"] in ("Job", "Node"):
            kubernetes_validate.validate(doc, f"{version}.0", strict=True)


def test_a_version_that_is_not_one_is_refused(tmp_path):
    from mctl.errors import MctlError

    with pytest.raises(MctlError, match="kubernetes_version"):
        k8s_site(tmp_path, kubernetes_version="latest")


def test_validation_catches_a_broken_compute_domain(bundle):
    crds = crd_schemas()
    cd = next(d for _p, d in manifests(bundle.files) if d["kind"] == "ComputeDomain")
    broken = {**cd, "spec": {"numNodes": 0, "channel": {"allocationMode": "Some"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crds[("resource.nvidia.com/v1beta1", "ComputeDomain")])
    job = next(d for _p, d in manifests(bundle.files) if d["kind"] == "Job")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**job, "spec": {**job["spec"], "parallelism": "nine"}}, K8S_VERSION, strict=True)


def test_one_compute_domain_and_example_per_partition(bundle):
    docs = manifests(bundle.files)
    cds = {d["metadata"]["name"]: d for _p, d in docs if d["kind"] == "ComputeDomain"}
    assert sorted(cds) == ["rack-a-p0", "rack-a-p1", "rack-b-all"]
    assert cds["rack-a-p0"]["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p0-channel"},
                                                                   "allocationMode": "Single"}}
    jobs = {d["metadata"]["name"]: d for _p, d in docs if d["kind"] == "Job"}
    job = jobs["rack-a-p0-example"]["spec"]
    assert job["parallelism"] == job["completions"] == 9
    pod = job["template"]["spec"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == CLIQUE_LABEL
    assert pod["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": "rack-a-p0-channel"}]
    assert pod["nodeSelector"] == {PARTITION_LABEL: "rack-a-p0"}
    for _p, d in docs:
        assert DNS_1123.match(d["metadata"]["name"])
        for value in (d["metadata"].get("labels") or {}).values():
            assert len(value) <= 63 and LABEL_VALUE.match(value)


def test_node_labels_follow_partitions_and_domain(bundle):
    nodes = {d["metadata"]["name"]: d["metadata"]["labels"] for _p, d in manifests(bundle.files) if d["kind"] == "Node"}
    assert len(nodes) == 36
    assert nodes["rack-a-tray10"] == {"mctl.io/rack": "rack-a", "mctl.io/nvlink-partition": "rack-a-p1",
                                      "mctl.io/nvlink-domain": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"}
    assert "mctl.io/nvlink-domain" not in nodes["rack-b-tray01"]     # rack-b's domain is discovered, not declared


def test_kai_topology(bundle):
    (topo,) = [d for _p, d in manifests(bundle.files) if d["kind"] == "Topology"]
    assert topo["spec"]["levels"] == [{"nodeLabel": "nvidia.com/gpu.clique"}, {"nodeLabel": "kubernetes.io/hostname"}]


def test_helm_values_avoid_the_pitfalls(tmp_path, bundle):
    dra = yaml.safe_load(bundle.files["helm/nvidia-dra-driver-gpu-values.yaml"])
    assert dra == {"nvidiaDriverRoot": "/", "resources": {"gpus": {"enabled": False},
                                                          "computeDomains": {"enabled": True}}}
    assert yaml.safe_load(bundle.files["helm/gpu-operator-values.yaml"]) == {"driver": {"enabled": False}}
    other = render_k8s(k8s_site(tmp_path, operator_manages_driver=True, dra_gpu_resources=True,
                                helm_repo="https://charts.example.invalid/nvidia", dra_driver_version="25.8.0"))
    dra = yaml.safe_load(other.files["helm/nvidia-dra-driver-gpu-values.yaml"])
    assert dra["nvidiaDriverRoot"] == "/run/nvidia/driver"
    assert dra["resources"]["gpus"]["enabled"] is True and dra["gpuResourcesEnabledOverride"] is True
    assert yaml.safe_load(other.files["helm/gpu-operator-values.yaml"]) == {"driver": {"enabled": True}}
    script = other.files["helm/install.sh"]
    assert '"https://charts.example.invalid/nvidia"' in script and "--version 25.8.0" in script


def test_install_script_is_valid_shell(tmp_path, bundle, processes):
    path = tmp_path / "install.sh"
    path.write_text(bundle.files["helm/install.sh"])
    subprocess.run(["sh", "-n", str(path)], check=True)
    assert "NVIDIA_HELM_REPO:?" in bundle.files["helm/install.sh"]      # no repository URL baked in


def test_rack_without_partitions_gets_one_compute_domain(tmp_path):
    doc = yaml.safe_load((REPO / "inventories" / "example-gb200" / "mctl.yml").read_text())
    doc["images_dir"] = str(REPO / "images")
    doc["scheduler"] = {"type": "k8s"}
    del doc["racks"]["rack-b"]["partitions"]
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    b = render_k8s(load_site(tmp_path))
    assert [x.name for x in b.blocks][-1] == "rack-b"
    assert any("rack rack-b has no NVLink partitions" in w for w in b.warnings)


def test_cli_render_writes_and_refuses_slurm_sites(tmp_path, capsys):
    site = k8s_site(tmp_path / "inv")
    out = tmp_path / "out"
    result = run_cli(capsys, "-i", str(site.root), "deploy", "k8s", "--render", str(out))
    assert result.code == 0, result.err
    assert (out / "manifests" / "20-computedomains.yaml").is_file()
    assert os.access(out / "helm" / "install.sh", os.X_OK)
    wrong = run_cli(capsys, "-i", str(REPO / "inventories" / "example-gb200"), "deploy", "k8s", "--render", str(out))
    assert wrong.code == 2 and "the inventory's scheduler is slurm, not k8s" in wrong.err
