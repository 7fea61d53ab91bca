"""/etc/os-release and `uname -r` -> what OS a tray runs.

os-release is shell-like KEY=value lines (values may be quoted, with backslash
escapes); see os-release(5). Unknown keys are kept, comments and blank lines
ignored; a line that is not KEY=value makes the file untrustworthy.
"""

from __future__ import annotations

import re
from mctl.facts import FactsParseError
from mctl.model.tray import OsRelease

_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
_KERNEL = re.compile(r"^\d+\.\d+(\.\d+)?\S*$")


def _unquote(raw: str, lineno: int) -> str:
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        if value[0] == "'":
            return inner
        return re.sub(r"\\([\\\"$`])", r"\1", inner)
    if any(c in value for c in " \t\"'"):
        raise FactsParseError(f"os-release line {lineno}: unquoted value with spaces or quotes: {raw!r}")
    return value


def parse_os_release(text: str) -> OsRelease:
    values: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(stripped)
        if not match:
            raise FactsParseError(f"os-release line {lineno} is not KEY=value: {line[:60]!r}",
                                  hint="the output looks garbled; rerun the inventory")
        values[match["key"]] = _unquote(match["value"], lineno)
    if not values:
        raise FactsParseError("os-release is empty")
    return OsRelease(
        id=values.get("ID", "linux").lower() or None,
        version_id=values.get("VERSION_ID"),
        pretty_name=values.get("PRETTY_NAME"),
        version_codename=values.get("VERSION_CODENAME"),
        id_like=tuple(values.get("ID_LIKE", "").split()),
        fields=values,
    )


def parse_kernel_release(text: str) -> str:
    """`uname -r`: one token such as 6.8.0-1025-nvidia-64k."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if len(lines) != 1 or not _KERNEL.match(lines[0]):
        raise FactsParseError(f"uname -r printed {text.strip()[:60]!r}, not a kernel release")
    return lines[0]
