"""YAML loading that remembers where every value came from, for every YAML file an operator gives mctl.

Validation errors must name the file and line of the field at fault, so the
document is composed into nodes first and converted by hand, recording each
key's line. What plain PyYAML lets through is refused here, each with its line
and field: duplicate keys (which it silently collapses), explicit tags on any
node (`!!str 22`, `!!binary`, `!vault`, a local `!x`, even the core ones: a tag
changes what a value is behind its plain spelling), merge keys, and control or
invisible characters anywhere in the file (before YAML reads it, so a line
separator cannot shift the line numbers) and in any key or value once escapes
are read (`"\\0"`, `"\\u202e"`). Anchors and aliases stay allowed, bounded
(docs/inventory.md "YAML"; docs/decisions.md D62).
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from mctl.errors import Problem, UsageError
from mctl.model.names import char_name, hidden_char, hidden_chars, shown

Path = tuple[Any, ...]
PathLike = str | os.PathLike


@dataclass
class Located:
    """A loaded document plus the 1-based line of every path in it."""

    data: Any
    file: str
    lines: dict[Path, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def refusal(self, hint: str) -> UsageError:
        """The first problem as one error, counting the others: for a file read outside the inventory's own
        validation (an image definition, group_vars), which stops at its first problem."""
        first = self.problems[0]
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return UsageError(f"cannot read {first.render()}{more}", hint=first.hint or hint)

    def line_of(self, path: Path) -> int | None:
        """Line of the deepest known prefix of *path* (a missing key points at its parent)."""
        path = tuple(path)
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]


def dotted(path: Path) -> str:
    """`racks.rack-a.partitions[0].trays`; a key holding a control or invisible character is shown escaped."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            text = str(part)
            out += ("." if out else "") + (repr(text) if hidden_char(text) is not None else text)
    return out


# Bounds that keep a hostile document from hanging or crashing the loader: an alias bomb
# (`a: &a [*b, *b, ...]` nine levels deep is a billion values), a self-referencing alias,
# nesting deeper than Python's stack.
MAX_DEPTH = 40
MAX_VALUES = 100_000
# The only tags a value may have, and only implicitly (by writing plain values): no explicit tag at all,
# so no !!binary, !!set, !!python/..., application tags, nor `!!str 22` (docs/decisions.md D62).
_CORE = "tag:yaml.org,2002:"
_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")}
# Line breaks and tabs inside a value: free-form text (an Ansible variable's motd) may hold them; typed
# fields refuse them in their own checks (mctl.inventory.spec). Nothing else is allowed anywhere.
TEXT_BREAKS = "\t\n"
_RAW_HINT = "remove it: an editor may not show it"
_CHARACTER_HINT = f"{_RAW_HINT} (in a double-quoted string it is an escape such as \\0, \\e, \\N, \\L or \\u202e)"
MAX_CHARACTER_PROBLEMS = 20
_LONE_CR = re.compile(r"\r(?!\n)")


class _Refused(Exception):
    def __init__(self, line: int | None, message: str, hint: str | None = None):
        super().__init__(message)
        self.line, self.message, self.hint = line, message, hint


class _Loader(yaml.SafeLoader):
    """SafeLoader's composer with a depth limit, so deep nesting is a located problem, not a RecursionError,
    and a memory of the tags written in the text (a node keeps only the tag resolved, `!!str 22` and `"22"` alike)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self.tags: dict[int, str] = {}      # id(node) -> the tag written on it (the node keeps only the resolved one)

    def compose_node(self, parent, index):  # type: ignore[override]
        self._depth += 1
        try:
            event = self.peek_event()
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark.line + 1, f"nested more than {MAX_DEPTH} levels deep",
                               "an inventory is a few levels of mappings and lists")
            node = super().compose_node(parent, index)
            written = None if isinstance(event, yaml.AliasEvent) else getattr(event, "tag", None)
            if written is not None:
                self.tags[id(node)] = written
            return node
        finally:
            self._depth -= 1


def read_yaml(path: PathLike, *, text_values: bool = True, what: str = "file") -> Located:
    """The YAML file at *path*, read as UTF-8 and loaded (load_yaml); one that cannot be read is a UsageError."""
    where = str(path)
    try:
        raw = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        return Located(None, where, problems=[Problem(where, line, "", f"not UTF-8 text (byte 0x{raw[exc.start]:02x})",
                                                      f"save the {what} as UTF-8")])
    return load_yaml(text, where, text_values=text_values)


def load_yaml(text: str, file: str, *, text_values: bool = True) -> Located:
    """*text* read as YAML, located; *text_values*: values may hold tabs and line breaks (TEXT_BREAKS)."""
    raw = _raw_characters(text)
    if raw:
        return _raw_problems(text, file, raw)
    return _load(text, file, text_values)


def _load(text: str, file: str, text_values: bool, spans: list | None = None) -> Located:
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            tags = loader.tags
        finally:
            loader.dispose()
    except _Refused as exc:
        return Located(None, file, problems=[Problem(file, exc.line, "", exc.message, exc.hint)])
    except RecursionError:
        return Located(None, file, problems=[Problem(file, None, "", f"nested more than {MAX_DEPTH} levels deep")])
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        context = getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        if line is None and isinstance(getattr(exc, "position", None), int):     # a ReaderError
            line = text.count("\n", 0, exc.position) + 1
        reason = getattr(exc, "problem", None) or str(exc)
        if context is not None and mark is not None and context.line != mark.line:
            # An unclosed construct is detected later than it starts; point at the start.
            reason = f"{reason} (at line {line}, {getattr(exc, 'context', '') or 'in a construct'} started here)"
            line = context.line + 1
        return Located(None, file, problems=[Problem(file, line, "", f"YAML syntax error: {reason}",
                                                     "check indentation and quoting near this line")])
    doc = Located(None, file)
    if node is None:
        doc.data = {}
        return doc
    doc.lines[()] = node.start_mark.line + 1
    try:
        doc.data = _convert(node, (), doc, _Walk(tags, TEXT_BREAKS if text_values else "", spans))
    except _Refused as exc:
        doc.data = None
        doc.problems.append(Problem(file, exc.line, "", exc.message, exc.hint))
    return doc


def _raw_characters(text: str) -> list[int]:
    """Where control and invisible characters are written into the file itself, comments included (a bidi
    override in a comment is how code is made to read differently from what it does). Tabs, line feeds, CR LF
    line ends and a leading BOM are the text's own; YAML would count a lone CR, NEL, U+2028 or U+2029 as a
    line break, and every line number after it would disagree with the operator's editor."""
    found = set(hidden_chars(text, allow="\t\n\r")) | {m.start() for m in _LONE_CR.finditer(text)}
    found.discard(0 if text.startswith("\ufeff") else -1)
    return sorted(found)


def _raw_problems(text: str, file: str, found: list[int]) -> Located:
    """One problem per character (the first MAX_CHARACTER_PROBLEMS), at its line and column, with the field it
    sits in: the document read once more with each character blanked, for the span of every key and value."""
    blank = list(text)
    for i in found:
        blank[i] = "\ufffd"
    spans: list[tuple[int, int, Path, bool]] = []
    _load("".join(blank), file, True, spans)
    # A key's own text, so a blanked key is shown as it is written (escaped by dotted), not with U+FFFD.
    keys = {path: text[start:end] for start, end, path, is_key in spans if is_key}
    problems = []
    for i in found[:MAX_CHARACTER_PROBLEMS]:
        inside = [(end - start, path) for start, end, path, _ in spans if start <= i < end]
        field = ""
        if inside:
            path = min(inside, key=lambda s: s[0])[1]
            field = dotted(tuple(_written_key(keys.get(path[:n + 1]), part) for n, part in enumerate(path)))
        line = text.count("\n", 0, i) + 1
        column = i - (text.rfind("\n", 0, i) + 1) + 1
        problems.append(Problem(file, line, field, f"{char_name(text[i])} at column {column}: control and invisible "
                                "characters are not allowed in the file", _RAW_HINT))
    if len(found) > MAX_CHARACTER_PROBLEMS:
        problems.append(Problem(file, problems[-1].line, "", f"and {len(found) - MAX_CHARACTER_PROBLEMS} more control "
                                "or invisible characters after this one", _RAW_HINT))
    return Located(None, file, problems=problems)


def _written_key(source: str | None, part: Any) -> Any:
    if source is None or not isinstance(part, str) or "\ufffd" not in part:
        return part
    return source[1:-1] if len(source) > 1 and source[0] == source[-1] and source[0] in "'\"" else source


class _Walk:
    """What one conversion has seen: the nodes on the current path (a cycle is an alias to an ancestor),
    how many values it has produced so far (aliases repeat values without repeating text), the tags
    written in the text, and the nodes already reported (an alias repeats a node's problem, not its report)."""

    def __init__(self, tags: dict[int, str] | None = None, breaks: str = TEXT_BREAKS, spans: list | None = None):
        self.path: set[int] = set()
        self.values = 0
        self.tags = tags or {}
        self.breaks = breaks
        self.reported: set[int] = set()
        self.spans = spans          # (start, end, path, is key) of every scalar, where a caller asks where text sits

    def span(self, node: yaml.Node, path: Path, key: bool = False) -> None:
        """A scalar's place in the text (a comment or the space between values is no field's)."""
        if self.spans is not None and isinstance(node, yaml.ScalarNode):
            self.spans.append((node.start_mark.index, node.end_mark.index, path, key))

    def report(self, node: yaml.Node, doc: Located, path: Path, message: str, hint: str | None) -> None:
        if id(node) not in self.reported:
            self.reported.add(id(node))
            doc.problems.append(Problem(doc.file, node.start_mark.line + 1, dotted(path), message, hint))


def _written(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


def _convert(node: yaml.Node, path: Path, doc: Located, walk: _Walk) -> Any:
    line = node.start_mark.line + 1
    walk.values += 1
    walk.span(node, path)
    if walk.values > MAX_VALUES:
        raise _Refused(line, f"the document stands for more than {MAX_VALUES:,} values",
                       "YAML aliases (*name) repeat whole subtrees; write the values out instead")
    written = walk.tags.get(id(node))
    if written is not None:
        walk.report(node, doc, path, f"YAML tag {_written(written)!r} is not allowed: a tag changes what the value "
                    "is behind its plain spelling", "write plain strings, numbers, booleans, lists and mappings "
                    "(quote a string that would read as another type)")
    if id(node) in walk.path:
        raise _Refused(line, "a YAML alias refers to a value that contains it (a loop)",
                       "remove the alias (*name) or point it at another value")
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        walk.path.add(id(node))
        try:
            return _convert_collection(node, path, doc, walk)
        finally:
            walk.path.discard(id(node))
    if written is not None:
        return node.value                   # refused above; read as the text written, never constructed
    if node.tag not in _TAGS:              # `=` (YAML 1.1's value key): nothing an inventory means
        walk.report(node, doc, path, f"cannot read the value {node.value[:40]!r} (YAML reads it as "
                    f"{_written(node.tag)})", "quote it to make it a string")
        return node.value
    value = _scalar(node)
    if isinstance(value, str):
        _check_text(value, node, path, doc, walk, walk.breaks, "value")
    return value


def _check_text(text: str, node: yaml.Node, path: Path, doc: Located, walk: _Walk, allow: str, what: str) -> None:
    i = hidden_char(text, allow)
    if i is not None:
        walk.report(node, doc, path, f"the {what} {shown(text)} holds {char_name(text[i])}: control and invisible "
                    f"characters are not allowed", _CHARACTER_HINT)


def _convert_collection(node: yaml.Node, path: Path, doc: Located, walk: _Walk) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == f"{_CORE}merge" and id(key_node) not in walk.tags:
                walk.report(key_node, doc, path, "YAML merge keys (<<) are not supported", "write the keys out")
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                doc.problems.append(Problem(doc.file, key_node.start_mark.line + 1, dotted(path),
                                            "mapping keys must be plain values"))
                continue
            key = _key(key_node, path, doc, walk)
            child = path + (key,)
            if key in out:
                doc.problems.append(Problem(doc.file, key_node.start_mark.line + 1, dotted(child),
                                            "duplicate key", "each key may appear once in a mapping"))
            doc.lines[child] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, child, doc, walk)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = path + (index,)
            doc.lines[child] = item.start_mark.line + 1
            items.append(_convert(item, child, doc, walk))
        return items
    return None


def _key(node: yaml.ScalarNode, path: Path, doc: Located, walk: _Walk) -> Any:
    """A mapping key: a plain scalar whose problems are reported at its own path (tabs and newlines too)."""
    walk.values += 1
    written = walk.tags.get(id(node))
    key = node.value if written is not None or node.tag not in _TAGS else _scalar(node)
    child = path + (key,)
    walk.span(node, child, key=True)
    if written is not None:
        walk.report(node, doc, child, f"YAML tag {_written(written)!r} is not allowed on a key",
                    "write the key as plain text")
    elif node.tag not in _TAGS:
        walk.report(node, doc, child, f"cannot read the key {node.value[:40]!r} (YAML reads it as "
                    f"{_written(node.tag)})", "quote it to make it a string")
    if isinstance(key, str):
        _check_text(key, node, child, doc, walk, "", "key")
    return key


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:   # e.g. a date such as 2024-13-45
        raise _Refused(node.start_mark.line + 1, f"cannot read the value {node.value[:40]!r}: {exc}",
                       "quote it to make it a string") from None
    finally:
        loader.dispose()
