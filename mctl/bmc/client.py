"""A Redfish client for one tray's BMC (GET, and actions POSTed once), on DMTF's `redfish` library.

The library (python-redfish-library, `redfish.rest.v1`) does the HTTP; this
module fixes the library defaults that do not fit a datacenter tool
(docs/decisions.md, D19):

- Retries: the library retries any request, POST included, `max_retry` times
  (default 10, 1 s apart). Here `max_retry=0`: every request is sent once; a
  reading that fails is reported, never silently re-sent.
- TLS: the library verifies nothing unless it is given a CA file. Here a CA file
  is always given: the inventory's `bmc.verify_tls` path, or the system bundle
  when `verify_tls: true`. `verify_tls: false` warns once per run.
- Deadlines: the library's `timeout` bounds each connect and each read, not a
  whole answer. Every request here gets `min(timeout_s, time left)` and the
  whole tray has a deadline (`deadline_s`) that mctl.bmc.inventory enforces from
  outside the worker thread, so one slow BMC cannot hold the run.
- Origins: paths come from `@odata.id` and are only ever joined to this BMC's
  own base URL; an absolute URL, a `//host` path or anything outside
  `/redfish/v1` is refused. Redirects are not followed by the library
  (`max_redirects=0` on its requests session): a same-origin redirect of a GET is
  followed here (at most 3), one to another scheme, host or port is refused and
  the credentials are not sent there. Environment proxies and ~/.netrc are off
  (`trust_env=False`).
- One connection per BMC, kept: every client mounts mctl's own adapter, whose pool holds one
  connection per BMC and reuses it across requests while the BMC keeps it open (HTTP/1.1 keep-alive:
  one TLS handshake per connection, not per request), with one verifying SSL context per BMC (and CA
  file) for the process, so the CA file is read once, not at every connection as urllib3 does when
  it is given the file; a client that does not resume (the watch) shares one context per CA file with
  every other BMC's. The health watch keeps one client per BMC for days (mctl.health.oob). A GET
  sent on a kept connection that the BMC had already closed (it never read it: the connection is
  gone before any answer) is sent once more on a new connection, as HTTP allows for an idempotent
  request (RFC 9112, 9.3.1); nothing else is re-sent. The adapter counts the connections it opened
  (`connections`, `tls_handshakes`, `tls_resumed`) and can cut them from another thread (`abort`), so
  a BMC that trickles an answer past the deadline does not keep its worker.
- TLS session resumption: a new connection to a BMC offers the session of the previous one
  (`SSLContext.wrap_socket(session=...)`), so a BMC that closes every connection costs an
  abbreviated handshake per connection, not a full one (no certificate chain to verify again).
  Verification is the same context's (CERT_REQUIRED, host name checked); a BMC that declines
  resumption gets full handshakes, nothing else changes (docs/decisions.md, D47). Only one-shot
  commands resume (`resume_tls`): reading a socket's TLS session leaks native memory in this
  Python's ssl module, which a watch that runs for days must not pay (docs/bmc.md).
- Fewer round trips: where the service root says `ProtocolFeaturesSupported.ExpandQuery.Levels`
  (the real GB200 BMC: MaxLevels 6), a collection's members are read with one
  `$expand=.($levels=1)`; a member the answer leaves as a bare link or without a field mctl needs
  (AMI answers null fields under $expand) is read by its own GET.
- Credentials: HTTP Basic from a file of one line `username:password` that must
  not be readable by group or others; no session is created (a GB200 BMC allows
  few client connections and sessions outlive a crashed client). The password
  never appears in a repr, an error or a log line.

The `redfish` import is inside the constructor so `mctl --help` never pays for it.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import weakref
from pathlib import Path
from typing import Any, Callable

from mctl.errors import UsageError
from mctl.transport.credentials import BasicCredentials, origin as _origin, read_credentials

ROOT = "/redfish/v1"
# Switches for bench/bmc_bench.py (before/after in the same minutes); always on otherwise.
RESUME_TLS = True
USE_EXPAND = True
# A space or control character (C0, DEL): never in a path mctl sends credentials to. One regex, not a Python
# loop over the characters: check_path runs for every link the watch follows (a third of a leak read's CPU).
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "0", "1")


class BMCError(Exception):
    """One tray's BMC could not be read. `kind` names the class of trouble for reports."""

    def __init__(self, kind: str, message: str, *, status: int | None = None):
        super().__init__(message)
        self.kind = kind            # auth, timeout, unreachable, tls, http, malformed, origin
        self.message = message
        self.status = status


# ------------------------------------------------------------------ credentials

class BMCCredentials(BasicCredentials):
    """HTTP Basic credentials for BMC (mctl.transport.credentials)."""


def load_credentials(path: str | Path) -> BMCCredentials:
    """Read `username:password` from *path*, refusing a file others could read."""
    return read_credentials(path, "BMC", BMCCredentials)


def base_url(address: str, *, scheme: str = "https", port: int | None = None) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" + (f":{port}" if port and port != default else "")


def system_ca_file() -> str | None:
    """The system CA bundle the library is given for `verify_tls: true`."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return candidate
    try:
        import certifi
        return certifi.where()
    except ImportError:  # pragma: no cover - requests brings certifi
        return None


def check_path(path: str) -> str:
    """A Redfish path mctl may send credentials to: absolute, under /redfish/v1, on no other host."""
    if not isinstance(path, str) or not path:
        raise BMCError("malformed", f"a link is not a path: {path!r}")
    parts = urllib.parse.urlsplit(path)
    if parts.scheme or parts.netloc or path.startswith("//") or "\\" in path or _CONTROL.search(path):
        raise BMCError("origin", f"the BMC linked to {path!r}, which is not a path on this BMC; "
                                 "mctl does not send the BMC credentials there")
    clean = parts.path.rstrip("/") or "/"
    if clean != ROOT and not clean.startswith(ROOT + "/"):
        raise BMCError("origin", f"the BMC linked to {path!r}, outside {ROOT}")
    if "/../" in clean + "/" or "/./" in clean + "/":
        raise BMCError("malformed", f"the BMC linked to {path!r} (dot segments)")
    return clean


class RedfishClient:
    """Access to one BMC: `get(path)` returns the JSON object, `post_action(path, body)` sends an action
    once; both raise BMCError."""

    def __init__(self, url: str, credentials: BMCCredentials, *, verify_tls: bool | str = True,
                 timeout_s: float = 10.0, deadline: float | None = None,
                 warn: Callable[[str], None] | None = None, resume_tls: bool | None = None):
        import redfish                                   # heavy (requests): only when a BMC is read

        self.url = url.rstrip("/")
        self.origin = _origin(self.url)
        self.timeout_s = timeout_s
        self.deadline = deadline                         # time.monotonic() value, or None
        self.requests = 0
        if isinstance(verify_tls, str):
            ca = Path(verify_tls).expanduser()
            if not ca.is_file():
                raise UsageError(f"bmc.verify_tls: CA bundle {ca} does not exist or is not a file",
                                 hint="give the path of the CA that signed the BMC certificates")
            cafile: str | None = str(ca)
        elif verify_tls:
            cafile = system_ca_file()
            if cafile is None:
                raise UsageError("no system CA bundle found to verify the BMC certificates",
                                 hint="set bmc.verify_tls to the CA bundle path")
        else:
            cafile = None                                # the library then sends verify=False
            if self.origin[0] == "https":
                (warn or _default_warn)(f"TLS verification of the BMC at {self.url} is off (bmc.verify_tls: false)")
        self._credentials = credentials
        self.expand: str | None = None                   # the $expand value, once the root says it is supported
        self.connections = 0                             # TCP connections opened (bench, tests)
        self.tls_handshakes = 0                          # full TLS handshakes, and resumed ones (bench, tests)
        self.tls_resumed = 0
        self._sockets: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()
        self._sockets_lock = threading.Lock()
        # resume_tls False: the long-running watch (mctl.health.oob, the ladder) keeps its connections, and
        # reading a socket's TLS session leaks native memory in this Python's ssl module (~40 KiB a connection:
        # the 30-minute soak's watch grew by 110-160 MiB); one-shot commands (bmc inventory, power) resume.
        self._resume = bool(RESUME_TLS if resume_tls is None else resume_tls) and cafile is not None
        ctx = _context_for(cafile, tuple(self.origin), self._resume) if cafile is not None \
            and self.origin[0] == "https" else None
        self._client = redfish.redfish_client(base_url=self.url, cafile=cafile, timeout=timeout_s, max_retry=0,
                                              check_connectivity=False)
        session = self._client._session                  # the library's requests.Session
        adapter = _adapter(self, ctx)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        session.trust_env = False                        # no environment proxies, no ~/.netrc
        session.max_redirects = 0                        # the library never follows a redirect itself
        self._client.set_authorization_key(credentials.header())

    def _opened(self, sock) -> None:
        """A connection of this client's adapter was opened (its TLS handshake done, for https)."""
        self.connections += 1
        if isinstance(sock, ssl.SSLSocket):
            if self._resume and sock.session_reused:
                self.tls_resumed += 1
            else:
                self.tls_handshakes += 1
        with self._sockets_lock:
            self._sockets.add(sock)

    def abort(self) -> None:
        """Cut this client's connections now, from any thread: a worker blocked reading one gets an error at
        once (a BMC trickling an answer past the deadline). The client is not to be used after."""
        with self._sockets_lock:
            socks = list(self._sockets)
        for sock in socks:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)   # the fd itself: an SSL object is left alone
            except (OSError, ValueError):
                pass

    def __repr__(self) -> str:
        return f"RedfishClient({self.url!r}, user={self._credentials.username!r})"

    def close(self) -> None:
        try:
            self._client._session.close()
        except Exception:  # pragma: no cover - closing a dead session
            pass

    def _timeout(self) -> float:
        if self.deadline is None:
            return self.timeout_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BMCError("timeout", "the tray's deadline passed")
        return min(self.timeout_s, left)

    def get(self, path: str, *, query: dict[str, str] | None = None) -> dict[str, Any]:
        import requests
        from redfish.rest.v1 import RetriesExhaustedError

        target = check_path(path)
        resent = False
        for _hop in range(5):
            self.requests += 1
            opened = self.connections
            try:
                resp = self._client.get(target, args=query, timeout=self._timeout())
            except RetriesExhaustedError as exc:
                cause = exc.__cause__
                if isinstance(cause, requests.TooManyRedirects) and cause.response is not None:
                    target = self._redirect(target, cause.response.status_code,
                                            cause.response.headers.get("Location", ""))
                    continue
                if not resent and self.connections == opened and _closed_by_peer(cause):
                    resent = True               # a kept connection the BMC had closed: it never read the GET
                    continue
                raise _transport_error(cause, target) from None
            status = resp.status
            if status in (401, 403):
                raise BMCError("auth", f"the BMC refused the credentials (HTTP {status} on GET {target})",
                               status=status)
            if status >= 300:
                raise BMCError("http", f"GET {target} answered HTTP {status}{_message(resp.text)}", status=status)
            try:
                doc = json.loads(resp.text)
            except (ValueError, UnicodeDecodeError) as exc:
                raise BMCError("malformed", f"GET {target}: the answer is not JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise BMCError("malformed", f"GET {target}: the answer is a JSON {type(doc).__name__}, not an object")
            return doc
        raise BMCError("http", f"GET {path} was redirected more than 3 times")

    def post_action(self, path: str, body: dict[str, Any]) -> int:
        """POST an action, sent exactly once (no retry, no redirect followed: a reset is never re-sent).

        Returns the HTTP status (2xx); raises BMCError otherwise. A timeout says the action may have
        been applied: the caller reads the state, it does not send the action again."""
        return self._once("POST", path, body).status

    def create(self, path: str, body: dict[str, Any]) -> str:
        """POST a new member to a collection (an EventService subscription), sent once like an action; returns
        the new member's path, from the answer's Location header (else its @odata.id), checked as every link."""
        target = check_path(path)
        resp = self._once("POST", target, body)
        location = resp.getheader("Location") or ""
        if location:
            url = urllib.parse.urljoin(self.url + target, location)
            if _origin(url) != self.origin:
                raise BMCError("origin", f"POST {target}: the new member is at {location!r}, another origin")
            return check_path(urllib.parse.urlsplit(url).path)
        try:
            doc = json.loads(resp.text)
        except (ValueError, UnicodeDecodeError):
            doc = None
        return link(doc, f"POST {target}'s answer (no Location)")

    def delete(self, path: str) -> int:
        """DELETE a resource (a subscription mctl made), once; 404 (already gone) is an answer too."""
        try:
            return self._once("DELETE", path, None).status
        except BMCError as exc:
            if exc.status == 404:
                return 404
            raise

    def _once(self, method: str, path: str, body: dict[str, Any] | None):
        """One POST or DELETE, never re-sent, no redirect followed; the library's response (2xx), else BMCError."""
        import requests
        from redfish.rest.v1 import RetriesExhaustedError

        target = check_path(path)
        self.requests += 1
        try:
            if method == "POST":
                resp = self._client.post(target, body=body, timeout=self._timeout())
            else:
                resp = self._client.delete(target, timeout=self._timeout())
        except RetriesExhaustedError as exc:
            cause = exc.__cause__
            if isinstance(cause, requests.TooManyRedirects):
                raise BMCError("origin", f"{method} {target} was redirected; mctl does not follow a redirect "
                                         "of an action (it could run twice)") from None
            err = _transport_error(cause, target)
            if err.kind == "timeout":
                err.message = f"{method} {target} timed out: the action may have been applied; it is not sent again"
                err.args = (err.message,)
            raise err from None
        status = resp.status
        if status in (401, 403):
            raise BMCError("auth", f"the BMC refused the credentials (HTTP {status} on {method} {target})",
                           status=status)
        if not 200 <= status < 300:
            raise BMCError("http", f"{method} {target} answered HTTP {status}{_message(resp.text)}", status=status)
        return resp

    def _redirect(self, here: str, status: int, location: str) -> str:
        url = urllib.parse.urljoin(self.url + here, location)
        if not location or _origin(url) != self.origin:
            raise BMCError("origin", f"GET {here} was redirected (HTTP {status}) to {location or 'nowhere'!r}, "
                                     "another origin; mctl does not send the BMC credentials there")
        parts = urllib.parse.urlsplit(url)
        return check_path(parts.path + (f"?{parts.query}" if parts.query else ""))

    def members(self, path: str) -> list[str]:
        """The member paths of a collection."""
        doc = self.get(path)
        members = doc.get("Members")
        if not isinstance(members, list):
            raise BMCError("malformed", f"{path} is not a collection (no Members list)")
        return [link(m, f"{path} Members") for m in members]

    def use_expand(self, root: dict[str, Any]) -> None:
        """Read collections with $expand where the service root says the BMC supports it."""
        if not USE_EXPAND:
            return
        features = root.get("ProtocolFeaturesSupported")
        expand = features.get("ExpandQuery") if isinstance(features, dict) else None
        if not isinstance(expand, dict) or expand.get("Levels") is not True:
            return
        if expand.get("NoLinks") is True:
            self.expand = ".($levels=1)"
        elif expand.get("ExpandAll") is True:
            self.expand = "*($levels=1)"

    def member_docs(self, path: str, need: tuple[str, ...] = ("Id",)) -> list[tuple[str, dict[str, Any]]]:
        """(path, document) of every member of a collection: one $expand GET where the BMC supports it,
        a GET per member otherwise or for a member the expanded answer left incomplete."""
        if self.expand is None:
            return [(p, self.get(p)) for p in self.members(path)]
        doc = self.get(path, query={"$expand": self.expand})
        members = doc.get("Members")
        if not isinstance(members, list):
            raise BMCError("malformed", f"{path} is not a collection (no Members list)")
        out = []
        for m in members:
            p = link(m, f"{path} Members")
            whole = isinstance(m, dict) and len(m) > 1 and all(m.get(k) is not None for k in need)
            out.append((p, m if whole else self.get(p)))
        return out


class _ResumingSocket(ssl.SSLSocket):
    """Keeps the TLS session of its connection on its context, for the next connection to resume."""

    _kept = False

    def _keep(self) -> None:                     # TLS 1.3 tickets arrive after the handshake, with data
        if not self._kept:
            self._kept = True
            try:
                session = self.session
                if session is not None:
                    self.context.tls_session = session
            except (ValueError, OSError, AttributeError):
                pass

    def recv_into(self, *args, **kwargs):
        n = super().recv_into(*args, **kwargs)
        self._keep()
        return n

    def read(self, *args, **kwargs):
        data = super().read(*args, **kwargs)
        self._keep()
        return data


class _ResumingContext(ssl.SSLContext):
    """A verifying context whose last session is offered to the next connection it makes."""

    tls_session = None

    def wrap_socket(self, sock, *args, session=None, **kwargs):
        offered = session or self.tls_session
        if offered is not None and offered.id == b"" and not offered.has_ticket:
            offered = None                       # nothing to resume with
        return super().wrap_socket(sock, *args, session=offered, **kwargs)


# (CA file, origin or None, resume) -> its context, built once for the process. A client that does not resume
# (the watch, its power-off, the ladder) shares one context per CA file across every BMC: the CA file is read
# and its store built once, not once per BMC or per connection (docs/decisions.md, D113). A resuming
# client (one-shot commands) has one per BMC, since a context keeps the one session it offers next; bounded
# by the inventory's BMCs.
_CONTEXTS: dict[tuple[str, tuple | None, bool], ssl.SSLContext] = {}
_CONTEXTS_LOCK = threading.Lock()
CONTEXTS_BUILT = [0]                    # contexts built in this process (bench, tests)


def _context_for(cafile: str, origin: tuple, resume: bool) -> ssl.SSLContext:
    key = (cafile, origin if resume else None, resume)
    with _CONTEXTS_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            CONTEXTS_BUILT[0] += 1
            ctx = (_ResumingContext if resume else ssl.SSLContext)(ssl.PROTOCOL_TLS_CLIENT)   # CERT_REQUIRED,
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2                                       # host names checked
            ctx.load_verify_locations(cafile=cafile)
            if resume:
                ctx.sslsocket_class = _ResumingSocket
            _CONTEXTS[key] = ctx
        return ctx


def _adapter(owner: "RedfishClient", ctx: ssl.SSLContext | None):
    """The requests adapter of one client: a pool of one kept connection per BMC, made with the BMC's context
    (urllib3 would make a context and read the CA file per connection otherwise), each connection told to
    the client when opened (counted; cut by `abort`)."""
    import requests.adapters
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    ref = weakref.ref(owner)

    def told(base):
        class Connection(base):
            def connect(self) -> None:
                super().connect()
                client = ref()
                if client is not None:
                    client._opened(self.sock)
        return Connection

    class HTTPPool(HTTPConnectionPool):
        ConnectionCls = told(HTTPConnection)

    class HTTPSPool(HTTPSConnectionPool):
        ConnectionCls = told(HTTPSConnection)

    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, connections, maxsize, block=False, **pool_kwargs):
            if ctx is not None:
                pool_kwargs["ssl_context"] = ctx
            super().init_poolmanager(connections, 1, block=block, **pool_kwargs)   # one connection per BMC
            self.poolmanager.pool_classes_by_scheme = {"http": HTTPPool, "https": HTTPSPool}

        def build_connection_pool_key_attributes(self, request, verify, cert=None):
            host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
            # The context above already holds the CA; urllib3 would load the file again for each connection.
            if ctx is not None and verify is not False:
                pool_kwargs.pop("ca_certs", None)
                pool_kwargs.pop("ca_cert_dir", None)
                pool_kwargs["cert_reqs"] = "CERT_REQUIRED"
            return host_params, pool_kwargs

        def cert_verify(self, conn, url, verify, cert):
            if ctx is not None and verify is not False:
                conn.cert_reqs, conn.ca_certs, conn.ca_cert_dir = "CERT_REQUIRED", None, None   # the context's
                return
            super().cert_verify(conn, url, verify, cert)

    return Adapter(max_retries=0)


def link(value: Any, where: str) -> str:
    """The `@odata.id` of a link object."""
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return check_path(value["@odata.id"])
    raise BMCError("malformed", f"{where}: a link without @odata.id")


def clean(value: Any, limit: int = 256) -> str:
    """A BMC-supplied value made safe to print: control characters escaped, length capped."""
    text = "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in str(value))
    return text if len(text) <= limit else text[:limit] + "..."


def _message(text: str) -> str:
    try:
        msg = json.loads(text)["error"]["message"]
        return f": {clean(msg, 200)}"
    except Exception:
        return ""


def _transport_error(cause: BaseException | None, target: str) -> BMCError:
    import requests

    if isinstance(cause, requests.exceptions.SSLError):
        return BMCError("tls", f"TLS verification of the BMC failed on GET {target}: {_short(cause)}")
    if isinstance(cause, requests.exceptions.Timeout):
        return BMCError("timeout", f"GET {target} timed out")
    if isinstance(cause, requests.exceptions.ConnectionError):
        return BMCError("unreachable", f"cannot connect for GET {target}: {_short(cause)}")
    return BMCError("unreachable", f"GET {target} failed: {_short(cause)}")


def _closed_by_peer(exc: BaseException | None) -> bool:
    """The connection was closed or reset by the BMC before any answer (not a timeout, not a refused connect)."""
    import http.client

    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
            return True
        stack += [e.__cause__, e.__context__] + [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return False


def _short(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else "no answer"
    return text if len(text) <= 200 else text[:200] + "..."


def _default_warn(message: str) -> None:
    sys.stderr.write(f"mctl: warning: {message}\n")


def warn_once(warn: "Callable[[str], None] | None") -> Callable[[str], None]:
    """A warn callback for clients used from many threads at once: only the first message goes on to
    *warn* (None: dropped), so one problem shared by every BMC (a CA file, a TLS setting) is said once."""
    lock = threading.Lock()
    said: list[str] = []

    def once(message: str) -> None:
        with lock:
            if said:
                return
            said.append(message)
        if warn is not None:
            warn(message)

    return once

