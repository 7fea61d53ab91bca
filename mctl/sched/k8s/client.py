"""A small Kubernetes API client (stdlib HTTP): get, list, create, merge-patch, delete, evict; typed errors.

mctl needs a handful of calls on a few kinds, so it speaks the REST API
directly instead of carrying a client library: paths follow the API
conventions (`/api/v1/...` for the core group, `/apis/<group>/<version>/...`).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from mctl.errors import MctlError, EXIT_PARTIAL, UsageError
from mctl.sched.k8s.kubeconfig import Connection


class ClusterUnreachable(MctlError):
    """The API server did not answer: nothing could be checked or applied."""

    exit_code = EXIT_PARTIAL


class ApiError(MctlError):
    def __init__(self, status: int, message: str, hint: str | None = None, body: Any = None):
        super().__init__(message, hint, exit_code=EXIT_PARTIAL)
        self.status = status
        self.body = body

    @property
    def causes(self) -> list[dict]:
        """The Status' details.causes (an eviction refused by a PodDisruptionBudget names it there)."""
        details = (self.body or {}).get("details") if isinstance(self.body, dict) else None
        return [c for c in ((details or {}).get("causes") or []) if isinstance(c, dict)]


# Answers that say "not now" rather than "no": too many requests (API priority and fairness, or a
# PodDisruptionBudget refusing an eviction), the server or a proxy in front of it failing or timing out.
TRANSIENT = (429, 500, 502, 503, 504)


HINTS = {
    404: "the object or its namespace does not exist",
    409: "another writer changed the object since it was read (stale resourceVersion) or it exists already",
    415: "the API server does not accept this patch type for this kind",
    422: "the API server rejected the object as invalid (the field and rule are in the message)",
}


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def base(self) -> str:
        return f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"

    def collection(self, namespace: str | None) -> str:
        return f"{self.base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{self.base}/{self.plural}"

    def path(self, name: str, namespace: str | None) -> str:
        return f"{self.collection(namespace)}/{name}"


KINDS: dict[str, Kind] = {
    "Namespace": Kind("", "v1", "namespaces", False),
    "Pod": Kind("", "v1", "pods", True),
    "PodDisruptionBudget": Kind("policy", "v1", "poddisruptionbudgets", True),
    "Node": Kind("", "v1", "nodes", False),
    "Event": Kind("", "v1", "events", True),
    "ComputeDomain": Kind("resource.nvidia.com", "v1beta1", "computedomains", True),
    "Topology": Kind("kai.scheduler", "v1alpha1", "topologies", False),
}


class KubeClient:
    def __init__(self, conn: Connection, timeout: float = 10.0):
        self.conn = conn
        self.timeout = timeout
        self._ssl = conn.ssl_context()
        if conn.insecure and conn.server.startswith("https://"):
            sys.stderr.write(f"mctl: warning: context {conn.context}: insecure-skip-tls-verify is set, so the "
                             f"certificate of {conn.server} is not verified (anyone on the path can read the "
                             "token and answer as the API server)\n")

    def _request(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> tuple[int, Any]:
        headers = {"Accept": "application/json", "User-Agent": "mctl"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if self.conn.token:
            headers["Authorization"] = f"Bearer {self.conn.token}"
        elif self.conn.basic:
            raw = f"{self.conn.basic[0]}:{self.conn.basic[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        req = urllib.request.Request(self.conn.server + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json(exc.read())
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                # refused during the TLS handshake: the token was never sent
                raise UsageError(f"the Kubernetes API at {self.conn.server} (context {self.conn.context}) presented "
                                 f"a certificate that is not trusted ({reason.verify_message}); nothing was sent "
                                 "or applied",
                                 hint="set certificate-authority or certificate-authority-data for the cluster in "
                                      "the kubeconfig; insecure-skip-tls-verify: true accepts any server (not for "
                                      "production)") from None
            raise ClusterUnreachable(f"cannot reach the Kubernetes API at {self.conn.server} "
                                     f"(context {self.conn.context}): {reason}; nothing was applied",
                                     hint="check the kubeconfig's server and that the API server is up") from None

    def _check(self, status: int, body: Any, what: str) -> Any:
        if status in (401, 403):
            raise UsageError(f"the Kubernetes API refused {what} ({status}): {_message(body)}",
                             hint=f"the credentials of context {self.conn.context} lack the rights")
        if status >= 400:
            reason = body.get("reason") if isinstance(body, dict) else None
            raise ApiError(status, f"{what} failed ({status}{' ' + reason if reason else ''}): {_message(body)}",
                           hint=HINTS.get(status), body=body)
        return body

    def version(self) -> dict:
        status, body = self._request("GET", "/version")
        return self._check(status, body, "GET /version")

    def has_api(self, group: str, version: str, plural: str) -> bool:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        status, body = self._request("GET", path)
        if status == 404:
            return False
        body = self._check(status, body, f"GET {path}")
        return any(r.get("name") == plural for r in (body or {}).get("resources", []))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        path = KINDS[kind].path(name, namespace)
        status, body = self._request("GET", path)
        if status == 404:
            return None
        return self._check(status, body, f"GET {path}")

    def list(self, kind: str, namespace: str | None = None, *, field_selector: str | None = None,
             limit: int | None = None) -> list[dict]:
        """The items of a collection (every namespace when *namespace* is None), optionally filtered; with
        *limit*, read in pages of that many (one list, continued with the server's `continue` token)."""
        k = KINDS[kind]
        path = k.collection(namespace) if namespace or not k.namespaced else f"{k.base}/{k.plural}"
        query: dict[str, str] = {}
        if field_selector:
            query["fieldSelector"] = field_selector
        if limit:
            query["limit"] = str(limit)
        items: list[dict] = []
        while True:
            url = path + ("?" + urllib.parse.urlencode(query) if query else "")
            status, body = self._request("GET", url)
            body = self._check(status, body, f"GET {url}")
            items += list((body or {}).get("items") or [])
            token = ((body or {}).get("metadata") or {}).get("continue")
            if not limit or not token:
                return items
            query["continue"] = token

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """Delete with the object's own grace period; None when it is gone already."""
        path = KINDS[kind].path(name, namespace)
        status, body = self._request("DELETE", path)
        if status == 404:
            return None
        return self._check(status, body, f"delete {kind} {namespace + '/' if namespace else ''}{name}")

    def evict(self, name: str, namespace: str, policy_version: str = "v1") -> None:
        """POST the pod's eviction subresource: the API server deletes it only where every PodDisruptionBudget
        covering it allows (else 429 with the budget named in the causes). A pod gone already is no error."""
        path = KINDS["Pod"].path(name, namespace) + "/eviction"
        body = {"apiVersion": f"policy/{policy_version}", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace}}
        status, out = self._request("POST", path, body)
        if status == 404:
            return
        self._check(status, out, f"evict pod {namespace}/{name}")

    def policy_version(self) -> str:
        """policy/v1 where the server serves it (Kubernetes >= 1.21), else policy/v1beta1 (Eviction and
        PodDisruptionBudget both)."""
        return "v1" if self.has_api("policy", "v1", "poddisruptionbudgets") else "v1beta1"

    def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        path = KINDS[obj["kind"]].collection(meta.get("namespace"))
        status, body = self._request("POST", path, obj)
        return self._check(status, body, f"create {obj['kind']} {meta.get('name') or meta.get('generateName')}")

    def merge_patch(self, kind: str, name: str, namespace: str | None, patch: dict) -> dict:
        path = KINDS[kind].path(name, namespace)
        status, body = self._request("PATCH", path, patch, "application/merge-patch+json")
        return self._check(status, body, f"patch {kind} {name}")


def client_for(site) -> KubeClient:
    """mctl's client for *site* (a Site): scheduler.k8s's kubeconfig (else $KUBECONFIG, ~/.kube/config)."""
    from mctl.sched.k8s import kubeconfig as kc

    settings = site.scheduler.k8s
    path = (site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path()
    return KubeClient(kc.load(path, settings.context))


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"message": raw[:200].decode("utf-8", "replace")}


def _message(body: Any) -> str:
    """The Status' message, or for 422 its causes (field: what is wrong), which say more in less space."""
    if isinstance(body, dict):
        causes = [c for c in ((body.get("details") or {}).get("causes") or []) if isinstance(c, dict)]
        if causes:
            text = "; ".join(f"{c.get('field')}: {c.get('message')}" if c.get("field") else str(c.get("message"))
                             for c in causes[:4])
        else:
            text = str(body.get("message") or body.get("reason") or body)
        return _cut(text)
    return _cut(str(body))


def _cut(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
