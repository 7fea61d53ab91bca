"""partition/imex CLI paths that need no NMX-M and no SSH (offline listing, recording only, rendering)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example-gb200"
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "imex"


@pytest.fixture()
def inv(tmp_path):
    """A copy of the example inventory whose images_dir still resolves."""
    dest = tmp_path / "inventories" / "example-gb200"
    shutil.copytree(EXAMPLE, dest)
    shutil.copytree(REPO / "images", tmp_path / "images")
    return dest


def test_every_command_has_an_example(capsys):
    for noun, verbs in (("partition", ("list", "show", "templates", "create", "delete", "apply")),
                        ("imex", ("render", "status", "apply"))):
        for verb in verbs:
            result = run_cli(capsys, noun, verb, "--help")
            assert result.code == 0 and f"Example: mctl -i inventories/lab {noun} {verb}" in result.out, (noun, verb)


def test_templates_without_inventory(capsys):
    result = run_cli(capsys, "partition", "templates", "--json")
    rows = {r["template"]: r for r in json.loads(result.out)["templates"]}
    assert rows["3x6"]["trays_each"] == 6 and rows["18x1"]["partitions"] == 18


def test_offline_list(capsys):
    result = run_cli(capsys, "-i", str(EXAMPLE), "partition", "list", "--offline", "--json")
    assert result.code == 0
    racks = {r["rack"]: r for r in json.loads(result.out)["racks"]}
    assert [(p["name"], p["state"], p["desired_trays"]) for p in racks["rack-a"]["partitions"]] == [
        ("p0", "declared", "rack-a-tray[01-09]"), ("p1", "declared", "rack-a-tray[10-18]")]


def test_create_records_only_and_dry_run_changes_nothing(inv, tmp_path, capsys):
    before = (inv / "mctl.yml").read_text()
    base = ["-i", str(inv), "--state-dir", str(tmp_path / "state")]
    dry = run_cli(capsys, *base, "partition", "create", "rack-a", "--template", "3x6", "--no-apply", "--dry-run")
    assert dry.code == 0, dry.err
    assert "p0=rack-a-tray[01-09]; p1=rack-a-tray[10-18] -> p0=rack-a-tray[01-06]" in dry.out
    assert (inv / "mctl.yml").read_text() == before
    done = run_cli(capsys, *base, "partition", "create", "rack-a", "--template", "3x6", "--no-apply", "--json")
    assert done.code == 0, done.err
    data = json.loads(done.out)
    assert data["inventory_changed"] and not data["applied"] and data["plan"] is None
    assert (inv / "mctl.yml.bak").read_text() == before
    shown = json.loads(run_cli(capsys, "-i", str(inv), "inventory", "show", "rack-a", "--json").out)
    assert [p["trays"] for p in shown["racks"][0]["partitions"]] == ["rack-a-tray[01-06]", "rack-a-tray[07-12]",
                                                                    "rack-a-tray[13-18]"]
    more = run_cli(capsys, *base, "partition", "create", "rack-a", "p3", "--trays", "rack-a-tray18", "--no-apply")
    assert more.code == 2 and "partitions overlap" in more.err
    removed = run_cli(capsys, *base, "partition", "delete", "rack-a", "p2", "--no-apply")
    assert removed.code == 0, removed.err
    added = run_cli(capsys, *base, "partition", "create", "rack-a", "p9", "--trays", "rack-a-tray[13-18]",
                    "--no-apply")
    assert added.code == 0, added.err
    assert "- name: p9\n        trays: rack-a-tray[13-18]" in (inv / "mctl.yml").read_text()


def test_create_input_errors(inv, capsys):
    base = ["-i", str(inv)]
    both = run_cli(capsys, *base, "partition", "create", "rack-a", "x", "--template", "2x9")
    assert both.code == 2 and "drop NAME" in both.err
    none = run_cli(capsys, *base, "partition", "create", "rack-a")
    assert none.code == 2 and "exactly one of" in none.err
    other = run_cli(capsys, *base, "partition", "create", "rack-a", "x", "--trays", "rack-b-tray01", "--no-apply")
    assert other.code == 2 and "belongs to rack rack-b" in other.err
    half = run_cli(capsys, *base, "partition", "create", "rack-a", "x", "--gpus", "rack-a-tray01:0")
    assert half.code == 2 and "smaller than one tray" in half.err
    nocred = run_cli(capsys, *base, "partition", "apply", "rack-a", "--dry-run")
    assert nocred.code == 2 and "credentials file" in nocred.err and "does not exist" in nocred.err


def test_imex_render(inv, tmp_path, capsys):
    base = ["-i", str(inv)]
    one = run_cli(capsys, *base, "imex", "render", "rack-a", "--tray", "rack-a-tray03")
    assert one.code == 0
    assert (GOLDEN / "config-rack-a-tray03.cfg").read_text() in one.out + "\n"
    assert (GOLDEN / "nodes_config-rack-a-p0.cfg").read_text().rstrip("\n") in one.out
    out = tmp_path / "render"
    written = run_cli(capsys, *base, "imex", "render", "rack-b", "--out", str(out), "--json")
    data = json.loads(written.out)
    assert [d["domain"] for d in data["domains"]] == ["all"] and len(data["trays"]) == 18
    nodes = (out / "rack-b-tray07" / "etc/nvidia-imex/nodes_config.cfg").read_text().split()
    assert nodes == [f"10.20.3.{i}" for i in range(11, 29)]
    job = run_cli(capsys, *base, "imex", "render", "rack-a", "--scope", "job", "--out", str(out))
    assert job.code == 0 and os.access(out / "prolog.d" / "90-mctl-imex.sh", os.X_OK)
    assert (out / "epilog.d" / "90-mctl-imex.sh").read_text() == (GOLDEN / "epilog.sh").read_text()
    bad = run_cli(capsys, *base, "imex", "render", "rack-a", "--tray", "rack-b-tray01")
    assert bad.code == 2 and "not a compute tray of rack rack-a" in bad.err
