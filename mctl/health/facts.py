"""What one health sweep knows about one compute tray (standard library only).

The same object comes from two places: the watch's SSH probe (one round trip
per tray) and `mctl node check` running on the tray itself (NVML or
nvidia-smi). Checks are pure functions of it, so both paths judge a tray by
identical rules. Anything a probe could not read is None plus a line in
`problems`, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mctl.facts.kernel_log import XidEvent
    from mctl.facts.services import ServiceState
    from mctl.model.gpu import GpuNvLinks, GpuReport
    from mctl.sched.slurm.facts import NodeState

REACH_OK = "ok"
# A tray whose clock stamp and uptime disagree by more than this wrote the line in an earlier boot.
BOOT_TOLERANCE_S = 300.0


@dataclass(frozen=True)
class Clock:
    """The tray's own clock when the probe ran: epoch, local wall time, seconds since boot."""

    epoch: float
    local: datetime               # naive local time, as syslog stamps are written
    uptime: float

    @property
    def boot_epoch(self) -> float:
        return self.epoch - self.uptime


@dataclass(frozen=True)
class XidObservation:
    """An XID line and how old it is on the tray's clock; this_boot False: the GPU was reset since."""

    event: "XidEvent"
    age_s: float | None
    this_boot: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {**self.event.to_dict(), "age_s": None if self.age_s is None else round(self.age_s, 1),
                "this_boot": self.this_boot}


def xid_key(event: "XidEvent") -> tuple:
    """What identifies one kernel-log line among a tray's XIDs from sweep to sweep."""
    return (event.timestamp, event.uptime, event.pci, event.code, event.message)


def observe_xid(event: "XidEvent", clock: Clock | None) -> XidObservation:
    """Date an XID line. The uptime prefix is exact within one boot; the wall-clock stamp
    tells whether the line belongs to this boot at all (kern.log outlives reboots)."""
    if clock is None:
        return XidObservation(event, None, None)
    from mctl.facts.kernel_log import stamp_age as _stamp_age

    stamp_age = None
    if event.timestamp:
        # every wall-clock form the kernel log comes in (syslog, ISO, dmesg -T): mctl.facts.kernel_log
        stamp_age = _stamp_age(event.timestamp, getattr(event, "stamp_kind", None), clock.local, clock.epoch)
    if event.uptime is not None:
        uptime_age = clock.uptime - event.uptime
        if uptime_age < -1.0:
            return XidObservation(event, stamp_age, False)
        if stamp_age is not None and stamp_age > clock.uptime + BOOT_TOLERANCE_S:
            return XidObservation(event, stamp_age, False)
        return XidObservation(event, max(uptime_age, 0.0), True)
    if stamp_age is not None:
        return XidObservation(event, stamp_age, stamp_age <= clock.uptime + BOOT_TOLERANCE_S)
    return XidObservation(event, None, None)


@dataclass(frozen=True)
class ImexObservation:
    """IMEX on one tray: whether it is set up there, and what its daemon says."""

    configured: bool                       # /etc/nvidia-imex/config.cfg exists
    daemon_state: str | None = None        # `nvidia-imex-ctl -q`: READY, ...
    domain_state: str | None = None        # `nvidia-imex-ctl -N -j`: UP, DEGRADED, DOWN
    link_problems: tuple[str, ...] = ()    # peers this tray is not connected to, map/version mismatches
    error: str | None = None               # the daemon did not answer, or its output was unreadable

    def to_dict(self) -> dict[str, Any]:
        return {"configured": self.configured, "daemon_state": self.daemon_state,
                "domain_state": self.domain_state, "link_problems": list(self.link_problems), "error": self.error}


@dataclass(frozen=True)
class DiskUsage:
    path: str
    mount: str
    size_kib: int
    used_kib: int
    avail_kib: int

    @property
    def used_pct(self) -> float:
        """As df computes Use%: used / (used + available), which leaves out root's reserve."""
        total = self.used_kib + self.avail_kib
        return 100.0 * self.used_kib / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "mount": self.mount, "size_kib": self.size_kib, "used_kib": self.used_kib,
                "avail_kib": self.avail_kib, "used_pct": round(self.used_pct, 1)}


@dataclass(frozen=True)
class Memory:
    total_kib: int
    available_kib: int

    @property
    def available_pct(self) -> float:
        return 100.0 * self.available_kib / self.total_kib if self.total_kib else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"total_kib": self.total_kib, "available_kib": self.available_kib,
                "available_pct": round(self.available_pct, 1)}


@dataclass(frozen=True)
class TrayHealthFacts:
    host: str
    address: str | None = None
    reach: str = REACH_OK                  # ok | unreachable | timeout | host-key-mismatch (HostStatus values)
    error: str | None = None               # why there are no facts (reach != ok)
    hostname: str | None = None
    clock: Clock | None = None
    gpus: "GpuReport | None" = None
    gpu_error: str | None = None
    gpu_messages: tuple[str, ...] = ()
    gpu_source: str | None = None          # nvidia-smi | nvml
    nvlinks: "tuple[GpuNvLinks, ...] | None" = None
    nvlink_error: str | None = None
    xids: tuple[XidObservation, ...] = ()
    xid_source: str | None = None
    imex: ImexObservation | None = None
    slurmd: "ServiceState | None" = None
    slurm_node: "NodeState | None" = None  # the scheduler's view (controller or local scontrol)
    disks: tuple[DiskUsage, ...] = ()
    memory: Memory | None = None
    problems: tuple[str, ...] = ()
    elapsed: float = 0.0
    boot_id: str | None = None             # /proc/sys/kernel/random/boot_id
    previous_boot_id: str | None = None    # the boot id the last sweep read (set by the engine), None: unknown

    @property
    def reached(self) -> bool:
        return self.reach == REACH_OK

    def with_slurm_node(self, node: "NodeState | None") -> "TrayHealthFacts":
        return replace(self, slurm_node=node)

    @property
    def rebooted(self) -> bool:
        """The boot id changed since the last sweep that read it."""
        return bool(self.boot_id and self.previous_boot_id and self.boot_id != self.previous_boot_id)

    def after_sweep(self, previous_boot_id: str | None, previous_boot_xids: frozenset = frozenset()) -> "TrayHealthFacts":
        """With what the last sweep knew: its boot id, and the XID lines it read under an earlier boot
        (those lines were written before this boot, whatever their stamps say)."""
        xids = self.xids
        if previous_boot_xids:
            xids = tuple(replace(x, this_boot=False) if xid_key(x.event) in previous_boot_xids else x for x in xids)
        return replace(self, previous_boot_id=previous_boot_id, xids=xids)

    def without_xids_before(self, epoch: float | None) -> "TrayHealthFacts":
        """Drop XIDs an operator already dealt with (resumed the tray by hand after them)."""
        if epoch is None or self.clock is None or not self.xids:
            return self
        keep = tuple(x for x in self.xids if x.age_s is None or self.clock.epoch - x.age_s > epoch)
        return replace(self, xids=keep) if len(keep) != len(self.xids) else self

    def to_dict(self) -> dict[str, Any]:
        node = self.slurm_node
        return {
            "host": self.host, "address": self.address, "reach": self.reach, "error": self.error,
            "hostname": self.hostname,
            "clock": None if self.clock is None else {"epoch": self.clock.epoch, "uptime": self.clock.uptime},
            "nvidia_smi": self.gpus.to_dict() if self.gpus else None, "gpu_error": self.gpu_error,
            "gpu_messages": list(self.gpu_messages), "gpu_source": self.gpu_source,
            "nvlinks": [n.to_dict() for n in self.nvlinks] if self.nvlinks is not None else None,
            "nvlink_error": self.nvlink_error,
            "xids": [x.to_dict() for x in self.xids], "xid_source": self.xid_source,
            "imex": self.imex.to_dict() if self.imex else None,
            "slurmd": self.slurmd.to_dict() if self.slurmd else None,
            "slurm_node": None if node is None else {"name": node.name, "state": node.state, "reason": node.reason},
            "disks": [d.to_dict() for d in self.disks],
            "memory": self.memory.to_dict() if self.memory else None,
            "problems": list(self.problems), "elapsed": round(self.elapsed, 3),
            "boot_id": self.boot_id, "previous_boot_id": self.previous_boot_id,
        }


@dataclass(frozen=True)
class TrayExpectation:
    """What the inventory says a tray should be (the checks' yardstick)."""

    host: str
    rack: str | None = None
    gpus_per_tray: int = 4
    driver_version: str | None = None      # from the tray's software image
    image: str | None = None
    nvlink_domain: str | None = None       # the rack's cluster UUID
    scheduler: str | None = None           # slurm | k8s | None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "rack": self.rack, "gpus_per_tray": self.gpus_per_tray,
                "driver_version": self.driver_version, "image": self.image, "nvlink_domain": self.nvlink_domain,
                "scheduler": self.scheduler}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrayExpectation":
        return cls(host=data["host"], rack=data.get("rack"), gpus_per_tray=int(data.get("gpus_per_tray", 4)),
                   driver_version=data.get("driver_version"), image=data.get("image"),
                   nvlink_domain=data.get("nvlink_domain"), scheduler=data.get("scheduler"))
