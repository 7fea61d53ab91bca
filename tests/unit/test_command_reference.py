"""Every command documents itself: an example in its --help, and an up-to-date reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("gen_ref", str(REPO / "scripts" / "gen-command-reference"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gen_ref", loader))
    loader.exec_module(module)
    return module


def _leaf_commands():
    from typer.main import get_command

    from mctl.cli.main import build_app

    root = get_command(build_app(None))

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, path + [name])
        else:
            yield " ".join(path), cmd

    yield from walk(root, ["mctl"])


def test_every_command_has_an_example():
    missing = [path for path, cmd in _leaf_commands() if "Example: mctl" not in (cmd.help or "")]
    assert missing == []


def test_reference_is_current():
    current = (REPO / "docs" / "commands" / "reference.md").read_text()
    assert current == _generator().render(), "run scripts/gen-command-reference and commit docs/commands/reference.md"
