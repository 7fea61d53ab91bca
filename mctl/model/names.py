"""The name grammar: what a host, rack, partition, cluster or site may be called, and how big a node set may grow.

Names leave mctl in many places: file names under the state directory, Slurm's
slurm.conf and scontrol, known_hosts patterns, Ansible groups, IMEX file paths,
shell commands on the trays. One grammar, checked at the inventory boundary, keeps
every one of those places free of separators (`/`, `..`, `,`, whitespace, newlines)
and shell syntax (`;`, `$()`, quotes), so no writer has to guess. docs/inventory.md
documents it.

  host and rack names   one DNS label: letters, digits and `-`, 1-63 characters,
                        starting and ending with a letter or digit (`rack-a-tray01`)
  partition names       letters, digits, `_`, `.` and `-`, 1-63 characters, starting with
                        a letter or digit (`p0`, `all`, `train.a`)
  cluster and site      letters, digits, `_` and `-`, 1-63 characters, starting with a
  names                 letter or digit (`gb200`, `lab_n1`)

Node set expressions are sized before ClusterShell expands them (a range such as
`tray[1-10000000]` would otherwise build ten million strings), so a typo costs a
message, not minutes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterator

HOST_GRAMMAR = "one DNS label: letters, digits and '-', 1-63 characters, starting and ending with a letter or digit"
PARTITION_GRAMMAR = "letters, digits, '_', '.' and '-', 1-63 characters, starting with a letter or digit"
CLUSTER_GRAMMAR = "letters, digits, '_' and '-', 1-63 characters, starting with a letter or digit"

_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
# Characters no name or setting may hold (docs/inventory.md "Characters"): the C0 and C1 controls and DEL
# (NUL, tab, newline, ESC, NEL ...), the line and paragraph separators, the invisible format characters
# (category Cf: the bidi embeddings, overrides and isolates, zero-width space and joiners, the word joiner,
# a BOM inside a value, the soft hyphen), lone surrogates and the noncharacters. Each of them either adds a
# line to a file or command a value is written into, or makes a value read differently from what it is
# (a name that looks like another, text reordered on the screen).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_CHAR_NAMES = {0x00: "NUL", 0x09: "tab", 0x0A: "newline", 0x0D: "carriage return", 0x1B: "escape", 0x7F: "DEL",
               0x85: "next line, NEL", 0xFEFF: "byte order mark, ZERO WIDTH NO-BREAK SPACE"}
_WHITESPACE = re.compile(r"\s")

# The most names one node-set expression may stand for. A site of 500 NVL72 racks has
# 13,500 trays; the inventory's own node sets are per rack (at most 18 or 9).
MAX_NODESET = 50_000


def is_host_name(name: object) -> bool:
    return isinstance(name, str) and _HOST.fullmatch(name) is not None


def is_partition_name(name: object) -> bool:
    return isinstance(name, str) and _PARTITION.fullmatch(name) is not None


def is_cluster_name(name: object) -> bool:
    return isinstance(name, str) and _CLUSTER.fullmatch(name) is not None


def has_control(text: str) -> bool:
    return hidden_char(text) is not None


def hidden_char(text: str, allow: str = "") -> int | None:
    """Index of the first control or invisible character in *text* (see _CONTROL), or None; *allow*: ones let by."""
    return next(hidden_chars(text, allow), None)


def hidden_chars(text: str, allow: str = "") -> Iterator[int]:
    """Index of every control or invisible character in *text*, in order; *allow*: ones let by."""
    if text.isascii():
        for match in _CONTROL.finditer(text):
            if match.group() not in allow:
                yield match.start()
        return
    for i, ch in enumerate(text):
        if ch in allow:
            continue
        code = ord(ch)
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES or 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            yield i


def char_name(ch: str) -> str:
    """A character as a message names it: `U+202E (RIGHT-TO-LEFT OVERRIDE)`, `U+0000 (NUL)`."""
    code = ord(ch)
    name = _CHAR_NAMES.get(code) or unicodedata.name(ch, "")
    if not name:
        name = {"Cc": "a control character", "Cs": "a lone surrogate"}.get(unicodedata.category(ch), "a noncharacter")
    return f"U+{code:04X} ({name})"


def shown(value: object) -> str:
    """A value as a message may show it: repr, so a newline or escape stays visible, and short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def path_problem(value: object, *, absolute: bool = False, parent_ok: bool = True) -> str | None:
    """What is wrong with a path field, or None.

    No whitespace or control characters anywhere (the path is written into shell
    commands, slurm.conf and Ansible variables); *absolute*: it must start with `/`
    (a path on the trays); not *parent_ok*: no `..` component.
    """
    if not isinstance(value, str):
        return "a path must be a string"
    if not value:
        return "a path must not be empty"
    if has_control(value) or _WHITESPACE.search(value):
        return "a path may not hold whitespace or control characters"
    if absolute and not value.startswith("/"):
        return "must be an absolute path (starting with '/')"
    if not parent_ok and ".." in value.split("/"):
        return "may not hold a '..' component"
    return None


def _range_count(inner: str) -> int:
    """How many values a bracket's range set stands for (an upper bound; bad syntax counts 1)."""
    total = 0
    for piece in inner.split(","):
        piece = piece.strip()
        step = 1
        if "/" in piece:
            piece, _, s = piece.partition("/")
            step = int(s) if s.isdigit() and int(s) > 0 else 1
        lo, dash, hi = piece.partition("-")
        lo, hi = lo.strip(), hi.strip()
        if dash and lo.isdigit() and hi.isdigit():
            if len(hi) > 15:                    # int() of a 5,000-digit string is itself refused
                total += 10 ** 15
                continue
            a, b = int(lo[-16:]), int(hi)
            total += max(0, (b - a) // step + 1) if b >= a else 1
        else:
            total += 1
    return max(total, 1)


def nodeset_size(expr: str) -> int:
    """An upper bound of the names *expr* expands to, computed without expanding it.

    Terms joined by `,` `!` `&` `^` outside brackets are added; the bracket groups of
    one term are multiplied (`r[1-2]-t[1-10]` is 20).
    """
    total, term, depth, inner = 0, 1, 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth == 1:
                inner = ""
                continue
        elif ch == "]" and depth:
            depth -= 1
            if depth == 0:
                term *= _range_count(inner)
                continue
        if depth:
            inner += ch
        elif ch in ",!&^":
            total += term
            term = 1
    return total + term


def nodeset_too_big(expr: str, limit: int = MAX_NODESET) -> str | None:
    """The reason to refuse *expr* before expanding it, or None."""
    size = nodeset_size(expr)
    if size > limit:
        return f"the node set {shown(expr)} stands for {size:,} names, more than {limit:,}"
    return None
