"""The check catalogue: every check id defined once, with one severity and its purposes, and every
purpose's evaluator (health sweep, node check, audit, rack inventory) held to it.

The evaluators run on real captures (the GB200 sample, the lab's healthy and faulted trays) with one
fault at a time, so what is asserted is what they really emit, not a list kept beside them.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

import mctl.checks
from mctl import checks
from mctl.checks import catalogue
from mctl.checks.catalogue import CHECKS, for_purpose, spec
from mctl.checks.inventory import validate_rack
from mctl.facts.kernel_log import observe_xid, parse_xid_line
from mctl.facts.nvidia_smi import parse_nvlink_status, parse_xml
from mctl.model.settings import HealthSettings
from mctl.model.findings import Severity
from mctl.model.site import Host, Rack
from mctl.model.tray import (AUDIT, HEALTH, INVENTORY, NODE_CHECK, PURPOSES, Clock, DcgmHealth, DcgmIncident, DiskUsage, ImexObservation,
                             Memory, ServiceState, TrayExpectation, TrayFacts)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REAL = parse_xml((FIX / "gb200-nvidia-smi-q-x.xml").read_text())
LAB_FAULTED = parse_xml((FIX / "lab" / "faulted-q-x.xml").read_text())
LINKS_OK = parse_nvlink_status((FIX / "lab" / "healthy-nvlink-status.txt").read_text())
LINKS_DOWN = parse_nvlink_status((FIX / "lab" / "faulted-nvlink-status.txt").read_text())
DOMAIN = "889d2be1-4bbf-69e1-d3f2-97c465ee31aa"
CLOCK = Clock(epoch=1_764_441_600.0, local=datetime(2025, 11, 29, 18, 40, 0), uptime=86_400.0)


def _xids(*codes: int):
    lines = [f"Nov 29 18:33:20 t01 kernel: [  86000.000000] NVRM: Xid (PCI:0000:29:00): {c}, pid='<unknown>', "
             "name=<unknown>, something went wrong" for c in codes]
    return tuple(observe_xid(parse_xid_line(l), CLOCK) for l in lines)


def _fabric(report, **change):
    return replace(report, gpus=tuple(replace(g, fabric=replace(g.fabric, **change)) for g in report.gpus))


def _tray(**kw) -> TrayFacts:
    base = dict(host="t01", address="10.0.0.1", gpus=REAL, nvlinks=LINKS_OK, clock=CLOCK,
                xid_source="/var/log/kern.log", slurmd=ServiceState("slurmd.service", True, "active", "running"),
                disks=(DiskUsage("/", "/", 1000, 100, 900),), memory=Memory(1000, 800),
                imex=ImexObservation(True, "READY", "UP"), boot_id="b" * 8 + "-0000-0000-0000-000000000000",
                previous_boot_id="b" * 8 + "-0000-0000-0000-000000000000")
    base.update(kw)
    return TrayFacts(**base)


# One fault at a time (and a healthy tray), on real captures.
TRAYS = {
    "healthy": _tray(),
    "unreachable": _tray(reach="unreachable", error="no SSH answer"),
    "hung": _tray(reach="timeout", error="no answer within 10s"),
    "no-gpu-facts": _tray(gpus=None, nvlinks=None, gpu_error="nvidia-smi hung: no answer within 27s"),
    "three-gpus": _tray(gpus=replace(REAL, gpus=REAL.gpus[:3])),
    "lab-faulted": _tray(gpus=LAB_FAULTED, nvlinks=LINKS_DOWN),
    "nvlink-unreadable": _tray(nvlinks=None, nvlink_error="nvlink --status unreadable"),
    "fabric-in-progress": _tray(gpus=_fabric(REAL, state="In Progress", status=None, cluster_uuid=None,
                                             clique_id=None)),
    "fabric-error": _tray(gpus=_fabric(REAL, status="Unknown Error")),
    "other-domain": _tray(gpus=_fabric(REAL, cluster_uuid="aaaaaaaa-4bbf-69e1-d3f2-97c465ee31aa")),
    "xid-drain": _tray(xids=_xids(79, 48)),
    "xid-warn": _tray(xids=_xids(13, 31)),
    "hot": _tray(gpus=replace(REAL, gpus=tuple(replace(g, temperature_c=95.0) for g in REAL.gpus))),
    "warm": _tray(gpus=replace(REAL, gpus=tuple(replace(g, temperature_c=84.0) for g in REAL.gpus))),
    "disk-full": _tray(disks=(DiskUsage("/", "/", 1000, 990, 10), DiskUsage("/tmp", "/tmp", 1000, 920, 80))),
    "low-memory": _tray(memory=Memory(1000, 10)),
    "imex-not-ready": _tray(imex=ImexObservation(True, None, "DEGRADED", ("t02 to t03: disconnected",),
                                                 "no answer")),
    "imex-absent": _tray(imex=ImexObservation(False)),
    "slurmd-down": _tray(slurmd=ServiceState("slurmd.service", True, "failed", "failed")),
    "slurmd-missing": _tray(slurmd=ServiceState("slurmd.service", False, None)),
    "partial": _tray(problems=("xid: output cut off",)),
    "rebooted": _tray(previous_boot_id="a" * 8 + "-0000-0000-0000-000000000000"),
    "old-driver": _tray(gpus=replace(REAL, driver_version="550.54.15")),
    "dcgm-failure": _tray(dcgm=DcgmHealth(True, "Failure", (DcgmIncident("GPU", "0", "Memory system", "Failure",
                                                                         "Detected 1 volatile double-bit ECC error(s) in GPU 0."),))),
    "dcgm-hung": _tray(dcgm=DcgmHealth(True, error="dcgmi health -c did not answer within 4s (host engine hung?); killed")),
    "dcgm-absent": _tray(dcgm=DcgmHealth(False)),
}
SETTINGS = (HealthSettings(), HealthSettings(imex="required", dcgm="required"), HealthSettings(driver_mismatch=Severity.CRITICAL),
            HealthSettings(fabric_flags={"route_unhealthy": Severity.CRITICAL}))


def _expect(host="t01") -> TrayExpectation:
    return TrayExpectation(host=host, rack="rack-a", driver_version=REAL.driver_version, nvlink_domain=DOMAIN,
                           scheduler="slurm")


def tray_findings():
    """What the health sweep, `node check` and the audit evaluate: run_tray per tray, run_rack per rack."""
    out = []
    for settings in SETTINGS:
        for facts in TRAYS.values():
            out += checks.run_tray(facts, _expect(facts.host), settings)
    rack = [replace(t, host=f"t{i:02d}") for i, t in enumerate(TRAYS.values()) if t.reached]
    plan = {t.host: ("p1" if i % 2 else "p2") for i, t in enumerate(rack)}
    out += checks.run_rack("rack-a", rack, plan)
    return out


def _rack(n: int, domain: str | None = DOMAIN) -> Rack:
    trays = tuple(Host(f"rack-a-tray{i:02d}", f"10.0.0.{i}", "compute", "rack-a") for i in range(1, n + 1))
    return Rack(name="rack-a", model="nvl72", compute_trays=n, switch_trays=0, nvlink_domain=domain, nmx=None,
                head=None, compute=trays, switches=(), partitions=())


def inventory_findings():
    """What `mctl rack inventory` evaluates: validate_rack over the same faults, as trays of one rack."""
    faults = list(TRAYS.values())
    rack = _rack(len(faults))
    trays = [replace(f, host=h.name, address=h.address, hostname=h.name) for f, h in zip(faults, rack.compute)]
    trays.append(replace(trays[0], hostname="someone-else"))      # host.name, and a duplicate GPU UUID
    trays.append(replace(trays[0], reach="host-key-mismatch", error="refused"))
    out = []
    for settings in SETTINGS:
        out += validate_rack(rack, trays, other_domains={DOMAIN: "rack-b"}, settings=settings)
        out += validate_rack(_rack(len(faults), None), trays[:1], settings=settings)   # domain undeclared
        split = _fabric(REAL, clique_id=7)
        split = replace(split, gpus=(replace(split.gpus[0], fabric=replace(split.gpus[0].fabric, clique_id=8,
                                                                           cluster_uuid=None)),) + split.gpus[1:])
        out += validate_rack(_rack(1), [replace(trays[0], gpus=split)], settings=settings)
    return out


def bmc_findings():
    """The out-of-band checks (mctl.checks.leak): the sweep reads them from each tray's BMC, node check never."""
    from tests.helpers import BMC_CASES

    out = []
    for settings in SETTINGS:
        for bmc in BMC_CASES.values():
            out += checks.run_tray(_tray(bmc=bmc), _expect(), settings)
            out += checks.run_tray(_tray(reach="unreachable", error="no SSH answer", bmc=bmc), _expect(), settings)
    return out


def switch_side_findings():
    """The switch side (mctl.checks.switch_fabric): the sweep judges it from each rack's NMX-M view."""
    from mctl.checks import switch_fabric
    from mctl.model.fabric import PartitionFabric, SwitchFault, SwitchSideView

    trays = ("r1-tray01", "r1-tray02")
    view = SwitchSideView("r1", (PartitionFabric("p0", 1, "DEGRADED", trays),),
                          (SwitchFault("nvsw01", "switch", "UNHEALTHY", trays, ("p0",)),
                           SwitchFault("nvsw02", "port", "DISABLED/STATE_DOWN", trays[:1], ("p0",), 3, ("r1-tray01:0",))),
                          9, 100, read_at=1.0, age_s=1.0)
    return (switch_fabric.judge_tray(trays[0], view) + switch_fabric.judge_view(view, 30)
            + switch_fabric.judge_view(SwitchSideView("r1", error="unavailable"), 30))


EVALUATED = {HEALTH: lambda: tray_findings() + bmc_findings() + switch_side_findings(), NODE_CHECK: tray_findings,
             AUDIT: lambda: tray_findings() + bmc_findings(), INVENTORY: inventory_findings}


# --- the catalogue itself -------------------------------------------------------------------------

def test_every_check_id_is_defined_once_with_one_severity():
    ids = [c.id for c in catalogue._ENTRIES]
    assert len(ids) == len(set(ids)) == len(CHECKS)
    for c in CHECKS.values():
        assert isinstance(c.severity, Severity), c
        assert c.about and c.id.count(".") == 1 and c.id == c.id.lower(), c


def test_every_check_is_tagged_with_known_purposes():
    for c in CHECKS.values():
        assert c.purposes and c.purposes <= set(PURPOSES), c
    for purpose in PURPOSES:
        assert for_purpose(purpose), purpose
    with pytest.raises(ValueError):
        for_purpose("bogus")


def test_a_severity_setting_names_a_health_setting():
    fields = {f.name for f in dataclasses.fields(HealthSettings)}
    for c in CHECKS.values():
        if c.setting is not None:
            assert c.setting in fields, c


def test_the_check_modules_define_only_catalogue_ids():
    """Every check-id constant of the rule modules (what _OWNERS orders drains by) is in the catalogue."""
    ids = set(checks._OWNERS)
    assert ids and ids <= set(CHECKS), ids - set(CHECKS)
    assert checks.PARTIAL in CHECKS


def test_failures_take_the_catalogues_severity():
    from mctl.checks._base import fail

    for c in CHECKS.values():
        assert fail("t01", c.id, "x").severity is c.severity
    with pytest.raises(KeyError):
        fail("t01", "gpu.not-a-check", "x")


def test_inventory_rules_use_catalogue_ids_only():
    """Every literal check id the inventory rules write is a catalogue id tagged inventory."""
    source = (Path(mctl.checks.__file__).parent / "inventory.py").read_text()
    literals = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and len(node.args) >= 3:
            func = getattr(node.func, "id", None)
            arg = node.args[2] if func == "Finding" else node.args[1] if func in ("critical", "warn", "fail") else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                literals.add(arg.value)
    assert len(literals) >= 10, literals
    for check_id in literals:
        assert INVENTORY in spec(check_id).purposes, check_id


# --- what each purpose's evaluator really emits ---------------------------------------------------

@pytest.mark.parametrize("purpose", PURPOSES)
def test_each_purpose_emits_only_its_catalogue_ids_at_their_severity(purpose):
    findings = EVALUATED[purpose]()
    assert findings
    for f in findings:
        assert f.check in CHECKS, f"{purpose}: {f.check} is not in the catalogue"
        entry = CHECKS[f.check]
        assert purpose in entry.purposes, f"{purpose} evaluates {f.check}, which is not tagged with it"
        assert entry.allows(f.severity), f"{f.check}: {f.severity.value} ({f.message})"


@pytest.mark.parametrize("purpose", PURPOSES)
def test_the_faults_exercise_most_of_each_purposes_checks(purpose):
    """The battery above is not a formality: it makes the evaluator emit nearly every check it is tagged with."""
    emitted = {f.check for f in EVALUATED[purpose]() if f.severity is not Severity.OK}
    # the audit's own families (audit-only ids) judge Slurm, NMX-M and files, not a tray's probe:
    # test_audit_only_ids_are_the_audit_rules_ids and tests/unit/test_audit_rules.py exercise them
    tagged = {c.id for c in for_purpose(purpose) if c.severity is not Severity.OK and c.purposes != {AUDIT}}
    assert len(emitted & tagged) >= 0.8 * len(tagged), sorted(tagged - emitted)


def test_shared_rules_judge_a_tray_alike_in_inventory_and_health():
    """gpu.count, gpu.facts and fabric.state: one rule, the same severity and words in both."""
    for name in ("three-gpus", "no-gpu-facts", "fabric-in-progress", "fabric-error"):
        facts = TRAYS[name]
        health = {(f.check, f.severity, f.message) for f in checks.run_tray(facts, replace(_expect(), gpus_per_tray=4),
                                                                            HealthSettings())
                  if f.check in ("gpu.count", "gpu.facts", "fabric.state") and f.severity is not Severity.OK}
        rack = _rack(1)
        inv = validate_rack(rack, [replace(facts, host=rack.compute[0].name, hostname=None)])
        inventory = {(f.check, f.severity, f.message) for f in inv
                     if f.check in ("gpu.count", "gpu.facts", "fabric.state")}
        assert health and health == inventory, name


def test_gpu_count_attached_but_unlisted_is_critical_everywhere():
    """All 4 GPUs listed but the driver counts 5 (a GPU it knows, nvidia-smi could not read): CRITICAL, with
    the same words, in the rack inventory and in a health sweep (the copies once disagreed)."""
    facts = _tray(gpus=replace(REAL, attached_gpus=5))
    (h,) = [f for f in checks.run_tray(facts, _expect(), HealthSettings()) if f.check == "gpu.count"]
    assert h.severity is Severity.CRITICAL and "driver counts 5 GPUs but nvidia-smi lists 4" in h.message
    rack = _rack(1)
    (i,) = [f for f in validate_rack(rack, [replace(facts, host=rack.compute[0].name, hostname=None)])
            if f.check == "gpu.count"]
    assert (i.severity, i.message) == (h.severity, h.message)


def test_audit_only_ids_are_the_audit_rules_ids():
    """Every id the audit's rule families and the image drift use is a catalogue entry for the audit, and
    every audit-only entry is used by one of them (no entry left behind)."""
    import re
    from types import ModuleType

    from mctl.audit.rules import boot, drains, firmware, hostkeys, imex, layers, nmx, slurm
    from mctl.images import drift
    from mctl.images.catalog import load_image

    used = set()
    for module in (boot, drains, firmware, hostkeys, imex, layers, nmx, slurm):
        assert isinstance(module, ModuleType)
        used |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)
                 and re.fullmatch(r"[a-z]+\.[a-z_-]+", v)}
    for name in ("gb200-ubuntu24.04", "lab-debian13"):          # the lab's image names MUNGE too
        image = load_image(Path(__file__).resolve().parents[2] / "images" / f"{name}.yml")
        used |= {c.check for c in drift.compare(image, {"slurm_version": None, "packages": {}})}
    for check_id in used:
        assert check_id in CHECKS and AUDIT in CHECKS[check_id].purposes, check_id
    audit_only = {c.id for c in CHECKS.values() if c.purposes == {AUDIT}}
    assert audit_only <= used, sorted(audit_only - used)


def test_an_audit_finding_outside_the_catalogue_is_refused():
    from mctl.audit.model import tag
    from mctl.model.findings import Finding

    with pytest.raises(RuntimeError, match="not in the check catalogue"):
        tag("x", [Finding(Severity.WARN, "h", "made.up", "m", None, {})], rack_of={})
    with pytest.raises(RuntimeError, match="at critical"):
        tag("x", [Finding(Severity.CRITICAL, "h", "drain.age", "m", None, {})], rack_of={})
    assert tag("x", [Finding(Severity.WARN, "h", "drain.age", "m", None, {})], rack_of={})
