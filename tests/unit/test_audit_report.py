"""A whole audit evaluated from gathered state (no hosts), its exit codes, and every report format.

Regenerate the golden files after an intended change with:
    MCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_audit_report.py
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from mctl.audit.collect import Actual, ControllerState, FabricView
from mctl.audit.model import AuditReport, parse_duration
from mctl.audit.reporters import render
from mctl.audit.service import AuditSettings, evaluate, plan_audit
from mctl.errors import UsageError
from mctl.fabric.imex import expected_files
from mctl.model.imex import ImexSettings
from mctl.model.tray import OsRelease, TrayFacts
from mctl.health.sweep import SweepResult
from mctl.inventory import load_site
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import GpuReport
from mctl.sched.slurm.facts import parse_show_nodes, parse_show_topology
from mctl.sched.slurm.topology import blocks_for, render_topology
from tests.helpers import CAPTURED, captured_lab_site, fabric_for, gpus_of

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "audit"
REGEN = os.environ.get("MCTL_REGEN_GOLDEN") == "1"
STARTED = 1764441600.0          # 2025-11-29T18:40:00Z


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file (MCTL_REGEN_GOLDEN=1 to update)"


@pytest.fixture()
def site(tmp_path):
    return load_site(captured_lab_site(tmp_path / "site"))


def tray_state(host: str, address: str, files: dict) -> TrayFacts:
    return TrayFacts(host, address, "ok", os=OsRelease("debian", "13", "Debian GNU/Linux 13 (trixie)"),
                     kernel="6.1.0-37-amd64", slurmd_version="24.11.5", files=dict(files))


def sweep(hosts: dict[str, str], findings: list[Finding]) -> SweepResult:
    """A health sweep's result as the engine returns it (driver/CUDA per tray, the catalogue's findings)."""
    facts = {h: TrayFacts(h, gpus=GpuReport(driver, "12.8", 4, ())) for h, driver in hosts.items()}
    return SweepResult(1, STARTED, 1.0, facts, findings, [], None, "slurm")


def gathered(site, *, nmx_error: str | None = "NMX-M at http://127.83.1.200:8443/nmx/v1 is unavailable: "
             "GET /nmx/v1/compute-nodes failed 4 times, last with Connection refused") -> Actual:
    rack = site.racks["lab-r1"]
    want = expected_files(rack, ImexSettings())
    trays = {h.name: tray_state(h.name, h.address, want[h.name]) for h in rack.compute}
    nodes_path = "/etc/nvidia-imex/nodes_config.cfg"
    trays["lab-r1-tray02"].files[nodes_path] = "127.83.1.1\n127.83.1.2\n127.83.1.3\n"      # edited by hand
    trays["lab-r1-tray04"] = TrayFacts("lab-r1-tray04", "127.83.1.4", "unreachable", error="no SSH answer within 5s")
    topo = render_topology(blocks_for(site), "block")
    ctl = ControllerState("lab-r1-head", "ok", now_local=datetime(2026, 11, 30, 20, 0, 0),
                          nodes=tuple(parse_show_nodes((CAPTURED / "scontrol-show-node-o.txt").read_text())),
                          topology=tuple(parse_show_topology((CAPTURED / "scontrol-show-topology.txt").read_text())),
                          config={"SLURM_VERSION": "24.11.5", "TopologyPlugin": "topology/block"},
                          partitions={"gpu": {"PartitionName": "gpu", "State": "UP", "Nodes": "lab-r1-tray[01-04]"}},
                          topology_conf=topo)
    if nmx_error:
        fabric = {"lab-r1": FabricView("lab-r1", error=nmx_error)}
    else:
        from mctl.model.fabric import NmxPartition
        parts = [NmxPartition("a", 1, "p0", "ID_BASED", "HEALTHY", gpus_of(range(0, 2))),
                 NmxPartition("b", 2, "p1", "ID_BASED", "HEALTHY", gpus_of(range(2, 4)))]
        fabric = {"lab-r1": FabricView("lab-r1", fabric_for(rack, parts))}
    health = sweep({"lab-r1-tray01": "570.148.08", "lab-r1-tray02": "570.148.08", "lab-r1-tray03": "570.172.08"},
                   [Finding(Severity.OK, "lab-r1-tray01", "gpu.count", "4 GPUs"),
                    Finding(Severity.CRITICAL, "lab-r1-tray04", "tray.reachable", "unreachable: no SSH answer within 5s",
                            "check the tray's BMC and network"),
                    Finding(Severity.WARN, "lab-r1-tray03", "gpu.driver", "driver 570.172.08, lab-debian13 wants "
                                                                          "570.148.08")])
    return Actual(trays, ctl, fabric, health)


def report_of(site, actual, fail_on="critical") -> AuditReport:
    plan = plan_audit(site, list(site.racks.values()))
    settings = AuditSettings(fail_on=fail_on)
    entries, gaps, coverage = evaluate(site, plan, actual, settings)
    return AuditReport(site.name, list(site.racks), STARTED, 4.2, entries, coverage, gaps, plan.skipped,
                       fail_on, settings.to_dict())


def problems(report) -> set[tuple[str, str | None, str, str]]:
    return {(e.family, e.host, e.check, e.severity.value) for e in report.findings}


def test_every_family_finds_its_drift(site):
    report = report_of(site, gathered(site))
    assert problems(report) == {
        ("imex", "lab-r1-tray02", "imex.nodes_config", "critical"),
        ("versions", "lab-r1-tray03", "image.driver", "critical"),
        ("slurm", "lab-r1", "slurm.topology", "critical"),            # captured: p0 = 3 trays, p1 = 1
        ("drains", "lab-r1-tray02", "drain.age", "warn"),              # drained since 2026-11-29T19:51:38
        ("health", "lab-r1-tray04", "tray.reachable", "critical"),
        ("health", "lab-r1-tray03", "gpu.driver", "warn"),
        ("layers", "lab-r1", "partition.layers", "critical"),          # one per partition: p0 and p1
    }
    by_partition = {e.subject: e.finding for e in report.findings if e.family == "layers"}
    assert sorted(by_partition) == ["p0", "p1"]
    assert by_partition["p0"].details["behind"] == ["imex", "topology"]
    assert by_partition["p0"].action == "run 'mctl imex apply lab-r1'"
    assert by_partition["p1"].details["behind"] == ["topology"]
    assert [(g.family, g.scope) for g in report.gaps] == [("reach", "lab-r1-tray04"), ("nmx", "lab-r1")]
    assert report.exit_code == 3 and not report.complete
    cov = report.coverage
    assert cov["imex"] == ["lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03"]     # tray04 was not reached
    assert cov["hostkeys"] == ["lab-r1-head", "lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03"]
    assert "nmx" not in cov and "lab-r1" in cov["slurm"]
    # health looked at the reached trays, the rack (clique against the plan) and the scheduler
    assert cov["health"] == ["lab-r1", "lab-r1-head", "lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03"]


def test_exit_codes_follow_fail_on_and_completeness(site):
    actual = gathered(site, nmx_error=None)
    actual.trays["lab-r1-tray04"] = replace(actual.trays["lab-r1-tray03"], host="lab-r1-tray04",
                                            address="127.83.1.4")
    assert report_of(site, actual).exit_code == 1                  # critical drift, everything checked
    clean_topology = parse_show_topology("BlockName=lab-r1-p0 Nodes=lab-r1-tray[01-02]\n"
                                         "BlockName=lab-r1-p1 Nodes=lab-r1-tray[03-04]\n")
    want = expected_files(site.racks["lab-r1"], ImexSettings())
    actual.trays = {h: replace(t, files=dict(want[h])) for h, t in actual.trays.items()}
    actual.controller = replace(actual.controller, topology=tuple(clean_topology))
    actual.health = sweep({h: "570.148.08" for h in actual.trays}, [])
    only_drain = report_of(site, actual)
    assert problems(only_drain) == {("drains", "lab-r1-tray02", "drain.age", "warn")}
    assert only_drain.exit_code == 0
    assert report_of(site, actual, fail_on="warn").exit_code == 1
    actual.controller = replace(actual.controller, now_local=datetime(2026, 11, 29, 20, 0, 0))
    assert report_of(site, actual, fail_on="warn").exit_code == 0


def test_slurmctld_down_is_a_gap_for_slurm_and_drains(site):
    actual = gathered(site, nmx_error=None)
    actual.controller = ControllerState("lab-r1-head", "ok", error="scontrol show node on lab-r1-head: Unable to "
                                                                   "contact slurm controller (connect failure)")
    report = report_of(site, actual)
    assert [(g.family, g.scope) for g in report.gaps][-2:] == [("slurm", "lab-r1-head"), ("drains", "lab-r1-head")]
    assert not any(e.family in ("slurm", "drains") for e in report.entries)


def test_table_report(site):
    report = report_of(site, gathered(site))
    report.history = {"run_id": 7, "new": 2, "persisting": 4, "resolved": 1}
    text = render(report, "table")
    golden("report.txt", text)
    assert "NOT CHECKED: nmx on lab-r1" in text and "\x1b" not in text
    verbose = render(report, "table", verbose=True)
    assert "    -> run 'mctl imex apply lab-r1'" in verbose


def test_json_report(site):
    text = render(report_of(site, gathered(site)), "json")
    golden("report.json", text)
    data = json.loads(text)
    assert data["kind"] == "mctl-audit" and data["exit_code"] == 3 and data["complete"] is False
    assert data["summary"] == {"critical": 7, "warn": 2, "checked": len(report_of(site, gathered(site)).entries)}
    nodes = next(f for f in data["findings"] if f["check"] == "imex.nodes_config")
    assert nodes["subject"] == "/etc/nvidia-imex/nodes_config.cfg" and nodes["rack"] == "lab-r1"
    assert nodes["details"]["found"] == ["127.83.1.1", "127.83.1.2", "127.83.1.3"]
    assert re.fullmatch(r"[0-9a-f]{16}", nodes["fingerprint"])


def test_junit_report_is_one_suite_per_family_one_case_per_host_and_check(site):
    text = render(report_of(site, gathered(site)), "junit")
    golden("junit.xml", text)
    root = ET.fromstring(text)
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["mctl-audit.versions", "mctl-audit.firmware", "mctl-audit.imex", "mctl-audit.slurm", "mctl-audit.nmx",
                            "mctl-audit.layers", "mctl-audit.drains", "mctl-audit.hostkeys", "mctl-audit.health", "mctl-audit.reach"]
    total = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("errors")) == sum(c.find("error") is not None for c in cases)
        assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
        names = [c.get("name") for c in cases]
        assert len(names) == len(set(names))          # one testcase per host x check
        for key in total:
            total[key] += int(suite.get(key))
    assert {k: int(root.get(k)) for k in total} == total
    case = suites["mctl-audit.imex"].find("testcase[@name='lab-r1-tray02: imex.nodes_config']")
    failure = case.find("failure")
    assert failure.get("type") == "critical" and "extra 127.83.1.3" in failure.get("message")
    assert "action: run 'mctl imex apply lab-r1'" in failure.text
    drain = suites["mctl-audit.drains"].find("testcase[@name='lab-r1-tray02: drain.age']")
    assert drain.find("failure") is None and drain.find("system-out").text.startswith("warn: drained for 1d")
    assert suites["mctl-audit.nmx"].find("testcase/error").get("type") == "incomplete"
    assert suites["mctl-audit.reach"].find("testcase").get("name") == "lab-r1-tray04: checked"
    warn = ET.fromstring(render(report_of(site, gathered(site), fail_on="warn"), "junit"))
    drain = warn.find("testsuite[@name='mctl-audit.drains']/testcase[@name='lab-r1-tray02: drain.age']")
    assert drain.find("failure").get("type") == "warn"


_SAMPLE = re.compile(r'^(?P<name>[a-z_]+)(\{(?P<labels>[a-z_]+="[^"\\\n]*"(,[a-z_]+="[^"\\\n]*")*)\})? '
                     r'(?P<value>-?[0-9]+(\.[0-9]+)?)$')


def test_prometheus_textfile(site):
    text = render(report_of(site, gathered(site)), "prometheus")
    golden("metrics.prom", text)
    helped, typed, samples = set(), set(), []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            assert line.split()[3] == "gauge"
            typed.add(line.split()[2])
        else:
            m = _SAMPLE.match(line)
            assert m, f"not exposition format: {line!r}"
            samples.append(m)
    assert helped == typed and {m["name"] for m in samples} <= helped
    values = {(m["name"], m["labels"]): float(m["value"]) for m in samples}
    assert values[("mctl_audit_findings", 'site="lab",rack="lab-r1",family="imex",check="imex.nodes_config",'
                                          'severity="critical"')] == 1
    assert values[("mctl_audit_rack_findings", 'site="lab",rack="lab-r1",severity="critical"')] == 7
    assert values[("mctl_audit_incomplete", 'site="lab"')] == 1
    assert values[("mctl_audit_last_run_timestamp_seconds", 'site="lab"')] == STARTED


def test_durations():
    assert parse_duration("7d", option="--since") == 7 * 86400
    assert parse_duration("90", option="--since") == 90
    assert parse_duration("1.5h", option="--drain-age") == 5400
    with pytest.raises(UsageError, match="--drain-age 'soon' is not a duration"):
        parse_duration("soon", option="--drain-age")
