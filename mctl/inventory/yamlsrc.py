"""YAML loading that remembers where every value came from.

Validation errors must name the file and line of the field at fault, so the
document is composed into nodes first and converted by hand, recording each
key's line. Duplicate keys, which plain PyYAML silently collapses, are reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from mctl.errors import Problem

Path = tuple[Any, ...]


@dataclass
class Located:
    """A loaded document plus the 1-based line of every path in it."""

    data: Any
    file: str
    lines: dict[Path, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

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
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


# Bounds that keep a hostile document from hanging or crashing the loader: an alias bomb
# (`a: &a [*b, *b, ...]` nine levels deep is a billion values), a self-referencing alias,
# nesting deeper than Python's stack.
MAX_DEPTH = 40
MAX_VALUES = 100_000
# The only tags an inventory may use (implicitly, by writing plain values): no !!binary,
# !!set, !!python/..., or application tags.
_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")}


class _Refused(Exception):
    def __init__(self, line: int | None, message: str, hint: str | None = None):
        super().__init__(message)
        self.line, self.message, self.hint = line, message, hint


class _Loader(yaml.SafeLoader):
    """SafeLoader's composer with a depth limit, so deep nesting is a located problem, not a RecursionError."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(mark.line + 1, f"nested more than {MAX_DEPTH} levels deep",
                               "an inventory is a few levels of mappings and lists")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, file: str) -> Located:
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
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
        doc.data = _convert(node, (), doc, _Walk())
    except _Refused as exc:
        doc.data = None
        doc.problems.append(Problem(file, exc.line, "", exc.message, exc.hint))
    return doc


class _Walk:
    """What one conversion has seen: the nodes on the current path (a cycle is an alias to an ancestor),
    and how many values it has produced so far (aliases repeat values without repeating text)."""

    def __init__(self) -> None:
        self.path: set[int] = set()
        self.values = 0


def _convert(node: yaml.Node, path: Path, doc: Located, walk: _Walk) -> Any:
    line = node.start_mark.line + 1
    walk.values += 1
    if walk.values > MAX_VALUES:
        raise _Refused(line, f"the document stands for more than {MAX_VALUES:,} values",
                       "YAML aliases (*name) repeat whole subtrees; write the values out instead")
    if node.tag == "tag:yaml.org,2002:merge":
        raise _Refused(line, "YAML merge keys (<<) are not supported in an inventory", "write the keys out")
    if node.tag not in _TAGS:
        raise _Refused(line, f"YAML tag {node.tag!r} is not allowed in an inventory",
                       "write plain strings, numbers, booleans, lists and mappings")
    if id(node) in walk.path:
        raise _Refused(line, "a YAML alias refers to a value that contains it (a loop)",
                       "remove the alias (*name) or point it at another value")
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        walk.path.add(id(node))
        try:
            return _convert_collection(node, path, doc, walk)
        finally:
            walk.path.discard(id(node))
    return _scalar(node)


def _convert_collection(node: yaml.Node, path: Path, doc: Located, walk: _Walk) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _convert(key_node, path, doc, walk)
            if isinstance(key, (list, dict)):
                doc.problems.append(Problem(doc.file, key_node.start_mark.line + 1, dotted(path),
                                            "mapping keys must be plain values"))
                continue
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


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:   # e.g. a date such as 2024-13-45
        raise _Refused(node.start_mark.line + 1, f"cannot read the value {node.value[:40]!r}: {exc}",
                       "quote it to make it a string") from None
    finally:
        loader.dispose()
