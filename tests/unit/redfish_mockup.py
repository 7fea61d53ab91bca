"""A static Redfish mockup server for tests: a real capture's tree served by @odata.id.

DMTF Mockup Creator stores `/redfish/v1/X` as `<dir>/redfish/v1/X/index.json`;
this serves those files byte for byte on 127.0.0.x (HTTP Basic required on every
path but the service root, as a BMC does), optionally over TLS with a throwaway
CA, with HTTP/1.1 keep-alive (each accepted connection counted: `connections`).
With `expand`, a collection asked with `$expand=.($levels=1)` comes with its
members inline, as the real GB200 BMC answers it (its root says ExpandQuery Levels);
without, the query is ignored (links only), as a BMC without $expand. A `fault`
makes the server misbehave the way a broken BMC does, to test that mctl reports
that tray and goes on (`drop-kept`: a request on a connection that already
answered one is dropped unanswered, as a BMC that closed an idle kept connection).
"""

from __future__ import annotations

import base64
import http.server
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

FAULTS = ("none", "401", "500", "slow", "trickle", "malformed", "redirect-port", "redirect-same", "drop-kept")


class MockupServer:
    def __init__(self, root: Path, *, host: str = "127.0.0.1", port: int = 0, user: str = "root",
                 password: str = "0penBmc", fault: str = "none", tls: tuple[Path, Path] | None = None,
                 fault_path: str | None = None, hold_s: float = 30.0, overrides: dict[str, bytes] | None = None,
                 expand: bool = False):
        assert fault in FAULTS, fault
        self.root, self.fault, self.fault_path, self.hold_s = Path(root), fault, fault_path, hold_s
        self.overrides = dict(overrides or {})      # path -> body: a variant made in memory, files untouched
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.requests: list[tuple[str, str, str | None]] = []    # (method, path, Authorization)
        self.posts: list[tuple[str, bytes]] = []                  # (path, body) of every POST
        self.release = threading.Event()
        self.connections = 0                                      # TCP connections accepted
        self.expand = expand
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True      # else each answer waits out the peer's delayed ACK

            def log_message(self, *args):   # quiet
                pass

            def setup(self):
                super().setup()
                owner.connections += 1
                self.answered = 0

            def do_GET(self):
                owner.requests.append(("GET", self.path, self.headers.get("Authorization")))
                self.answered += 1
                if owner.fault == "drop-kept" and self.answered > 1:
                    self.close_connection = True
                    return
                path = self.path.split("?", 1)[0].rstrip("/") or "/"
                hit = owner.fault_path is None or path == owner.fault_path
                if owner.fault == "slow" and hit:
                    owner.release.wait(owner.hold_s)
                    return self._send(200, b"{}")
                if path != "/redfish/v1" and self.headers.get("Authorization") != owner.expected:
                    return self._send(401, b'{"error": {"message": "unauthorized"}}',
                                      extra={"WWW-Authenticate": 'Basic realm="Redfish"'})
                if owner.fault == "401" and hit:
                    return self._send(401, b'{"error": {"message": "unauthorized"}}')
                if owner.fault == "500" and hit:
                    return self._send(500, b'{"error": {"message": "internal error"}}')
                if owner.fault in ("redirect-port", "redirect-same") and hit:
                    host, port = self.server.server_address[:2]
                    port = port + 1 if owner.fault == "redirect-port" else port
                    scheme = "https" if tls else "http"
                    return self._send(307, b"", extra={"Location": f"{scheme}://{host}:{port}{path}/moved"})
                if path.endswith("/moved"):
                    path = path[: -len("/moved")]
                if path in owner.overrides:
                    return self._send(200, owner.overrides[path])
                file = owner.root / path.lstrip("/") / "index.json"
                if not file.resolve().is_relative_to(owner.root.resolve()) or not file.is_file():
                    return self._send(404, b'{"error": {"message": "not found"}}')
                body = file.read_bytes()
                if owner.expand and "$expand=.($levels=1)" in urllib.parse.unquote(self.path):
                    body = owner._expanded(body)
                if owner.fault == "malformed" and hit:
                    body = body[: len(body) // 2]
                if owner.fault == "trickle" and hit:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for b in body:
                        if owner.release.wait(0.5):
                            return
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                    return
                self._send(200, body)

            def do_POST(self):
                """An action: recorded (with its body) and answered 204, or the fault; the tree is not changed."""
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                owner.requests.append(("POST", self.path, self.headers.get("Authorization")))
                self.answered += 1
                if owner.fault == "drop-kept" and self.answered > 1:
                    self.close_connection = True
                    return
                owner.posts.append((self.path, body))
                path = self.path.split("?", 1)[0].rstrip("/") or "/"
                hit = owner.fault_path is None or path == owner.fault_path
                if self.headers.get("Authorization") != owner.expected:
                    return self._send(401, b'{"error": {"message": "unauthorized"}}')
                if owner.fault == "slow" and hit:
                    owner.release.wait(owner.hold_s)
                    return self._send(204, b"")
                if owner.fault in ("401", "500") and hit:
                    return self._send(int(owner.fault), b'{"error": {"message": "refused"}}')
                if owner.fault in ("redirect-port", "redirect-same") and hit:
                    return self._send(307, b"", extra={"Location": self.path + "/moved"})
                self._send(204, b"")

            def _send(self, code, body, extra=None):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.host, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "MockupServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self) -> list[str]:
        return [p for _m, p, _a in self.requests]

    def _expanded(self, body: bytes) -> bytes:
        """A collection with each member's document inline (a member not in the tree stays a link)."""
        import json

        doc = json.loads(body)
        if not isinstance(doc.get("Members"), list):
            return body
        members = []
        for m in doc["Members"]:
            file = self.root / str(m.get("@odata.id", "")).lstrip("/") / "index.json"
            members.append(json.loads(file.read_text()) if file.is_file() else m)
        return json.dumps({**doc, "Members": members}).encode()


def free_port(hosts: list[str]) -> int:
    """A TCP port free on every one of *hosts* (loopback addresses) at this moment."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        ok = True
        for h in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((h, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no common free port")


def throwaway_ca(folder: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert, server key) for *hosts* (IP SANs), made with the openssl CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, timeout=60)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=mctl test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=bmc")
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=" + ",".join(f"IP:{h}" for h in hosts) + "\n"
                   "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def wait_until(predicate, timeout: float = 10.0):
    """The predicate's first truthy value within *timeout* seconds, else its last (falsy) one."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    return predicate()


def credentials_file(folder: Path, line: str = "root:0penBmc") -> Path:
    """The inventory's `bmc.credentials_file` (mode 0600, as mctl requires)."""
    cred = Path(folder) / "bmc.cred"
    cred.write_text(line + "\n")
    cred.chmod(0o600)
    return cred
