"""Run the CLI in-process and capture what it prints, as a user would see it."""

from __future__ import annotations

from dataclasses import dataclass

from mctl.cli.main import main


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(capsys, *args: str) -> Result:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)
