"""HTTP Basic credentials files (NMX-M, BMCs): one line `username:password`, private to its owner.

One reader for every service, so the rules are the same everywhere: the file must be a regular
file that neither group nor others can read, the password never shows in a repr or a message.
"""

from __future__ import annotations

import base64
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from mctl.errors import UsageError


@dataclass(frozen=True)
class BasicCredentials:
    username: str
    password: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}(username={self.username!r}, password='***')"

    __str__ = __repr__

    def header(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


C = TypeVar("C", bound=BasicCredentials)


def read_credentials(path: str | Path, service: str, kind: type[C]) -> C:
    """Read `username:password` from *path* for *service* (e.g. "NMX-M"), refusing a file others could read."""
    p = Path(path).expanduser()
    what = f"{service} credentials file {p}"
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UsageError(f"{what} does not exist",
                         hint="create it with one line 'username:password' and 'chmod 600' it") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} is not a regular file")
    if st.st_mode & 0o077:
        raise UsageError(f"{what} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})", hint=f"chmod 600 {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not UTF-8 text", hint="write it as one line 'username:password'") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) != 1 or ":" not in lines[0] or not lines[0].split(":", 1)[0]:
        raise UsageError(f"{what} must hold exactly one line 'username:password'",
                         hint="blank lines and lines starting with '#' are ignored")
    user, password = lines[0].split(":", 1)
    return kind(user, password)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of *url*: credentials go only where all three equal the configured endpoint's."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)
