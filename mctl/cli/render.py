"""The only place that writes to the terminal.

Rich on a TTY; plain text (no colour, no live widgets) when stdout is not a
terminal or NO_COLOR is set; JSON when --json is given.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # rich costs ~50 ms to import; `mctl --help` and --json never need it
    from rich.console import Console
    from rich.table import Table as _DataTable
    from rich.text import Text

_console: Console | None = None
_err: Console | None = None


def _plain() -> bool:
    return "NO_COLOR" in os.environ or not sys.stdout.isatty()


def console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        plain = _plain()
        _console = Console(no_color=plain, highlight=False, soft_wrap=plain,
                           force_terminal=None if not plain else False,
                           width=int(os.environ.get("COLUMNS", "0")) or (None if not plain else 200))
    return _console


def err_console() -> Console:
    global _err
    if _err is None:
        from rich.console import Console

        plain = "NO_COLOR" in os.environ or not sys.stderr.isatty()
        _err = Console(stderr=True, no_color=plain, highlight=False,
                       force_terminal=None if not plain else False, width=None if not plain else 200)
    return _err


def reset() -> None:
    """Forget cached consoles (tests swap stdout between invocations)."""
    global _console, _err
    _console = None
    _err = None


def interactive() -> bool:
    return not _plain()


def line(text: str = "") -> None:
    """One line of text, printed as is (no markup); rich only on a terminal."""
    if _plain():
        sys.stdout.write(text + "\n")
    else:
        console().print(text, markup=False, highlight=False)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table: rich's on a terminal; off a terminal (pipes, cron, scripts) aligned plain columns,
    one row per line, which `grep` and `awk` read and which needs no rich import at all."""
    if not _plain():
        t = data_table(title=title, title_justify="left")
        for col in columns:
            t.add_column(col)
        for row in rows:
            t.add_row(*row)
        console().print(t)
        return
    widths = [max([len(col)] + [len(row[i]) for row in rows]) for i, col in enumerate(columns)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = ([title] if title else []) + [fmt(columns), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    sys.stdout.write("\n".join(out) + "\n")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=_default) + "\n")
    sys.stdout.flush()


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f)}


def printable(text: Any) -> str:
    """Control characters in data (an ESC sequence in a name, a reason, a lock record) shown as \\xNN,
    so an error or warning cannot move the cursor, retitle the terminal or hide text. Newline and tab stay."""
    return str(text).translate(_CONTROL)


def error(message: str, hint: str | None = None) -> None:
    message, hint = printable(message), (printable(hint) if hint else hint)
    if _plain_err():
        sys.stderr.write(f"mctl: error: {message}\n" + (f"  hint: {hint}\n" if hint else ""))
        return
    con = err_console()
    con.print(f"[bold red]mctl: error:[/] {escape(message)}", markup=True, highlight=False)
    if hint:
        con.print(f"  [dim]hint:[/] {escape(hint)}", markup=True, highlight=False)


def warn(message: str) -> None:
    message = printable(message)
    if _plain_err():
        sys.stderr.write(f"mctl: warning: {message}\n")
    else:
        err_console().print(f"[yellow]mctl: warning:[/] {escape(message)}", markup=True, highlight=False)


def escape(text: Any) -> str:
    """*text* as rich markup that prints literally: data (names, reasons, messages) is never markup.
    rich.markup.escape also doubles a trailing backslash, which would otherwise escape the tag after it."""
    from rich.markup import escape as _escape

    return _escape(str(text))


def cell(value: Any) -> "Text":
    """A table cell that holds data: a rich Text, never parsed as markup."""
    from rich.text import Text

    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def data_table(*args: Any, **kwargs: Any) -> "_DataTable":
    """A rich Table whose cells, title and column names are data: add_row() and add_column() take plain
    strings and never read them as markup (`[/x]` or `[bold]` in a tray or partition name prints as is)."""
    from rich.table import Table

    class _Table(Table):
        def add_column(self, header: Any = "", *a: Any, **kw: Any) -> None:
            super().add_column(cell(header), *a, **kw)

        def add_row(self, *cells: Any, **kw: Any) -> None:
            super().add_row(*(cell(c) for c in cells), **kw)

    if "title" in kwargs and isinstance(kwargs["title"], str):
        kwargs["title"] = cell(kwargs["title"])
    return _Table(*args, **kwargs)


def _plain_err() -> bool:
    return "NO_COLOR" in os.environ or not sys.stderr.isatty()
