"""Read a kubeconfig into what an HTTPS client needs (server, CA, client certificate or token).

Only the parts mctl uses: the chosen context's cluster (`server`,
`certificate-authority[-data]`, `insecure-skip-tls-verify`) and user (`token`,
`tokenFile`, `client-certificate[-data]`, `client-key[-data]`, basic auth).
Exec and auth-provider plugins are refused with a clear message rather than
half-supported.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from mctl.errors import UsageError


@dataclass(frozen=True)
class Connection:
    server: str
    context: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    basic: tuple[str, str] | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https://"):
            return None
        ctx = ssl.create_default_context()
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_file or self.ca_data:
            what = f"certificate-authority {self.ca_file}" if self.ca_file else "certificate-authority-data"
            try:
                ctx.load_verify_locations(cafile=self.ca_file,
                                          cadata=self.ca_data.decode("ascii", "replace") if self.ca_data else None)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise UsageError(f"context {self.context}: cannot use the cluster's {what}: {exc}",
                                 hint="it must be a PEM CA certificate (base64 of it in -data); "
                                      "nothing was sent") from None
        if self.cert_file or self.cert_data:
            cert, key = self.cert_file, self.key_file
            tmp: list[str] = []
            try:
                if self.cert_data:       # ssl wants files: write them 0600 and remove them at once
                    cert = _temp(self.cert_data, tmp)
                if self.key_data:
                    key = _temp(self.key_data, tmp)
                ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise UsageError(f"context {self.context}: cannot use the user's client certificate/key: {exc}",
                                 hint="client-certificate(-data) and client-key(-data) must be PEM; "
                                      "nothing was sent") from None
            finally:
                for path in tmp:
                    os.unlink(path)
        return ctx


def _temp(data: bytes, made: list[str]) -> str:
    fd, path = tempfile.mkstemp(prefix="mctl-kube-")
    made.append(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def default_path() -> Path:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser()
    return Path("~/.kube/config").expanduser()


def _named(items: list | None, name: str, what: str, path: Path) -> dict:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(what) or {}
    raise UsageError(f"{path}: no {what} named {name!r}", hint=f"see 'kubectl config view --kubeconfig {path}'")


def _data(value: str | None, field: str = "", path: Path | None = None) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise UsageError(f"{path}: {field} is not base64", hint="it holds the PEM file, base64-encoded") from None


def load(path: Path, context: str | None = None) -> Connection:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"kubeconfig not found: {path}",
                         hint="pass --kubeconfig PATH, set scheduler.k8s.kubeconfig in the inventory, or KUBECONFIG; "
                              "nothing was applied")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a kubeconfig (a YAML mapping with clusters, users, contexts)")
    name = context or doc.get("current-context")
    if not name:
        raise UsageError(f"{path} has no current-context", hint="pass --context NAME")
    ctx = _named(doc.get("contexts"), name, "context", path)
    cluster = _named(doc.get("clusters"), ctx.get("cluster", ""), "cluster", path)
    user = _named(doc.get("users"), ctx.get("user", ""), "user", path) if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise UsageError(f"{path}: user {ctx.get('user')!r} authenticates through an exec/auth-provider plugin, "
                         "which mctl does not run", hint="use a kubeconfig with a token or a client certificate")
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise UsageError(f"{path}: cluster {ctx.get('cluster')!r} has no usable server URL ({server!r})")
    base = path.parent

    def rel(p: str | None) -> str | None:
        return str((base / p).resolve()) if p else None

    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = Path(rel(user["tokenFile"])).read_text().strip()
        except OSError as exc:
            raise UsageError(f"{path}: user {ctx.get('user')!r}: cannot read tokenFile {rel(user['tokenFile'])}: "
                             f"{exc.strerror or exc}", hint="nothing was sent") from None
    basic = (user["username"], user["password"]) if user.get("username") and user.get("password") else None
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure not in (None, True, False):
        raise UsageError(f"{path}: cluster {ctx.get('cluster')!r}: insecure-skip-tls-verify must be true or false, "
                         f"not {insecure!r}")
    if insecure and (cluster.get("certificate-authority") or cluster.get("certificate-authority-data")):
        # as kubectl: one or the other, so a CA that is set is never silently unused
        raise UsageError(f"{path}: cluster {ctx.get('cluster')!r} sets both a certificate authority and "
                         "insecure-skip-tls-verify", hint="remove insecure-skip-tls-verify to verify the server")
    return Connection(server=server.rstrip("/"), context=name, ca_file=rel(cluster.get("certificate-authority")),
                      ca_data=_data(cluster.get("certificate-authority-data"), "certificate-authority-data", path),
                      insecure=insecure is True, token=token,
                      cert_file=rel(user.get("client-certificate")), key_file=rel(user.get("client-key")),
                      cert_data=_data(user.get("client-certificate-data"), "client-certificate-data", path),
                      key_data=_data(user.get("client-key-data"), "client-key-data", path), basic=basic)
