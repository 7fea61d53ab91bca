"""mctl deploy k8s against a real local HTTP server that emulates the Kubernetes API (kmock).

The CLI runs as its own process and talks HTTP to the emulator through an
ordinary kubeconfig; the emulator keeps the objects, so the tests read back
what a cluster would hold. No patching of mctl anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

kmock = pytest.importorskip("kmock", reason="kmock (test extra) is not installed")

REPO = Path(__file__).resolve().parents[2]
CD = "resource.nvidia.com/v1beta1/computedomains"
TOPO = "kai.scheduler/v1alpha1/topologies"


class KubeAPI:
    """kmock's KubernetesEmulator on 127.0.0.1:<free port>, served from a background thread."""

    def __init__(self, *, compute_domains: bool = True, kai: bool = True):
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.emulator = None
        self.url = ""
        self._declare = [(CD, "ComputeDomain", True)] * compute_domains + [(TOPO, "Topology", False)] * kai
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(15), "kmock did not start"

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as k, kmock.Server(k) as server:
            for res, kind, namespaced in self._declare:
                k.resources[res] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
            self.emulator, self.url = k, str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def add_node(self, name: str, labels: dict | None = None) -> None:
        self.emulator.objects["v1/nodes", None, name] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}

    def get(self, res: str, namespace: str | None, name: str) -> dict | None:
        try:
            obj = self.emulator.objects[res, namespace, name]
        except KeyError:
            return None
        return None if obj.deleted else dict(obj.raw)

    def writes(self) -> list[str]:
        """Every request that could change state, as the server received it."""
        return [f"{r.method.value} {r.url.path}" for r in list(self.emulator)
                if r.method.value.upper() in ("POST", "PATCH", "PUT", "DELETE")]


def _site(folder: Path, kubeconfig: Path | None) -> Path:
    doc = yaml.safe_load((REPO / "inventories" / "example-gb200" / "mctl.yml").read_text())
    doc["images_dir"] = str(REPO / "images")
    doc["scheduler"] = {"type": "k8s", "k8s": {"kubeconfig": str(kubeconfig)} if kubeconfig else {}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server}}],
        "users": [{"name": "admin", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}]}))
    return path


def mctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MCTL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


TRAYS = [f"rack-{r}-tray{n:02d}" for r in "ab" for n in range(1, 19)]


@pytest.fixture
def kube():
    api = KubeAPI()
    for t in TRAYS:
        api.add_node(t)
    yield api
    api.stop()


@pytest.fixture
def site(tmp_path, kube):
    return _site(tmp_path / "site", _kubeconfig(tmp_path / "kubeconfig", kube.url))


def test_apply_creates_labels_domains_topology_then_changes_nothing(tmp_path, kube, site):
    dry = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["pending"] == 36 + 3 + 1 and kube.writes() == []

    first = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert first.returncode == 0, first.stderr
    lines = [ln.split() for ln in first.stdout.splitlines()]
    assert ["created", "ComputeDomain", "default/rack-a-p0"] in lines
    cd = kube.get(CD, "default", "rack-a-p1")
    assert cd["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p1-channel"},
                                                     "allocationMode": "Single"}}
    node = kube.get("v1/nodes", None, "rack-a-tray12")
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": "rack-a-tray12", "mctl.io/rack": "rack-a",
                                          "mctl.io/nvlink-partition": "rack-a-p1",
                                          "mctl.io/nvlink-domain": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"}
    topo = kube.get(TOPO, None, "gb200-nvlink")
    assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == ["nvidia.com/gpu.clique", "kubernetes.io/hostname"]

    before = len(kube.writes())
    again = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["pending"] == 0 and len(kube.writes()) == before


def test_label_drift_is_patched_alone(tmp_path, kube, site):
    assert mctl(tmp_path, "-i", str(site), "deploy", "k8s").returncode == 0
    kube.add_node("rack-b-tray03", {"mctl.io/rack": "rack-b", "mctl.io/nvlink-partition": "old", "mctl.io/stale": "x"})
    before = len(kube.writes())
    res = mctl(tmp_path, "-i", str(site), "--json", "deploy", "k8s")
    assert res.returncode == 0, res.stderr
    changes = [c for c in json.loads(res.stdout)["changes"] if c["action"] != "unchanged"]
    assert [(c["kind"], c["name"], c["action"]) for c in changes] == [("Node", "rack-b-tray03", "update")]
    labels = kube.get("v1/nodes", None, "rack-b-tray03")["metadata"]["labels"]
    assert labels["mctl.io/nvlink-partition"] == "rack-b-all" and "mctl.io/stale" not in labels
    assert len(kube.writes()) == before + 1


def test_immutable_spec_conflict_applies_nothing(tmp_path, kube, site):
    kube.emulator.objects[CD, "default", "rack-a-p0"] = {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "rack-a-p0", "namespace": "default"},
        "spec": {"numNodes": 9, "channel": {"resourceClaimTemplate": {"name": "other"}}}}
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2
    assert "immutable" in res.stderr and "nothing was applied" in res.stderr
    assert kube.writes() == []


def test_missing_crd_applies_nothing(tmp_path):
    api = KubeAPI(compute_domains=False, kai=False)
    try:
        for t in TRAYS:
            api.add_node(t)
        site = _site(tmp_path / "site", _kubeconfig(tmp_path / "kubeconfig", api.url))
        res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
        assert res.returncode == 2
        assert "does not serve ComputeDomains" in res.stderr and "helm/install.sh" in res.stderr
        assert api.writes() == []
    finally:
        api.stop()


def test_missing_nodes_apply_nothing(tmp_path, kube, site):
    kube.emulator.objects["v1/nodes", None, "rack-b-tray18"].delete()
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2 and "rack-b-tray18" in res.stderr and "nothing was applied" in res.stderr
    assert kube.writes() == []


def test_kai_missing_only_skips_the_topology(tmp_path):
    api = KubeAPI(kai=False)
    try:
        for t in TRAYS:
            api.add_node(t)
        site = _site(tmp_path / "site", _kubeconfig(tmp_path / "kubeconfig", api.url))
        res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
        assert res.returncode == 0, res.stderr
        assert "KAI Scheduler is not installed" in res.stderr
        assert api.get(CD, "default", "rack-b-all") is not None
    finally:
        api.stop()


def test_kubeconfig_missing(tmp_path):
    site = _site(tmp_path / "site", tmp_path / "nope" / "kubeconfig")
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 2
    assert "kubeconfig not found" in res.stderr and "Traceback" not in res.stderr


def test_api_unreachable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # closed again before mctl connects
    site = _site(tmp_path / "site", _kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"))
    res = mctl(tmp_path, "-i", str(site), "deploy", "k8s")
    assert res.returncode == 3
    assert "cannot reach the Kubernetes API" in res.stderr and "nothing was applied" in res.stderr


def test_slurm_inventory_refused(tmp_path):
    res = mctl(tmp_path, "-i", str(REPO / "inventories" / "example-gb200"), "deploy", "k8s")
    assert res.returncode == 2 and "not k8s" in res.stderr
