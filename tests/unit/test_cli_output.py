"""The one output path of the commands (mctl.cli.render.Output): what each mode shows, and that every
command module goes through it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mctl.cli import render
from mctl.errors import UsageError

CLI = Path(__file__).resolve().parents[2] / "mctl" / "cli"
# Their owners move them onto render.output() (the lead: the partition commands; the lab's engineer: lab fault).
NOT_YET: set[str] = set()          # every CLI module shows what it shows through Output


@pytest.fixture()
def terminal(monkeypatch):
    """Render as on a terminal of 100 columns, into capsys."""
    monkeypatch.setattr(render, "_plain", lambda: False)
    monkeypatch.setenv("COLUMNS", "100")
    render.reset()
    yield
    render.reset()


def test_plain_lines_tables_and_a_result_that_is_not_shown(capsys):
    out = render.Output()
    out.line("2 trays")
    out.table("rack r1", ["tray", render.Column("GPUs", right=True)],
              [["r1-tray01", "4/4"], [render.Styled("r1-tray10", "bold red"), "3/4"]])
    out.result({"trays": 2})
    out.result({"trays": 2}, lambda: out.line("text form"))
    assert capsys.readouterr().out.splitlines() == [
        "2 trays", "rack r1", "tray       GPUs", "---------  ----", "r1-tray01  4/4", "r1-tray10  3/4", "text form"]


def test_json_shows_the_document_alone_and_warnings_not_in_it(capsys):
    out = render.Output(json=True)
    out.line("not shown")
    out.lines(["nor this"])
    out.block("nor this\n")
    out.verbatim("nor this")
    out.table("t", ["a"], [["b"]], boxed=True)
    out.warn("a warning the document carries", in_result=True)
    out.warn("a warning about the run")
    out.event("t1: failed at 'x': y")
    out.result({"ok": True}, lambda: out.line("the text form"))
    cap = capsys.readouterr()
    assert json.loads(cap.out) == {"ok": True}
    assert cap.err.splitlines() == ["mctl: warning: a warning about the run", "t1: failed at 'x': y"]


def test_the_document_and_blocks_are_written_as_they_are(capsys):
    render.Output(json=True).document("<testsuites/>\n")
    render.Output().block("a\tb\n")
    assert capsys.readouterr().out == "<testsuites/>\na\tb\n"


def test_a_boxed_table_is_rich_off_a_terminal_too(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    render.reset()
    render.Output().table("drains", [render.Column("tray", fold=True), "reason"], [["t1", "mctl: xid 79"]],
                          boxed=True)
    text = capsys.readouterr().out
    render.reset()
    assert "\x1b[" not in text
    assert text.splitlines()[0] == "drains" and "│ t1   │ mctl: xid 79 │" in text


def test_control_characters_in_data_are_shown_not_sent(capsys):
    out = render.Output()
    out.line("reason \x1b]0;pwned\x07 set")
    out.table(None, ["tray"], [["t\x1b[2J1"]])
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text
    assert "reason \\x1b]0;pwned\\x07 set" in text and "t\\x1b[2J1" in text


def test_verbatim_host_output_is_shown_as_rich_shows_it(capsys):
    render.reset()
    render.Output().verbatim("127.0.0.1\tlocalhost")
    assert capsys.readouterr().out == "127.0.0.1       localhost\n"


def test_on_a_terminal_data_is_never_markup_and_marks_replace_words(capsys, terminal):
    out = render.Output()
    out.line("[bold]t1[/] :thumbs_up:", style="bold")
    out.line("error: bad key", tty=[("✗", "red"), (" bad key [/x]", "")])
    lines = capsys.readouterr().out.splitlines()
    assert "[bold]t1[/] :thumbs_up:" in lines[0]
    assert "✗ bad key [/x]" in lines[1] and "error:" not in lines[1]


def test_progress_status_and_screen_are_for_terminals_only(capsys):
    out = render.Output()
    assert not out.rich
    with out.hosts(["t1"]) as progress:
        assert progress.update("t1", "t1: ok") is False
    with out.status("reading ..."):
        pass
    assert capsys.readouterr() == ("", "")


def test_confirm_without_a_terminal_is_refused_unless_yes(monkeypatch):
    monkeypatch.setattr(render, "_plain_in", lambda: True)
    out = render.Output()
    out.confirm("power off t1?", yes=True, what="power off")         # --yes: nothing asked
    with pytest.raises(UsageError) as err:
        out.confirm("power off t1?", yes=False, what="power off t1")
    assert err.value.exit_code == 2
    assert err.value.message == "power off t1 needs a confirmation and there is no terminal to ask; nothing was done"
    assert "--yes" in err.value.hint


def test_the_global_json_and_the_command_s_own(monkeypatch):
    from mctl.cli.context import Options, options, set_options

    before = options()
    try:
        set_options(Options(json=True))
        assert render.output().json and render.output(False).json
        set_options(Options())
        assert not render.output().json and render.output(True).json
        assert not options().json                       # the command's --json is its own, not a global
    finally:
        set_options(before)


# ------------------------------------------------------------------ every command goes through Output

BANNED_CALLS = {"print", "print_json", "want_json", "console", "err_console", "echo", "secho"}
BANNED_RENDER = {"line", "table", "warn", "error", "print_json", "console", "err_console", "data_table",
                 "interactive", "escape", "cell"}
BOUNDARY = {"main.py": {"error", "write"}}      # the error boundary writes errors, help and the version


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_say":
            found.append(f"{path.name}:{node.lineno}: a _say helper of its own")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "sys" and node.attr in ("stdout", "stderr") and path.name != "main.py":
                found.append(f"{path.name}:{node.lineno}: sys.{node.attr}")
            if node.value.id == "render" and node.attr in BANNED_RENDER - BOUNDARY.get(path.name, set()):
                found.append(f"{path.name}:{node.lineno}: render.{node.attr} (use the command's Output)")
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else (
                node.func.attr if isinstance(node.func, ast.Attribute) else None)
            if name in BANNED_CALLS:
                found.append(f"{path.name}:{node.lineno}: {name}()")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mctl.cli"):
            for alias in node.names:
                if alias.name in BANNED_CALLS | {"want_json"}:
                    found.append(f"{path.name}:{node.lineno}: imports {alias.name}")
    return found


def test_every_command_module_writes_through_its_output():
    modules = sorted(p for p in CLI.glob("*.py") if p.name not in NOT_YET | {"render.py"})
    assert len(modules) > 15
    offences = [o for p in modules for o in _offences(p)]
    assert offences == []


def test_the_modules_not_moved_yet_are_the_named_ones():
    """When the owners move these onto Output, they leave NOT_YET (and want_json goes with the last)."""
    assert all(_offences(CLI / name) for name in NOT_YET)
    from mctl.cli import context

    assert not hasattr(context, "want_json")                 # gone with the last module
