"""The check catalogue on real captures first (the GB200 sample, the lab's faulted tray), then edge cases."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mctl.facts.kernel_log import parse_xid_line
from mctl.facts.nvidia_smi import parse_nvlink_status, parse_xml
from mctl.model.tray import ServiceState
from mctl import checks
from mctl.checks import compose_reason, drain_reason
from mctl.checks import fabric_identity
from mctl.facts.kernel_log import observe_xid
from mctl.model.tray import DiskUsage, ImexObservation, Memory, TrayFacts
from mctl.model.drain import REASON_MAX
from mctl.model.settings import HealthSettings
from mctl.model.findings import Severity, worst
from mctl.model.gpu import GpuNvLinks, NvLink
from mctl.sched.slurm.facts import parse_show_nodes
from tests.helpers import GB200_GPUS, LINKS_OK, TRAY_CLOCK, by_check, expect, tray, xid_line

FIX = Path(__file__).resolve().parents[1] / "fixtures"
LAB_HEALTHY = parse_xml((FIX / "lab" / "healthy-q-x.xml").read_text())
LAB_FAULTED = parse_xml((FIX / "lab" / "faulted-q-x.xml").read_text())
LINKS_DOWN = parse_nvlink_status((FIX / "lab" / "faulted-nvlink-status.txt").read_text())
S = HealthSettings()


def run(facts, exp=None, settings=S):
    return checks.run_tray(facts, exp or expect(facts.host), settings)


# --- real captures --------------------------------------------------------------------------------

def test_real_gb200_tray_is_healthy_apart_from_the_route_unhealthy_warning():
    found = run(tray())
    assert worst(found) is Severity.WARN
    (flag,) = [f for f in found if f.severity is not Severity.OK]
    assert flag.check == "fabric.health" and "route unhealthy" in flag.message and "gpu0,1,2,3" in flag.message
    assert {f.check for f in found} >= {"gpu.count", "gpu.driver", "fabric.state", "fabric.domain", "nvlink.links",
                                        "gpu.ecc", "gpu.temperature", "gpu.power", "slurm.slurmd", "host.disk",
                                        "host.memory", "tray.reachable"}


def test_route_unhealthy_severity_is_configurable():
    strict = replace(S, fabric_flags={**S.fabric_flags, "route_unhealthy": Severity.CRITICAL})
    found = run(tray(), settings=strict)
    assert worst(found) is Severity.CRITICAL
    quiet = replace(S, fabric_flags={**S.fabric_flags, "route_unhealthy": Severity.OK})
    found = run(tray(), settings=quiet)
    assert worst(found) is Severity.OK
    assert "not counted" in by_check(found, "fabric.health")[0].message


def test_lab_faulted_capture_has_every_lasting_effect_critical():
    found = run(tray(gpus=LAB_FAULTED, nvlinks=LINKS_DOWN), expect(nvlink_domain=None))
    crit = {f.check for f in found if f.severity is Severity.CRITICAL}
    assert crit == {"gpu.count", "gpu.ecc", "gpu.recovery", "nvlink.links"}
    assert by_check(found, "gpu.count")[0].details["visible"] == 3
    assert "gpu0 link3" in by_check(found, "nvlink.links")[0].message
    assert by_check(found, "gpu.remapped-rows")[0].severity is Severity.WARN     # pending, not failed
    reason, full = drain_reason(found)
    assert reason.startswith("mctl: gpu count 3/4") and reason.endswith("+3") and len(reason) <= REASON_MAX
    assert "nvlink.links" in full and "gpu.ecc" in full


def test_lab_healthy_capture_is_ok():
    found = run(tray(gpus=LAB_HEALTHY), expect(nvlink_domain=None))
    assert worst(found) is Severity.OK


# --- one check at a time ----------------------------------------------------------------------------

def test_unreachable_tray_gets_only_the_reachability_finding():
    facts = TrayFacts("t01", address="10.0.0.1", reach="unreachable", error="no SSH answer within 10s")
    found = run(facts)
    assert [(f.check, f.severity) for f in found] == [("tray.reachable", Severity.CRITICAL)]
    assert found[0].details["reach"] == "unreachable"


def test_no_gpu_facts_is_critical_and_silences_gpu_checks():
    found = run(tray(gpus=None, nvlinks=None, gpu_error="nvidia-smi hung: no answer within 27s (driver wedged?)"))
    (f,) = by_check(found, "gpu.facts")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "nvidia-smi hung"
    assert not by_check(found, "nvlink.links") and not by_check(found, "fabric.state")


def test_driver_against_the_image():
    found = run(tray(), expect(driver_version="575.51.03", image="gb200-ubuntu24.04"))
    (f,) = by_check(found, "gpu.driver")
    assert f.severity is Severity.WARN and "575.51.03" in f.message and "gb200-ubuntu24.04" in f.message
    found = run(tray(), expect(driver_version="575.51.03"), replace(S, driver_mismatch=Severity.CRITICAL))
    assert by_check(found, "gpu.driver")[0].severity is Severity.CRITICAL
    assert not by_check(run(tray(), expect(driver_version=None)), "gpu.driver")


def _fabric(report, **fields):
    gpus = tuple(replace(g, fabric=replace(g.fabric, **fields)) for g in report.gpus)
    return replace(report, gpus=gpus)


def test_fabric_in_progress_is_a_warning_other_states_critical():
    found = run(tray(gpus=_fabric(GB200_GPUS, state="In Progress", status=None, cluster_uuid=None, clique_id=None)))
    (f,) = by_check(found, "fabric.state")
    assert f.severity is Severity.WARN and "In Progress/N/A" in f.message
    assert not by_check(found, "fabric.domain")        # no domain yet is fabric.state's to report
    found = run(tray(gpus=_fabric(GB200_GPUS, status="Unknown Error")))
    assert by_check(found, "fabric.state")[0].severity is Severity.CRITICAL
    assert by_check(found, "fabric.state")[0].details["short"] == "fabric unknown error gpu0,1,2,3"


def test_fabric_domain_against_the_inventory():
    found = run(tray(), expect(nvlink_domain="7b968a6d-c8aa-45e1-9e07-e1e51be99c31"))
    (f,) = by_check(found, "fabric.domain")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "wrong nvlink domain"
    found = run(tray(gpus=_fabric(GB200_GPUS, cluster_uuid=None)))
    assert by_check(found, "fabric.domain")[0].details["short"] == "no nvlink domain"


def test_clique_split_inside_a_tray():
    gpus = tuple(replace(g, fabric=replace(g.fabric, clique_id=2 if g.index < 2 else 3)) for g in GB200_GPUS.gpus)
    found = run(tray(gpus=replace(GB200_GPUS, gpus=gpus)))
    (f,) = by_check(found, "fabric.clique")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "clique split"


def test_clique_against_the_partition_plan():
    def with_clique(host, clique):
        return tray(host, gpus=_fabric(GB200_GPUS, clique_id=clique))
    trays = [with_clique("t01", 2), with_clique("t02", 2), with_clique("t03", 5), with_clique("t04", 3),
             with_clique("t05", 3)]
    plan = {"t01": "p0", "t02": "p0", "t03": "p0", "t04": "p1", "t05": "p1"}
    found = fabric_identity.rack_check("rack-a", trays, plan)
    (f,) = found
    assert f.host == "t03" and f.severity is Severity.CRITICAL and f.details == {
        "clique": 5, "partition": "p0", "expected": 2, "short": "clique 5 not 2"}
    # the plan is not applied: both partitions still in one clique -> a rack warning, no tray drained
    same = [with_clique(h, 32766) for h in ("t01", "t02", "t04", "t05")]
    (f,) = fabric_identity.rack_check("rack-a", same, plan)
    assert f.host == "rack-a" and f.severity is Severity.WARN and "p0, p1" in f.message
    # no majority in a partition: a warning, not a guess
    split = [with_clique("t01", 2), with_clique("t02", 3)]
    (f,) = fabric_identity.rack_check("rack-a", split, {"t01": "p0", "t02": "p0"})
    assert f.severity is Severity.WARN and "no majority" in f.message


def _xids(*lines):
    return tuple(observe_xid(parse_xid_line(line), TRAY_CLOCK) for line in lines)


def test_recent_fatal_xid_is_critical_with_a_short_reason():
    found = run(tray(xids=_xids(xid_line(79))))
    (f,) = by_check(found, "gpu.xid")
    assert f.severity is Severity.CRITICAL
    assert f.details["short"] == "xid 79 gpu0 (fell off bus)"
    assert "400s ago" in f.message and "reboot host" in f.action
    assert drain_reason(found)[0] == "mctl: xid 79 gpu0 (fell off bus)"


def test_which_xids_drain_is_configurable():
    lines = _xids(xid_line(63, pci="0000:3f:00"), xid_line(92, pci="0000:3f:00"))
    found = by_check(run(tray(xids=lines)), "gpu.xid")
    assert {f.details["code"]: f.severity for f in found} == {63: Severity.WARN, 92: Severity.WARN}
    assert found[0].details["gpu"] == "gpu1"
    azure = replace(S, drain_xids=S.drain_xids | {63, 92})
    found = by_check(run(tray(xids=lines), settings=azure), "gpu.xid")
    assert {f.severity for f in found} == {Severity.CRITICAL}


def test_xid_ages_out_and_earlier_boots_do_not_count():
    old = xid_line(48, uptime=86_400 - 4000, stamp="Nov 29 17:33:20")       # 4000 s ago, window is 1 h
    previous_boot = xid_line(79, uptime=500.0, stamp="Nov 27 10:00:00")     # stamp long before this boot
    found = by_check(run(tray(xids=_xids(old, previous_boot))), "gpu.xid")
    assert [(f.severity, f.message) for f in found] == [
        (Severity.OK, "no XID in the last 3600s (2 older or from an earlier boot)")]
    found = by_check(run(tray(xids=_xids(old)), settings=replace(S, xid_window_s=7200)), "gpu.xid")
    assert found[0].severity is Severity.CRITICAL


def test_xid_of_a_gpu_that_fell_off_is_named_from_nvidia_smis_message():
    without_gpu0 = replace(GB200_GPUS, gpus=GB200_GPUS.gpus[1:])
    facts = tray(gpus=without_gpu0, xids=_xids(xid_line(79, pci="0000:29:00")),
                 gpu_messages=("Unable to determine the device handle for GPU0: 0000:29:00.0: Unknown Error",))
    (f,) = by_check(run(facts), "gpu.xid")
    assert f.details["gpu"] == "gpu0"


def _gpu(report, index, **fields):
    gpus = tuple(replace(g, **fields) if g.index == index else g for g in report.gpus)
    return replace(report, gpus=gpus)


def test_ecc_remapped_rows_and_recovery_action():
    g0 = GB200_GPUS.gpus[0]
    report = _gpu(GB200_GPUS, 0, ecc=replace(g0.ecc, volatile_uncorrectable=2, aggregate_uncorrectable=2))
    (f,) = by_check(run(tray(gpus=report)), "gpu.ecc")
    assert f.severity is Severity.CRITICAL and "gpu0 2" in f.message
    report = _gpu(GB200_GPUS, 1, ecc=replace(g0.ecc, aggregate_uncorrectable=7))
    assert by_check(run(tray(gpus=report)), "gpu.ecc")[0].severity is Severity.WARN
    report = _gpu(GB200_GPUS, 2, remapped_rows=replace(g0.remapped_rows, failure=True))
    (f,) = by_check(run(tray(gpus=report)), "gpu.remapped-rows")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "row remap failure gpu2"
    report = _gpu(GB200_GPUS, 3, gpu_recovery_action="Reset")
    (f,) = by_check(run(tray(gpus=report)), "gpu.recovery")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "gpu3 needs reset"
    assert not by_check(run(tray(gpus=_gpu(GB200_GPUS, 3, gpu_recovery_action="None"))), "gpu.recovery")


def test_nvlinks():
    short = tuple(GpuNvLinks(g.index, g.name, g.uuid, g.links[:17] if g.index == 1 else g.links) for g in LINKS_OK)
    (f,) = by_check(run(tray(nvlinks=short)), "nvlink.links")
    assert f.severity is Severity.CRITICAL and "gpu1 shows 17 links" in f.message
    one_down = tuple(GpuNvLinks(g.index, g.name, g.uuid, tuple(NvLink(l.link, None if (g.index, l.link) == (2, 7)
                                                                      else l.speed_gbps) for l in g.links))
                     for g in LINKS_OK)
    (f,) = by_check(run(tray(nvlinks=one_down)), "nvlink.links")
    assert f.details["short"] == "nvlink gpu2 link7 down"
    (f,) = by_check(run(tray(nvlinks=None, nvlink_error="nvidia-smi nvlink --status hung")), "nvlink.links")
    assert f.severity is Severity.WARN


def test_temperature_and_power():
    report = _gpu(GB200_GPUS, 1, temperature_c=93.0)
    (f,) = by_check(run(tray(gpus=report)), "gpu.temperature")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "gpu1 temp 93C"
    report = _gpu(GB200_GPUS, 1, temperature_c=87.0)
    assert by_check(run(tray(gpus=report)), "gpu.temperature")[0].severity is Severity.WARN
    report = _gpu(GB200_GPUS, 2, power_draw_w=1300.0)
    (f,) = by_check(run(tray(gpus=report)), "gpu.power")
    assert f.severity is Severity.WARN and "1300 W" in f.message


def test_imex_modes_and_states():
    ready = ImexObservation(True, "READY", "UP")
    assert worst(by_check(run(tray(imex=ready)), "imex.daemon")) is Severity.OK
    assert by_check(run(tray(imex=ImexObservation(False))), "imex.daemon")[0].severity is Severity.OK
    required = replace(S, imex="required")
    assert by_check(run(tray(imex=ImexObservation(False)), settings=required), "imex.daemon")[0].severity \
        is Severity.CRITICAL
    found = run(tray(imex=ImexObservation(True, "WAITING_FOR_PEERS", "DOWN", ("node 10.0.0.2 is UNAVAILABLE",))))
    assert by_check(found, "imex.daemon")[0].severity is Severity.CRITICAL
    (d,) = by_check(found, "imex.domain")
    assert d.severity is Severity.WARN and "UNAVAILABLE" in d.message
    found = run(tray(imex=ImexObservation(True, "READY", "DEGRADED", ("a to b: disconnected",))))
    assert worst(found) is Severity.WARN
    assert not by_check(run(tray(imex=ready), settings=replace(S, imex="ignore")), "imex.daemon")


def test_slurmd():
    stopped = ServiceState("slurmd.service", True, "inactive", "dead", source="process-table")
    (f,) = by_check(run(tray(slurmd=stopped)), "slurm.slurmd")
    assert f.severity is Severity.CRITICAL and f.details["short"] == "slurmd not running"
    (node,) = parse_show_nodes("NodeName=t01 State=IDLE*+NOT_RESPONDING Reason=Not responding")
    (f,) = by_check(run(tray(slurm_node=node)), "slurm.slurmd")
    assert f.severity is Severity.WARN
    assert not by_check(run(tray(), expect(scheduler="k8s")), "slurm.slurmd")


def test_disk_and_memory():
    facts = tray(disks=(DiskUsage("/", "/", 1000, 990, 10), DiskUsage("/var", "/", 1000, 990, 10),
                        DiskUsage("/tmp", "/tmp", 1000, 920, 80)), memory=Memory(1000, 20))
    found = run(facts)
    disk = by_check(found, "host.disk")
    assert [(f.severity, f.message) for f in disk] == [(Severity.CRITICAL, "/ is 99% full"),
                                                       (Severity.WARN, "/tmp is 92% full")]
    assert by_check(found, "host.memory")[0].severity is Severity.WARN


def test_probe_problems_are_warnings():
    found = run(tray(problems=("xid: output cut off",)))
    (f,) = by_check(found, "probe.partial")
    assert f.severity is Severity.WARN


# --- drain reasons --------------------------------------------------------------------------------

def test_drain_reason_fits_sinfo_and_prefers_the_most_specific_check():
    found = run(tray(gpus=replace(GB200_GPUS, gpus=GB200_GPUS.gpus[1:]), xids=_xids(xid_line(79, pci="0000:29:00")),
                     gpu_messages=("Unable to determine the device handle for GPU0: 0000:29:00.0: Unknown Error",)))
    reason, full = drain_reason(found)
    assert reason == "mctl: xid 79 gpu0 (fell off bus) +1"
    assert full.startswith("gpu.xid: XID 79 on gpu0")
    long = compose_reason("x" * 80, " +2")
    assert len(long) == REASON_MAX and long.startswith("mctl: xxx") and long.endswith("~ +2")
    with pytest.raises(ValueError):
        drain_reason(run(tray(gpus=LAB_HEALTHY), expect(nvlink_domain=None)))
