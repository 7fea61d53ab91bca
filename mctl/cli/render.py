"""The only place that writes to the terminal.

Rich on a TTY; plain text (no colour, no live widgets) when stdout is not a
terminal or NO_COLOR is set; JSON when --json is given. Commands say *what* to
show through one `Output` (`output(json_)`), which decides *how*; the module
functions below are its primitives (and what partition.py and lab.py still call
until they take an Output too).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Sequence, Union

if TYPE_CHECKING:  # rich costs ~50 ms to import; `mctl --help` and --json never need it
    from rich.console import Console, RenderableType
    from rich.live import Live
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


def _plain_in() -> bool:
    """No terminal to ask on: stdin (the answer) or stderr (the question) is not one."""
    return not (sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty())


def write(text: str, *, err: bool = False) -> None:
    """Text as it is, on stdout or stderr: help, the version, a traceback (the error boundary's own)."""
    (sys.stderr if err else sys.stdout).write(text)


# ------------------------------------------------------------------ the one output path of the commands

@dataclass(frozen=True)
class Column:
    """A table column: *fold* wraps long cells inside the column, *right* aligns numbers (rich tables)."""

    name: str
    fold: bool = False
    right: bool = False


@dataclass(frozen=True)
class Styled:
    """A cell whose *style* (rich's) shows on a terminal only; elsewhere it is its text."""

    text: str
    style: str


Cell = Union[str, Styled]


class HostProgress:
    """One spinner line per host on a terminal, updated as its events come and gone at the end; nothing
    elsewhere (the caller prints what must stay: failures, summaries). Open it with `with`, or
    start()/stop() around a phase."""

    def __init__(self, hosts: Sequence[str], live: bool):
        self.hosts = list(hosts)
        self.live = live
        self._progress: Any = None
        self._rows: dict[str, Any] = {}

    def start(self) -> "HostProgress":
        if self.live and self._progress is None:
            from rich.progress import Progress, SpinnerColumn, TextColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console(),
                                      transient=True)
            self._progress.__enter__()
            self._rows = {h: self._progress.add_task(escape(printable(f"{h}: waiting"))) for h in self.hosts}
        return self

    def stop(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*(exc or (None, None, None)))
            self._progress = None

    def __enter__(self) -> "HostProgress":
        return self.start()

    def __exit__(self, *exc: Any) -> bool:
        self.stop(*exc)
        return False

    def update(self, host: str, text: str) -> bool:
        """Show *text* on *host*'s line; False when there is no such line (off a terminal, a host not listed)."""
        if self._progress is None or host not in self._rows:
            return False
        self._progress.update(self._rows[host], description=escape(printable(text)))
        return True


class Output:
    """What one command shows: told *what* (lines, tables, warnings, a result document), it decides *how*
    (ClusterShell's Display): rich on a terminal, plain text off one or with NO_COLOR, JSON with --json.

    With --json the text form (line, lines, block, verbatim, table) shows nothing: stdout is the result
    document alone, given to result(). Warnings, errors and events go to stderr in every mode; a warning
    that is also in the result document (`in_result`) is left to the document with --json. Data is never
    markup, and control characters in it are shown as \\xNN (printable), never sent to the terminal.
    """

    def __init__(self, *, json: bool = False):
        self.json = json

    @property
    def rich(self) -> bool:
        """Styles and live widgets: text on a terminal (not --json, not NO_COLOR)."""
        return not self.json and interactive()

    # ---- the text form (nothing with --json)

    def line(self, text: str = "", *, style: str | None = None, tty: Sequence[tuple[str, str]] | None = None,
             end: str = "\n") -> None:
        """One line of text (or several, with newlines). *style* colours it on a terminal; *tty* is what a
        terminal shows instead, as (text, style) pieces (a mark where plain text has a word)."""
        if self.json:
            return
        text = printable(text)
        if _plain():
            write(text + end)
            return
        if tty is not None:
            from rich.text import Text

            console().print(Text.assemble(*((printable(t), s) for t, s in tty)), highlight=False, end=end)
            return
        console().print(text, markup=False, highlight=False, emoji=False, style=style, end=end)

    def lines(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.line(text)

    def block(self, text: str) -> None:
        """Text laid out already (the node check's report, a history listing), written as it is."""
        if not self.json:
            write(text)

    def verbatim(self, text: str) -> None:
        """What hosts printed or files hold (exec output, a config diff), shown as rich shows text: tabs at
        8 columns, CR/BEL/BS/VT/FF dropped; escape sequences a host sent are its own (as clush shows them)."""
        if not self.json:
            console().out(text, highlight=False)

    def table(self, title: str | None, columns: Sequence[str | Column], rows: Sequence[Sequence[Cell]], *,
              boxed: bool = False) -> None:
        """A table: rich's on a terminal. Off one, aligned plain columns (grep and awk read them; no rich
        import), or with *boxed* rich's box-drawn table at the output's width, as those commands always
        printed it (docs/decisions.md D64)."""
        if self.json:
            return
        cols = [c if isinstance(c, Column) else Column(c) for c in columns]
        if _plain() and not boxed:
            table(title, [printable(c.name) for c in cols],
                  [[printable(c.text if isinstance(c, Styled) else c) for c in row] for row in rows])
            return
        from rich.text import Text

        t = data_table(title=printable(title) if title is not None else None, title_justify="left")
        for c in cols:
            t.add_column(printable(c.name), **({"overflow": "fold"} if c.fold else {}),
                         **({"justify": "right"} if c.right else {}))
        styled = not _plain()
        for row in rows:
            t.add_row(*(Text(printable(c.text), style=c.style) if isinstance(c, Styled) and styled
                        else printable(c.text if isinstance(c, Styled) else c) for c in row))
        console().print(t)

    def flush(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    # ---- the result, and what goes to stderr

    def result(self, doc: Any, text: Callable[[], None] | None = None) -> None:
        """The command's result: *doc* as JSON with --json, else *text()* (the text form, if any)."""
        if self.json:
            print_json(doc)
        elif text is not None:
            text()

    def document(self, text: str) -> None:
        """A whole report in the format the operator asked for (audit --format), written as it is, --json or not."""
        write(text)
        sys.stdout.flush()

    def warn(self, text: str, *, in_result: bool = False) -> None:
        """A warning on stderr; *in_result*: the result document carries it too, so --json leaves it there."""
        if not (in_result and self.json):
            warn(text)

    def error(self, message: str, hint: str | None = None) -> None:
        """An error on stderr that does not end the command (a failed check among others, an interruption)."""
        error(message, hint)

    def event(self, text: str) -> None:
        """Something that happened while the command runs (a host failed), on stderr, --json or not."""
        text = printable(text)
        if _plain_err():
            write(text + "\n", err=True)
        else:
            err_console().print(text, markup=False, highlight=False, emoji=False)

    # ---- asking, and live widgets (on a terminal only)

    def confirm(self, question: str, *, yes: bool, what: str) -> None:
        """Go on only when the operator says so: *yes* (--yes), or yes to *question* asked on the terminal
        (stderr, default no). No terminal to ask and no --yes: refused (exit 2); *what* names what was not done."""
        from mctl.errors import UsageError

        if yes:
            return
        if _plain_in():
            raise UsageError(f"{what} needs a confirmation and there is no terminal to ask; nothing was done",
                             hint="add --yes to go ahead without a question")
        import typer

        if not typer.confirm(printable(question), default=False, err=True):
            raise UsageError(f"not confirmed; {what}: nothing was done")

    def status(self, text: str) -> ContextManager[Any]:
        """A spinner with *text* on stderr while a long read runs, on a terminal; nothing elsewhere."""
        if not self.rich:
            return nullcontext()
        return err_console().status(escape(printable(text)))

    def hosts(self, hosts: Sequence[str]) -> HostProgress:
        """Per-host progress lines (HostProgress), live on a terminal only."""
        return HostProgress(hosts, live=self.rich)

    def screen(self, renderable: "RenderableType") -> "Live":
        """A full-screen view redrawn twice a second (the watch); only asked for where `rich` is true."""
        from rich.live import Live

        return Live(renderable, console=console(), screen=True, auto_refresh=True, refresh_per_second=2,
                    redirect_stdout=False, redirect_stderr=False)


def output(json_: bool = False) -> Output:
    """The command's Output, from the global options and its own --json (given before or after the subcommand)."""
    from mctl.cli.context import options

    return Output(json=options().json or json_)
