"""NMX-Manager REST client (stdlib urllib; tenacity for retries).

NMX-M fronts the NVLink switch trays of one or more NVLink domains. Partition
changes are asynchronous: 202 + an operation to poll. Transient trouble (5xx,
refused or reset connections, timeouts on reads) is retried with backoff, then
surfaced as NMXUnavailable (exit 3: the rack may be half way through a change).

Credentials: HTTP Basic, read from a file that holds one line
`username:password` (the password may itself contain ':'; blank lines and lines
starting with '#' are ignored). The file must not be readable by group or
others. The password never appears in a repr, an error or a log line.

Base path: the URL's path when it has one (`https://nmx/v1` for NetQ releases
that dropped the prefix), else `/nmx/v1`.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from mctl.errors import PartialFailure, UsageError
from mctl.model.fabric import NmxComputeNode, NmxGpu, NmxOperation, NmxPartition

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

DEFAULT_BASE_PATH = "/nmx/v1"
INVENTORY_KINDS = ("gpus", "compute-nodes", "switch-nodes", "ports", "chassis")


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
    """401/403: the credentials file does not hold working credentials (nothing changed)."""


class _Transient(Exception):
    def __init__(self, text: str, status: int | None = None):
        super().__init__(text)
        self.status = status


# ------------------------------------------------------------------ credentials

@dataclass(frozen=True)
class NMXCredentials:
    username: str
    password: str

    def __repr__(self) -> str:
        return f"NMXCredentials(username={self.username!r}, password='***')"

    __str__ = __repr__

    def header(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def load_credentials(path: str | Path) -> NMXCredentials:
    """Read `username:password` from *path*, refusing a file others could read."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UsageError(f"NMX-M credentials file {p} does not exist",
                         hint="create it with one line 'username:password' and 'chmod 600' it") from None
    except OSError as exc:
        raise UsageError(f"cannot read NMX-M credentials file {p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"NMX-M credentials file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise UsageError(f"NMX-M credentials file {p} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
                         hint=f"chmod 600 {p}")
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read NMX-M credentials file {p}: {exc.strerror}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) != 1 or ":" not in lines[0] or not lines[0].split(":", 1)[0]:
        raise UsageError(f"NMX-M credentials file {p} must hold exactly one line 'username:password'",
                         hint="blank lines and lines starting with '#' are ignored")
    user, password = lines[0].split(":", 1)
    return NMXCredentials(user, password)


# ----------------------------------------------------------------------- client

@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    backoff_s: float = 0.5          # first wait; doubles per attempt
    max_backoff_s: float = 5.0
    timeout_s: float = 15.0         # per HTTP request
    operation_deadline_s: float = 300.0
    poll_s: float = 0.5             # first poll interval; grows by half per poll
    max_poll_s: float = 5.0


class NMXClient:
    """One NMX-M endpoint. Methods return model objects; partition changes wait for their operation."""

    def __init__(self, url: str, credentials: NMXCredentials, *, verify_tls: bool | str = True,
                 policy: RetryPolicy | None = None, base_path: str | None = None):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"NMX-M URL {url!r} is not an http(s) URL", hint="e.g. https://10.20.0.5")
        if parts.username or parts.password:
            raise UsageError("the NMX-M URL must not carry credentials",
                             hint="put 'username:password' in the rack's nmx.credentials_file")
        path = base_path if base_path is not None else (parts.path.rstrip("/") or DEFAULT_BASE_PATH)
        self.root = f"{parts.scheme}://{parts.netloc}"
        self.base_path = "/" + path.strip("/")
        self.url = self.root + self.base_path
        self._credentials = credentials
        self.policy = policy or RetryPolicy()
        self._context = None
        if parts.scheme == "https":
            if verify_tls is False:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif isinstance(verify_tls, str):
                ctx = ssl.create_default_context(cafile=verify_tls)
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
        if isinstance(verify, str) and not Path(verify).expanduser().is_absolute():
            verify = str(site.root / verify)
        return cls(rack.nmx.url, load_credentials(cred), verify_tls=verify, policy=policy)

    # ---- transport

    def _once(self, method: str, target: str, body: Any) -> tuple[int, dict[str, str], Any]:
        url = target if target.startswith(("http://", "https://")) else self.root + target
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", self._credentials.header())
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.policy.timeout_s, context=self._context) as resp:
                return resp.status, dict(resp.headers.items()), _decode(resp.read())
        except urllib.error.HTTPError as exc:
            payload = _decode(exc.read())
            if exc.code >= 500:
                raise _Transient(f"HTTP {exc.code} {_message(payload) or exc.reason}", exc.code) from None
            return exc.code, dict(exc.headers.items()) if exc.headers else {}, payload
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise UsageError(f"TLS verification of NMX-M at {self.root} failed: {reason.verify_message}",
                                 hint="set nmx.verify_tls to the CA bundle path (or false for a lab)") from None
            if isinstance(reason, (socket.timeout, TimeoutError)) and method != "GET":
                raise NMXUnavailable(f"NMX-M at {self.url} did not answer {method} {_path(url)} in "
                                     f"{self.policy.timeout_s:g} s; the change may or may not have been accepted",
                                     hint="run 'mctl partition list' to see NMX-M's state, then apply again") from None
            raise _Transient(f"{getattr(reason, 'strerror', None) or reason}") from None
        except http.client.HTTPException as exc:       # a reply cut short or garbled on the wire
            raise _Transient(f"{exc.__class__.__name__}: {exc}") from None
        except (ConnectionError, socket.timeout, TimeoutError) as exc:
            if method != "GET" and isinstance(exc, (socket.timeout, TimeoutError)):
                raise NMXUnavailable(f"NMX-M at {self.url} did not answer {method} {_path(url)} in "
                                     f"{self.policy.timeout_s:g} s; the change may or may not have been accepted",
                                     hint="run 'mctl partition list' to see NMX-M's state, then apply again") from None
            raise _Transient(str(exc) or exc.__class__.__name__) from None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        """One call with retries on transient trouble; 4xx come back to the caller, 401/403 raise."""
        # Relative paths hang off the base path; absolute ones (a Location header) off the host.
        target = path if path.startswith(("http://", "https://", "/")) else self.base_path + "/" + path
        p = self.policy
        try:
            for attempt in Retrying(stop=stop_after_attempt(max(1, p.attempts)),
                                    wait=wait_exponential(multiplier=p.backoff_s, min=p.backoff_s,
                                                          max=p.max_backoff_s),
                                    retry=retry_if_exception_type(_Transient), reraise=False):
                with attempt:
                    status, headers, payload = self._once(method, target, body)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise NMXUnavailable(f"NMX-M at {self.url} is unavailable: {method} {_path(target)} failed "
                                 f"{p.attempts} times, last with {last}",
                                 hint="check the NMX-M service and racks.<rack>.nmx.url; nothing further was changed",
                                 status=getattr(last, "status", None)) from None
        if status in (401, 403):
            raise NMXAuthError(f"NMX-M at {self.url} refused the credentials (HTTP {status})",
                               hint="check the username:password line in the rack's nmx.credentials_file")
        return status, headers, payload

    def _get(self, path: str) -> Any:
        status, _, payload = self.request("GET", path)
        if status == 404:
            raise NMXNotFound(f"NMX-M has no {path.strip('/')} ({_message(payload) or 'HTTP 404'})", status=404)
        if status != 200:
            raise NMXError(f"GET {path} on NMX-M failed: HTTP {status} {_message(payload)}", status=status)
        return payload

    # ---- inventory

    def compute_nodes(self) -> list[NmxComputeNode]:
        return [NmxComputeNode.from_nmx(d) for d in _items(self._get("compute-nodes"))]

    def gpus(self) -> list[NmxGpu]:
        return [NmxGpu.from_nmx(d) for d in _items(self._get("gpus"))]

    def inventory(self, kind: str) -> list[dict[str, Any]]:
        if kind not in INVENTORY_KINDS:
            raise UsageError(f"unknown NMX-M inventory {kind!r}", hint=f"one of {', '.join(INVENTORY_KINDS)}")
        return list(_items(self._get(kind)))

    def count(self, kind: str) -> int:
        if kind not in INVENTORY_KINDS + ("partitions",):
            raise UsageError(f"unknown NMX-M inventory {kind!r}", hint=f"one of {', '.join(INVENTORY_KINDS)}")
        payload = self._get(f"{kind}/count")
        if isinstance(payload, dict):
            payload = payload.get("Count", payload.get("count"))
        try:
            return int(payload)
        except (TypeError, ValueError):
            raise NMXError(f"NMX-M answered {kind}/count with {payload!r}, not a number") from None

    # ---- partitions

    def partitions(self) -> list[NmxPartition]:
        return [NmxPartition.from_nmx(d) for d in _items(self._get("partitions"))]

    def partition(self, ident: str | int) -> NmxPartition:
        return NmxPartition.from_nmx(self._get(f"partitions/{urllib.parse.quote(str(ident), safe='')}"))

    def partition_named(self, name: str) -> NmxPartition | None:
        return next((p for p in self.partitions() if p.name == name), None)

    def create_partition(self, name: str, members: list[Any], *, wait: bool = True) -> NmxPartition | NmxOperation:
        """POST a partition (GPU IDs or location dicts), wait for it, return it as NMX-M holds it."""
        op = self._accepted("POST", "partitions", {"Name": name, "Members": members}, f"create partition {name!r}")
        if not wait:
            return op
        self.wait(op)
        created = self.partition_named(name)
        if created is None:
            raise NMXOperationFailed(f"NMX-M reported creating partition {name!r} done, but does not list it")
        return created

    def replace_members(self, ident: str | int, members: list[Any], *, name: str | None = None,
                        wait: bool = True) -> NmxOperation:
        """PUT the full member list (the name cannot change)."""
        body: dict[str, Any] = {"Members": members}
        if name is not None:
            body["Name"] = name
        op = self._accepted("PUT", f"partitions/{urllib.parse.quote(str(ident), safe='')}", body,
                            f"update partition {name or ident!r}")
        return self.wait(op) if wait else op

    def delete_partition(self, ident: str | int, *, name: str | None = None, wait: bool = True) -> NmxOperation:
        op = self._accepted("DELETE", f"partitions/{urllib.parse.quote(str(ident), safe='')}", None,
                            f"delete partition {name or ident!r}")
        return self.wait(op) if wait else op

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
        if status != 202 and not op_id:
            return NmxOperation(id="", status="completed")
        if not op_id and not location:
            raise NMXError(f"NMX-M accepted the request to {what} but named no operation to follow")
        return NmxOperation(id=op_id or location.rstrip("/").rsplit("/", 1)[-1], status="pending",
                            location=location or None)

    def operation(self, op_id: str, location: str | None = None) -> NmxOperation:
        path = location or f"operations/{urllib.parse.quote(op_id, safe='')}"
        return NmxOperation.from_nmx(self._get(path) or {})

    def wait(self, op: NmxOperation, *, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> NmxOperation:
        """Poll an operation to completed, with growing intervals, until the deadline."""
        if op.terminal and not op.id:
            return op
        location = op.location
        p = self.policy
        deadline = clock() + p.operation_deadline_s
        interval = p.poll_s
        while True:
            current = self.operation(op.id, location)
            if current.status == "completed":
                return current
            if current.status in ("failed", "cancelled"):
                raise NMXOperationFailed(f"NMX-M operation {op.id} {current.status}"
                                         f"{': ' + current.error if current.error else ''}",
                                         hint="'mctl partition list' shows what NMX-M holds now; fix and apply again")
            if clock() + interval > deadline:
                raise NMXOperationFailed(f"NMX-M operation {op.id} still {current.status or 'unknown'} after "
                                         f"{p.operation_deadline_s:g} s",
                                         hint="the change may still complete; check 'mctl partition list' later")
            sleep(interval)
            interval = min(interval * 1.5, p.max_poll_s)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500]


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        for key in ("message", "Message", "error", "Error", "detail", "Detail"):
            value = payload.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("Message")
            if value:
                return str(value)
        return ""
    return str(payload or "")[:300]


def _items(payload: Any) -> list[dict[str, Any]]:
    if isinstance(payload, list):
        return [d for d in payload if isinstance(d, dict)]
    if isinstance(payload, dict):
        for key in ("items", "Items", "data", "Data", "results"):
            if isinstance(payload.get(key), list):
                return [d for d in payload[key] if isinstance(d, dict)]
    raise NMXError(f"NMX-M answered with {type(payload).__name__}, not a list")


def _header(headers: dict[str, str], name: str) -> str:
    for k, v in headers.items():
        if k.lower() == name.lower():
            return v
    return ""


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path or url
