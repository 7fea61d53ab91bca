"""IMEX parsers on real `nvidia-imex-ctl` captures first, then on the documented JSON shape and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mctl.facts import FactsParseError
from mctl.facts.imex import (parse_config, parse_domain, parse_domain_json, parse_domain_text, parse_nodes_config,
                             parse_query)

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "imex" / "samples"


def test_real_18_node_gb200_domain():
    status = parse_domain_text((SAMPLES / "aws-pcluster-gb200-imex-ctl-N.txt").read_text())
    assert status.state == "UP" and status.timestamp == "5/12/2025 06:08:10.580"
    assert len(status.nodes) == 18
    assert status.nodes[0].address == "172.31.48.81" and status.nodes[17].address == "172.31.56.47"
    assert {n.state for n in status.nodes} == {"READY"} and {n.version for n in status.nodes} == {"570.172"}
    assert all(n.links == ("C",) * 18 for n in status.nodes)
    assert status.link(10, 17) == "C"


@pytest.mark.parametrize("name,count", [("dra-repro-imex-ctl-N-1node.txt", 1), ("dra-repro-imex-ctl-N-2nodes.txt", 2)])
def test_real_older_format_without_version(name, count):
    status = parse_domain((SAMPLES / name).read_text())
    assert status.state == "UP" and len(status.nodes) == count
    assert status.nodes[-1].version is None and status.nodes[-1].address.startswith("10.136.206.")


def _mismatch_text() -> str:
    return "\n".join([
        "5/12/2025 06:08:10.580", "Nodes:",
        "Node #0   - 10.0.0.1        - lab-r1-tray01        - READY                - Version: 570.172",
        "Node #1   - 10.0.0.2        - lab-r1-tray02        - READY                - Version: 570.172",
        "Node #2   - 10.0.0.3        - -                    - UNAVAILABLE",
        "", " Nodes From\\To  0   1   2", "       0        C   C   !M!", "       1        C   C   !M!",
        "       2        I   I   I", "", "Domain State: DEGRADED", ""])


def test_hostnames_and_mismatch_letters():
    status = parse_domain_text(_mismatch_text())
    assert status.state == "DEGRADED"
    assert status.nodes[0].hostname == "lab-r1-tray01" and status.nodes[2].state == "UNAVAILABLE"
    assert status.link(0, 2) == "!M!" and status.link(2, 0) == "I"


@pytest.mark.parametrize("broken,message", [
    (lambda t: t.replace("Domain State: DEGRADED", ""), "no 'Domain State'"),
    (lambda t: t.replace("       2        I   I   I\n", ""), "do not match"),
    (lambda t: t.replace("C   C   !M!", "C   X   !M!", 1), "unknown letters X"),
    (lambda t: t.replace("UNAVAILABLE", "SLEEPY"), "unknown state 'SLEEPY'"),
    (lambda t: t.replace("DEGRADED", "SIDEWAYS"), "unknown IMEX domain state"),
])
def test_truncated_or_garbled_text_is_rejected(broken, message):
    with pytest.raises(FactsParseError, match=message):
        parse_domain_text(broken(_mismatch_text()))


def _json_doc() -> dict:
    return {"nodes": {
        "0": {"status": "READY", "host": "10.0.0.1", "hostName": "gpu-node-1", "changed": True, "version": "580.95.05",
              "connections": {"0": {"host": "10.0.0.1", "status": "CONNECTED", "changed": True},
                              "1": {"host": "10.0.0.2", "status": "INVALID", "changed": True}}},
        "1": {"status": "UNAVAILABLE", "host": "10.0.0.2", "connections": {}}},
        "timestamp": "9/4/2026 00:37:39.905", "status": "DOWN"}


def test_json_form():
    status = parse_domain_json(json.dumps(_json_doc()))
    assert status.state == "DOWN" and status.timestamp == "9/4/2026 00:37:39.905"
    assert status.nodes[0].links == ("C", "I") and status.nodes[1].links == ("I", "I")
    assert status.nodes[0].hostname == "gpu-node-1" and status.nodes[1].version is None
    doc = _json_doc()
    doc["nodes"]["0"]["connections"]["1"]["status"] = "SOMETHING"
    with pytest.raises(FactsParseError, match="unknown connection status"):
        parse_domain_json(json.dumps(doc))
    with pytest.raises(FactsParseError, match="invalid JSON"):
        parse_domain_json('{"status": "UP", "nodes": {')


def test_query_states():
    assert parse_query("READY\n") == "READY"
    assert parse_query("WAITING_FOR_PEERS\n") == "WAITING_FOR_PEERS"
    with pytest.raises(FactsParseError, match="printed nothing"):
        parse_query("")
    with pytest.raises(FactsParseError, match="not a daemon state"):
        parse_query("Connection refused\n")


def test_config_files():
    cfg = parse_config("# comment\nSERVER_PORT=50000\nBIND_INTERFACE_IP=\n  IMEX_CMD_PORT = 50005\n")
    assert cfg == {"SERVER_PORT": "50000", "BIND_INTERFACE_IP": "", "IMEX_CMD_PORT": "50005"}
    with pytest.raises(FactsParseError, match="line 1"):
        parse_config("not a key\n")
    assert parse_nodes_config("10.0.0.1\n\n10.0.0.2\n") == ("10.0.0.1", "10.0.0.2")
    with pytest.raises(FactsParseError, match="more than an address"):
        parse_nodes_config("10.0.0.1 10.0.0.2\n")
