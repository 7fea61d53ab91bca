"""The HTTP side of a lab BMC: HTTP/1.1 with keep-alive over TLS, serving a WSGI application.

A real BMC (bmcweb) keeps a client's connection open between requests; Werkzeug's development
server, which `flask run` and sushy-tools use, answers every request with `Connection: close` and,
after each answer, reads whatever else the client sent and throws it away (a kept connection's next
request with it), so it cannot keep a connection (docs/decisions.md, D47 and D78). This server is
the standard library's `http.server` with `protocol_version = "HTTP/1.1"`: one thread per connection,
each request read exactly (its `Content-Length` body, no more), the application's answer sent whole
with its `Content-Length`, and the connection kept until the client closes it, asks `Connection:
close`, speaks HTTP/1.0, or stays idle for IDLE_S. The TLS handshake runs in the connection's own
thread, so a client that stalls in it holds no one else's.

The faults of mctl.lab.bmc_faults are the application's (a WSGI middleware checked per request), so a
hung BMC holds the requests of kept connections as those of new ones.
"""

from __future__ import annotations

import http.server
import io
import logging
import socket
import ssl
import sys
import urllib.parse
from typing import Any, Callable, Iterable

LOG = logging.getLogger("mctl-lab-bmc")
IDLE_S = 120.0              # a kept connection with no request for this long is closed (a BMC's idle timeout)
MAX_BODY = 1 << 20          # a BMC takes small JSON bodies only (actions)

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True          # else each answer waits out the peer's delayed ACK
    timeout = IDLE_S
    server_version = "mctl-lab-bmc"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:    # noqa: A002 - the base class's name
        LOG.debug("%s %s", self.address_string(), format % args)

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return self._plain(411, b"chunked request bodies are not taken")
        try:
            size = int(length) if length else 0
        except ValueError:
            self.close_connection = True
            return self._plain(400, b"bad Content-Length")
        if size < 0 or size > MAX_BODY:
            self.close_connection = True
            return self._plain(413, b"request body too large")
        body = self.rfile.read(size) if size else b""
        status, headers, payload = self._run(body)
        self.send_response(int(status.split(None, 1)[0]), status.split(None, 1)[1] if " " in status else "")
        for key, value in headers:
            if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and payload:
            self.wfile.write(payload)
        self.wfile.flush()

    def _run(self, body: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
        path, _, query = self.path.partition("?")
        environ = {
            "REQUEST_METHOD": self.command, "SCRIPT_NAME": "", "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
            "QUERY_STRING": query, "SERVER_NAME": self.server.server_address[0],
            "SERVER_PORT": str(self.server.server_address[1]), "SERVER_PROTOCOL": self.request_version,
            "REMOTE_ADDR": self.client_address[0], "REMOTE_PORT": str(self.client_address[1]),
            "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if isinstance(self.connection, ssl.SSLSocket)
            else "http", "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": False, "wsgi.run_once": False,
        }
        for key, value in self.headers.items():
            name = "HTTP_" + key.upper().replace("-", "_")
            if name not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                environ[name] = f"{environ[name]},{value}" if name in environ else value
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
            answer["status"], answer["headers"] = status, list(headers)
            return lambda data: answer.setdefault("written", []).append(data)

        result = self.server_app(environ, start_response)
        try:
            chunks = answer.get("written", []) + [bytes(c) for c in result]
        finally:
            if hasattr(result, "close"):
                result.close()
        return answer.get("status", "500 Internal Server Error"), answer.get("headers", []), b"".join(chunks)

    def _plain(self, code: int, text: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(text)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _serve


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type, ssl_context: ssl.SSLContext | None):
        self.ssl_context = ssl_context
        super().__init__(address, handler)

    def finish_request(self, request, client_address) -> None:
        """In the connection's own thread: the TLS handshake first (a client stalled in it holds only it)."""
        if self.ssl_context is not None:
            request.settimeout(IDLE_S)
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                LOG.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                return
        try:
            super().finish_request(request, client_address)
        finally:
            if request is not None and isinstance(request, ssl.SSLSocket):
                try:
                    request.close()
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, socket.timeout, ssl.SSLError)):
            return                          # a client that went away
        LOG.exception("error serving %s", client_address[0])


def serve(app: WSGIApp, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve *app* on host:port until the process ends."""
    handler = type("Handler", (_Handler,), {"server_app": staticmethod(app)})
    server = _Server((host, port), handler, ssl_context)
    server.serve_forever()


def serve_many(app: WSGIApp, listeners: list[tuple[str, int, ssl.SSLContext | None]]) -> None:
    """Serve *app* on every (host, port, TLS context) until the process ends (fleet mode: one process
    answers as every BMC of a rack); each server's SERVER_NAME is its own address."""
    import threading

    handler = type("Handler", (_Handler,), {"server_app": staticmethod(app)})
    servers = [_Server((host, port), handler, ctx) for host, port, ctx in listeners]
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, name=f"bmc-{server.server_address[0]}", daemon=True).start()
    servers[0].serve_forever()
