"""NMX-Manager REST client (stdlib urllib; tenacity for retries).

NMX-M fronts the NVLink switch trays of one or more NVLink domains. Partition
changes are asynchronous: 202 + an operation to poll. Transient trouble (5xx,
refused or reset connections, timeouts on reads) is retried with backoff, then
surfaced as NMXUnavailable (exit 3: the rack may be half way through a change).

The contract (docs/partitions.md, from the NMX-M OpenAPI spec as NVIDIA's generated
client `crates/libnmxm` carries it): counts answer `{"total": N}`; an operation ends
`completed`, `failed` or `cancelled` and says why in `Result.Error`/`Result.Details`;
`DELETE /operations/{id}` cancels; the inventory lists page with `offset`/`limit`
and the client follows the pages; `ro-user` and `rw-user` are Kong gateway users,
and a write by the read-only one is refused with 403 (NMXReadOnly).

Credentials stay with their origin: a redirect or an operation `Location` that
names another scheme, host or port is refused (NMXForeignOrigin) and the
credentials are never sent there; environment proxies are not used; `http://` is
refused except on a loopback address or with `allow_http`; a warning is printed
once when TLS verification is off. Every call has a deadline: `timeout_s` per
read and per whole answer, `call_deadline_s` over the retries of one call, and
`operation_deadline_s` for an operation to end.

Credentials: HTTP Basic, read from a file that holds one line
`username:password` (the password may itself contain ':'; blank lines and lines
starting with '#' are ignored). The file must not be readable by group or
others. The password never appears in a repr, an error or a log line.

Base path: the URL's path when it has one (`https://nmx/v1` for NetQ releases
that dropped the prefix), else `/nmx/v1`.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tenacity import (RetryError, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay,
                      wait_exponential)

from mctl.errors import PartialFailure, UsageError
from mctl.model.fabric import NmxComputeNode, NmxGpu, NmxOperation, NmxPartition
from mctl.transport.credentials import BasicCredentials, origin as _origin, read_credentials

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

DEFAULT_BASE_PATH = "/nmx/v1"
INVENTORY_KINDS = ("gpus", "compute-nodes", "switch-nodes", "switches", "ports", "chassis")
# The list endpoints whose OpenAPI entry takes `pagination` (offset, limit); partitions
# and operations take none and are asked for whole.
PAGED_KINDS = INVENTORY_KINDS
BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "0", "1")
_WARNED: set[str] = set()


class NMXError(PartialFailure):
    """NMX-M answered, but not with what was asked (exit 3: earlier steps may have applied)."""

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None):
        super().__init__(message, hint)
        self.status = status


class NMXUnavailable(NMXError):
    """NMX-M could not be reached or kept failing (5xx) after retries."""


class NMXNotFound(NMXError):
    """404: the partition or operation does not exist (any more)."""


class NMXConflict(NMXError):
    """409: overlapping members, mixed member kinds, or a duplicate name."""


class NMXOperationFailed(NMXError):
    """An asynchronous operation ended failed or cancelled, or did not end in time."""


class NMXAuthError(UsageError):
    """401 (or 403 on a read): the credentials file does not hold working credentials (nothing changed)."""


class NMXReadOnly(NMXAuthError):
    """403 on a write: the user is NMX-M's read-only user (`ro-user`); nothing changed."""


class NMXForeignOrigin(NMXError):
    """NMX-M pointed mctl (redirect or operation Location) at another scheme, host or port."""


class _Deadline(Exception):
    """The watchdog shut the connection: the whole exchange took longer than timeout_s."""


class _Transient(Exception):
    def __init__(self, text: str, status: int | None = None):
        super().__init__(text)
        self.status = status


# ------------------------------------------------------------------ credentials

class NMXCredentials(BasicCredentials):
    """HTTP Basic credentials for NMX-M (mctl.transport.credentials)."""


def load_credentials(path: str | Path) -> NMXCredentials:
    """Read `username:password` from *path*, refusing a file others could read."""
    return read_credentials(path, "NMX-M", NMXCredentials)


# ----------------------------------------------------------------------- client

@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    backoff_s: float = 0.5          # first wait; doubles per attempt
    max_backoff_s: float = 5.0
    timeout_s: float = 15.0         # per HTTP request: each read, and the whole answer
    operation_deadline_s: float = 300.0
    poll_s: float = 0.5             # first poll interval; grows by half per poll
    max_poll_s: float = 5.0
    call_deadline_s: float = 60.0   # one call with all its retries
    page_size: int = 100            # items asked per page of a list endpoint
    max_pages: int = 1000           # a list longer than page_size * max_pages is refused


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _default_warn(message: str) -> None:
    sys.stderr.write(f"mctl: warning: {message}\n")


class NMXClient:
    """One NMX-M endpoint. Methods return model objects; partition changes wait for their operation."""

    def __init__(self, url: str, credentials: NMXCredentials, *, verify_tls: bool | str = True,
                 policy: RetryPolicy | None = None, base_path: str | None = None, allow_http: bool = False,
                 warn: Callable[[str], None] | None = None):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"NMX-M URL {url!r} is not an http(s) URL", hint="e.g. https://10.20.0.5")
        if parts.username or parts.password:
            raise UsageError("the NMX-M URL must not carry credentials",
                             hint="put 'username:password' in the rack's nmx.credentials_file")
        try:
            parts.port
        except ValueError:
            raise UsageError(f"NMX-M URL {url!r} has a bad port", hint="e.g. https://10.20.0.5:443") from None
        if parts.scheme == "http" and not allow_http and not is_loopback(parts.hostname):
            raise UsageError(f"NMX-M URL {url!r} is plain http:// on a routed address: the credentials would "
                             "cross the network in clear",
                             hint="use https:// (NMX-M serves HTTPS), or set nmx.allow_http: true for this rack")
        if isinstance(verify_tls, str) and verify_tls.strip().lower() in BOOL_WORDS:
            raise UsageError(f"nmx.verify_tls is the string {verify_tls!r}, not a boolean or a CA bundle path",
                             hint="write verify_tls: false (without quotes) to turn verification off, "
                                  "or give the CA bundle's path")
        if not isinstance(verify_tls, (bool, str)):
            raise UsageError(f"nmx.verify_tls must be true, false or a CA bundle path, not {verify_tls!r}")
        path = base_path if base_path is not None else (parts.path.rstrip("/") or DEFAULT_BASE_PATH)
        self.root = f"{parts.scheme}://{parts.netloc}"
        self.origin = _origin(self.root)
        self.base_path = "/" + path.strip("/")
        self.url = self.root + self.base_path
        self._credentials = credentials
        self.policy = policy or RetryPolicy()
        self._warn = warn or _default_warn
        self._context = None
        if parts.scheme == "https":
            if verify_tls is False:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                if self.root not in _WARNED:
                    _WARNED.add(self.root)
                    self._warn(f"TLS verification of NMX-M at {self.root} is off (nmx.verify_tls: false): "
                               "anyone on the path can read the NMX-M credentials")
            elif isinstance(verify_tls, str):
                ca = Path(verify_tls).expanduser()
                if not ca.is_file():
                    raise UsageError(f"nmx.verify_tls: CA bundle {ca} does not exist or is not a file",
                                     hint="give the path of the PEM file that signed NMX-M's certificate")
                try:
                    ctx = ssl.create_default_context(cafile=str(ca))
                except (ssl.SSLError, OSError) as exc:
                    raise UsageError(f"nmx.verify_tls: cannot load CA bundle {ca}: {exc}",
                                     hint="it must be a PEM file of CA certificates") from None
            else:
                ctx = ssl.create_default_context()
            self._context = ctx

    def __repr__(self) -> str:
        return f"NMXClient({self.url!r}, user={self._credentials.username!r})"

    @classmethod
    def for_rack(cls, site: "Site", rack: "Rack", policy: RetryPolicy | None = None) -> "NMXClient":
        if rack.nmx is None:
            raise UsageError(f"rack {rack.name} has no NMX-Manager endpoint",
                             hint=f"add racks.{rack.name}.nmx with url and credentials_file to the inventory")
        cred = Path(rack.nmx.credentials_file).expanduser()
        if not cred.is_absolute():
            cred = site.root / cred
        verify = rack.nmx.verify_tls
        if isinstance(verify, str) and verify.strip().lower() not in BOOL_WORDS \
                and not Path(verify).expanduser().is_absolute():
            verify = str(site.root / verify)
        return cls(rack.nmx.url, load_credentials(cred), verify_tls=verify, policy=policy,
                   allow_http=bool(getattr(rack.nmx, "allow_http", False)))

    # ---- transport

    def _resolve(self, target: str) -> str:
        """An absolute URL on this client's origin for *target*; another origin is refused."""
        url = urllib.parse.urljoin(self.root + "/", target)
        if _origin(url) != self.origin:
            raise NMXForeignOrigin(
                f"NMX-M at {self.root} pointed mctl at {_safe_url(url)}, another scheme, host or port; "
                "mctl does not send the NMX-M credentials there",
                hint="set racks.<rack>.nmx.url to the address NMX-M itself answers on (the one it redirects to, "
                     "if that is really NMX-M)")
        return url

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        scheme, host, port = self.origin
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _exchange(self, method: str, url: str, data: bytes | None) -> tuple[int, str, dict[str, str], bytes]:
        """One HTTP exchange on a fresh connection, all of it (connect, send, headers, body) within timeout_s.

        http.client, not urllib: it follows no redirect and uses no proxy from the environment,
        so the Authorization header only ever goes to this client's own origin. A watchdog
        shuts the socket at the deadline, so a server that drips its answer cannot hold a call.
        """
        timeout = self.policy.timeout_s
        parts = urllib.parse.urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Authorization": self._credentials.header(), "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn = self._connection(timeout)
        expired = threading.Event()

        def abort() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(timeout, abort)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = _read(resp, url)
            if expired.is_set():        # the shut socket read as an early end: the answer is cut, not whole
                raise _Deadline(f"no whole answer from {_path(url)} in {timeout:g} s")
            return resp.status, resp.reason, dict(resp.getheaders()), raw
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() and not isinstance(exc, ssl.SSLCertVerificationError):
                raise _Deadline(f"no whole answer from {_path(url)} in {timeout:g} s") from None
            raise
        finally:
            watchdog.cancel()
            conn.close()

    def _once(self, method: str, target: str, body: Any) -> tuple[int, dict[str, str], Any]:
        url = self._resolve(target)
        data = None if body is None else json.dumps(body).encode()
        for _hop in range(4):                   # same-origin redirects of a GET, at most 3
            try:
                status, reason, headers, raw = self._exchange(method, url, data)
            except ssl.SSLCertVerificationError as exc:
                raise UsageError(f"TLS verification of NMX-M at {self.root} failed: {exc.verify_message}",
                                 hint="set nmx.verify_tls to the CA bundle path (or false for a lab)") from None
            except (socket.timeout, TimeoutError, _Deadline) as exc:
                if method != "GET":
                    raise self._write_timeout(method, url) from None
                raise _Transient(str(exc) if isinstance(exc, _Deadline) else
                                 f"no answer from {_path(url)} in {self.policy.timeout_s:g} s") from None
            except http.client.HTTPException as exc:       # a reply cut short or garbled on the wire
                raise _Transient(f"{exc.__class__.__name__}: {exc}") from None
            except OSError as exc:                          # refused, reset, unreachable, no such name
                raise _Transient(exc.strerror or str(exc) or exc.__class__.__name__) from None
            payload = _decode(raw)
            if 300 <= status < 400:
                location = _header(headers, "Location")
                if not location:
                    return status, headers, payload
                here = url
                url = self._resolve(urllib.parse.urljoin(url, location))    # raises for another origin
                if method != "GET":
                    raise NMXError(f"NMX-M answered {method} {_path(here)} with a redirect (HTTP {status}) to "
                                   f"{_path(url)}; mctl does not repeat a change at another address",
                                   hint="set racks.<rack>.nmx.url to the address NMX-M answers on", status=status)
                continue
            if status >= 500:
                raise _Transient(f"HTTP {status} {_message(payload) or reason}", status)
            return status, headers, payload
        raise NMXError(f"NMX-M redirected GET {_path(target)} more than 3 times", hint="check racks.<rack>.nmx.url")

    def _write_timeout(self, method: str, url: str) -> NMXUnavailable:
        return NMXUnavailable(f"NMX-M at {self.url} did not answer {method} {_path(url)} in "
                              f"{self.policy.timeout_s:g} s; the change may or may not have been accepted",
                              hint="run 'mctl partition list' to see NMX-M's state, then apply again")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        """One call with retries on transient trouble; 4xx come back to the caller, 401/403 raise."""
        # Relative paths hang off the base path; absolute ones (a Location header) off the host.
        target = path if path.startswith(("http://", "https://", "/")) else self.base_path + "/" + path
        p = self.policy
        try:
            for attempt in Retrying(stop=stop_after_attempt(max(1, p.attempts)) | stop_after_delay(p.call_deadline_s),
                                    wait=wait_exponential(multiplier=p.backoff_s, min=p.backoff_s,
                                                          max=p.max_backoff_s),
                                    retry=retry_if_exception_type(_Transient), reraise=False):
                with attempt:
                    status, headers, payload = self._once(method, target, body)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            tries = exc.last_attempt.attempt_number
            raise NMXUnavailable(f"NMX-M at {self.url} is unavailable: {method} {_path(target)} failed "
                                 f"{tries} times, last with {last}",
                                 hint="check the NMX-M service and racks.<rack>.nmx.url; nothing further was changed",
                                 status=getattr(last, "status", None)) from None
        if status == 401:
            raise NMXAuthError(f"NMX-M at {self.url} refused the credentials (HTTP 401)",
                               hint="check the username:password line in the rack's nmx.credentials_file")
        if status == 403:
            user = self._credentials.username
            if method != "GET":
                raise NMXReadOnly(f"NMX-M at {self.url} refused {method} {_path(target)} for user {user!r}: "
                                  f"this user is read-only (HTTP 403{_colon(_message(payload))})",
                                  hint="changes need NMX-M's read-write user (rw-user): put its "
                                       "username:password in the rack's nmx.credentials_file; nothing was changed")
            raise NMXAuthError(f"NMX-M at {self.url} does not let user {user!r} read {_path(target)} (HTTP 403)",
                               hint="use NMX-M's ro-user or rw-user in the rack's nmx.credentials_file")
        return status, headers, payload

    def _get(self, path: str) -> Any:
        status, _, payload = self.request("GET", path)
        if status == 404:
            raise NMXNotFound(f"NMX-M has no {path.split('?')[0].strip('/')} ({_message(payload) or 'HTTP 404'})",
                              status=404)
        if status != 200:
            raise NMXError(f"GET {path} on NMX-M failed: HTTP {status} {_message(payload)}", status=status)
        return payload

    def _list(self, kind: str) -> list[dict[str, Any]]:
        """Every item of a list endpoint, page by page (`offset`, `limit`) for the paged ones."""
        if kind not in PAGED_KINDS:
            return _items(self._get(kind), kind)
        limit = max(1, self.policy.page_size)
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        offset = 0
        for _page in range(max(1, self.policy.max_pages)):
            items = _items(self._get(f"{kind}?offset={offset}&limit={limit}"), kind)
            if offset == 0 and len(items) > limit:      # NMX-M ignored the paging: this is the whole list
                return items
            fresh = [i for i in items if _key(i) not in seen]
            seen.update(_key(i) for i in fresh)
            out += fresh
            if len(items) < limit or not fresh:
                return out
            offset += len(items)
        raise NMXError(f"NMX-M lists more than {self.policy.max_pages} pages of {limit} {kind}; mctl stopped there",
                       hint="raise the page size, or check that NMX-M honours offset")

    # ---- inventory

    def compute_nodes(self) -> list[NmxComputeNode]:
        return [NmxComputeNode.from_nmx(d) for d in self._list("compute-nodes")]

    def gpus(self) -> list[NmxGpu]:
        return [NmxGpu.from_nmx(d) for d in self._list("gpus")]

    def switch_side(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """The raw switch-nodes, switches and ports lists (each paged); mctl.fabric.switchside parses and maps them."""
        return self._list("switch-nodes"), self._list("switches"), self._list("ports")

    def inventory(self, kind: str) -> list[dict[str, Any]]:
        if kind not in INVENTORY_KINDS:
            raise UsageError(f"unknown NMX-M inventory {kind!r}", hint=f"one of {', '.join(INVENTORY_KINDS)}")
        return self._list(kind)

    def count(self, kind: str) -> int:
        if kind not in INVENTORY_KINDS:        # the spec has no partitions/count or operations/count
            raise UsageError(f"unknown NMX-M inventory {kind!r}", hint=f"one of {', '.join(INVENTORY_KINDS)}")
        payload = self._get(f"{kind}/count")
        total = payload.get("total") if isinstance(payload, dict) else None
        if isinstance(total, bool) or not isinstance(total, int):
            raise NMXError(f"NMX-M answered {kind}/count with {str(payload)[:200]!r}, not {{\"total\": N}}")
        return total

    # ---- partitions

    def partitions(self) -> list[NmxPartition]:
        return [NmxPartition.from_nmx(d) for d in self._list("partitions")]

    def partition(self, ident: str | int) -> NmxPartition:
        payload = self._get(f"partitions/{urllib.parse.quote(str(ident), safe='')}")
        if not isinstance(payload, dict):
            raise NMXError(f"NMX-M answered partition {ident} with {type(payload).__name__}, not an object")
        return NmxPartition.from_nmx(payload)

    def partition_named(self, name: str) -> NmxPartition | None:
        return next((p for p in self.partitions() if p.name == name), None)

    def create_partition(self, name: str, members: list[Any], *, wait: bool = True) -> NmxPartition | NmxOperation:
        """POST a partition (GPU IDs or location dicts), wait for it, return it as NMX-M holds it."""
        op = self._accepted("POST", "partitions", {"Name": name, "Members": members}, f"create partition {name!r}")
        if not wait:
            return op
        self.wait(op, what=f"create partition {name!r}")
        created = self.partition_named(name)
        if created is None:
            raise NMXOperationFailed(f"NMX-M reported creating partition {name!r} done, but does not list it")
        return created

    def replace_members(self, ident: str | int, members: list[Any], *, name: str | None = None,
                        wait: bool = True) -> NmxOperation:
        """PUT the full member list. The body holds `Members` only (UpdatePartitionRequest); *name* is for messages."""
        what = f"update partition {name or ident!r}"
        op = self._accepted("PUT", f"partitions/{urllib.parse.quote(str(ident), safe='')}", {"Members": members},
                            what)
        return self.wait(op, what=what) if wait else op

    def delete_partition(self, ident: str | int, *, name: str | None = None, wait: bool = True) -> NmxOperation:
        what = f"delete partition {name or ident!r}"
        op = self._accepted("DELETE", f"partitions/{urllib.parse.quote(str(ident), safe='')}", None, what)
        return self.wait(op, what=what) if wait else op

    def _accepted(self, method: str, path: str, body: Any, what: str) -> NmxOperation:
        status, headers, payload = self.request(method, path, body)
        if status == 409:
            raise NMXConflict(f"NMX-M refused to {what}: {_message(payload) or 'conflict (HTTP 409)'}",
                              hint="another partition holds some of these GPUs, or the member kind differs; "
                                   "'mctl partition list' shows NMX-M's partitions", status=409)
        if status == 404:
            raise NMXNotFound(f"NMX-M cannot {what}: {_message(payload) or 'not found (HTTP 404)'}", status=404)
        if status not in (200, 201, 202):
            raise NMXError(f"NMX-M refused to {what}: HTTP {status} {_message(payload)}", status=status)
        op_id = ""
        if isinstance(payload, dict):
            op_id = str(payload.get("operationId") or payload.get("OperationID") or payload.get("ID") or "")
        location = _header(headers, "Location")
        if location:
            try:
                self._resolve(location)
            except NMXForeignOrigin as exc:
                exc.message = (f"NMX-M accepted the request to {what}, but {exc.message}; "
                               "the change may still be applied")
                exc.hint = "check 'mctl partition list' (it asks the configured address), and fix nmx.url"
                raise
        if status != 202 and not op_id:
            return NmxOperation(id="", status="completed")
        if not op_id and not location:
            raise NMXError(f"NMX-M accepted the request to {what} but named no operation to follow")
        return NmxOperation(id=op_id or location.rstrip("/").rsplit("/", 1)[-1], status="pending",
                            location=location or None)

    # ---- operations

    def operation(self, op_id: str, location: str | None = None) -> NmxOperation:
        path = location or f"operations/{urllib.parse.quote(op_id, safe='')}"
        payload = self._get(path)
        if not isinstance(payload, dict):
            raise NMXError(f"NMX-M answered operation {op_id} with {type(payload).__name__}, not an object")
        return NmxOperation.from_nmx(payload)

    def operations(self) -> list[NmxOperation]:
        return [NmxOperation.from_nmx(d) for d in self._list("operations")]

    def cancel_operation(self, op_id: str) -> NmxOperation:
        """DELETE /operations/{id}: ask NMX-M to cancel; returns the cancel request's own operation (202)."""
        status, headers, payload = self.request("DELETE", f"operations/{urllib.parse.quote(op_id, safe='')}")
        if status == 404:
            raise NMXNotFound(f"NMX-M has no operation {op_id} ({_message(payload) or 'HTTP 404'})", status=404)
        if status == 409:
            raise NMXConflict(f"NMX-M cannot cancel operation {op_id}: {_message(payload) or 'conflict (HTTP 409)'}",
                              hint="only an operation whose Request.Cancellable is true and that has not ended can "
                                   "be cancelled", status=409)
        if status not in (200, 202):
            raise NMXError(f"NMX-M refused to cancel operation {op_id}: HTTP {status} {_message(payload)}",
                           status=status)
        op_id2 = str(payload.get("operationId") or "") if isinstance(payload, dict) else ""
        return NmxOperation(id=op_id2, status="pending" if op_id2 else "completed",
                            location=_header(headers, "Location") or None)

    def wait(self, op: NmxOperation, *, what: str | None = None, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> NmxOperation:
        """Poll an operation to completed, with growing intervals, until the deadline."""
        if op.terminal and not op.id:
            return op
        location = op.location
        p = self.policy
        deadline = clock() + p.operation_deadline_s
        interval = p.poll_s
        label = f"NMX-M operation {op.id}" + (f" ({what})" if what else "")
        while True:
            current = self.operation(op.id, location)
            if current.status == "completed":
                return current
            if current.status == "failed":
                raise NMXOperationFailed(f"{label} failed: {current.reason or 'NMX-M gave no reason'}",
                                         hint="'mctl partition list' shows what NMX-M holds now; fix and apply again")
            if current.status == "cancelled":
                raise NMXOperationFailed(f"{label} was cancelled{': ' + current.reason if current.reason else ''}",
                                         hint="someone cancelled it on NMX-M (DELETE /operations/{id}); "
                                              "'mctl partition list' shows what NMX-M holds now")
            if clock() + interval > deadline:
                step = f", at {current.current_step!r}" if current.current_step else ""
                pct = f" ({current.percentage:g} %)" if current.percentage is not None else ""
                raise NMXOperationFailed(f"{label} still {current.status or 'unknown'}{pct}{step} after "
                                         f"{p.operation_deadline_s:g} s",
                                         hint="the change may still complete; check 'mctl partition list' later")
            sleep(interval)
            interval = min(interval * 1.5, p.max_poll_s)


def _colon(text: str) -> str:
    return f": {text}" if text else ""


def _read(resp: Any, url: str, limit: int = 64 << 20) -> bytes:
    """The whole body (the caller's watchdog bounds the time); a body over *limit* is refused."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise _Transient(f"the answer from {_path(url)} is larger than {limit >> 20} MiB")


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500]


def _message(payload: Any) -> str:
    """The reason in an error body: NMX-M's Error (`description`, `customErrorCode`) or Kong's `message`."""
    if isinstance(payload, dict):
        desc = payload.get("description")
        code = payload.get("customErrorCode")
        if desc or code:
            return f"{desc or ''}{' (' + str(code) + ')' if code and desc else code or ''}"
        for key in ("message", "Message", "error", "Error", "detail", "Detail"):
            value = payload.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("Message")
            if value:
                return str(value)
        return ""
    return str(payload or "")[:300]


def _items(payload: Any, kind: str = "list") -> list[dict[str, Any]]:
    if isinstance(payload, list):
        return [d for d in payload if isinstance(d, dict)]
    if isinstance(payload, dict):
        for key in ("items", "Items", "data", "Data", "results"):
            if isinstance(payload.get(key), list):
                return [d for d in payload[key] if isinstance(d, dict)]
    raise NMXError(f"NMX-M answered {kind} with {type(payload).__name__}, not a list")


def _key(item: dict[str, Any]) -> str:
    ident = item.get("ID")
    return f"id:{ident}" if ident else "json:" + json.dumps(item, sort_keys=True, default=str)


def _header(headers: dict[str, str], name: str) -> str:
    for k, v in headers.items():
        if k.lower() == name.lower():
            return v
    return ""


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path or url


def _safe_url(url: str) -> str:
    """scheme://host:port/path of *url*, without any user info or query (for messages)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
