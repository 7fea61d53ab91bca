"""A flag means one thing in every command: walk every command's parameters (click, through typer)
and fail on a flag name with two help texts or types, on a command that defines inline an option
mctl/cli/options.py defines, and on a flag more than one command takes that options.py does not hold."""

from __future__ import annotations

import inspect
from typing import Any, get_args, get_origin

import pytest

from mctl.cli import options as shared

# The flags still to be given one meaning (docs/decisions.md D65): none are left; keep it empty.
PENDING: dict = {}


def _commands():
    from typer.main import get_command

    from mctl.cli.main import build_app

    def walk(cmd, path):
        yield " ".join(path), cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, path + [name])

    yield from walk(get_command(build_app(None)), [])


def _meaning(param) -> tuple:
    """What a flag means to the operator: its names, help, type and kind (not its default: a command may
    read its default from the inventory and say so in its own help)."""
    t = param.type
    kind = (type(t).__name__, getattr(t, "min", None), getattr(t, "max", None), getattr(t, "min_open", None),
            getattr(t, "max_open", None), tuple(getattr(t, "choices", ()) or ()), getattr(t, "dir_okay", None),
            getattr(t, "file_okay", None), getattr(t, "exists", None))
    return (tuple(sorted(param.opts)), tuple(sorted(param.secondary_opts)), param.help, kind, param.is_flag,
            param.multiple, param.count, param.metavar)


def _uses() -> dict[str, list[tuple[str, Any]]]:
    """flag -> [(command, click option)] over every command, the root included."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for path, cmd in _commands():
        for p in cmd.params:
            if p.param_type_name == "option":
                for flag in (*p.opts, *p.secondary_opts):
                    out.setdefault(flag, []).append((path or "mctl", p))
    return out


def _flags(info: Any) -> list[str]:
    """The flags a typer OptionInfo declares (under Annotated, typer keeps the first one as its default)."""
    decls = list(getattr(info, "param_decls", None) or ())
    first = getattr(info, "default", None)
    if isinstance(first, str) and first.startswith("-"):
        decls.insert(0, first)
    return [flag for decl in decls for flag in decl.split("/")]


def _shared() -> dict[str, Any]:
    """flag -> the typer OptionInfo options.py defines for it."""
    found = {}
    for value in vars(shared).values():
        if get_origin(value) is not None and len(get_args(value)) > 1:
            info = get_args(value)[1]
            for flag in _flags(info):
                found[flag] = info
    return found


def _inline() -> list[tuple[str, str]]:
    """(command, flag) for every option a command defines itself although options.py defines that flag."""
    defined = _shared()
    out = []
    for path, cmd in _commands():
        func = getattr(cmd.callback, "__wrapped__", None)
        if func is None:
            continue
        for name, prm in inspect.signature(func, eval_str=True).parameters.items():
            infos = [a for a in get_args(prm.annotation)[1:]] + [prm.default]
            for info in infos:
                for flag in _flags(info):
                    if flag in defined and info is not defined[flag]:
                        out.append((path, flag))
    return out


def _offences() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    inline = set(_inline())
    defined = _shared()
    for flag, where in _uses().items():
        meanings: dict[tuple, list[str]] = {}
        for path, p in where:
            meanings.setdefault(_meaning(p), []).append(path)
        if len(meanings) > 1:
            # the meaning options.py gives the flag, else the one most commands give it
            ours = [m for m, paths in meanings.items() if any((path, flag) not in inline for path in paths)]
            common = ours[0] if flag in defined and ours else max(meanings, key=lambda m: len(meanings[m]))
            for meaning, paths in meanings.items():
                for path in paths if meaning != common else ():
                    found[(path, flag)] = f"{flag} means something else here than in {', '.join(meanings[common])}"
        commands = {path for path, _ in where if path != "mctl"}
        if len(commands) > 1 and flag not in defined:
            for path in commands:
                found.setdefault((path, flag), f"{flag} is taken by {len(commands)} commands and not in options.py")
    for path, flag in inline:
        found.setdefault((path, flag), f"{flag} is defined inline; options.py defines it")
    return found


def test_every_flag_has_one_meaning_and_one_definition():
    offences = {k: v for k, v in _offences().items() if k not in PENDING}
    assert offences == {}


def test_the_pending_flags_are_still_pending():
    """A flag its owner fixed leaves PENDING (the list only shrinks)."""
    offences = _offences()
    assert [k for k in PENDING if k not in offences] == []


def test_the_renamed_flags():
    uses = _uses()
    assert {p for p, _ in uses["--passed"]} == {"health check", "node check"}
    assert {p for p, _ in uses["--all"]} == {"rack inventory", "audit run"}
    assert {p for p, _ in uses["--imex-wait"]} == {"rack bring-up", "imex apply"}
    assert [p for p, _ in uses["--file-diff"]] == ["provision"] and "provision" not in {p for p, _ in uses["--diff"]}
    assert [p for p, _ in uses["-f"]] == ["exec"]
    assert {p for p, o in uses["-t"] if o.name == "timeout"} >= {"exec", "health check", "audit run", "bmc inventory"}


@pytest.mark.parametrize("flag", ["--json", "--dry-run", "--timeout", "--all", "--yes", "--force"])
def test_shared_flags_come_from_options_py(flag):
    assert flag in _shared()
