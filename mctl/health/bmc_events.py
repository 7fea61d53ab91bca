"""The watch's receiver of Redfish events: a BMC pushes a leak, the watch reads that BMC now.

`health.bmc_events.listen` turns it on (docs/health.md, "Leak events"). The watch then subscribes at every
BMC that offers an EventService (mctl.bmc.eventservice; mctl.health.oob.BmcWatch makes the subscription
on its first read of the BMC and checks it is still there at each BMC health read) with a Context token of
its own per BMC, and this listener takes the BMCs' POSTs:

- HTTPS with `tls_cert`/`tls_key`; plain HTTP only on a loopback address (the lab: its BMCs and the
  watch share the machine's loopback). The loader refuses http off loopback.
- One path (PATH) and POST only; a body of at most MAX_BODY bytes with its Content-Length, read within
  READ_DEADLINE_S whatever the sender does (a trickle is cut); at most MAX_HANDLERS requests at once
  (more are answered 503 at once) and MAX_CONNECTIONS connections (more are closed: a sender trickling its
  headers holds one, each header line within READ_DEADLINE_S; such a flood delays events, never the poll); a JSON Event whose Context is a token the watch gave, and whose
  records parse (mctl.bmc.eventservice.parse_event). Anything else is refused (400, 401, 404, 405, 411,
  413, 503) and counted by reason; nothing of a refused body is logged.
- Accepted leak records go on a bounded queue (`queue`, default 1024; a full queue drops the newest and
  counts it): the BmcWatch takes them and reads that BMC at once. An event is never a reading: what
  the watch judges is what the read says, so a forged or stale event costs one read, never a drain or a
  power-off, and a lost event costs the time until the next poll (`bmc_events.leak_interval`).
"""

from __future__ import annotations

import hmac
import ipaddress
import queue
import secrets
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from mctl.bmc.eventservice import MAX_BODY, EventRecord, parse_event

if TYPE_CHECKING:
    from mctl.model.settings import BmcEventSettings

PATH = "/mctl/redfish-events"
READ_DEADLINE_S = 5.0
MAX_HANDLERS = 16
MAX_CONNECTIONS = 64        # connections held at once (a sender that trickles its headers holds one); more are closed


@dataclass(frozen=True)
class Received:
    host: str
    record: EventRecord
    at: float                           # time.monotonic() when it was accepted


class EventReceiver:
    """The listener, the tokens it accepts (one per BMC) and the queue of leak events for the watch."""

    def __init__(self, settings: "BmcEventSettings"):
        self.settings = settings
        self.queue: "queue.Queue[Received]" = queue.Queue(maxsize=max(1, settings.queue))
        self._tokens: dict[str, str] = {}           # token -> host
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self.accepted = self.dropped = self.ignored = 0
        self.rejected: dict[str, int] = {}
        self.httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- tokens -----------------------------------------------------------------------------------------

    def token_for(self, host: str) -> str:
        """A new Context token for *host*'s subscription (an earlier one of it stays valid until forgotten)."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = host
        return token

    def forget(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)

    def host_of(self, context: str) -> str | None:
        with self._lock:
            for token, host in self._tokens.items():
                if hmac.compare_digest(token.encode(), context.encode("utf-8", "replace")):
                    return host
        return None

    # -- the listener -------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """What the BMCs are told to POST to."""
        if self.settings.url:
            return self.settings.url.rstrip("/") + PATH
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self.settings.tls_cert else 'http'}://{shown}:{port}{PATH}"

    def start(self) -> "EventReceiver":
        s = self.settings
        ip = ipaddress.ip_address(s.listen)
        if s.tls_cert is None and not ip.is_loopback:       # the loader refuses it too; never in the clear
            raise ValueError(f"health.bmc_events.listen {s.listen}: http only on loopback (give tls_cert)")
        me = self

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_DEADLINE_S                   # each recv; the whole body has READ_DEADLINE_S too
            server_version = "mctl-events"
            sys_version = ""

            def log_message(self, *args) -> None:       # nothing a sender wrote is logged
                pass

            def do_POST(self) -> None:
                me._handle(self)

            def _refuse(self) -> None:
                me._refused("method")
                self._reply(405)

            do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse

            def _reply(self, status: int) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.send_header("Connection", "close")
                    self.end_headers()
                except OSError:
                    pass
                self.close_connection = True

        family = 10 if ip.version == 6 else 2
        conns = threading.BoundedSemaphore(MAX_CONNECTIONS)

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            request_queue_size = 256            # a rack's BMCs posting at once are not dropped by the listen backlog

            def process_request(self, request, client_address):
                if not conns.acquire(blocking=False):
                    me._refused("connections")
                    self.shutdown_request(request)
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    conns.release()

        self.httpd = Server((s.listen, s.port), Handler)
        if s.tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(s.tls_cert, s.tls_key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mctl-bmc-events", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def _refused(self, why: str) -> None:
        with self._lock:
            self.rejected[why] = self.rejected.get(why, 0) + 1

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        if not self._slots.acquire(blocking=False):
            self._refused("busy")
            return h._reply(503)                        # type: ignore[attr-defined]
        try:
            status = self._take(h)
        finally:
            self._slots.release()
        h._reply(status)                                # type: ignore[attr-defined]

    def _take(self, h: BaseHTTPRequestHandler) -> int:
        if h.path.split("?", 1)[0] != PATH:
            self._refused("path")
            return 404
        length = h.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self._refused("length")
            return 411
        n = int(length)
        if n > MAX_BODY:
            self._refused("too large")
            return 413
        body = bytearray()
        until = time.monotonic() + READ_DEADLINE_S
        try:
            while len(body) < n:
                left = until - time.monotonic()
                if left <= 0:
                    self._refused("slow")
                    return 400
                h.connection.settimeout(left)           # the whole body within the deadline, not each recv
                chunk = h.rfile.read1(n - len(body)) if hasattr(h.rfile, "read1") else h.rfile.read(n - len(body))
                if not chunk:
                    break
                body += chunk
        except OSError:
            self._refused("slow")
            return 400
        if len(body) < n:
            self._refused("short")
            return 400
        try:
            context, records = parse_event(bytes(body))
        except ValueError:
            self._refused("malformed")
            return 400
        host = self.host_of(context)
        if host is None:
            self._refused("context")
            return 401
        now = time.monotonic()
        for r in records:
            if not r.leak:
                with self._lock:
                    self.ignored += 1
                continue
            try:
                self.queue.put_nowait(Received(host, r, now))
                with self._lock:
                    self.accepted += 1
            except queue.Full:
                with self._lock:
                    self.dropped += 1
        return 204

    def counts(self) -> dict[str, object]:
        with self._lock:
            return {"accepted": self.accepted, "dropped": self.dropped, "ignored": self.ignored,
                    "rejected": dict(self.rejected)}
