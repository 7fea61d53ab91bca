"""The example inventory validates; each malformed one fails with file, line, field and exit 2."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mctl.inventory import load_site, validate_inventory
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example-gb200"


@pytest.fixture
def example_text() -> str:
    return (EXAMPLE / "mctl.yml").read_text().replace("images_dir: ../../images", f"images_dir: {REPO / 'images'}")


def write_inv(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "site"
    d.mkdir()
    (d / "mctl.yml").write_text(text)
    return d


def line_of(text: str, needle: str) -> int:
    """Line of *needle* in *text*; 'needle#2' means its second occurrence."""
    needle, _, nth_text = needle.partition("#")
    nth = int(nth_text or 1)
    count = 0
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            count += 1
            if count == nth:
                return i
    raise AssertionError(f"{needle!r} not in text")


def test_example_inventory_validates(capsys):
    result = run_cli(capsys, "-i", str(EXAMPLE), "inventory", "validate")
    assert result.code == 0, result.err
    assert "ok: site example-gb200: 2 racks, 36 compute trays, 3 partitions" in result.out


def test_example_inventory_model():
    site = load_site(EXAMPLE)
    rack = site.racks["rack-a"]
    assert [h.name for h in rack.compute][:2] == ["rack-a-tray01", "rack-a-tray02"]
    assert rack.compute[17].address == "10.20.1.28"
    assert rack.compute[0].bmc == "10.20.9.11"
    assert len(rack.switches) == 9 and rack.head.name == "rack-a-head"
    assert [p.nodeset for p in rack.partitions] == ["rack-a-tray[01-09]", "rack-a-tray[10-18]"]
    assert rack.partition_of("rack-a-tray12").name == "p1"
    assert site.known_hosts == EXAMPLE.resolve() / "known_hosts"
    assert site.racks["rack-b"].nvlink_domain is None


# (name, edit(text) -> text, needle locating the expected line (or None), field, message regex)
CASES = [
    ("yaml-syntax", lambda t: t.replace("  port: 22\n", "  port: [22\n"), "port: [22", "", r"YAML syntax error"),
    ("unknown-top-key", lambda t: t.replace("site: example-gb200", "site: example-gb200\nsitename: x"),
     "sitename: x", "sitename", r"unknown key"),
    ("unknown-rack-key", lambda t: t.replace("    model: nvl72\n    nvlink_domain", "    modle: nvl72\n    nvlink_domain"),
     "modle: nvl72", "racks.rack-a.modle", r"unknown key"),
    ("wrong-type", lambda t: t.replace("  port: 22", "  port: twenty-two"), "port: twenty-two", "ssh.port",
     r"valid integer"),
    ("bad-model", lambda t: t.replace("    model: nvl72", "    model: nvl36", 1), "model: nvl36", "racks.rack-a.model",
     r"nvl72"),
    ("duplicate-yaml-key", lambda t: t.replace("  port: 22\n", "  port: 22\n  port: 23\n"), "port: 23", "ssh.port",
     r"duplicate key"),
    ("missing-required", lambda t: t.replace("      addresses: 10.20.1.[11-28]\n", ""), "    compute:",
     "racks.rack-a.compute.addresses", r"required key is missing"),
    ("duplicate-host-name", lambda t: t.replace("nodes: rack-b-tray[01-18]", "nodes: rack-a-tray[01-18]"),
     "nodes: rack-a-tray[01-18]#2", "racks.rack-b.compute", r"duplicate host name rack-a-tray01"),
    ("duplicate-address", lambda t: t.replace("addresses: 10.20.3.[11-28]", "addresses: 10.20.1.[11-28]"),
     "addresses: 10.20.1.[11-28]#2", "racks.rack-b.compute", r"duplicate address 10\.20\.1\.11"),
    ("compute-count", lambda t: t.replace("rack-a-tray[01-18]", "rack-a-tray[01-17]", 1)
     .replace("10.20.1.[11-28]", "10.20.1.[11-27]").replace("10.20.9.[11-28]", "10.20.9.[11-27]"),
     "nodes: rack-a-tray[01-17]", "racks.rack-a.compute.nodes", r"17 compute trays, but an nvl72 rack has 18"),
    ("switch-count", lambda t: t.replace("rack-a-nvsw[01-09]", "rack-a-nvsw[01-08]").replace("10.20.2.[11-19]", "10.20.2.[11-18]")
     .replace("10.20.9.[51-59]", "10.20.9.[51-58]"), "rack-a-nvsw[01-08]", "racks.rack-a.switches",
     r"8 switch trays, but an nvl72 rack has 9"),
    ("bad-nodeset", lambda t: t.replace("nodes: rack-a-tray[01-18]", "nodes: rack-a-tray[01-18"),
     "nodes: rack-a-tray[01-18", "racks.rack-a.compute.nodes", r"bad node-set syntax"),
    ("address-count", lambda t: t.replace("addresses: 10.20.1.[11-28]", "addresses: 10.20.1.[11-27]"),
     "addresses: 10.20.1.[11-27]", "racks.rack-a.compute.addresses", r"17 addresses for 18 nodes"),
    ("partitions-overlap", lambda t: t.replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[09-18]"),
     "trays: rack-a-tray[09-18]", "racks.rack-a.partitions[1].trays", r"rack-a-tray09 is in partitions 'p0' and 'p1'"),
    ("partition-spans-racks", lambda t: t.replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[10-18],rack-b-tray01"),
     "rack-b-tray01", "racks.rack-a.partitions[1].trays", r"belongs to rack rack-b: a partition cannot span racks"),
    ("partition-unknown-tray", lambda t: t.replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[10-19]"),
     "trays: rack-a-tray[10-19]", "racks.rack-a.partitions[1].trays", r"unknown tray rack-a-tray19"),
    ("duplicate-partition-name", lambda t: t.replace("      - name: p1", "      - name: p0"),
     "      - name: p0#2", "racks.rack-a.partitions[1].name", r"duplicate partition name 'p0'"),
    ("unknown-image", lambda t: t.replace("image: gb200-ubuntu24.04", "image: gb300-rhel9", 1),
     "image: gb300-rhel9", "racks.rack-a.compute.image", r"unknown image 'gb300-rhel9'"),
    ("unknown-controller", lambda t: t.replace("controller: rack-a-head", "controller: rack-z-head"),
     "controller: rack-z-head", "scheduler.controller", r"unknown host 'rack-z-head'"),
    ("bad-domain-uuid", lambda t: t.replace("nvlink_domain: 7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "nvlink_domain: not-a-uuid"),
     "nvlink_domain: not-a-uuid", "racks.rack-a.nvlink_domain", r"pattern"),
    ("bad-address", lambda t: t.replace("address: 10.20.0.10", "address: 10.20.0.10/24"),
     "address: 10.20.0.10/24", "racks.rack-a.head.address", r"neither an IP address nor a host name"),
    ("shape-too-big", lambda t: t.replace("    model: nvl72\n    nvlink_domain",
                                           "    model: nvl72\n    shape: {compute_trays: 20, switch_trays: 9}\n    nvlink_domain"),
     "shape: {compute_trays: 20", "racks.rack-a.shape", r"at most 18 compute"),
]


@pytest.mark.parametrize("name,edit,needle,field,message", CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory(tmp_path, capsys, example_text, name, edit, needle, field, message):
    text = edit(example_text)
    assert text != example_text, "the edit must change the inventory"
    inv = write_inv(tmp_path, text)
    _, problems = validate_inventory(inv)
    expected_line = line_of(text, needle)
    match = [p for p in problems if re.search(message, p.message) and p.field == field]
    assert match, f"no problem {field}: /{message}/ in {[p.render() for p in problems]}"
    assert match[0].line == expected_line
    assert match[0].file.endswith("mctl.yml")

    result = run_cli(capsys, "-i", str(inv), "inventory", "validate")
    assert result.code == 2
    assert f"mctl.yml:{expected_line}: " in result.out
    assert re.search(message, result.out)
    assert "Traceback" not in result.out + result.err

    # Every other command refuses the broken inventory the same way, without a traceback.
    result = run_cli(capsys, "-i", str(inv), "inventory", "show")
    assert result.code == 2
    assert "mctl: error:" in result.err and "Traceback" not in result.err


def test_validate_json_lists_every_problem(tmp_path, capsys, example_text):
    text = example_text.replace("  port: 22", "  port: 0").replace("image: gb200-ubuntu24.04", "image: nope")
    inv = write_inv(tmp_path, text)
    result = run_cli(capsys, "-i", str(inv), "--json", "inventory", "validate")
    assert result.code == 2
    data = json.loads(result.out)
    assert data["valid"] is False
    fields = {p["field"] for p in data["problems"]}
    assert "ssh.port" in fields


def test_not_a_mapping(tmp_path, capsys):
    inv = write_inv(tmp_path, "- just\n- a list\n")
    result = run_cli(capsys, "-i", str(inv), "inventory", "validate")
    assert result.code == 2
    assert "an inventory is a YAML mapping" in result.out


def test_missing_inventory(tmp_path, capsys):
    result = run_cli(capsys, "-i", str(tmp_path / "nowhere"), "inventory", "show")
    assert result.code == 2
    assert "inventory not found" in result.err and "hint:" in result.err


def test_no_inventory_given(capsys, monkeypatch):
    monkeypatch.delenv("MCTL_INVENTORY", raising=False)
    result = run_cli(capsys, "inventory", "show")
    assert result.code == 2
    assert "no inventory given" in result.err


def test_partly_populated_rack_with_shape(tmp_path, example_text):
    text = (example_text.replace("rack-a-tray[01-18]", "rack-a-tray[01-04]", 1)
            .replace("10.20.1.[11-28]", "10.20.1.[11-14]").replace("10.20.9.[11-28]", "10.20.9.[11-14]")
            .replace("trays: rack-a-tray[01-09]", "trays: rack-a-tray[01-02]")
            .replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[03-04]")
            .replace("    model: nvl72\n    nvlink_domain", "    model: nvl72\n    shape: {compute_trays: 4, switch_trays: 9}\n    nvlink_domain"))
    site, problems = validate_inventory(write_inv(tmp_path, text))
    assert problems == []
    assert site.racks["rack-a"].compute_trays == 4


def test_range_vars_expand_per_host(tmp_path, example_text):
    text = example_text.replace("      image: gb200-ubuntu24.04\n    switches:\n      nodes: rack-a-nvsw",
                                "      image: gb200-ubuntu24.04\n      vars: {slurmd_port: '[16801-16818]', tier: gold}\n"
                                "    switches:\n      nodes: rack-a-nvsw", 1)
    site, problems = validate_inventory(write_inv(tmp_path, text))
    assert problems == []
    trays = site.racks["rack-a"].compute
    assert trays[0].vars == {"slurmd_port": 16801, "tier": "gold"}
    assert trays[17].vars["slurmd_port"] == 16818
