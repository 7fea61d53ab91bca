"""CLI conventions shared by every command: help, version, errors, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "inventories" / "example-gb200")


def test_version(capsys):
    result = run_cli(capsys, "--version")
    assert result.code == 0
    assert result.out.strip() == "mctl 0.1.0"


def test_help_short_alias_and_example(capsys):
    result = run_cli(capsys, "-h")
    assert result.code == 0
    assert "Usage: mctl" in result.out
    assert "--inventory" in result.out and "MCTL_INVENTORY" in result.out
    assert "Example: mctl" in result.out


def test_no_arguments_prints_help(capsys):
    result = run_cli(capsys)
    assert result.code == 0
    assert "Commands" in result.out


def test_unknown_command_is_usage_error(capsys):
    result = run_cli(capsys, "frobnicate")
    assert result.code == 2
    assert "mctl: error: No such command 'frobnicate'" in result.err
    assert "Traceback" not in result.err


def test_unknown_option_is_usage_error(capsys):
    result = run_cli(capsys, "-i", EXAMPLE, "inventory", "show", "--nope")
    assert result.code == 2
    assert "No such option: --nope" in result.err
    assert "hint: see 'mctl inventory show --help'" in result.err


def test_inventory_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("MCTL_INVENTORY", EXAMPLE)
    result = run_cli(capsys, "inventory", "show", "rack-b")
    assert result.code == 0
    assert "rack-b-tray18" in result.out and "rack-a-tray01" not in result.out


def test_json_before_or_after_subcommand(capsys):
    for args in (("--json", "inventory", "show"), ("inventory", "show", "--json")):
        result = run_cli(capsys, "-i", EXAMPLE, *args)
        assert result.code == 0
        data = json.loads(result.out)
        assert data["site"] == "example-gb200"
        assert [r["name"] for r in data["racks"]] == ["rack-a", "rack-b"]
        tray = next(h for h in data["racks"][0]["hosts"] if h["name"] == "rack-a-tray10")
        assert tray == {"name": "rack-a-tray10", "role": "compute", "address": "10.20.1.20", "bmc": "10.20.9.20",
                        "image": "gb200-ubuntu24.04", "partition": "p1", "vars": {}}


def test_unknown_rack_lists_known(capsys):
    result = run_cli(capsys, "-i", EXAMPLE, "inventory", "show", "rack-z")
    assert result.code == 2
    assert "unknown rack 'rack-z'" in result.err
    assert "known racks: rack-a, rack-b" in result.err


def test_plain_output_without_tty_has_no_escape_codes(processes):
    env = dict(os.environ, COLUMNS="120")
    env.pop("NO_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "mctl", "-i", EXAMPLE, "inventory", "show", "rack-a"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    assert "rack-a-tray01" in proc.stdout


def test_console_script_exit_code_for_bad_input(tmp_path, processes):
    proc = subprocess.run([sys.executable, "-m", "mctl", "-i", str(tmp_path / "missing"), "inventory", "validate"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("mctl: error: inventory not found")
    assert "Traceback" not in proc.stderr


def test_state_dir_option_and_env(capsys, monkeypatch, tmp_path):
    from mctl.cli.context import options

    monkeypatch.setenv("MCTL_STATE_DIR", str(tmp_path / "env"))
    run_cli(capsys, "-i", EXAMPLE, "inventory", "validate")
    assert options().state_dir == tmp_path / "env"
    run_cli(capsys, "--state-dir", str(tmp_path / "opt"), "-i", EXAMPLE, "inventory", "validate")
    assert options().state_dir == tmp_path / "opt"


def test_shell_completion_is_offered(capsys, monkeypatch):
    # Typer finds the shell from the parent processes (shellingham); a test run without a login shell above it
    # (CI, a detached run) has none, so the test says which shell the operator runs.
    import shellingham

    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    result = run_cli(capsys, "--show-completion")
    assert result.code == 0
    assert "complete" in result.out
