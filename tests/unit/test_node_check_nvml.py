"""NVML -> GpuReport with a stand-in for pynvml (no driver here): the structs are nvidia-ml-py's own
ctypes classes, so field names, the fabric-info version constant and healthMask decoding are real."""

from __future__ import annotations

import pynvml
import pytest

from mctl import checks
from mctl.health import nvml
from mctl.model.tray import TrayExpectation, TrayFacts
from mctl.model.settings import HealthSettings
from mctl.model.findings import Severity

UUID = bytes.fromhex("889d2be14bbf69e1d3f297c465ee31aa")


class FakeNvml:
    """The subset of pynvml the node check calls, answering for a 4-GPU GB200 tray."""

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
    nvmlGpuFabricInfo_v2 = pynvml.nvmlGpuFabricInfo_v2
    NVMLError = pynvml.NVMLError
    nvmlClocksEventReasonGpuIdle = pynvml.nvmlClocksEventReasonGpuIdle
    nvmlClocksEventReasonHwSlowdown = pynvml.nvmlClocksEventReasonHwSlowdown
    nvmlClocksEventReasonHwPowerBrakeSlowdown = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    nvmlClocksEventReasonSwPowerCap = pynvml.nvmlClocksEventReasonSwPowerCap

    def __init__(self, lost=(), down=(), health_mask=None, state=3, ecc=None, clocks=0):
        self.lost, self.down, self.state, self.ecc = set(lost), set(down), state, ecc or {}
        self.clocks = clocks
        # bandwidth FALSE(2), recovery FALSE, route_unhealthy TRUE(1), timeout FALSE, config none(1)
        self.mask = health_mask if health_mask is not None else (2 | 2 << 2 | 1 << 4 | 2 << 6 | 1 << 8)

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetHandleByIndex(self, i):
        if i in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08x}-7c3e-5a1b-9d2f-4e6a8b0c1d2e"

    def nvmlDeviceGetPciInfo(self, h):
        class Pci:
            busId = f"00000008:0{h + 1}:00.0".encode()
        return Pci()

    def nvmlDeviceGetSerial(self, h):
        return "1655024000123"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA GB200"

    def nvmlDeviceGetModuleId(self, h):
        return h + 1

    def nvmlDeviceGetMinorNumber(self, h):
        return h

    def nvmlDeviceGetGpuFabricInfoV(self, h, info):
        assert info.version == pynvml.nvmlGpuFabricInfo_v2
        info.state = self.state
        info.status = 0
        info.cliqueId = 32766
        info.healthMask = self.mask
        for i, b in enumerate(UUID):
            info.clusterUuid[i] = b
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return self.ecc.get(h, 0)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 0, False, False)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 30 + h

    def nvmlDeviceGetPowerUsage(self, h):
        return 240_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 1_200_000

    def nvmlDeviceGetMemoryInfo(self, h):
        class Mem:
            total = 189471 * 1024 * 1024
        return Mem()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.clocks

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if (h, link) in self.down else 1

    def nvmlSystemGetDriverVersion(self):
        return "570.148.08"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080


def judge(report, links, messages=()):
    facts = TrayFacts("t01", gpus=report, nvlinks=links, gpu_messages=messages, gpu_source="nvml")
    expect = TrayExpectation("t01", driver_version="570.148.08", nvlink_domain="889d2be1-4bbf-69e1-d3f2-97c465ee31aa")
    return checks.run_tray(facts, expect, HealthSettings())


def test_healthy_tray_from_nvml_reads_like_the_real_sample():
    report, links, messages = nvml.read(FakeNvml())
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("570.148.08", "12.8", 4)
    g = report.gpus[0]
    assert g.fabric.state == "Completed" and g.fabric.status == "Success" and g.fabric.clique_id == 32766
    assert g.fabric.cluster_uuid == "889d2be1-4bbf-69e1-d3f2-97c465ee31aa"
    assert (g.fabric.health.bandwidth, g.fabric.health.route_unhealthy, g.fabric.health.incorrect_configuration) \
        == ("Full", True, "None")
    assert (g.power_draw_w, g.power_limit_w, g.memory_total_mib) == (240.0, 1200.0, 189471)
    assert g.ecc.volatile_uncorrectable == 0 and g.ecc.volatile_correctable is None
    assert [len(l.links) for l in links] == [18] * 4 and messages == ()
    found = judge(report, links)
    assert {f.check for f in found if f.severity is not Severity.OK} == {"fabric.health"}   # route_unhealthy: warn


def test_lost_gpu_down_link_and_ecc_from_nvml():
    report, links, messages = nvml.read(FakeNvml(lost={2}, down={(0, 3)}, ecc={1: 4}))
    assert len(report.gpus) == 3 and report.attached_gpus == 4
    assert messages and "GPU2" in messages[0]
    crit = {f.check for f in judge(report, links, messages) if f.severity is Severity.CRITICAL}
    assert crit == {"gpu.count", "nvlink.links", "gpu.ecc"}


def test_fabric_not_completed_and_bad_configuration():
    report, _, _ = nvml.read(FakeNvml(state=2))
    g = report.gpus[0]
    assert (g.fabric.state, g.fabric.status, g.fabric.cluster_uuid) == ("In Progress", None, None)
    report, _, _ = nvml.read(FakeNvml(health_mask=(5 << 8)))
    assert report.gpus[0].fabric.health.incorrect_configuration == "insufficient NVLinks"


def test_load_explains_why_nvml_is_not_used():
    nv, why = nvml.load()
    if nv is None:
        assert why and ("NVML" in why or "pynvml" in why)
    else:   # a machine with a real driver
        nvml.shutdown(nv)
        pytest.skip("NVML loaded here")


def test_clock_event_reasons_from_nvml_are_judged():
    from mctl.checks import clocks
    from mctl.health import nvml as nvml_facts

    nv = FakeNvml(clocks=pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown | pynvml.nvmlClocksEventReasonGpuIdle)
    events = nvml_facts.clock_events(nv, 0)
    assert events.element == "clocks_event_reasons"
    assert events.active == ("gpu_idle", "hw_power_brake_slowdown")
    assert "sw_power_cap" in events.reported and "sw_thermal_slowdown" not in events.reported   # the fake lacks it
    report, links, _ = nvml_facts.read(nv)
    found = clocks.check(TrayFacts(host="t01", gpus=report, nvlinks=links), None, HealthSettings())
    assert [f.severity for f in found] == [Severity.WARN]          # one sweep: warns (critical after 3)
    assert "HW power brake (1 sweep)" in found[0].message
