"""Bring-up's judge of trays without GPU tools (mctl.checks.bare_tray): provisioning's to install, or blocking.

Pure: the witnesses are what mctl.rackinv.bare reads from the trays' BMCs (Chassis/HGX_GPU_n, as in the
real GB200 capture) and NMX-M (the GPUs of each tray's compute node).
"""

from __future__ import annotations

from mctl.checks.bare_tray import Witness, judge
from mctl.checks.inventory import validate_rack
from mctl.model.findings import Severity
from mctl.model.tray import GPU_TOOLS_MISSING, TrayFacts
from tests.helpers import make_rack

RACK = make_rack(2, name="r1")
T1, T2 = (h.name for h in RACK.compute)
FOUR = tuple(f"HGX_GPU_{i}" for i in range(4))
NMX4 = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")


def bare(host: str) -> TrayFacts:
    return TrayFacts(host, "127.0.0.1", "ok", hostname=host, gpu_error=GPU_TOOLS_MISSING)


def _judge(witnesses, serials=None):
    trays = [bare(T1), bare(T2)]
    findings = validate_rack(RACK, trays)
    assert {f.check for f in findings if f.severity is Severity.CRITICAL} == {"gpu.facts"}
    return judge(RACK, trays, findings, witnesses, serials or {})


def crit(findings):
    return {(f.host, f.check): f for f in findings if f.severity is Severity.CRITICAL}


def test_missing_tools_are_provisionings_where_bmc_and_nmx_show_every_gpu():
    both = [Witness("BMC", FOUR), Witness("NMX-M", NMX4)]
    findings, deferred = _judge({T1: both, T2: both}, {T1: "0xAA", T2: "0xBB"})
    assert crit(findings) == {}
    assert deferred == {t: "nvidia-smi not installed yet: provisioning installs the GPU tools (BMC 4/4, NMX-M 4/4 "
                           "GPUs)" for t in (T1, T2)}


def test_a_gpu_one_witness_does_not_show_blocks_and_is_named():
    findings, deferred = _judge({T1: [Witness("BMC", FOUR[:3]), Witness("NMX-M", NMX4)],
                                 T2: [Witness("BMC", FOUR), Witness("NMX-M", NMX4[:2])]})
    got = crit(findings)
    assert set(got) == {(T1, "gpu.out-of-band"), (T2, "gpu.out-of-band")} and deferred == {}
    assert got[(T1, "gpu.out-of-band")].message == ("the BMC shows 3 GPUs, expected 4 (HGX_GPU_0, HGX_GPU_1, "
                                                    "HGX_GPU_2) (no GPU tools on the tray yet)")
    assert "the NMX-M shows 2 GPUs, expected 4" in got[(T2, "gpu.out-of-band")].message
    assert got[(T1, "gpu.out-of-band")].details["short"] == "gpu count 3/4"


def test_an_unread_witness_or_none_at_all_blocks_with_the_reason():
    findings, deferred = _judge({T1: [Witness("BMC", None, "no complete answer within 5s"), Witness("NMX-M", NMX4)],
                                 T2: []})
    got = crit(findings)
    assert deferred == {}
    assert got[(T1, "gpu.out-of-band")].message == (f"{GPU_TOOLS_MISSING}, and the BMC could not be read (no complete "
                                                    "answer within 5s)")
    assert "neither a BMC nor NMX-M is configured" in got[(T2, "gpu.out-of-band")].message
    assert "bmc section" in got[(T2, "gpu.out-of-band")].action


def test_one_chassis_serial_on_two_trays_blocks_both():
    both = [Witness("BMC", FOUR), Witness("NMX-M", NMX4)]
    findings, deferred = _judge({T1: both, T2: both}, {T1: "0xAA", T2: "0xAA"})
    got = crit(findings)
    assert set(got) == {(T1, "bmc.serial-duplicate"), (T2, "bmc.serial-duplicate")} and deferred == {}
    assert got[(T1, "bmc.serial-duplicate")].message == f"its BMC reports chassis serial 0xAA, as the BMC of {T2} does"


def test_a_tray_with_its_tools_is_judged_by_the_inventory_alone():
    """A driver fault (nvidia-smi there, no driver) is never left to provisioning."""
    broken = TrayFacts(T1, "127.0.0.1", "ok", hostname=T1, gpu_error="NVIDIA-SMI has failed: no driver")
    trays = [broken, bare(T2)]
    findings = validate_rack(RACK, trays)
    kept, deferred = judge(RACK, trays, findings, {T2: [Witness("BMC", FOUR)]}, {})
    assert set(crit(kept)) == {(T1, "gpu.facts")} and set(deferred) == {T2}
    assert not broken.gpu_tools_missing and bare(T2).gpu_tools_missing
    assert not TrayFacts(T1, reach="unreachable", gpu_error=GPU_TOOLS_MISSING).gpu_tools_missing
