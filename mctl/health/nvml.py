"""GPU facts straight from NVML (nvidia-ml-py's `pynvml`) for `mctl node check` on a tray.

Faster and sturdier than parsing nvidia-smi when the library loads; the result
is the same GpuReport/GpuNvLinks the nvidia-smi parsers produce, so the checks
cannot tell the difference. A call the driver does not support yields None for
that value (as nvidia-smi prints N/A). When pynvml is missing or libnvidia-ml
does not load, `available()` says so and the node check uses nvidia-smi.
"""

from __future__ import annotations

from typing import Any

from mctl.model.gpu import (FABRIC_STATES, ClockEvents, EccCounts, FabricHealth, Gpu, GpuFabric, GpuNvLinks, GpuReport, NvLink,
                            NVLINK_SPEED_GBPS, NVLINKS_PER_GPU, PlatformInfo, RemappedRows, cluster_uuid_or_none)

# healthMask fields: (shift, width) as NVML documents them.
_TRUE, _FALSE = 1, 2
_INCORRECT_CONFIG = {1: "None", 2: "sysguid", 3: "chassis serial", 4: "no partition", 5: "insufficient NVLinks",
                     6: "incompatible GPU firmware", 7: "invalid location", 8: "GPU state invalid"}


def load() -> tuple[Any | None, str | None]:
    """(initialised pynvml module, None) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, ("nvidia-ml-py (pynvml) is not installed (the node_check role ships it in "
                      "/usr/local/lib/mctl-node-check; 'mctl node install-check' re-installs it)")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, OSError ...
        return None, f"NVML did not load: {exc}"
    return pynvml, None


def _call(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises per-call errors for unsupported queries: N/A
        return default


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    value = str(value).strip()
    return value or None


def _uuid16(raw) -> str | None:
    data = bytes(raw)
    if len(data) != 16:
        return None
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _flag(mask: int, shift: int) -> bool | None:
    value = (mask >> shift) & 0x3
    return True if value == _TRUE else False if value == _FALSE else None


def fabric(nv, handle) -> GpuFabric:
    """nvmlDeviceGetGpuFabricInfoV (v2 struct) -> GpuFabric, health flags decoded from healthMask."""
    info = nv.c_nvmlGpuFabricInfoV_t()
    info.version = nv.nvmlGpuFabricInfo_v2
    try:
        nv.nvmlDeviceGetGpuFabricInfoV(handle, info)
    except Exception:  # noqa: BLE001 - not a fabric-attached GPU, or an older driver
        return GpuFabric()
    state = FABRIC_STATES[info.state] if 0 <= info.state < len(FABRIC_STATES) else None
    completed = state == "Completed"
    status = None
    if completed:
        status = "Success" if info.status == 0 else _text(_call(lambda: str(nv.NVMLError(info.status))))
    mask = int(info.healthMask)
    bad_config = (mask >> 8) & 0xF
    health = FabricHealth(
        bandwidth=None if _flag(mask, 0) is None else ("Degraded" if _flag(mask, 0) else "Full"),
        route_recovery_in_progress=_flag(mask, 2), route_unhealthy=_flag(mask, 4),
        access_timeout_recovery=_flag(mask, 6),
        incorrect_configuration=_INCORRECT_CONFIG.get(bad_config) if bad_config else None,
    ) if completed else FabricHealth()
    return GpuFabric(state=state, status=status, clique_id=int(info.cliqueId) if completed else None,
                     cluster_uuid=cluster_uuid_or_none(_uuid16(info.clusterUuid)) if completed else None,
                     health=health)


# nvmlClocksEventReason* masks (the ClocksThrottleReason* names of older bindings are the same bits) by the
# reason names nvidia-smi -q -x prints (mctl.model.gpu.CLOCK_REASONS)
_CLOCK_BITS = (("gpu_idle", "GpuIdle"), ("applications_clocks_setting", "ApplicationsClocksSetting"),
               ("sw_power_cap", "SwPowerCap"), ("hw_slowdown", "HwSlowdown"),
               ("hw_thermal_slowdown", "HwThermalSlowdown"), ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
               ("sync_boost", "SyncBoost"), ("sw_thermal_slowdown", "SwThermalSlowdown"),
               ("display_clocks_setting", "DisplayClockSetting"))


def clock_events(nv, handle) -> ClockEvents:
    """nvmlDeviceGetCurrentClocksEventReasons (R535+), else ...ThrottleReasons: the same reasons nvidia-smi prints;
    a reason outside the supported mask is not reported."""
    for call, prefix, element in (("nvmlDeviceGetCurrentClocksEventReasons", "nvmlClocksEventReason",
                                   "clocks_event_reasons"),
                                  ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlClocksThrottleReason",
                                   "clocks_throttle_reasons")):
        fn = getattr(nv, call, None)
        mask = _call(fn, handle) if fn is not None else None
        if mask is None:
            continue
        supported_fn = getattr(nv, call.replace("Current", "Supported"), None)
        supported = _call(supported_fn, handle) if supported_fn is not None else None
        active, reported = [], []
        for name, bit_name in _CLOCK_BITS:
            bit = getattr(nv, prefix + bit_name, None)
            if bit is None or (supported is not None and not int(supported) & int(bit)):
                continue
            reported.append(name)
            if int(mask) & int(bit):
                active.append(name)
        return ClockEvents(element, tuple(active), tuple(reported))
    return ClockEvents()


def _gpu(nv, index: int, handle) -> Gpu:
    pci = _call(nv.nvmlDeviceGetPciInfo, handle)
    bus_id = _text(getattr(pci, "busId", None)) or f"unknown:{index}"
    unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    corr = getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    rows = _call(nv.nvmlDeviceGetRemappedRows, handle)
    power = _call(nv.nvmlDeviceGetPowerUsage, handle)
    limit = _call(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
    memory = _call(nv.nvmlDeviceGetMemoryInfo, handle)
    return Gpu(
        index=index, uuid=_text(_call(nv.nvmlDeviceGetUUID, handle)) or f"unknown-{index}", pci_bus_id=bus_id,
        serial=_text(_call(nv.nvmlDeviceGetSerial, handle)), product_name=_text(_call(nv.nvmlDeviceGetName, handle)),
        module_id=_call(nv.nvmlDeviceGetModuleId, handle), minor_number=_call(nv.nvmlDeviceGetMinorNumber, handle),
        platform=PlatformInfo(), fabric=fabric(nv, handle),
        ecc=EccCounts(volatile_uncorrectable=_call(nv.nvmlDeviceGetTotalEccErrors, handle, unc, nv.NVML_VOLATILE_ECC),
                      aggregate_uncorrectable=_call(nv.nvmlDeviceGetTotalEccErrors, handle, unc,
                                                    nv.NVML_AGGREGATE_ECC),
                      volatile_correctable=_call(nv.nvmlDeviceGetTotalEccErrors, handle, corr, nv.NVML_VOLATILE_ECC),
                      aggregate_correctable=_call(nv.nvmlDeviceGetTotalEccErrors, handle, corr,
                                                  nv.NVML_AGGREGATE_ECC)),
        remapped_rows=RemappedRows(*(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])) if rows else ()),
        temperature_c=_call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
        power_draw_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        memory_total_mib=None if memory is None else int(memory.total // (1024 * 1024)),
        clock_events=clock_events(nv, handle),
    )


def _links(nv, index: int, handle, gpu: Gpu) -> GpuNvLinks:
    links = []
    for link in range(NVLINKS_PER_GPU):
        state = _call(nv.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            break            # the GPU has fewer links than this one
        links.append(NvLink(link, NVLINK_SPEED_GBPS if state else None))
    return GpuNvLinks(index, gpu.product_name, gpu.uuid, tuple(links))


def read(nv) -> tuple[GpuReport, tuple[GpuNvLinks, ...], tuple[str, ...]]:
    """(report, NVLinks per GPU, messages about GPUs NVML counts but cannot open)."""
    count = int(nv.nvmlDeviceGetCount())
    gpus: list[Gpu] = []
    links: list[GpuNvLinks] = []
    messages: list[str] = []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:  # noqa: BLE001 - a GPU that fell off the bus: counted, not readable
            messages.append(f"Unable to determine the device handle for GPU{i}: {exc}")
            continue
        gpu = _gpu(nv, len(gpus), handle)
        gpus.append(gpu)
        links.append(_links(nv, gpu.index, handle, gpu))
    cuda = _call(nv.nvmlSystemGetCudaDriverVersion)
    report = GpuReport(driver_version=_text(_call(nv.nvmlSystemGetDriverVersion)),
                       cuda_version=f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None,
                       attached_gpus=count, gpus=tuple(gpus))
    return report, tuple(links), tuple(messages)


def shutdown(nv) -> None:
    _call(nv.nvmlShutdown)
