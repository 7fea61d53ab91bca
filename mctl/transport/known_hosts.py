"""The site's known_hosts file: the only source of trust for SSH host keys.

It lives with the inventory (Site.known_hosts) in OpenSSH format, so `ssh`,
pdsh, clush and Ansible can use the very same file. mctl never trusts a key on
first use: `mctl ssh trust` records keys explicitly, and replacing a changed key
needs `--replace`. Lines mctl does not manage (comments, markers, hashed or
wildcard entries written by hand) are kept as they are.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from mctl.errors import UsageError
from mctl.state.files import atomic_write

DEFAULT_PORT = 22


def host_patterns(name: str, address: str, port: int) -> list[str]:
    """The patterns mctl writes for a host: its address first, then its inventory name."""
    names = [address] + ([name] if name != address else [])
    if port == DEFAULT_PORT:
        return names
    return [f"[{n}]:{port}" for n in names]


# What may stand in a known_hosts line mctl writes: a host pattern is a name or an address
# (no whitespace, which ends the field; no ',' which separates patterns; no '*', '?', '!' or
# '|', which are patterns of their own), a key type is a word, a key is base64.
_PATTERN = re.compile(r"^[A-Za-z0-9._:%-]+$")
_KEY_TYPE = re.compile(r"^[A-Za-z0-9@._-]+$")
_KEY_B64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


def check_entry(name: str, address: str, port: int, key: "HostKey | None" = None) -> None:
    """Refuse to write a line that would say more than 'this host has this key'.

    The inventory's name grammar keeps newlines and separators out of host names already;
    this is the guard where the line is written (a name with a newline once trusted another key).
    """
    for what, value in (("host name", name), ("address", address)):
        if not isinstance(value, str) or not _PATTERN.match(value) or value.startswith("-"):
            raise UsageError(f"refusing to write known_hosts: {what} {value!r} is not a plain name or address",
                             hint="host names follow the inventory's name grammar (docs/inventory.md)")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"refusing to write known_hosts: port {port!r} of {name} is not a TCP port")
    if key is not None and (not _KEY_TYPE.match(key.key_type) or not _KEY_B64.match(key.key_b64)):
        raise UsageError(f"refusing to write known_hosts: the key {name} presented is not an OpenSSH public key")


def fingerprint(key_type: str, key_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint (what `ssh-keygen -lf` prints), without needing asyncssh."""
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except ValueError:
        return "SHA256:?"
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


@dataclass(frozen=True)
class HostKey:
    key_type: str            # ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa, ...
    key_b64: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key_type, self.key_b64)

    def describe(self) -> str:
        return f"{self.key_type} {self.fingerprint}"

    @classmethod
    def from_openssh(cls, text: str) -> "HostKey":
        parts = text.split()
        if len(parts) < 2:
            raise ValueError(f"not an OpenSSH public key: {text[:40]!r}")
        return cls(parts[0], parts[1])


@dataclass(frozen=True)
class _Line:
    raw: str
    marker: str | None = None
    hosts: tuple[str, ...] = ()
    key: HostKey | None = None

    @property
    def is_entry(self) -> bool:
        return self.key is not None


def _parse_line(raw: str) -> _Line:
    text = raw.strip()
    if not text or text.startswith("#"):
        return _Line(raw)
    fields = text.split()
    marker = None
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
    if len(fields) < 3:
        return _Line(raw)
    return _Line(raw, marker, tuple(fields[0].split(",")), HostKey(fields[1], fields[2]))


def _pattern_matches(pattern: str, candidate: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt, digest = pattern.split("|", 3)
            mac = hmac.new(base64.b64decode(salt), candidate.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(base64.b64encode(mac).decode(), digest)
        except (ValueError, TypeError):
            return False
    if "*" not in pattern and "?" not in pattern:
        return pattern.lower() == candidate.lower()
    # OpenSSH wildcards are * and ? only; brackets are literal ([host]:port).
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, candidate.lower()) is not None


def _line_matches(line: _Line, candidates: list[str]) -> bool:
    hit = False
    for pattern in line.hosts:
        if pattern.startswith("!"):
            if any(_pattern_matches(pattern[1:], c) for c in candidates):
                return False
        elif any(_pattern_matches(pattern, c) for c in candidates):
            hit = True
    return hit


class KnownHosts:
    """An editable view of one known_hosts file."""

    def __init__(self, path: str | Path, text: str = ""):
        self.path = Path(path)
        self._lines = [_parse_line(raw) for raw in text.splitlines()]

    @classmethod
    def load(cls, path: str | Path) -> "KnownHosts":
        p = Path(path)
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            return cls(p, "")
        except OSError as exc:
            raise UsageError(f"cannot read known_hosts {p}: {exc.strerror}") from None
        try:
            return cls(p, raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise UsageError(f"{p}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); known_hosts is plain ASCII",
                             hint="fix or remove that line, then run 'mctl ssh trust'") from None

    def text(self) -> str:
        return "".join(line.raw.rstrip("\n") + "\n" for line in self._lines)

    def keys_for(self, name: str, address: str, port: int) -> list[HostKey]:
        """Plain (unmarked) keys recorded for this host under any of its patterns."""
        candidates = host_patterns(name, address, port)
        found = [line.key for line in self._lines
                 if line.is_entry and line.marker is None and _line_matches(line, candidates)]
        return [k for k in dict.fromkeys(found) if k is not None]

    def revoked_for(self, name: str, address: str, port: int) -> list[HostKey]:
        candidates = host_patterns(name, address, port)
        return [line.key for line in self._lines
                if line.is_entry and line.marker == "@revoked" and _line_matches(line, candidates) and line.key]

    def forget(self, name: str, address: str, port: int) -> int:
        """Drop every plain entry that names this host exactly (not wildcards); returns how many."""
        exact = set(host_patterns(name, address, port))
        kept, dropped = [], 0
        for line in self._lines:
            if line.is_entry and line.marker is None and any(
                    p in exact or (p.startswith("|1|") and any(_pattern_matches(p, c) for c in exact))
                    for p in line.hosts):
                dropped += 1
                continue
            kept.append(line)
        self._lines = kept
        return dropped

    def add(self, name: str, address: str, port: int, key: HostKey) -> None:
        check_entry(name, address, port, key)
        patterns = ",".join(host_patterns(name, address, port))
        self._lines.append(_parse_line(f"{patterns} {key.key_type} {key.key_b64}"))

    def save(self) -> Path:
        return atomic_write(self.path, self.text(), mode=0o644)

    def as_asyncssh(self):
        """The same trust, in the form asyncssh checks during the handshake."""
        import asyncssh

        lines = [line.raw for line in self._lines if line.is_entry]
        return asyncssh.import_known_hosts("\n".join(lines) + ("\n" if lines else ""))
