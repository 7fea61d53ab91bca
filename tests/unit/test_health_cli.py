"""mctl health / mctl node without hosts: help, examples, usage errors, state-only commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mctl.health import store
from mctl.health.breaker import BreakerState
from tests.unit.cli_helpers import run_cli

EXAMPLE = str(Path(__file__).resolve().parents[2] / "inventories" / "example-gb200")
COMMANDS = [("health", "check"), ("health", "watch"), ("health", "drains"), ("health", "resume"),
            ("health", "breaker", "status"), ("health", "breaker", "reset"), ("node", "check"),
            ("node", "install-check")]


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(w))
def test_every_command_has_an_example(capsys, words):
    r = run_cli(capsys, *words, "--help")
    assert r.code == 0 and f"Example: mctl " in r.out


def test_json_and_dry_run_where_they_belong(capsys):
    for words in COMMANDS:
        out = run_cli(capsys, *words, "--help").out
        if words[-1] in ("check", "drains", "resume", "status", "reset", "install-check"):
            assert "--json" in out, words
        if words[-1] in ("check", "watch", "resume", "reset", "install-check"):
            assert "--dry-run" in out, words


def test_bad_fail_on_and_unknown_trays_are_usage_errors(capsys, tmp_path):
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "health", "check", "--fail-on", "info")
    assert r.code == 2 and "--fail-on" in r.err
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "health", "check", "rack-z-tray[01-02]")
    assert r.code == 2 and "unknown host" in r.err and "known racks: rack-a, rack-b" in r.err
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "health", "check", "rack-a-head")
    assert r.code == 2 and "names no compute trays" in r.err


def test_breaker_status_and_reset_work_on_the_state_alone(capsys, tmp_path):
    state = store.HealthState("example", breaker=BreakerState(True, 1.0, "draining x would make 5 of 18",
                                                              ((1.0, "rack-a-tray01", "rack-a"),)))
    store.save_state(tmp_path, state)
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "--json", "health", "breaker", "status")
    data = json.loads(r.out)
    assert r.code == 0 and data["tripped"] is True and data["max_drained_share"] == 0.25
    r = run_cli(capsys, "--state-dir", str(tmp_path), "health", "breaker", "reset", "--dry-run")
    assert r.code == 0 and "would reset" in r.out and store.load_state(tmp_path).breaker.tripped
    r = run_cli(capsys, "--state-dir", str(tmp_path), "health", "breaker", "reset")
    assert r.code == 0 and "reset the circuit breaker" in r.out
    assert store.load_state(tmp_path).breaker == BreakerState()
    (entry,) = store.read_actions(tmp_path)
    assert entry.action == "breaker-reset" and entry.was_tripped is True and entry.cleared_drains == 1


def test_node_check_with_a_missing_config_is_a_usage_error(capsys, tmp_path):
    r = run_cli(capsys, "node", "check", "--config", str(tmp_path / "nope.json"))
    assert r.code == 2 and "no config file" in r.err


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_node_check_runs_here_without_gpus(capsys, tmp_path, processes):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"schema": 1, "node": "here", "scheduler": None, "drain": False,
                                  "expect": {"host": "here"}, "settings": {"disk_paths": ["/"]}}))
    r = run_cli(capsys, "--json", "node", "check", "--config", str(config), "--no-nvml")
    data = json.loads(r.out)
    assert r.code == 1 and data["node"] == "here"
    assert "gpu.facts" in [f["check"] for f in data["findings"] if f["severity"] == "critical"]
