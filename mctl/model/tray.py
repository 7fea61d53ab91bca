"""One compute tray as mctl sees it: the model every probe purpose reads into.

Inventory (`mctl rack inventory`), health sweeps, `mctl node check` and the
audit all probe a tray with one script builder (mctl.facts.probe, sections by
purpose) and read its output with one parser into TrayFacts. A section the
purpose did not ask for stays None/empty; a section that was asked for but
could not be read is None plus a line in `problems`, never a guess.

The model's own value types live here too (OS release, service state, IMEX
config and observation, XID events and their age, clock, disk, memory), so
parsers and checks share them without importing each other. Standard library
and mctl.model only.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mctl.model.gpu import pci_key
from mctl.model.xid import NvLink5Detail, RecoveryChange, XidInfo, describe

if TYPE_CHECKING:
    from mctl.model.gpu import GpuNvLinkCounters, GpuNvLinks, GpuReport, NvLinkWindow

# Why a tray is probed and checked: each purpose's probe reads its own sections (mctl.facts.probe) and
# evaluates the checks of the catalogue tagged with it (mctl.checks.catalogue).
INVENTORY = "inventory"     # mctl rack inventory: what the rack is, validated against an NVL72 rack
HEALTH = "health"           # the health sweep (mctl health check / watch)
NODE_CHECK = "node-check"   # mctl node check, on the tray itself (NVML when it loads)
AUDIT = "audit"             # mctl audit (its health family is the health sweep's catalogue)
PURPOSES = (INVENTORY, HEALTH, NODE_CHECK, AUDIT)

# nvidia-smi's own timeout stays this far inside the SSH command's (every probe purpose)
SMI_MARGIN = 3.0


def smi_timeout_for(command_timeout: float) -> float:
    """nvidia-smi's timeout for a probe whose SSH command may run *command_timeout* seconds."""
    return max(1.0, command_timeout - SMI_MARGIN)


# --- the OS ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OsRelease:
    id: str | None
    version_id: str | None
    pretty_name: str | None
    version_codename: str | None = None
    id_like: tuple[str, ...] = ()
    fields: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def short(self) -> str:
        """`ubuntu 24.04`, `debian 13`: what a table column has room for."""
        parts = [p for p in (self.id, self.version_id) if p]
        return " ".join(parts) if parts else (self.pretty_name or "unknown")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "version_id": self.version_id, "pretty_name": self.pretty_name,
                "version_codename": self.version_codename, "id_like": list(self.id_like)}


# --- services and IMEX -----------------------------------------------------------------------

@dataclass(frozen=True)
class ServiceState:
    unit: str
    installed: bool
    active: str | None            # systemd ActiveState: active, inactive, failed, activating, ...
    sub: str | None = None        # systemd SubState: running, dead, exited, ...
    enabled: str | None = None    # systemd UnitFileState: enabled, disabled, static, masked, ...
    source: str = "systemd"       # systemd | process-table
    pids: tuple[int, ...] = ()

    @property
    def running(self) -> bool:
        return self.active == "active"

    @property
    def short(self) -> str:
        if not self.installed:
            return "not installed"
        return self.active or "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "installed": self.installed, "active": self.active, "sub": self.sub,
                "enabled": self.enabled, "source": self.source, "pids": list(self.pids)}


@dataclass(frozen=True)
class ImexConfig:
    """sha256 of every /etc/nvidia-imex/*.cfg; `checksum` folds them into one value to compare trays."""

    present: bool
    files: dict[str, str] = field(default_factory=dict)

    @property
    def checksum(self) -> str | None:
        if not self.files:
            return None
        text = "".join(f"{path} {digest}\n" for path, digest in sorted(self.files.items()))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"present": self.present, "files": dict(sorted(self.files.items())), "checksum": self.checksum}


# --- the kernel log ---------------------------------------------------------------------------

# A stamp an age can be computed from, by kind:
STAMP_SYSLOG = "syslog"        # 'Nov 29 19:18:17[.123]' local time, no year
STAMP_ISO = "iso"              # ISO 8601, with or without an offset (none: local time)
STAMP_CTIME = "ctime"          # dmesg -T 'Tue Mar  5 10:11:12 2024' local time


@dataclass(frozen=True)
class XidEvent:
    pci: str                          # as the kernel printed it, e.g. "0008:01:00"
    code: int
    message: str
    timestamp: str | None = None      # the wall-clock stamp text, when the line had one
    uptime: float | None = None       # seconds since boot from the `[  123.456]` or /dev/kmsg prefix
    host: str | None = None
    pid: int | None = None
    process_name: str | None = None
    stamp_kind: str | None = None     # STAMP_SYSLOG | STAMP_ISO | STAMP_CTIME when timestamp is set
    # "xid": an `NVRM: Xid` line; "fell-off-bus": the driver said the GPU fell off the bus and
    # logged no Xid for it (read as XID 79, which NVIDIA's catalogue gives for that state).
    form: str = "xid"
    nvlink5: NvLink5Detail | None = field(default=None, compare=False)
    recovery: RecoveryChange | None = field(default=None, compare=False)

    @property
    def info(self) -> XidInfo | None:
        return describe(self.code)

    def on_gpu(self, pci_bus_id: str) -> bool:
        """Whether this event is about the GPU nvidia-smi lists at `pci_bus_id` (00000008:01:00.0)."""
        try:
            return pci_key(self.pci) == pci_key(pci_bus_id)
        except ValueError:
            return False

    def to_dict(self) -> dict:
        data = asdict(self)
        info = self.info
        data["info"] = info.to_dict() if info else None
        data["nvlink5"] = self.nvlink5.to_dict() if self.nvlink5 else None
        data["recovery"] = self.recovery.to_dict() if self.recovery else None
        return data


# --- what a sweep reads besides --------------------------------------------------------------

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


# DCGM's health check (`dcgmi health -c -j`, mctl.facts.dcgm): the values dcgmi prints for a result
DCGM_HEALTHY, DCGM_WARNING, DCGM_FAILURE = "Healthy", "Warning", "Failure"
DCGM_RESULTS = (DCGM_HEALTHY, DCGM_WARNING, DCGM_FAILURE)
# The DCGM section's own deadline inside a probe's: a third of what nvidia-smi gets, 1..DCGM_MAX_S seconds
DCGM_MAX_S = 5.0


def dcgm_timeout_for(command_timeout: float) -> float:
    """dcgmi's timeout (the whole DCGM section: the check, and setting the watches when they are not set) for
    a probe whose SSH command may run *command_timeout* seconds: a hung host engine ends inside the tray's
    deadline, so it is a finding of its own and never a tray that timed out."""
    return max(1.0, min(DCGM_MAX_S, (command_timeout - SMI_MARGIN) / 3))


@dataclass(frozen=True)
class DcgmIncident:
    """One health system of one entity that DCGM reports not Healthy (its messages joined)."""

    entity_group: str                      # "GPU", "Switch", "CPU", "ConnectX" (DcgmFieldsGetEntityGroupString)
    entity_id: str                         # dcgmi prints the id as a key ("0")
    system: str                            # "Memory system", "PCIe system", "NVLINK system", ..., "Driver"
    health: str                            # Warning | Failure (or what dcgmi printed, when it is neither)
    message: str

    @property
    def label(self) -> str:
        return f"{self.entity_group.lower()}{self.entity_id}" if self.entity_group else self.entity_id

    def to_dict(self) -> dict[str, Any]:
        return {"entity_group": self.entity_group, "entity_id": self.entity_id, "system": self.system,
                "health": self.health, "message": self.message}


@dataclass(frozen=True)
class DcgmHealth:
    """DCGM's health watches on one tray, as `dcgmi health -c -j` reported them (health, node check).

    installed False: no dcgmi on the tray (not applicable). error: DCGM is there but gave no readable
    report (host engine not answering, a hang killed at its deadline, garbage, an unknown status): never
    read as healthy."""

    installed: bool
    overall: str | None = None             # Healthy | Warning | Failure
    incidents: tuple[DcgmIncident, ...] = ()
    error: str | None = None
    watches_set: bool = False              # the probe set the health watches (they were not set)

    def to_dict(self) -> dict[str, Any]:
        return {"installed": self.installed, "overall": self.overall,
                "incidents": [i.to_dict() for i in self.incidents], "error": self.error,
                "watches_set": self.watches_set}


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


# gpu_error when the tray has no nvidia-smi at all: on a tray that arrived with its OS only, provisioning's to install
GPU_TOOLS_MISSING = "nvidia-smi is not installed (command not found)"


@dataclass(frozen=True)
class TrayFacts:
    """Every fact one probe read from one compute tray (or why there are none: reach != ok)."""

    host: str
    address: str | None = None
    reach: str = REACH_OK                  # ok | unreachable | timeout | host-key-mismatch (HostStatus values)
    error: str | None = None               # why there are no facts (reach != ok)
    host_key: Any = None                   # the transport's HostKeyProblem on a refusal (presented/recorded keys)
    hostname: str | None = None
    os: OsRelease | None = None
    kernel: str | None = None
    clock: Clock | None = None
    boot_id: str | None = None             # /proc/sys/kernel/random/boot_id
    previous_boot_id: str | None = None    # the boot id the last sweep read (set by the engine), None: unknown
    gpus: "GpuReport | None" = None
    gpu_error: str | None = None           # nvidia-smi missing, hung, garbled, driver down
    gpu_messages: tuple[str, ...] = ()     # what nvidia-smi printed on stderr (lost GPUs, ...)
    gpu_source: str | None = None          # nvidia-smi | nvml
    nvlinks: "tuple[GpuNvLinks, ...] | None" = None
    nvlink_error: str | None = None
    nvlink_counters: "tuple[GpuNvLinkCounters, ...] | None" = None   # `nvidia-smi nvlink -e` (health)
    nvlink_counters_error: str | None = None
    # Set by the health engine's memory of earlier sweeps (mctl.health.signals); None: no memory (one reading)
    nvlink_window: "NvLinkWindow | None" = None
    clock_streaks: tuple[tuple[int, str, int], ...] | None = None    # (GPU, reason, consecutive sweeps active)
    xids: tuple[XidObservation, ...] = ()
    xid_source: str | None = None
    imex: ImexObservation | None = None    # what nvidia-imex-ctl says (health, node check)
    dcgm: DcgmHealth | None = None         # `dcgmi health -c -j` (health, node check; None: not asked)
    imex_service: ServiceState | None = None   # the nvidia-imex unit (inventory)
    imex_config: ImexConfig | None = None      # checksums of /etc/nvidia-imex/*.cfg (inventory)
    slurmd: ServiceState | None = None
    slurmd_version: str | None = None      # `slurmd -V` (audit)
    slurmd_error: str | None = None        # not installed, or unreadable (audit)
    files: dict[str, str | None] = field(default_factory=dict)   # audit: path -> text (None: absent)
    file_errors: dict[str, str] = field(default_factory=dict)    # audit: path -> why it could not be read
    packages: dict[str, str | None] | None = None   # audit: Debian package -> installed version (None: not installed)
    package_notes: dict[str, str] = field(default_factory=dict)  # audit: package -> why it has no version
    packages_error: str | None = None      # audit: why no package was read (no dpkg-query, output cut off)
    slurm_node: Any = None                 # the scheduler's view (mctl.sched.slurm.facts.NodeState), set by the caller
    bmc: Any = None                        # what the tray's BMC said (mctl.checks.leak.BmcHealth), set by the sweep
    disks: tuple[DiskUsage, ...] = ()
    memory: Memory | None = None
    problems: tuple[str, ...] = ()         # probe sections that were missing or unreadable
    elapsed: float = 0.0

    @property
    def reached(self) -> bool:
        return self.reach == REACH_OK

    @property
    def gpu_tools_missing(self) -> bool:
        """The tray answered but has no nvidia-smi (not a driver fault: no GPU tools installed yet)."""
        return self.reached and self.gpus is None and self.gpu_error == GPU_TOOLS_MISSING

    @property
    def gpu_count(self) -> int | None:
        return len(self.gpus.gpus) if self.gpus is not None else None

    @property
    def xid_events(self) -> tuple[XidEvent, ...]:
        return tuple(x.event for x in self.xids)

    def with_slurm_node(self, node: Any) -> "TrayFacts":
        return replace(self, slurm_node=node)

    @property
    def rebooted(self) -> bool:
        """The boot id changed since the last sweep that read it."""
        return bool(self.boot_id and self.previous_boot_id and self.boot_id != self.previous_boot_id)

    def after_sweep(self, previous_boot_id: str | None, previous_boot_xids: frozenset = frozenset()) -> "TrayFacts":
        """With what the last sweep knew: its boot id, and the XID lines it read under an earlier boot
        (those lines were written before this boot, whatever their stamps say)."""
        xids = self.xids
        if previous_boot_xids:
            xids = tuple(replace(x, this_boot=False) if xid_key(x.event) in previous_boot_xids else x for x in xids)
        return replace(self, previous_boot_id=previous_boot_id, xids=xids)

    def without_xids_before(self, epoch: float | None) -> "TrayFacts":
        """Drop XIDs an operator already dealt with (resumed the tray by hand after them)."""
        if epoch is None or self.clock is None or not self.xids:
            return self
        keep = tuple(x for x in self.xids if x.age_s is None or self.clock.epoch - x.age_s > epoch)
        return replace(self, xids=keep) if len(keep) != len(self.xids) else self

    def to_dict(self) -> dict[str, Any]:
        """The health sweep's and `node check`'s JSON form."""
        node = self.slurm_node
        return {
            "host": self.host, "address": self.address, "reach": self.reach, "error": self.error,
            "hostname": self.hostname,
            "clock": None if self.clock is None else {"epoch": self.clock.epoch, "uptime": self.clock.uptime},
            "nvidia_smi": self.gpus.to_dict() if self.gpus else None, "gpu_error": self.gpu_error,
            "gpu_messages": list(self.gpu_messages), "gpu_source": self.gpu_source,
            "nvlinks": [n.to_dict() for n in self.nvlinks] if self.nvlinks is not None else None,
            "nvlink_error": self.nvlink_error,
            **({"nvlink_counters": [c.to_dict() for c in self.nvlink_counters]}
               if self.nvlink_counters is not None else {}),
            **({"nvlink_counters_error": self.nvlink_counters_error} if self.nvlink_counters_error else {}),
            **({"nvlink_window": self.nvlink_window.to_dict()} if self.nvlink_window is not None else {}),
            **({"clock_streaks": [list(s) for s in self.clock_streaks]} if self.clock_streaks is not None else {}),
            "xids": [x.to_dict() for x in self.xids], "xid_source": self.xid_source,
            "imex": self.imex.to_dict() if self.imex else None,
            **({"dcgm": self.dcgm.to_dict()} if self.dcgm is not None else {}),
            "slurmd": self.slurmd.to_dict() if self.slurmd else None,
            "slurm_node": None if node is None else {"name": node.name, "state": node.state, "reason": node.reason},
            "disks": [d.to_dict() for d in self.disks],
            "memory": self.memory.to_dict() if self.memory else None,
            "problems": list(self.problems), "elapsed": round(self.elapsed, 3),
            "boot_id": self.boot_id, "previous_boot_id": self.previous_boot_id,
            **({"bmc": self.bmc.to_dict()} if self.bmc is not None else {}),
        }

    def snapshot_dict(self) -> dict[str, Any]:
        """The inventory snapshot's JSON form (mctl.model.inventory_snapshot compares it run to run)."""
        return {
            "host": self.host, "address": self.address, "reach": self.reach, "error": self.error,
            "hostname": self.hostname, "os": self.os.to_dict() if self.os else None, "kernel": self.kernel,
            "nvidia_smi": self.gpus.to_dict() if self.gpus else None, "gpu_error": self.gpu_error,
            "gpu_messages": list(self.gpu_messages),
            "gpu_count": self.gpu_count,
            "imex": {"service": self.imex_service.to_dict() if self.imex_service else None,
                     "config": self.imex_config.to_dict() if self.imex_config else None},
            "slurmd": self.slurmd.to_dict() if self.slurmd else None,
            "xids": [x.event.to_dict() for x in self.xids], "xid_source": self.xid_source,
            "problems": list(self.problems), "elapsed": round(self.elapsed, 3),
            **({"host_key": self.host_key.to_dict()} if self.host_key else {}),
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
