"""Debian packages on a tray, read with one `dpkg-query` for every package an image names.

The audit and `mctl image diff` ask it beside their other facts (mctl.facts.probe, purpose AUDIT):
the components whose version no tool reports (IMEX, DCGM, DOCA-OFED, MUNGE, enroot, pyxis, ...)
are read from dpkg's database, where provisioning installed and pinned them. Parsing is pure and
standard library only.

The format is ours (`-f`); dpkg-query prints one line per package it knows, also a package it
knows but that is not installed (status `un`, `rc`), and nothing on stdout for a name it never
heard of (it says so on stderr and exits 1).
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

# ${db:Status-Abbrev}: three characters, desired action, package status, error flag (dpkg-query(1))
FORMAT = r"${Package}\t${Version}\t${db:Status-Abbrev}\n"
# package status letters that mean its files are on the tray at the version shown:
# installed, triggers awaited, triggers pending
INSTALLED = frozenset("iWt")
STATUS_WORDS = {"n": "not installed", "c": "config files only", "H": "half installed", "U": "unpacked, not configured",
                "F": "half configured"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_EPOCH = re.compile(r"^[0-9]+:")

# The probe's function: 127 when the tray has no dpkg-query (not a Debian-based OS)
LOCAL = r"""
dpkgq() { command -v dpkg-query >/dev/null 2>&1 || return 127; to 10 dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Abbrev}\n' "$@"; }
"""


def split_pin(spec: str) -> tuple[str, str | None]:
    """'nvidia-imex-570=570.148.08-1' -> ('nvidia-imex-570', '570.148.08-1'); 'munge' -> ('munge', None)."""
    name, _, version = spec.partition("=")
    return name.strip(), (version.strip() or None)


def upstream(version: str) -> str:
    """A Debian version's upstream part: '1:4.3.1-1' -> '4.3.1', '570.148.08-0ubuntu1' -> '570.148.08'."""
    v = _EPOCH.sub("", version)
    return v.rsplit("-", 1)[0] if "-" in v else v


def command(names: Sequence[str]) -> str:
    """The section's command line for *names* (each checked: a package name, nothing the shell would read)."""
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise ValueError(f"not Debian package names: {', '.join(map(repr, bad))}")
    return "dpkgq " + " ".join(shlex.quote(n) for n in names)


def parse(text: str, names: Sequence[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """dpkg-query's answer -> (name -> installed version or None, name -> why it is None) for every name asked."""
    found: dict[str, str | None] = {}
    why: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not _NAME.match(parts[0]):
            continue
        name, version, abbrev = parts
        status = abbrev[1:2]
        if status in INSTALLED and version:
            found[name] = version
        else:
            found[name] = None
            why[name] = STATUS_WORDS.get(status, f"dpkg status {abbrev.strip() or '?'}")
    for n in names:
        if n not in found:
            found[n] = None
            why[n] = "not installed (dpkg knows no such package)"
    return {n: found[n] for n in names}, {n: why[n] for n in names if n in why}
