"""A real Kubernetes API server for the Kubernetes tests: etcd and kube-apiserver on loopback.

The binaries are built once by scripts/build-kube-apiserver (run by scripts/install) into
$MCTL_KUBE_CACHE (default /var/cache/mctl/kube-apiserver)/current/bin. When they are not
there, every test using the `kube_apiserver` fixture is skipped with the reason the build
gave (its FAILED file names the log); MCTL_REQUIRE_KUBE_APISERVER=1 turns that skip into a
failure (CI). A build running now (scripts/test starts a cold one in the background, while the
tests before the Kubernetes ones run) is waited for first, up to MCTL_KUBE_BUILD_WAIT s (30 min).

One server per session (about 5 s to start): HTTPS with a throwaway CA, static tokens for an
admin (system:masters, used by the tests to arrange and read back) and for `mctl` (RBAC: only
what mctl needs), the ComputeDomain and KAI Topology CRDs of tests/fixtures/golden/k8s/crds,
and an audit log of every write, so a test counts exactly what mctl changed. Tests call
`reset()` to start from GB200-like Nodes; `writes()` lists mctl's writes since `mark()`.
Nothing here has a controller-manager, scheduler or kubelet: Nodes stay as created. Where a test
needs their part it plays it in the open: `Kubelet` finishes the graceful deletion of pods (what a
kubelet does once their containers stopped), `set_budget_status` writes a PodDisruptionBudget's
status (what the disruption controller computes), and `FlakyProxy` stands between mctl and the
server answering 429/5xx or nothing at all for the requests a test names.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "tests" / "fixtures" / "golden" / "k8s" / "crds"
CACHE = Path(os.environ.get("MCTL_KUBE_CACHE", "/var/cache/mctl/kube-apiserver"))
REQUIRE_ENV = "MCTL_REQUIRE_KUBE_APISERVER"
BUILD_WAIT_ENV = "MCTL_KUBE_BUILD_WAIT"         # s the fixture waits for a build running now (default 30 min)
BUILD_WAITED: list[float] = []                  # how long the fixture waited for it, if it did
CD_CRD = "computedomains.resource.nvidia.com"
TOPO_CRD = "topologies.kai.scheduler"
CD_PATH = "/apis/resource.nvidia.com/v1beta1"
TOPO_PATH = "/apis/kai.scheduler/v1alpha1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
START_DEADLINE = 120.0          # s for /readyz on a loaded 2-core machine (about 5 s when idle)

# What mctl needs, nothing more: deploy k8s (get and create namespaces; get and patch nodes; get,
# create and patch ComputeDomains and Topologies) and health's remediation (get and patch nodes).
# Discovery (/version, /apis/...) is granted to every authenticated user by the default roles.
# A partition change's --drain lists the pods on its trays, evicts them (delete with --force).
MCTL_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]},
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["kai.scheduler"], "resources": ["topologies"], "verbs": ["get", "create", "patch"]},
]

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
"""


def building(cache: Path = CACHE) -> bool:
    """Whether scripts/build-kube-apiserver is building into *cache* now (it holds <cache>/.lock throughout;
    scripts/test starts a cold build in the background while the tests before the Kubernetes ones run)."""
    lock = cache / ".lock"
    if not lock.exists():
        return False
    with open(lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def built(cache: Path = CACHE, wait: float = 0.0) -> tuple[Path, Path] | str:
    """binaries(), after waiting up to *wait* seconds for a build running now to end."""
    if building(cache):
        wait_for(f"the kube-apiserver build into {cache} to end (scripts/build-kube-apiserver)",
                 lambda: not building(cache), wait, every=2.0)
    return binaries(cache)


def binaries(cache: Path = CACHE) -> tuple[Path, Path] | str:
    """(kube-apiserver, etcd), or why they are not there."""
    bindir = cache / "current" / "bin"
    api, etcd = bindir / "kube-apiserver", bindir / "etcd"
    if api.is_file() and etcd.is_file() and os.access(api, os.X_OK) and os.access(etcd, os.X_OK):
        return api, etcd
    failed = cache / "FAILED"
    if failed.is_file():
        lines = failed.read_text(errors="replace").splitlines()
        return "; ".join(ln.strip() for ln in lines[:2])          # the failed step; the log's path
    return (f"kube-apiserver is not built (no {bindir}): run scripts/install, or scripts/build-kube-apiserver "
            "(about 8 min on 2 cores, once)")


def gb200_node(name: str, clique: str | None, *, taints: list | None = None, unschedulable: bool = False,
               labels: dict | None = None) -> dict:
    """A Node as a GB200 compute tray's kubelet and the GPU Operator leave it (labels of GPU Feature
    Discovery: docs/scheduler.md), Ready."""
    lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64",
           "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "arm64",
           "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-GB200", "nvidia.com/gpu.count": "4"}
    if clique:
        lab["nvidia.com/gpu.clique"] = clique
    lab.update(labels or {})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}],
                       "capacity": {"cpu": "144", "memory": "900Gi", "nvidia.com/gpu": "4", "pods": "110"}}}


class ApiFailed(AssertionError):
    pass


class KubeServer:
    """A running etcd + kube-apiserver; the admin side the tests use to arrange and read back."""

    def __init__(self, root: Path, api_bin: Path, etcd_bin: Path):
        self.root = root
        self.api_bin, self.etcd_bin = api_bin, etcd_bin
        self.procs: list[subprocess.Popen] = []
        self.admin_token = secrets.token_hex(16)
        self.mctl_token = secrets.token_hex(16)
        self.nobody_token = secrets.token_hex(16)        # authenticated, no RBAC binding at all
        self.url = ""
        self.audit = root / "audit.log"
        self._mark = 0
        self._sentinel = 0
        self._etcd_data = Path(tempfile.mkdtemp(prefix="mctl-etcd-", dir="/dev/shm" if Path("/dev/shm").is_dir()
                                                else None))
        self._pki()
        self._ctx = ssl.create_default_context(cafile=str(self.ca))

    # ---- start and stop ----
    def _pki(self) -> None:
        pki = self.root / "pki"
        pki.mkdir()
        self.ca, self.ca_key = pki / "ca.crt", pki / "ca.key"
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _run(["openssl", "req", "-x509", *ec, "-keyout", self.ca_key, "-out", self.ca, "-days", "2",
              "-subj", "/CN=mctl-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        csr, self.cert, self.key = pki / "server.csr", pki / "server.crt", pki / "server.key"
        _run(["openssl", "req", "-new", *ec, "-keyout", self.key, "-out", csr, "-subj", "/CN=kube-apiserver"])
        ext = pki / "server.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                       "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
        _run(["openssl", "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
              "-out", self.cert, "-days", "2", "-extfile", ext])
        self.sa_key, self.sa_pub = pki / "sa.key", pki / "sa.pub"
        _run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.sa_key])
        _run(["openssl", "ec", "-in", self.sa_key, "-pubout", "-out", self.sa_pub])
        (self.root / "tokens.csv").write_text(f'{self.admin_token},admin,uid-admin,"system:masters"\n'
                                              f"{self.mctl_token},mctl,uid-mctl\n"
                                              f"{self.nobody_token},nobody,uid-nobody\n")
        (self.root / "audit-policy.yaml").write_text(AUDIT_POLICY)

    def start(self) -> None:
        last = ""
        for _attempt in range(3):           # a free port taken by someone else in between: new ports
            client, peer, secure = _free_ports(3)
            try:
                self._start(client, peer, secure)
                return
            except ApiFailed as exc:
                last = str(exc)
                self.stop()
                shutil.rmtree(self._etcd_data, ignore_errors=True)
                self._etcd_data.mkdir()
                if "address already in use" not in last:
                    break
        raise ApiFailed(last)

    def _spawn(self, name: str, argv: list) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        # killed with the test process even when that is killed hard (no server left behind)
        guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        try:
            proc = subprocess.Popen(guard + [str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def _start(self, client: int, peer: int, secure: int) -> None:
        etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._spawn("etcd", [
            self.etcd_bin, "--name", "mctl-test", "--data-dir", self._etcd_data,
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"mctl-test=http://127.0.0.1:{peer}"])
        self._wait(lambda: _http_ok(f"{etcd_url}/health"), etcd, "etcd", 30)
        api = self._spawn("kube-apiserver", [
            self.api_bin, "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1", "--advertise-address",
            "127.0.0.1", "--secure-port", secure, "--insecure-port", "0",
            "--tls-cert-file", self.cert, "--tls-private-key-file", self.key,
            "--token-auth-file", self.root / "tokens.csv", "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", self.sa_pub, "--service-account-signing-key-file", self.sa_key,
            "--service-cluster-ip-range", "10.0.0.0/24", "--endpoint-reconciler-type", "none",
            # without a controller-manager nothing would ever lift TaintNodesByCondition's not-ready taint
            "--disable-admission-plugins", "TaintNodesByCondition", "--enable-priority-and-fairness=false",
            "--profiling=false", "--audit-policy-file", self.root / "audit-policy.yaml",
            "--audit-log-path", self.audit, "--audit-log-format", "json", "--audit-log-mode", "blocking"])
        self.url = f"https://127.0.0.1:{secure}"
        self._wait(lambda: self.request("GET", "/readyz")[0] == 200, api, "kube-apiserver", START_DEADLINE)
        self._bootstrap()

    def _wait(self, ready, proc: subprocess.Popen, name: str, deadline: float) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise ApiFailed(f"{name} exited with {proc.returncode}: {self._tail(name)}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise ApiFailed(f"{name} not ready after {deadline:.0f} s: {self._tail(name)}")

    def _tail(self, name: str) -> str:
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-6:]) + f" (log: {path})"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._etcd_data, ignore_errors=True)

    def _bootstrap(self) -> None:
        self.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "mctl"}, "rules": MCTL_RULES})
        self.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "mctl"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "mctl"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mctl"}]})
        for name in (CD_CRD, TOPO_CRD):
            self.add_crd(name)

    # ---- admin requests ----
    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                token: str | None = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json", "Authorization": f"Bearer {token or self.admin_token}",
                   "User-Agent": "mctl-tests"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), content_type
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._ctx) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        status, out = self.request(method, path, body, content_type)
        if status >= 300:
            raise ApiFailed(f"{method} {path}: {status} {out}")
        return out

    def get(self, path: str) -> dict | None:
        status, out = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise ApiFailed(f"GET {path}: {status} {out}")
        return out

    def node(self, name: str) -> dict | None:
        return self.get(f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict, kind: str = "strategic") -> dict:
        return self.ok("PATCH", f"/api/v1/nodes/{name}", patch, f"application/{kind}-merge-patch+json")

    def compute_domain(self, name: str, namespace: str = "default") -> dict | None:
        return self.get(f"{CD_PATH}/namespaces/{namespace}/computedomains/{name}")

    def topology(self, name: str) -> dict | None:
        return self.get(f"{TOPO_PATH}/topologies/{name}")

    def reset(self, nodes: list[dict]) -> None:
        """Exactly these Nodes, no ComputeDomain in `default`, no Topology; writes counted from now."""
        self.ok("DELETE", "/api/v1/nodes")
        # (a Namespace cannot be deleted here: without a controller-manager it stays Terminating)
        for crd, path in ((CD_CRD, f"{CD_PATH}/namespaces/default/computedomains"),
                          (TOPO_CRD, f"{TOPO_PATH}/topologies")):
            if self.get(f"{CRD_PATH}/{crd}") is None:
                self.add_crd(crd)
            self.ok("DELETE", path)
        for node in nodes:
            self.ok("POST", "/api/v1/nodes", node)
        self.mark()

    # ---- CRDs ----
    def add_crd(self, name: str) -> None:
        path = CRDS / {CD_CRD: "resource.nvidia.com_computedomains.yaml",
                       TOPO_CRD: "kai.scheduler_topologies.yaml"}[name]
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        # 1.20 drops x-kubernetes-validations (CEL): tests/unit/test_k8s_cel.py evaluates them
        self.ok("POST", CRD_PATH, crd)
        self.wait_for(lambda: _established(self.get(f"{CRD_PATH}/{name}")), f"CRD {name} established")
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = crd["spec"]["versions"][0]["name"]
        self.wait_for(lambda: plural in json.dumps(self.get(f"/apis/{group}/{version}") or {}),
                      f"{group}/{version} {plural} discoverable")

    @contextlib.contextmanager
    def without_crd(self, name: str) -> Iterator[None]:
        """The CRD deleted for the block (its custom resources with it), registered again after."""
        self.ok("DELETE", f"{CRD_PATH}/{name}")
        self.wait_for(lambda: self.get(f"{CRD_PATH}/{name}") is None, f"CRD {name} deleted")
        api = {CD_CRD: CD_PATH, TOPO_CRD: TOPO_PATH}[name]
        self.wait_for(lambda: self.request("GET", api)[0] == 404, f"{api} gone from discovery")
        self.mark()
        try:
            yield
        finally:
            self.add_crd(name)

    def wait_for(self, cond, what: str, deadline: float = 60.0) -> None:
        try:
            wait_for(what, cond, deadline, every=0.1)
        except AssertionError as exc:
            raise ApiFailed(str(exc)) from None

    # ---- what mctl wrote ----
    def mark(self) -> None:
        self._mark = self.audit.stat().st_size if self.audit.exists() else 0

    def writes(self, user: str = "mctl") -> list[str]:
        """`user`'s writes since mark(): 'verb URI code' from the audit log.

        An event is written as its request completes, possibly just after the client has the
        response; so first a marker request of our own (a patch of a ConfigMap that does not
        exist: audited, changes nothing) is sent and awaited in the log, with a deadline."""
        self._sentinel += 1
        marker = f"/api/v1/namespaces/default/configmaps/mctl-tests-marker-{self._sentinel}"
        self.request("PATCH", marker, {}, "application/merge-patch+json")
        events: list[dict] = []
        end = time.monotonic() + 30
        while True:
            with self.audit.open("rb") as fh:
                fh.seek(self._mark)
                events = [json.loads(raw) for raw in fh.read().splitlines() if raw.strip()]
            if any(ev.get("requestURI") == marker and ev.get("stage") == "ResponseComplete" for ev in events):
                break
            if time.monotonic() > end:
                raise ApiFailed(f"the audit log has no event for {marker} after 30 s")
            time.sleep(0.05)
        out = []
        for ev in events:
            if ev.get("stage") != "ResponseComplete" or (ev.get("user") or {}).get("username") != user:
                continue
            if ev.get("verb") in WRITE_VERBS:
                out.append(f"{ev['verb']} {ev['requestURI']} {(ev.get('responseStatus') or {}).get('code')}")
        return out

    # ---- kubeconfigs ----
    def kubeconfig(self, path: Path, *, ca: str = "data", token: str = "inline", server: str | None = None,
                   insecure: bool = False, user_token: str | None = None) -> Path:
        """A kubeconfig for mctl's user: CA as certificate-authority-data ('data'), a file ('file') or none;
        the token inline or as tokenFile."""
        path.parent.mkdir(parents=True, exist_ok=True)
        cluster: dict[str, Any] = {"server": server or self.url}
        if ca == "data":
            cluster["certificate-authority-data"] = base64.b64encode(self.ca.read_bytes()).decode()
        elif ca == "file":
            shutil.copy(self.ca, path.parent / "ca.crt")
            cluster["certificate-authority"] = "ca.crt"
        if insecure:
            cluster["insecure-skip-tls-verify"] = True
        tok = user_token or self.mctl_token
        user: dict[str, Any] = {"token": tok}
        if token == "file":
            (path.parent / "token").write_text(tok + "\n")
            user = {"tokenFile": "token"}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "gb200",
            "clusters": [{"name": "gb200", "cluster": cluster}],
            "users": [{"name": "mctl", "user": user}],
            "contexts": [{"name": "gb200", "context": {"cluster": "gb200", "user": "mctl"}}]}))
        return path


# ------------------------------------------------------------------ pods, budgets, and what no controller does here

POLICY = "/apis/policy/v1beta1"         # 1.20 serves PodDisruptionBudget and Eviction as policy/v1beta1


def gpu_pod(name: str, node: str, *, gpus: int = 4, labels: dict | None = None, owner: str | None = None,
            namespace: str = "default") -> dict:
    """A pod bound to *node* that holds its GPUs (a limit of nvidia.com/gpu), as the scheduler leaves it."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {"app": "train"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "controller": True,
                                    "uid": "00000000-0000-0000-0000-000000000001"}]
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "worker", "image": "ubuntu:24.04", "resources": res}]}}


def add_pods(kube: "KubeServer", pods: list[dict], phase: str = "Running") -> None:
    """Create *pods* and report them *phase* (as their kubelet would: a Pending pod ignores every budget)."""
    for ns in {p["metadata"]["namespace"] for p in pods}:
        if kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default") is None:
            kube.ok("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    for pod in pods:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        kube.ok("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        kube.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}},
                "application/merge-patch+json")


def pod_names(kube: "KubeServer", namespace: str = "default") -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.ok("GET", f"/api/v1/namespaces/{namespace}/pods")["items"])


def clear_pods(kube: "KubeServer", namespace: str = "default") -> None:
    """Every pod of *namespace* gone at once (grace period 0), every budget with them."""
    for p in kube.ok("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    kube.ok("DELETE", f"{POLICY}/namespaces/{namespace}/poddisruptionbudgets")
    kube.wait_for(lambda: not pod_names(kube, namespace), f"no pod left in {namespace}")


def add_budget(kube: "KubeServer", name: str, selector: dict, min_available: int, namespace: str = "default") -> None:
    kube.ok("POST", f"{POLICY}/namespaces/{namespace}/poddisruptionbudgets",
            {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}}})


def set_budget_status(kube: "KubeServer", name: str, *, allowed: int, healthy: int, desired: int, expected: int,
                      namespace: str = "default") -> None:
    """The budget's status as the disruption controller (not running here) would compute it."""
    path = f"{POLICY}/namespaces/{namespace}/poddisruptionbudgets/{name}"
    gen = kube.ok("GET", path)["metadata"].get("generation", 1)
    kube.ok("PATCH", path + "/status",
            {"status": {"observedGeneration": gen, "disruptionsAllowed": allowed, "currentHealthy": healthy,
                        "desiredHealthy": desired, "expectedPods": expected}}, "application/merge-patch+json")


class Kubelet:
    """What the trays' kubelets would do for a pod deleted gracefully (evicted, or deleted by --force): its
    containers stop, the pod goes (here at once: a delete with grace period 0 once deletionTimestamp is set).
    `hold` names pods whose containers do not stop."""

    def __init__(self, kube: "KubeServer", namespace: str = "default"):
        self.kube, self.namespace = kube, namespace
        self.hold: set[str] = set()
        self.finished: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="test-kubelet")

    def __enter__(self) -> "Kubelet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            status, body = self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")
            for p in (body or {}).get("items", []) if status == 200 else []:
                name = p["metadata"]["name"]
                if p["metadata"].get("deletionTimestamp") and name not in self.hold:
                    self.kube.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                                      {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                    self.finished.append(name)


class FlakyProxy:
    """HTTPS in front of the API server (its own certificate, so mctl's kubeconfig trusts it as the server):
    passes every request on, except those a rule takes: `fail(match, answers)` makes the next requests whose
    'METHOD path' contains *match* answer each of *answers* in turn: an HTTP status (429 with Retry-After,
    or 5xx, with a Status body) or 'stall' (no answer for `stall_s` seconds, then the connection closed).
    `always` instead of a list answers that for every match until `clear()`. `seen` lists what came in."""

    def __init__(self, kube: "KubeServer", stall_s: float = 3.0):
        self.kube, self.stall_s = kube, stall_s
        self.rules: list[tuple[str, list | str]] = []
        self.seen: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy._serve(self)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(kube.cert), str(kube.key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="flaky-proxy")
        self._thread.start()

    def fail(self, match: str, answers: "list | str") -> None:
        with self.lock:
            self.rules.append((match, answers if isinstance(answers, str) else list(answers)))

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, what: str):
        with self.lock:
            self.seen.append(what)
            for match, answers in self.rules:
                if match in what:
                    if isinstance(answers, str):
                        return answers
                    if answers:
                        return answers.pop(0)
        return None

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        answer = self._answer(f"{h.command} {h.path}")
        if answer == "stall":
            time.sleep(self.stall_s)
            h.close_connection = True
            return
        if answer is not None:
            status = int(answer)
            out = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                              "reason": {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                                         504: "Timeout"}.get(status, "InternalError"),
                              "message": f"injected by the test's proxy ({status})"}).encode()
            h.send_response(status)
            if status == 429:
                h.send_header("Retry-After", "1")
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(out)))
            h.end_headers()
            h.wfile.write(out)
            return
        conn = http.client.HTTPSConnection("127.0.0.1", int(self.kube.url.rsplit(":", 1)[1]),
                                           context=self.kube._ctx, timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "connection")}
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


def _established(crd: dict | None) -> bool:
    conds = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


def _run(argv: list) -> None:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ApiFailed(f"{' '.join(map(str, argv[:3]))}: {proc.stderr.strip()[-300:]}")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def kube_skip(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(f"Kubernetes tier: {reason}")


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory, processes) -> Iterator[KubeServer]:
    """etcd + kube-apiserver for the session, stopped at its end (skipped, with the reason, when not built)."""
    started, waits = time.monotonic(), building()
    found = built(wait=float(os.environ.get(BUILD_WAIT_ENV) or 1800))
    if waits:
        BUILD_WAITED.append(time.monotonic() - started)      # the tier summary says so
    if isinstance(found, str):
        kube_skip(found)
    api_bin, etcd_bin = found
    server = KubeServer(tmp_path_factory.mktemp("kube-apiserver"), api_bin, etcd_bin)
    try:
        server.start()
    except ApiFailed as exc:
        server.close()
        pytest.fail(f"the real kube-apiserver did not start: {exc}", pytrace=False)
    except BaseException:
        server.close()          # whatever went wrong, nothing is left running
        raise
    try:
        yield server
    finally:
        server.close()
