"""`mctl health catalogue`: every check has its severity, purposes, source, thresholds and lab fault, and
every lab fault it names is one `mctl lab fault` takes (parsed by the lab's own command, validated by
its own rules: nothing is run)."""

from __future__ import annotations

import json
import shlex

import pytest
import typer

from mctl.checks import catalogue
from mctl.cli import lab as lab_cli
from mctl.lab import faults as faultlib
from mctl.model.tray import PURPOSES
from tests.unit.cli_helpers import run_cli

ENTRIES = catalogue.entries()


def test_every_check_says_what_it_follows_and_how_it_is_exercised():
    assert len(ENTRIES) == len(catalogue.CHECKS) >= 60
    for c in ENTRIES:
        assert c.severity is not None and c.purposes and set(c.purposes) <= set(PURPOSES), c.id
        assert len(c.source) > 5 and len(c.thresholds) > 5, c.id
        assert c.lab.startswith("mctl lab fault ") or (c.lab.startswith("none: ") and len(c.lab) > 12), c.id
    for new in ("nvlink.errors", "gpu.clocks"):
        assert catalogue.spec(new).lab.startswith("mctl lab fault gpu ")


def _fault_context(command: str) -> tuple[str, click.Context]:
    words = shlex.split(command)
    assert words[:3] == ["mctl", "lab", "fault"], command
    group = typer.main.get_command(lab_cli.app).commands["fault"]
    sub = group.commands[words[3]]
    return words[3], sub.make_context(words[3], words[4:])


@pytest.mark.parametrize("check", [c for c in ENTRIES if c.lab.startswith("mctl ")], ids=lambda c: c.id)
def test_each_named_lab_fault_exists(check):
    target, ctx = _fault_context(check.lab)
    if target in faultlib.TARGETS:
        params = {("unreachable" if k == "freeze" else k): v for k, v in ctx.params.items()}   # host --freeze
        fields = {k: v for k, v in params.items() if k in faultlib.FIELDS[target]}
        faultlib.validate(faultlib.FaultRequest(target=target, **fields))
    elif target == "nmx":
        from mctl.lab import nmx_faults

        assert ctx.params["kind"] in nmx_faults.NMX_FAULTS
    else:
        assert target == "bmc" and any(v not in (None, False) for k, v in ctx.params.items()
                                       if k in ("leak", "psu_fail", "hang", "slow")), check.lab


def test_an_unknown_flag_would_be_caught():
    with pytest.raises(Exception, match="No such option: --no-such-flag"):
        _fault_context("mctl lab fault gpu lab-r1-tray03 --no-such-flag")


def test_the_command_prints_every_check_and_json(capsys):
    res = run_cli(capsys, "health", "catalogue", "--json")
    assert res.code == 0, res.err
    doc = json.loads(res.out)
    assert [c["id"] for c in doc["checks"]] == [c.id for c in ENTRIES]
    errors = next(c for c in doc["checks"] if c["id"] == "nvlink.errors")
    assert errors["severity"] == "critical" and "DCGM" in errors["source"] and "100/s" in errors["thresholds"]
    text = run_cli(capsys, "health", "catalogue")
    assert text.code == 0 and f"{len(ENTRIES)} checks" in text.out
    assert "gpu.clocks  (critical, milder form warns; audit, health, node-check)" in text.out
