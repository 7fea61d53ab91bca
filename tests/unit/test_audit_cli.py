"""`mctl audit` refuses bad input with exit 2 before contacting any host."""

from __future__ import annotations

import pytest

from tests.unit.cli_helpers import run_cli
from tests.helpers import captured_lab_site


@pytest.fixture()
def inv(tmp_path):
    return str(captured_lab_site(tmp_path / "site"))


@pytest.mark.parametrize("args, said", [
    (["--format", "html"], "--format 'html': expected one of table, json, junit, prometheus"),
    (["--fail-on", "info"], "--fail-on 'info': expected warn or critical"),
    (["--drain-age", "a while"], "--drain-age 'a while' is not a duration"),
    (["lab-r9"], "unknown rack lab-r9"),
    (["lab-r1", "--all"], "give rack names or --all, not both"),
    (["--json", "--format", "junit"], "--json and --format junit contradict each other"),
    (["--timeout", "0"], "Invalid value for '--timeout'"),
])
def test_bad_input_is_exit_2(capsys, tmp_path, inv, args, said):
    res = run_cli(capsys, "-i", inv, "--state-dir", str(tmp_path / "state"), "audit", *args)
    assert res.code == 2, res.err
    assert said in res.err
    assert not (tmp_path / "state" / "audit").exists()          # refused before anything was recorded


def test_output_must_be_a_file(capsys, tmp_path, inv):
    res = run_cli(capsys, "-i", inv, "--state-dir", str(tmp_path / "state"), "audit", "--output", str(tmp_path))
    assert res.code == 2 and "is a directory" in res.err


def test_help_shows_usage_and_an_example(capsys):
    for args in (["audit", "--help"], ["audit", "run", "--help"]):
        res = run_cli(capsys, *args)
        assert res.code == 0 and "Example: mctl -i inventories/site audit --all --format prometheus" in res.out
        assert "--drain-age" in res.out and "--fail-on" in res.out
    res = run_cli(capsys, "audit", "history", "--help")
    assert res.code == 0 and "Example: mctl audit history --since 7d" in res.out
