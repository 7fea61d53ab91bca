"""NVL72 shape rules on real and lab facts, with one fault at a time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mctl.facts.nvidia_smi import parse_xml
from mctl.checks.inventory import validate_rack
from mctl.model.findings import Severity
from mctl.model.tray import TrayFacts
from mctl.model.site import Host, Rack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = parse_xml((FIXTURES / "gb200-nvidia-smi-q-x.xml").read_text())
LAB = parse_xml((FIXTURES / "lab" / "healthy-q-x.xml").read_text())
REAL_DOMAIN = "889d2be1-4bbf-69e1-d3f2-97c465ee31aa"


def make_rack(n: int = 18, domain: str | None = REAL_DOMAIN, name: str = "rack-a") -> Rack:
    trays = tuple(Host(f"{name}-tray{i:02d}", f"10.0.0.{i}", "compute", name) for i in range(1, n + 1))
    return Rack(name=name, model="nvl72", compute_trays=n, switch_trays=0, nvlink_domain=domain, nmx=None,
                head=None, compute=trays, switches=(), partitions=())


def with_gpus(report, **fabric_changes_by_index):
    """A copy of *report* whose GPU i has fabric fields replaced (gpu2={'clique_id': 5})."""
    gpus = []
    for g in report.gpus:
        change = fabric_changes_by_index.get(f"gpu{g.index}")
        gpus.append(replace(g, fabric=replace(g.fabric, **change)) if change else g)
    return replace(report, gpus=tuple(gpus))


def uniquify(report, tag: str):
    """Give every GPU its own UUID/serial per tray, as real trays have."""
    return replace(report, gpus=tuple(replace(g, uuid=f"{g.uuid[:-4]}{tag}", serial=f"{g.serial}{tag}")
                                      for g in report.gpus))


def rack_facts(rack: Rack, report=REAL, **per_tray) -> list[TrayFacts]:
    out = []
    for i, h in enumerate(rack.compute, 1):
        t = TrayFacts(h.name, h.address, "ok", hostname=h.name, gpus=uniquify(report, f"{i:04d}"))
        out.append(per_tray.get(h.name, lambda x: x)(t))
    return out


def checks(findings, severity=None):
    return sorted({f.check for f in findings if severity is None or f.severity is severity})


def test_real_capture_rack_is_shape_clean_but_flags_route_unhealthy():
    rack = make_rack()
    findings = validate_rack(rack, rack_facts(rack))
    assert checks(findings, Severity.CRITICAL) == []
    # the real capture reports route_unhealthy True on every GPU: a warning, per tray
    assert checks(findings, Severity.WARN) == ["fabric.health"]
    assert len([f for f in findings if f.check == "fabric.health"]) == 18


def test_lab_rack_is_clean():
    domain = LAB.cluster_uuids[0]
    rack = make_rack(4, domain)
    assert validate_rack(rack, rack_facts(rack, LAB)) == []


def test_missing_gpu_is_critical():
    rack = make_rack()
    three = lambda t: replace(t, gpus=replace(t.gpus, gpus=t.gpus.gpus[:3]))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray05": three}))
    f = [f for f in findings if f.check == "gpu.count"]
    assert len(f) == 1 and f[0].host == "rack-a-tray05" and f[0].severity is Severity.CRITICAL
    assert "3 GPUs visible, expected 4" in f[0].message and "(driver counts 4)" in f[0].message


def test_two_cluster_uuids_on_one_tray_is_a_finding_not_a_guess():
    rack = make_rack()
    other = "11111111-2222-3333-4444-555555555555"
    split = lambda t: replace(t, gpus=with_gpus(t.gpus, gpu3={"cluster_uuid": other}))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray02": split}))
    conflict = [f for f in findings if f.check == "fabric.cluster-uuid-conflict"]
    assert len(conflict) == 1 and other in conflict[0].message and REAL_DOMAIN in conflict[0].message
    assert "fabric.rack-domains" in checks(findings) and "fabric.domain-mismatch" in checks(findings)


def test_two_cliques_on_one_tray():
    rack = make_rack()
    split = lambda t: replace(t, gpus=with_gpus(t.gpus, gpu0={"clique_id": 7}))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray03": split}))
    f = [f for f in findings if f.check == "fabric.clique-split"]
    assert len(f) == 1 and f[0].host == "rack-a-tray03" and "clique 7 on GPU 0" in f[0].message


def test_zero_uuid_means_no_domain():
    report = parse_xml((FIXTURES / "gb200-nvidia-smi-q-x.xml").read_text()
                       .replace(REAL_DOMAIN, "00000000-0000-0000-0000-000000000000"))
    rack = make_rack(2)
    findings = validate_rack(rack, rack_facts(rack, report))
    assert "fabric.no-domain" in checks(findings, Severity.CRITICAL)
    assert "fabric.rack-domains" not in checks(findings)   # zero is no domain, not a second domain


def test_fabric_not_completed():
    rack = make_rack(2)
    busy = lambda t: replace(t, gpus=with_gpus(t.gpus, gpu1={"state": "In Progress", "status": "N/A"}))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray01": busy}))
    f = [f for f in findings if f.check == "fabric.state"]
    assert len(f) == 1 and "GPU 1" in f[0].message and "In Progress" in f[0].message


@pytest.mark.parametrize("reach, check", [("unreachable", "ssh.unreachable"), ("timeout", "ssh.timeout"),
                                          ("host-key-mismatch", "ssh.host-key")])
def test_unanswered_tray_is_critical_and_others_still_checked(reach, check):
    rack = make_rack(3)
    dark = lambda t: TrayFacts(t.host, t.address, reach, error="because")
    three = lambda t: replace(t, gpus=replace(t.gpus, gpus=t.gpus.gpus[:3]))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray01": dark, "rack-a-tray02": three}))
    assert {(f.host, f.check) for f in findings if f.severity is Severity.CRITICAL} == {
        ("rack-a-tray01", check), ("rack-a-tray02", "gpu.count")}


def test_unreadable_gpu_facts():
    rack = make_rack(1)
    bad = lambda t: replace(t, gpus=None, gpu_error="nvidia-smi output unreadable: truncated")
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray01": bad}))
    assert [(f.check, f.message) for f in findings] == [("gpu.facts", "nvidia-smi output unreadable: truncated")]


def test_rack_split_across_domains_and_declared_domain():
    rack = make_rack(4)
    other = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    move = lambda t: replace(t, gpus=with_gpus(t.gpus, **{f"gpu{i}": {"cluster_uuid": other} for i in range(4)}))
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray04": move}))
    f = [f for f in findings if f.check == "fabric.rack-domains"][0]
    assert f.host == "rack-a" and "889d2be1 on rack-a-tray[01-03]" in f.message and "aaaaaaaa on rack-a-tray04" in f.message
    assert [x.message for x in findings if x.check == "fabric.domain-mismatch"] == [
        f"inventory declares NVLink domain {REAL_DOMAIN}, trays report {other}"]


def test_undeclared_domain_is_reported_with_the_line_to_add():
    rack = make_rack(2, domain=None)
    findings = validate_rack(rack, rack_facts(rack))
    f = [f for f in findings if f.check == "fabric.domain-undeclared"][0]
    assert f.severity is Severity.OK and f"nvlink_domain: {REAL_DOMAIN}" in f.action


def test_domain_shared_with_another_rack():
    rack = make_rack(2)
    findings = validate_rack(rack, rack_facts(rack), other_domains={REAL_DOMAIN: "rack-b"})
    f = [f for f in findings if f.check == "fabric.domain-shared"]
    assert len(f) == 1 and f[0].severity is Severity.CRITICAL and "rack rack-b" in f[0].message


def test_driver_drift_and_hostname_and_duplicate_gpu():
    rack = make_rack(3)
    old = lambda t: replace(t, gpus=replace(t.gpus, driver_version="565.57.01"), hostname="rack-a-tray09")
    same = lambda t: replace(t, gpus=rack_facts(rack)[0].gpus)
    findings = validate_rack(rack, rack_facts(rack, **{"rack-a-tray02": old, "rack-a-tray03": same}))
    assert ("rack-a-tray02", "gpu.driver") in {(f.host, f.check) for f in findings}
    assert ("rack-a-tray02", "host.name") in {(f.host, f.check) for f in findings}
    assert ("rack-a-tray03", "gpu.duplicate") in {(f.host, f.check) for f in findings if f.severity is Severity.CRITICAL}
