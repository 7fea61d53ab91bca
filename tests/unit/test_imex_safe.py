"""IMEX done safely: -N -j against the text -N (real captures), whole-domain apply plans, backups beside files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mctl.fabric.imex import TrayImexReport, assess_domain, compare_views, plan_domains
from mctl.fabric.imex_remote import BACKUP_SUFFIX, backup_path, push_command
from mctl.facts.imex import parse_domain_json, parse_domain_text
from mctl.lab.emulators.imex_ctl import render_text
from mctl.model.fabric import LINK_LETTERS, ImexDomain, ImexMember

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "imex" / "samples"
CAPTURES = sorted(p.name for p in SAMPLES.glob("*.txt"))
WORD = {letter: word for word, letter in LINK_LETTERS.items()}


def _json_of(text_status, **override) -> str:
    """The documented -N -j shape for what a text capture shows (the JSON form has no public capture)."""
    nodes = {}
    for n in text_status.nodes:
        nodes[str(n.index)] = {"status": n.state, "host": n.address, "hostName": "", "version": n.version or "",
                               "connections": {str(j): {"host": text_status.nodes[j].address,
                                                        "status": WORD.get(c, c), "changed": False}
                                               for j, c in enumerate(n.links)}}
    doc = {"nodes": nodes, "timestamp": "1/1/2026 00:00:00.000", "status": text_status.state}
    doc.update(override)
    return json.dumps(doc)


@pytest.mark.parametrize("name", CAPTURES)
def test_real_text_captures_agree_with_their_json(name):
    text = parse_domain_text((SAMPLES / name).read_text())
    assert compare_views(parse_domain_json(_json_of(text)), text) == []


def test_disagreements_are_named_field_by_field():
    text = parse_domain_text((SAMPLES / "aws-pcluster-gb200-imex-ctl-N.txt").read_text())
    doc = json.loads(_json_of(text))
    doc["status"] = "DEGRADED"
    doc["nodes"]["3"]["status"] = "UNAVAILABLE"
    doc["nodes"]["5"]["host"] = "172.31.99.99"
    doc["nodes"]["7"]["connections"]["12"]["status"] = "DISCONNECTED"
    doc["nodes"]["9"]["version"] = "580.65"
    found = compare_views(parse_domain_json(json.dumps(doc)), text)
    assert found == ["domain state DEGRADED (-N -j) vs UP (-N)",
                     "node 3 state UNAVAILABLE (-N -j) vs READY (-N)",
                     "node 5 address 172.31.99.99 (-N -j) vs 172.31.50.44 (-N)",
                     "node 7 links (-N -j/-N) 12: D/C",
                     "node 9 version 580.65 (-N -j) vs 570.172 (-N)"]
    two = parse_domain_text((SAMPLES / "dra-repro-imex-ctl-N-2nodes.txt").read_text())
    one = parse_domain_text((SAMPLES / "dra-repro-imex-ctl-N-1node.txt").read_text())
    assert compare_views(parse_domain_json(_json_of(two)), one) == ["2 nodes (-N -j) vs 1 nodes (-N)"]
    assert compare_views(None, one, json_error="invalid JSON") == [
        "-N -j could not be read (invalid JSON) while -N says UP"]
    assert compare_views(parse_domain_json(_json_of(one)), None, text_error="garbled node line") == [
        "-N could not be read (garbled node line) while -N -j says UP"]
    assert compare_views(None, None) == []


def test_a_disagreement_is_a_finding_of_the_domain():
    two = parse_domain_text((SAMPLES / "dra-repro-imex-ctl-N-2nodes.txt").read_text())
    domain = ImexDomain("default", "r1", (ImexMember("t1", "10.136.206.47"), ImexMember("t2", "10.136.206.48")))
    nodes = "10.136.206.47\n10.136.206.48\n"
    agree = {t: TrayImexReport(t, nodes_config=nodes, query="READY", status=parse_domain_json(_json_of(two)),
                               text_status=two) for t in ("t1", "t2")}
    assert assess_domain(domain, agree).state == "UP"
    stale = dict(agree, t2=TrayImexReport("t2", nodes_config=nodes, query="READY",
                                          status=parse_domain_json(_json_of(two, status="DEGRADED")),
                                          text_status=two))
    health = assess_domain(domain, stale)
    assert health.state != "UP"
    assert [r.message for r in health.reasons if "disagree" in r.message] == [
        "nvidia-imex-ctl -N -j and -N disagree on tray t2: domain state DEGRADED (-N -j) vs UP (-N)"]


@pytest.mark.parametrize("name", CAPTURES)
def test_lab_emulator_prints_the_real_layout(name):
    """The lab's nvidia-imex-ctl -N, fed what a capture shows, prints that capture byte for byte."""
    raw = (SAMPLES / name).read_text()
    status = parse_domain_text(raw)
    view = {"timestamp": status.timestamp, "status": status.state,
            "nodes": [{"host": n.address, "status": n.state, "version": n.version, "row": list(n.links)}
                      for n in status.nodes]}
    assert render_text(view, False) + "\n" == raw


# ------------------------------------------------------------ apply: whole domains only

def _domains() -> tuple[ImexDomain, ...]:
    return (ImexDomain("p1", "r1", (ImexMember("t1", "10.0.0.1"), ImexMember("t2", "10.0.0.2"))),
            ImexDomain("p2", "r1", (ImexMember("t3", "10.0.0.3"), ImexMember("t4", "10.0.0.4"))))


def test_plan_touches_whole_domains_and_holds_one_with_an_unreachable_tray():
    plan = {"t1": ["nodes"], "t2": ["nodes"], "t3": ["nodes"], "t4": ["nodes"]}
    assert plan_domains(_domains(), plan, []) == ({"t1", "t2", "t3", "t4"}, {})
    touched, held = plan_domains(_domains(), {t: f for t, f in plan.items() if t != "t2"}, ["t2"])
    assert touched == {"t3", "t4"} and held == {"p1": ["t2"]}
    # nothing to change on the reachable trays: nothing to hold either
    assert plan_domains(_domains(), {"t3": ["nodes"]}, ["t2"]) == ({"t3"}, {})
    # --restart restarts every daemon, so a domain with an unreachable tray is held even with no file to write
    assert plan_domains(_domains(), {}, ["t4"], restart=True) == ({"t1", "t2"}, {"p2": ["t4"]})


# ------------------------------------------------------------ backups

def test_backup_is_named_beside_the_file():
    assert BACKUP_SUFFIX == ".mctl-bak"
    assert backup_path("/etc/nvidia-imex/nodes_config.cfg") == "/etc/nvidia-imex/nodes_config.cfg.mctl-bak"


def test_push_keeps_the_previous_file_and_skips_identical_ones(tmp_path, processes):
    nodes = tmp_path / "nodes_config.cfg"
    config = tmp_path / "config.cfg"
    nodes.write_text("10.0.0.1\n10.0.0.2\n")
    nodes.chmod(0o600)
    config.write_text("A=1\n")
    script = push_command({str(nodes): "10.0.0.1\n", str(config): "A=1\n", str(tmp_path / "new.cfg"): "B=2\n"}, None)
    subprocess.run(["bash", "-c", script], check=True, timeout=30)
    assert nodes.read_text() == "10.0.0.1\n"
    backup = tmp_path / ("nodes_config.cfg" + BACKUP_SUFFIX)
    assert backup.read_text() == "10.0.0.1\n10.0.0.2\n" and oct(backup.stat().st_mode & 0o777) == "0o600"
    # an identical file is not rewritten and gets no backup; a new file has nothing to back up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.cfg", "new.cfg", "nodes_config.cfg",
                                                          "nodes_config.cfg.mctl-bak"]
    # a second change keeps one generation: the file as it was just before
    subprocess.run(["bash", "-c", push_command({str(nodes): "10.0.0.9\n"}, None)], check=True, timeout=30)
    assert backup.read_text() == "10.0.0.1\n" and nodes.read_text() == "10.0.0.9\n"


def test_a_stopped_daemon_with_right_files_is_restarted_and_an_unreachable_tray_is_not():
    from mctl.fabric.imex import TrayImexReport, trays_not_running

    reports = {"t1": TrayImexReport("t1", query="READY"), "t2": TrayImexReport("t2", query=None),
               "t3": TrayImexReport("t3", reachable=False), "t4": TrayImexReport("t4", query=None)}
    assert trays_not_running(reports, {"t1": {}, "t2": {}, "t3": {}}) == ["t2"]   # t4 is in no domain
