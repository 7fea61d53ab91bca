"""GPU facts as one compute tray reports them (nvidia-smi / NVML).

Values stay per GPU on purpose: a tray whose GPUs disagree on NVLink domain or
partition is a finding, so nothing here collapses them into one tray value.
Fields a driver reports as "N/A" are None.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

ZERO_UUID = "00000000-0000-0000-0000-000000000000"

FABRIC_NOT_SUPPORTED = "Not Supported"
FABRIC_NOT_STARTED = "Not Started"
FABRIC_IN_PROGRESS = "In Progress"
FABRIC_COMPLETED = "Completed"
FABRIC_STATES = (FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED)
FABRIC_SUCCESS = "Success"

NVLINKS_PER_GPU = 18
NVLINK_SPEED_GBPS = 53.125


def cluster_uuid_or_none(value: str | None) -> str | None:
    """An all-zero cluster UUID means 'no NVLink domain', never a domain of its own."""
    if value is None:
        return None
    text = value.strip().lower()
    if not text or text == ZERO_UUID:
        return None
    return text


_PCI_RE = re.compile(r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$")


def pci_key(text: str) -> tuple[int, int, int]:
    """(domain, bus, device) of a PCI address, so nvidia-smi's `00000008:01:00.0`
    and the kernel log's `0008:01:00` compare equal."""
    match = _PCI_RE.match(text.strip())
    if not match:
        raise ValueError(f"not a PCI address: {text!r}")
    return (int(match["domain"] or "0", 16), int(match["bus"], 16), int(match["dev"], 16))


@dataclass(frozen=True)
class PlatformInfo:
    """Where the GPU sits in the rack, as the GB200 board reports it."""

    chassis_serial_number: str | None = None
    slot_number: int | None = None
    tray_index: int | None = None
    host_id: int | None = None
    peer_type: str | None = None
    gpu_fabric_guid: str | None = None


@dataclass(frozen=True)
class FabricHealth:
    bandwidth: str | None = None                      # "Full" | "Degraded" | None
    route_recovery_in_progress: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    summary: str | None = None                        # newer drivers: Healthy | Unhealthy | Limited Capacity
    incorrect_configuration: str | None = None        # newer drivers: "None" when fine

    @property
    def degraded_bandwidth(self) -> bool | None:
        if self.bandwidth is None:
            return None
        return self.bandwidth.strip().lower() != "full"

    def problems(self) -> tuple[str, ...]:
        """Operator words for every flag that is set; empty when the fabric is healthy."""
        out = []
        if self.degraded_bandwidth:
            out.append("bandwidth degraded")
        if self.route_recovery_in_progress:
            out.append("route recovery in progress")
        if self.route_unhealthy:
            out.append("route unhealthy")
        if self.access_timeout_recovery:
            out.append("access timeout recovery")
        if self.incorrect_configuration and self.incorrect_configuration.lower() not in ("none", "n/a"):
            out.append(f"incorrect configuration: {self.incorrect_configuration}")
        if self.summary and self.summary.lower() not in ("healthy", "n/a"):
            out.append(f"summary {self.summary}")
        return tuple(out)


@dataclass(frozen=True)
class GpuFabric:
    state: str | None = None
    status: str | None = None
    clique_id: int | None = None
    cluster_uuid: str | None = None                   # None: no NVLink domain (absent, N/A or all-zero)
    health: FabricHealth = field(default_factory=FabricHealth)

    @property
    def attached(self) -> bool:
        """NVIDIA's device-plugin rule: Completed, Success and a non-zero cluster UUID."""
        return (self.state == FABRIC_COMPLETED and self.status == FABRIC_SUCCESS
                and cluster_uuid_or_none(self.cluster_uuid) is not None)


@dataclass(frozen=True)
class EccCounts:
    """Totals over DRAM and SRAM, volatile (since driver load) and aggregate (lifetime)."""

    volatile_uncorrectable: int | None = None
    aggregate_uncorrectable: int | None = None
    volatile_correctable: int | None = None
    aggregate_correctable: int | None = None
    volatile_dram_uncorrectable: int | None = None
    aggregate_dram_uncorrectable: int | None = None


@dataclass(frozen=True)
class MemoryRepair:
    """Blackwell memory self-repair as R580 drivers report it under <ecc_errors>: a channel or TPC repair
    waiting for a GPU reset, memory the GPU could not repair, and the SRAM error threshold crossed."""

    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None
    sram_threshold_exceeded: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


# Clock-event reasons (nvidia-smi -q -x): R535 and later print <clocks_event_reasons> with
# <clocks_event_reason_*> children, earlier branches <clocks_throttle_reasons> with <clocks_throttle_reason_*>
# (real captures in tests/fixtures/real/: 510-525 throttle, 535-595 event). The reason names after the prefix
# are the same in both; each is "Active" or "Not Active".
CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                 "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown", "display_clocks_setting")


@dataclass(frozen=True)
class ClockEvents:
    """Why the GPU's clocks are held below what was asked, as the driver says now."""

    element: str | None = None                        # clocks_event_reasons | clocks_throttle_reasons | None: neither
    active: tuple[str, ...] = ()                      # reasons (CLOCK_REASONS names) that are Active
    reported: tuple[str, ...] = ()                    # reasons the driver printed with a value

    @property
    def known(self) -> bool:
        return self.element is not None and bool(self.reported)


@dataclass(frozen=True)
class Gpu:
    index: int                                        # NVML enumeration order on the tray
    uuid: str
    pci_bus_id: str
    serial: str | None = None
    product_name: str | None = None
    module_id: int | None = None
    minor_number: int | None = None
    platform: PlatformInfo = field(default_factory=PlatformInfo)
    fabric: GpuFabric = field(default_factory=GpuFabric)
    ecc: EccCounts = field(default_factory=EccCounts)
    remapped_rows: RemappedRows = field(default_factory=RemappedRows)
    repair: MemoryRepair = field(default_factory=MemoryRepair)
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    memory_total_mib: int | None = None
    gpu_recovery_action: str | None = None
    clock_events: ClockEvents = field(default_factory=ClockEvents)

    @property
    def fabric_attached(self) -> bool:
        return self.fabric.attached

    @property
    def clique_label(self) -> str | None:
        """`<clusterUUID>.<cliqueID>` as GPU Feature Discovery, the DRA driver and
        Topograph spell it; None unless the GPU is fabric-attached."""
        if not self.fabric.attached or self.fabric.clique_id is None:
            return None
        return f"{self.fabric.cluster_uuid}.{self.fabric.clique_id}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fabric"]["health"]["degraded_bandwidth"] = self.fabric.health.degraded_bandwidth
        data["fabric_attached"] = self.fabric_attached
        data["clique_label"] = self.clique_label
        return data


@dataclass(frozen=True)
class GpuReport:
    """One tray's `nvidia-smi -q -x`. attached_gpus is what the driver counts; it can
    exceed len(gpus) when a GPU is known to the driver but cannot be read."""

    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[Gpu, ...]
    timestamp: str | None = None

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def cluster_uuids(self) -> tuple[str, ...]:
        """Distinct non-zero cluster UUIDs, sorted; more than one is a finding."""
        return tuple(sorted({g.fabric.cluster_uuid for g in self.gpus if g.fabric.cluster_uuid}))

    @property
    def clique_ids(self) -> tuple[int, ...]:
        return tuple(sorted({g.fabric.clique_id for g in self.gpus if g.fabric.clique_id is not None}))

    @property
    def clique_labels(self) -> tuple[str, ...]:
        return tuple(sorted({g.clique_label for g in self.gpus if g.clique_label}))

    @property
    def clique_label(self) -> str | None:
        """The tray's label only when every GPU is fabric-attached and all agree, as
        GPU Feature Discovery does; a disagreement yields None, never a guess."""
        if not self.gpus or not all(g.fabric_attached for g in self.gpus):
            return None
        labels = self.clique_labels
        return labels[0] if len(labels) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "attached_gpus": self.attached_gpus,
            "gpus": [g.to_dict() for g in self.gpus],
            "cluster_uuids": list(self.cluster_uuids),
            "clique_ids": list(self.clique_ids),
            "clique_label": self.clique_label,
        }


@dataclass(frozen=True)
class NvLink:
    link: int
    speed_gbps: float | None                          # None: the link is inactive

    @property
    def active(self) -> bool:
        return self.speed_gbps is not None and self.speed_gbps > 0


@dataclass(frozen=True)
class GpuNvLinks:
    """`nvidia-smi nvlink --status` for one GPU."""

    index: int
    name: str | None
    uuid: str | None
    links: tuple[NvLink, ...]
    # NVML printed "Unable to retrieve NVLink information as all links are inActive" instead of link lines:
    # every link of the GPU is down (no link lines to count).
    all_inactive: bool = False

    @property
    def inactive_links(self) -> tuple[int, ...]:
        return tuple(l.link for l in self.links if not l.active)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid,
                "links": [{"link": l.link, "speed_gbps": l.speed_gbps, "active": l.active} for l in self.links],
                "inactive_links": list(self.inactive_links), "all_inactive": self.all_inactive}


# --- NVLink error counters (`nvidia-smi nvlink -e`) ---------------------------------------------------
# The names each driver prints (mctl.checks.nvlink_errors judges them; docs/health.md "NVLink error counters"):
# Hopper and earlier print three per link (a real H100 capture: tests/fixtures/real/ml-engineering-nvlink-e-h100.txt);
# Blackwell drivers print the NVLink5 set (names as a B300 on driver 595.91.07 prints them, see docs/health.md)
# and FEC buckets ("FEC Errors - N"), BERs and raw lane counters, which are not error counts.
LEGACY_COUNTERS = ("Replay Errors", "Recovery Errors", "CRC Errors")
NVLINK5_COUNTERS = ("Malformed packet Errors", "Buffer overrun Errors", "Rx Errors", "Rx remote Errors",
                    "Rx General Errors", "Local link integrity Errors", "Tx discards",
                    "Link recovery successful events", "Link recovery failed events", "Total link recovery events",
                    "Effective Errors", "Symbol Errors")
# A value this large is not a count (NVML's "not available" is -1 read as an unsigned 64-bit number).
COUNTER_MAX = 2 ** 63


@dataclass(frozen=True)
class GpuNvLinkCounters:
    """One GPU's error counters, per link: {link: {counter name: value}} (integer counters only)."""

    index: int
    uuid: str | None
    links: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """What identifies the GPU from sweep to sweep (NVML renumbers GPUs when one vanishes)."""
        return self.uuid or f"index{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid,
                "links": {str(k): dict(v) for k, v in sorted(self.links.items())}}


@dataclass(frozen=True)
class LinkRate:
    """How much one counter of one link grew over the window the sweep compared against."""

    gpu: int
    link: int
    counter: str
    delta: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.delta / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "link": self.link, "counter": self.counter, "delta": self.delta,
                "seconds": round(self.seconds, 3), "per_s": round(self.per_s, 6)}


@dataclass(frozen=True)
class NvLinkWindow:
    """The counters of this sweep against the earliest sample within the window (mctl.health.signals)."""

    seconds: float | None = None                      # time between the two samples; None: no earlier sample
    rates: tuple[LinkRate, ...] = ()                  # counters that grew (delta > 0)
    resets: tuple[str, ...] = ()                      # "gpuN linkL counter": went backwards (reset, reload, wrap)

    @property
    def baseline(self) -> bool:
        return self.seconds is None

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "rates": [r.to_dict() for r in self.rates], "resets": list(self.resets)}
