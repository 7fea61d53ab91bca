"""mctl deploy k8s against a real kube-apiserver (tests/kube_apiserver.py; skipped with the build's
reason when it is not built).

The CLI runs as its own process and talks HTTPS to the server through an ordinary kubeconfig
(the test CA, mctl's own token, RBAC limited to what mctl needs); the tests arrange and read
back as an admin, and count mctl's writes from the server's audit log.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.kube_apiserver import CD_CRD, TOPO_CRD, gb200_node

REPO = Path(__file__).resolve().parents[2]
DOMAIN_A = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"       # rack-a's nvlink_domain in the example inventory
TRAYS = [f"rack-{r}-tray{n:02d}" for r in "ab" for n in range(1, 19)]


def clique(tray: str) -> str:
    """GPU Feature Discovery's <clusterUUID>.<cliqueID>: rack-a has two partitions, rack-b one."""
    n = int(tray[-2:])
    if tray.startswith("rack-a"):
        return f"{DOMAIN_A}.{1 if n <= 9 else 2}"
    return "0f3e1a52-5b7c-4d39-9a4e-2c8d6b1e7f90.1"


def nodes(trays=TRAYS) -> list[dict]:
    return [gb200_node(t, clique(t)) for t in trays]


def _site(folder: Path, kubeconfig: Path | None, **k8s) -> Path:
    doc = yaml.safe_load((REPO / "inventories" / "example-gb200" / "mctl.yml").read_text())
    doc["images_dir"] = str(REPO / "images")
    doc["scheduler"] = {"type": "k8s", "k8s": {**({"kubeconfig": str(kubeconfig)} if kubeconfig else {}), **k8s}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def mctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """mctl as its own process; an apply of `deploy k8s` skips the trays' host IMEX read (--no-tray-check): the
    example inventory's trays are not hosts of this machine (tests/integration/test_health_k8s.py reads the lab's)."""
    if "deploy" in args and "k8s" in args and "--render" not in args:
        args = (*args, "--no-tray-check")
    env = dict(os.environ, MCTL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def kube(kube_apiserver):
    kube_apiserver.reset(nodes())
    return kube_apiserver


@pytest.fixture
def site(tmp_path, kube):
    return _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config"))


def test_apply_creates_labels_domains_topology_then_changes_nothing(tmp_path, kube, site):
    dry = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["pending"] == 36 + 3 + 1 and plan["server_version"] == "v1.20.2"
    assert kube.writes() == [] and kube.compute_domain("rack-a-p0") is None

    first = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert first.returncode == 0, first.stderr
    lines = [ln.split() for ln in first.stdout.splitlines()]
    assert ["created", "ComputeDomain", "default/rack-a-p0"] in lines
    # the test server is 1.20; the site names the default 1.32
    assert "the cluster runs Kubernetes v1.20.2, older than the 1.32 the inventory names" in first.stderr
    writes = kube.writes()
    assert len(writes) == 40 and all(w.endswith((" 200", " 201")) for w in writes), writes
    assert sum(w.startswith("patch /api/v1/nodes/") for w in writes) == 36
    cd = kube.compute_domain("rack-a-p1")
    assert cd["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p1-channel"},
                                                     "allocationMode": "Single"}}
    assert cd["metadata"]["labels"] == {"mctl.io/nvlink-partition": "rack-a-p1", "mctl.io/rack": "rack-a"}
    labels = kube.node("rack-a-tray12")["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("mctl.io/")} == {
        "mctl.io/rack": "rack-a", "mctl.io/nvlink-partition": "rack-a-p1", "mctl.io/nvlink-domain": DOMAIN_A}
    # what GPU Feature Discovery and the kubelet set is left alone
    assert labels["nvidia.com/gpu.clique"] == f"{DOMAIN_A}.2" and labels["kubernetes.io/hostname"] == "rack-a-tray12"
    topo = kube.topology("gb200-nvlink")
    assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == ["nvidia.com/gpu.clique", "kubernetes.io/hostname"]

    kube.mark()
    again = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["pending"] == 0
    assert kube.writes() == []                              # idempotent: zero writes on the server


def test_server_defaults_are_not_a_spec_conflict(tmp_path, kube, site):
    """The server defaults allocationMode and may add fields; a ComputeDomain created by an earlier mctl
    without allocationMode is the same spec, not an immutable-spec conflict."""
    kube.ok("POST", "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains", {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "rack-a-p0", "namespace": "default",
                     "labels": {"mctl.io/nvlink-partition": "rack-a-p0", "mctl.io/rack": "rack-a"}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p0-channel"}},
                 "unknownField": "pruned"}})
    stored = kube.compute_domain("rack-a-p0")["spec"]
    assert stored["channel"]["allocationMode"] == "Single" and "unknownField" not in stored
    res = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s")
    assert res.returncode == 0, res.stderr
    cd = next(c for c in json.loads(res.stdout)["changes"] if c["name"] == "rack-a-p0")
    assert cd["action"] == "unchanged"


def test_label_drift_is_patched_alone(tmp_path, kube, site):
    assert mctl(tmp_path, "-i", str(site), "deploy", "k8s").returncode == 0
    kube.patch_node("rack-b-tray03", {"metadata": {"labels": {"mctl.io/nvlink-partition": "old", "mctl.io/stale": "x",
                                                              "team": "theirs"}}})
    kube.mark()
    res = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s")
    assert res.returncode == 0, res.stderr
    changes = [c for c in json.loads(res.stdout)["changes"] if c["action"] != "unchanged"]
    assert [(c["kind"], c["name"], c["action"]) for c in changes] == [("Node", "rack-b-tray03", "update")]
    labels = kube.node("rack-b-tray03")["metadata"]["labels"]
    assert labels["mctl.io/nvlink-partition"] == "rack-b-all" and "mctl.io/stale" not in labels
    assert labels["team"] == "theirs"
    assert kube.writes() == ["patch /api/v1/nodes/rack-b-tray03 200"]


def test_immutable_spec_conflict_applies_nothing(tmp_path, kube, site):
    kube.ok("POST", "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains", {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "rack-a-p0", "namespace": "default"},
        "spec": {"numNodes": 9, "channel": {"resourceClaimTemplate": {"name": "other"}}}})
    kube.mark()
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2
    assert "immutable" in res.stderr and "nothing was applied" in res.stderr
    assert kube.writes() == []


def test_invalid_namespace_is_refused_at_the_inventory_before_any_write(tmp_path, kube):
    """A workload namespace that is not a DNS label never reaches the server: the inventory names it
    (file:line, exit 2) and nothing is written. (The server's own 422 with its field is reported as
    tests/integration/test_k8s_remediation.py shows for a taint value the inventory cannot check.)"""
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config"), workload_namespace="GPU_Work")
    kube.mark()
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2, res.stderr
    assert "mctl.yml:" in res.stderr and "scheduler.k8s.workload_namespace" in res.stderr
    assert "'GPU_Work' is not a Kubernetes namespace name" in res.stderr and "Traceback" not in res.stderr
    assert kube.writes() == []


def test_missing_crd_applies_nothing(tmp_path, kube, site):
    with kube.without_crd(CD_CRD):
        res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
        assert res.returncode == 2
        assert "does not serve ComputeDomains" in res.stderr and "helm/install.sh" in res.stderr
        assert kube.writes() == []


def test_missing_nodes_apply_nothing(tmp_path, kube, site):
    kube.ok("DELETE", "/api/v1/nodes/rack-b-tray18")
    kube.mark()
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2 and "rack-b-tray18" in res.stderr and "nothing was applied" in res.stderr
    assert kube.writes() == []


def test_kai_missing_only_skips_the_topology(tmp_path, kube, site):
    with kube.without_crd(TOPO_CRD):
        res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
        assert res.returncode == 0, res.stderr
        assert "KAI Scheduler is not installed" in res.stderr
        assert kube.compute_domain("rack-b-all") is not None
        assert not any("topolog" in w for w in kube.writes())


def test_tls_ca_file_and_token_file(tmp_path, kube):
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config", ca="file", token="file"))
    res = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["server"] == kube.url


def test_unverified_server_is_refused_before_the_token_is_sent(tmp_path, kube):
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config", ca="none"))
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s", "--dry-run")
    assert res.returncode == 2, res.stderr
    assert "certificate" in res.stderr and "not trusted" in res.stderr and "certificate-authority" in res.stderr
    assert "Traceback" not in res.stderr


def test_insecure_skip_tls_verify_only_when_asked_and_with_a_warning(tmp_path, kube):
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config", ca="none", insecure=True))
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "insecure-skip-tls-verify" in res.stderr and "not verified" in res.stderr


def test_wrong_token_and_missing_rights(tmp_path, kube):
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config", user_token="not-the-token"))
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s", "--dry-run")
    assert res.returncode == 2 and "(401" in res.stderr and "Traceback" not in res.stderr


def test_a_user_without_rights_is_told_so(tmp_path, kube):
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config", user_token=kube.nobody_token))
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2 and "(403)" in res.stderr and "lack the rights" in res.stderr
    assert kube.writes("nobody") == []


def test_workload_namespace_is_created_first(tmp_path, kube):
    ns = "gpu-work"                      # only this test uses it; each session has a fresh etcd
    assert kube.get(f"/api/v1/namespaces/{ns}") is None
    site = _site(tmp_path / "site", kube.kubeconfig(tmp_path / "kube" / "config"), workload_namespace=ns)
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 0, res.stderr
    writes = kube.writes()
    assert writes[0] == "create /api/v1/namespaces 201"          # first, so the ComputeDomains find it
    assert sum(w.startswith(f"create /apis/resource.nvidia.com/v1beta1/namespaces/{ns}/") for w in writes) == 3
    assert kube.compute_domain("rack-b-all", ns)["metadata"]["namespace"] == ns
    kube.mark()
    assert mctl(tmp_path, "-i", str(site), "deploy", "k8s").returncode == 0
    assert kube.writes() == []


def test_kubeconfig_missing(tmp_path, processes):
    site = _site(tmp_path / "site", tmp_path / "nope" / "kubeconfig")
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2
    assert "kubeconfig not found" in res.stderr and "Traceback" not in res.stderr


def test_api_unreachable(tmp_path, sockets):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # closed again before mctl connects
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "u"}}]}))
    res = mctl(tmp_path, "-i", str(_site(tmp_path / "site", cfg)), "deploy", "k8s")
    assert res.returncode == 3
    assert "cannot reach the Kubernetes API" in res.stderr and "nothing was applied" in res.stderr


def test_slurm_inventory_refused(tmp_path, processes):
    res = mctl(tmp_path, "-i", str(REPO / "inventories" / "example-gb200"), "deploy", "k8s")
    assert res.returncode == 2 and "not k8s" in res.stderr
