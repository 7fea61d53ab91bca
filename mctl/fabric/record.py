"""Record a rack's desired partitions in mctl.yml, keeping everything else of the file as it was.

Partitions are desired state and the inventory is where desired state lives, so
`mctl partition create` writes them there before touching NMX-M. No round-trip
YAML library is available, so the `racks.<rack>.partitions` block is replaced
as text: the loader's line numbers locate the rack and the key, indentation
bounds the block, and everything outside it (comments, order, quoting) is kept
byte for byte. Comments inside the replaced block are not kept. The candidate
file is validated with the normal loader before it replaces the original, and
the original is kept as mctl.yml.bak.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import yaml
from ClusterShell.NodeSet import NodeSet

from mctl.errors import InventoryError, UsageError
from mctl.inventory.yamlsrc import load_yaml
from mctl.model.site import Partition

if TYPE_CHECKING:
    from mctl.model.site import Site


@dataclass(frozen=True)
class InventoryEdit:
    path: Path
    old_text: str
    new_text: str

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text

    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.old_text.splitlines(keepends=True),
                                            self.new_text.splitlines(keepends=True),
                                            fromfile=str(self.path), tofile=str(self.path)))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _scalar(value: str) -> str:
    """Plain YAML when it reads back as the same string, else a double-quoted (JSON) string."""
    import json
    try:
        plain_ok = yaml.safe_load(value) == value and ": " not in value and " #" not in value
    except yaml.YAMLError:
        plain_ok = False
    return value if plain_ok and value.strip() == value else json.dumps(value)


def render_block(partitions: Sequence[Partition], indent: int) -> list[str]:
    pad = " " * indent
    if not partitions:
        return [f"{pad}partitions: []\n"]
    lines = [f"{pad}partitions:\n"]
    for p in partitions:
        lines.append(f"{pad}  - name: {_scalar(p.name)}\n")
        lines.append(f"{pad}    trays: {_scalar(str(NodeSet.fromlist(list(p.trays))))}\n")
    return lines


def edit_partitions(site: "Site", rack: str, partitions: Sequence[Partition]) -> InventoryEdit:
    """The inventory text with rack's partitions block replaced (validated; nothing written)."""
    path = site.file
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    doc = load_yaml(text, str(path))
    if ("racks", rack) not in doc.lines:
        raise UsageError(f"rack {rack} is not in {path}")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    rack_idx = doc.lines[("racks", rack)] - 1
    rack_indent = _indent(lines[rack_idx])
    # The rack's block: every following line more indented than the rack key.
    last = rack_idx
    child_indent = None
    for i in range(rack_idx + 1, len(lines)):
        if not _content(lines[i]):
            continue
        if _indent(lines[i]) <= rack_indent:
            break
        last = i
        if child_indent is None:
            child_indent = _indent(lines[i])
    if child_indent is None:
        raise UsageError(f"rack {rack} in {path} has no keys to extend", hint="edit the file by hand")
    key = ("racks", rack, "partitions")
    if key in doc.lines:
        start = doc.lines[key] - 1
        key_indent = _indent(lines[start])
        end = start + 1
        for i in range(start + 1, len(lines)):
            if not _content(lines[i]):
                continue
            ind = _indent(lines[i])
            if ind > key_indent or (ind == key_indent and lines[i].lstrip().startswith("- ")):
                end = i + 1
                continue
            break
        new_lines = lines[:start] + render_block(partitions, key_indent) + lines[end:]
    else:
        new_lines = lines[:last + 1] + render_block(partitions, child_indent) + lines[last + 1:]
    edit = InventoryEdit(path, text, "".join(new_lines))
    _check(site, rack, edit, partitions)
    return edit


def _check(site: "Site", rack: str, edit: InventoryEdit, partitions: Sequence[Partition]) -> None:
    from mctl.inventory import validate_inventory

    fd, tmp = tempfile.mkstemp(prefix=f".{edit.path.name}.", suffix=".check.yml", dir=edit.path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(edit.new_text)
        checked, problems = validate_inventory(tmp)
    finally:
        os.unlink(tmp)
    if problems or checked is None:
        for p in problems:
            p.file = str(edit.path)
        raise InventoryError(problems or [], str(edit.path))
    got = [(p.name, tuple(p.trays)) for p in checked.racks[rack].partitions]
    want = [(p.name, tuple(sorted(p.trays, key=_natural))) for p in partitions]
    if sorted(got) != sorted((n, tuple(sorted(t, key=_natural))) for n, t in want):
        raise UsageError(f"rewriting the partitions of rack {rack} in {edit.path} did not read back as intended",
                         hint="edit the racks.<rack>.partitions block by hand; 'mctl inventory validate' checks it")


def write_edit(edit: InventoryEdit) -> Path | None:
    """Replace the inventory atomically, keeping the previous text as <file>.bak; None when nothing changed."""
    from mctl.state.files import atomic_write

    if not edit.changed:
        return None
    current = edit.path.read_text()
    if current != edit.old_text:
        raise UsageError(f"{edit.path} changed while mctl was editing it", hint="run the command again")
    mode = edit.path.stat().st_mode & 0o7777
    backup = edit.path.with_name(edit.path.name + ".bak")
    atomic_write(backup, edit.old_text, mode=mode)
    atomic_write(edit.path, edit.new_text, mode=mode)
    return backup


def _natural(name: str) -> tuple:
    import re
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
