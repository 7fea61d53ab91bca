"""A small etcd v3 client over etcd's own HTTP/JSON gateway (`/v3/...`), for the watch's leader lease.

etcd serves its v3 API as JSON on the client URLs (etcd >= 3.4: `/v3/`); keys and values travel in
base64 and 64-bit numbers as strings. Only what a lease with fencing needs is here: grant, keep alive and
revoke a lease; create a key under a lease only if it is absent (a transaction on its create revision);
read a key; and the fence itself, a transaction that succeeds only while the key still has the create
revision its holder got. Every call has a deadline; an endpoint that does not answer (refused, timed out,
a 5xx) is skipped for the next one, and when none answers `EtcdUnreachable` is raised: a caller that
cannot reach etcd cannot know it still holds anything (docs/health.md, "Failover").

Standard library only (urllib): no client library in the product's dependencies for five calls.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

from mctl.errors import MctlError


class EtcdUnreachable(MctlError):
    """No endpoint answered within its deadline."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str | None) -> str:
    return base64.b64decode(text or "").decode(errors="replace")


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def of(cls, kv: dict[str, Any]) -> "KeyValue":
        return cls(_unb64(kv.get("key")), _unb64(kv.get("value")), int(kv.get("create_revision") or 0),
                   int(kv.get("mod_revision") or 0), int(kv.get("lease") or 0))


class EtcdClient:
    def __init__(self, endpoints: Sequence[str], *, timeout: float = 2.0):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._first = 0                     # the endpoint that answered last is asked first

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        errors: list[str] = []
        n = len(self.endpoints)
        for i in range(n):
            k = (self._first + i) % n
            url = self.endpoints[k] + path
            req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    answer = json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as exc:
                if exc.code >= 500:
                    errors.append(f"{self.endpoints[k]}: HTTP {exc.code}")
                    continue
                detail = exc.read().decode(errors="replace")[:200]
                raise MctlError(f"etcd {self.endpoints[k]} refused {path}: HTTP {exc.code} {detail}",
                                hint="check the etcd endpoints and that etcd serves the v3 API (etcd >= 3.4)")
            except (OSError, ValueError) as exc:       # refused, reset, timed out, not JSON
                errors.append(f"{self.endpoints[k]}: {getattr(exc, 'reason', None) or exc}")
                continue
            self._first = k
            return answer
        raise EtcdUnreachable(f"etcd did not answer {path} ({'; '.join(errors)})",
                              hint="check the etcd endpoints (health.failover.etcd) and the network to them")

    # ------------------------------------------------------------------ leases

    def grant(self, ttl: int) -> int:
        """A new lease of *ttl* seconds; its id."""
        return int(self._post("/v3/lease/grant", {"TTL": int(ttl)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew *lease*; the TTL it has again (0: it had expired, or was revoked)."""
        answer = self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int((answer.get("result") or answer).get("TTL") or 0)

    def revoke(self, lease: int) -> None:
        """End *lease* now (its keys go with it); a lease already gone is no error."""
        try:
            self._post("/v3/lease/revoke", {"ID": str(lease)})
        except MctlError as exc:
            if isinstance(exc, EtcdUnreachable) or "not found" not in exc.message:
                raise

    # ------------------------------------------------------------------ keys

    def get(self, key: str) -> KeyValue | None:
        kvs = self._post("/v3/kv/range", {"key": _b64(key)}).get("kvs") or []
        return KeyValue.of(kvs[0]) if kvs else None

    def create(self, key: str, value: str, lease: int) -> tuple[bool, KeyValue | None]:
        """Put *key* under *lease* only if no key of that name exists (one transaction). (True, the key as
        created) when it was; (False, the key that holds the name) when not."""
        answer = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value), "lease": str(lease)}}],
            "failure": [{"request_range": {"key": _b64(key)}}]})
        if answer.get("succeeded"):
            revision = int(answer["header"]["revision"])
            return True, KeyValue(key, value, revision, revision, lease)
        kvs = ((answer.get("responses") or [{}])[0].get("response_range") or {}).get("kvs") or []
        return False, (KeyValue.of(kvs[0]) if kvs else None)

    def holds(self, key: str, create_revision: int) -> bool:
        """The fence: True only if *key* exists now with *create_revision* (one transaction, so etcd answers
        for this instant: the holder's lease has not expired and nobody has taken the key since)."""
        answer = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE",
                         "create_revision": str(int(create_revision))}],
            "success": [], "failure": []})
        return bool(answer.get("succeeded"))
