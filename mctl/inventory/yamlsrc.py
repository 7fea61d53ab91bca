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


def load_yaml(text: str, file: str) -> Located:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
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
    doc.data = _convert(node, (), doc)
    return doc


def _convert(node: yaml.Node, path: Path, doc: Located) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _convert(key_node, path, doc)
            if isinstance(key, (list, dict)):
                doc.problems.append(Problem(doc.file, key_node.start_mark.line + 1, dotted(path),
                                            "mapping keys must be plain values"))
                continue
            child = path + (key,)
            if key in out:
                doc.problems.append(Problem(doc.file, key_node.start_mark.line + 1, dotted(child),
                                            "duplicate key", "each key may appear once in a mapping"))
            doc.lines[child] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, child, doc)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = path + (index,)
            doc.lines[child] = item.start_mark.line + 1
            items.append(_convert(item, child, doc))
        return items
    return _scalar(node)


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
