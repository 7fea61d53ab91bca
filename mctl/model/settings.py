"""The site's settings as mctl reads them: plain frozen objects, standard library only.

The inventory's sections (`ssh:`, `bmc:`, `scheduler:`, `health:` and each rack's `nmx:`)
are validated by mctl.inventory (schema.py, spec.py) and converted once, by the loader,
into these (mctl.inventory.convert); everything after the loader reads only these. Nothing
here knows the YAML: the model sits on no validator.

Health settings also travel to a tray running `mctl node check`, which carries no inventory
code: as JSON (HealthSettings.to_dict) and back (from_dict). Both paths end in the same
object, which keeps the watch and the node check on one set of rules.

Defaults here and in mctl.inventory.schema must agree (tests/unit/test_settings_model.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

from mctl.model.findings import Severity
from mctl.model.xid import DEFAULT_DRAIN_XIDS, DEFAULT_NVLINK5_NO_DRAIN, NVLINK5_MODES


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}

FABRIC_FLAG_DEFAULTS: dict[str, Severity] = {
    "degraded_bandwidth": Severity.WARN,
    "route_recovery_in_progress": Severity.WARN,
    # Real GB200 trays on driver 570 report route_unhealthy True while fabric is Completed/Success.
    "route_unhealthy": Severity.WARN,
    "access_timeout_recovery": Severity.WARN,
    "incorrect_configuration": Severity.CRITICAL,
    "summary_unhealthy": Severity.CRITICAL,
    "summary_limited_capacity": Severity.WARN,
}


def parse_subcodes(values) -> frozenset[tuple[int, int]]:
    """['149.38', '149.40'] -> {(149, 38), (149, 40)}: NVLink5 XID.subcode pairs."""
    out = set()
    for value in values:
        text = str(value).strip()
        match = re.fullmatch(r"(14[4-9]|150)\.(\d{1,2})", text)
        if not match or int(match[2]) > 63:
            raise ValueError(f"not an NVLink5 XID.subcode: {text!r} (use e.g. 149.38: XID 144-150, subcode 0-63)")
        out.add((int(match[1]), int(match[2])))
    return frozenset(out)


def subcode_texts(pairs) -> list[str]:
    return [f"{x}.{s}" for x, s in sorted(pairs)]


def parse_duration(text: str | int | float) -> float:
    """'90s', '5m', '1h', '2d' (or a number of seconds) -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 1h, 2d)")
    return float(int(match[1]) * _UNIT[match[2]])


def _mode(value) -> str:
    if value not in NVLINK5_MODES:
        raise ValueError(f"nvlink5_drain is {value!r}; use one of {', '.join(NVLINK5_MODES)}")
    return str(value)


DEFAULT_HYSTERESIS_CHECKS = frozenset({"nvlink.links", "gpu.xid", "fabric.state"})


@dataclass(frozen=True)
class HysteresisSettings:
    """How long a flapping finding is held (mctl/health/hysteresis.py; docs/health.md "Flapping and storms")."""

    clear_sweeps: int = 1               # clear sweeps that release a latch that never flapped
    max_hold_sweeps: int = 64           # the longest hold, however often it flapped
    checks: frozenset[str] = DEFAULT_HYSTERESIS_CHECKS
    window_sweeps: int = 10             # a finding back within this many sweeps after its release flapped

    def hold(self, flaps: int) -> int:
        """Clear sweeps in a row that release a latch: clear_sweeps for a steady fault; once it came back,
        window_sweeps, doubling with every further return, at most max_hold_sweeps."""
        flaps = int(flaps)
        if flaps <= 0:
            n = self.clear_sweeps
        else:
            n = max(self.clear_sweeps, self.window_sweeps, 1) * (2 ** min(flaps - 1, 20))
        return max(1, min(n, self.max_hold_sweeps))


LADDER_RUNGS = ("gpu-reset", "reboot", "power-cycle")      # the recovery ladder's rungs, lowest first
LADDER_BURN_IN = ("off", "quick", "medium", "long")


@dataclass(frozen=True)
class EscalationSettings:
    """Rack-level escalation (mctl/health/escalation.py; docs/health.md "Rack escalation"): one hold on a
    rack's trays, instead of drains one by one until the breaker stops them, when more than `rack_share`
    of its compute trays fail within `window_s` or a switch tray of it fails. Off by default: a fault on
    most of a rack at once is also what a bad check or driver rollout looks like, and the breaker's stop
    is the safe answer to that until a site trusts its checks (D98)."""

    enabled: bool = False
    rack_share: float = 0.5                 # more than this share of a rack's compute trays failed: the rack
    window_s: float = 600.0                 # ... each failure begun within this long (a correlated event)
    min_trays: int = 2                      # ... and at least this many of them (a 1-tray rack never escalates)
    on_switch_tray: bool = True             # a switch tray critical for confirm_sweeps sweeps: the rack
    count_unreachable: bool = False         # an unreachable tray counts as failed (default: never)


@dataclass(frozen=True)
class LadderSettings:
    """The recovery ladder (mctl/health/ladder.py; docs/health.md "The recovery ladder"): every rung off
    by default; a site turns on the ones it wants under `health.ladder` in mctl.yml."""

    gpu_reset: bool = False                 # nvidia-smi -r on an idle tray whose XIDs say reset
    reboot: bool = False                    # systemctl reboot through the OS (SSH answers)
    power_cycle: bool = False               # ComputerSystem.Reset PowerCycle through the BMC
    power_cycle_when: str = "unanswered"    # unanswered: the OS does not answer (or its reboot did not help);
    #                                         unfixed: also a tray the rungs below did not fix (or has none on)
    burn_in: str = "off"                    # off | quick | medium | long: DCGM/NCCL before the resume
    max_failures: int = 3                   # failed recoveries within failure_window_s: marked for repair
    failure_window_s: float = 86400.0
    fail_after_sweeps: int = 3              # critical sweeps after a rung before it counts as not fixed
    retry_after_s: float = 60.0             # after a failed recovery, the next starts no sooner
    gpu_reset_deadline_s: float = 120.0
    reboot_deadline_s: float = 600.0
    power_cycle_deadline_s: float = 900.0
    verify_deadline_s: float = 600.0        # a tray back from a rung must pass its checks within this
    burn_in_deadline_s: float = 3600.0
    repair_hook: tuple[str, ...] = ()       # argv of a command run when a tray is marked for repair
    repair_hook_timeout_s: float = 60.0
    evidence: bool = True                   # a bundle per tray before each rung (mctl/health/evidence.py)
    evidence_deadline_s: float = 60.0       # the rung waits at most this for it

    @property
    def enabled(self) -> bool:
        return self.gpu_reset or self.reboot or self.power_cycle

    def rung_on(self, rung: str) -> bool:
        return {"gpu-reset": self.gpu_reset, "reboot": self.reboot, "power-cycle": self.power_cycle}[rung]

    def deadline_s(self, rung: str) -> float:
        return {"gpu-reset": self.gpu_reset_deadline_s, "reboot": self.reboot_deadline_s,
                "power-cycle": self.power_cycle_deadline_s, "verify": self.verify_deadline_s,
                "burn-in": self.burn_in_deadline_s}[rung]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "LadderSettings":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ladder setting {unknown[0]!r}")
        if "repair_hook" in data:
            data["repair_hook"] = tuple(str(a) for a in data["repair_hook"] or ())
        return cls(**data)


EVENT_SINK_TYPES = ("file", "syslog", "webhook", "exec")
EVENT_KINDS = ("finding", "action")
SYSLOG_FACILITIES = ("kern", "user", "daemon", "auth", "syslog", "local0", "local1", "local2", "local3", "local4",
                     "local5", "local6", "local7")


@dataclass(frozen=True)
class BmcEventSettings:
    """`health.bmc_events`: the watch's receiver of Redfish EventService events (mctl/health/bmc_events.py, docs/health.md
    "Leak events"). Off unless `listen` is given."""

    listen: str | None = None               # the IP the receiver binds (loopback: http allowed; else https only)
    port: int = 0                           # its port (0: any free one, said in the watch's log; a lab's choice)
    url: str | None = None                  # the URL the BMCs POST to (default: the scheme, listen address and port)
    tls_cert: str | None = None             # PEM certificate chain and key of the receiver: https
    tls_key: str | None = None
    leak_interval: float | None = None      # the leak poll of a subscribed BMC (default: health.bmc_interval's, >= 60 s)
    queue: int = 1024                       # events waiting for the watch; a full queue drops the newest (counted)

    @property
    def enabled(self) -> bool:
        return self.listen is not None


@dataclass(frozen=True)
class EventSink:
    """One place the event stream goes (mctl/health/events.py, docs/events.md): `health.events` in mctl.yml.

    Which fields a type reads: file: path; syslog: address, facility; webhook: url, timeout_s, retries,
    backoff_s, headers_file; exec: command, timeout_s (run as the repair hook, for `repair` only).
    Every type: kinds and actions (filters: empty takes all), queue, dead_letter, name."""

    type: str                               # file | syslog | webhook | exec
    name: str = ""                          # the sink's label in metrics and dead letters (default: type[N])
    path: str | None = None                 # file: the JSON-lines file events are appended to
    address: str | None = None              # syslog: unix:/dev/log | udp:HOST:PORT
    facility: str = "daemon"                # syslog facility
    url: str | None = None                  # webhook: http(s) URL; one POST of one event each
    timeout_s: float = 5.0                  # webhook: each attempt; exec: the command
    retries: int = 3                        # webhook: attempts after the first
    backoff_s: float = 1.0                  # webhook: the first retry's wait, doubled each time (at most 60 s)
    headers_file: str | None = None         # webhook: "Name: value" lines (a secret); read at start, never logged
    command: tuple[str, ...] = ()           # exec: argv; {tray} {rack} {reason} {failures}; no shell
    kinds: tuple[str, ...] = ()             # finding | action; empty: both
    actions: tuple[str, ...] = ()           # action events of these actions only (empty: every action)
    queue: int = 1000                       # events waiting for this sink; a full queue drops the newest
    dead_letter: str | None = None          # undeliverable events (JSON lines); default <state>/health/

    def label(self, index: int) -> str:
        return self.name or f"{self.type}[{index}]"

    def takes(self, kind: str, action: str | None) -> bool:
        """Whether an event of *kind* (and *action*, for an action event) passes this sink's filters."""
        if self.kinds and kind not in self.kinds:
            return False
        if self.actions and (kind != "action" or action not in self.actions):
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["command"], out["kinds"], out["actions"] = list(self.command), list(self.kinds), list(self.actions)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EventSink":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown event sink setting {unknown[0]!r}")
        kwargs = dict(data)
        for key in ("command", "kinds", "actions"):
            if key in kwargs:
                kwargs[key] = tuple(str(x) for x in kwargs[key] or ())
        return cls(**kwargs)


DCGM_MODES = ("auto", "required", "off")

# What a critical leak on a switch tray does (`health.leak.switch_tray`): the switch tray alone is powered off
# after the grace, the whole rack is powered off in order, or nothing is powered off (drain and alert).
LEAK_SWITCH_TRAY = ("power-off", "rack", "alert")


@dataclass(frozen=True)
class FailoverSettings:
    """The watch's leader lease in etcd v3 (mctl/health/failover.py; docs/health.md "Failover"). No endpoints:
    no lease, the watch runs alone as it always did."""

    etcd: tuple[str, ...] = ()              # client URLs (http://host:2379), tried in turn
    key_prefix: str = "/mctl"               # the lease key: <prefix>/<site>/watch/<shard or racks>
    ttl_s: float | None = None              # the lease's TTL (None: the watch's interval, at least MIN_TTL_S)
    timeout_s: float = 2.0                  # each request to etcd

    @property
    def enabled(self) -> bool:
        return bool(self.etcd)

    def ttl_for(self, interval: float) -> int:
        """The lease's TTL in whole seconds (etcd grants whole seconds) for a watch of *interval*."""
        return max(MIN_TTL_S, math.ceil(self.ttl_s if self.ttl_s is not None else interval))


MIN_TTL_S = 2                               # etcd refuses shorter leases (its election timeout bounds them)


@dataclass(frozen=True)
class HealthSettings:
    interval: float = 60.0
    drain_xids: frozenset[int] = DEFAULT_DRAIN_XIDS
    # NVLink5 XIDs 144-150: "fatal" drains on the line's Fatal word only (NVIDIA's catalogue), "all" on every line;
    # nvlink5_no_drain: Fatal XID.subcode pairs the catalogue says to ignore.
    nvlink5_drain: str = "fatal"
    nvlink5_no_drain: frozenset[tuple[int, int]] = DEFAULT_NVLINK5_NO_DRAIN
    resume_after_healthy_sweeps: int = 3
    unreachable_sweeps_before_drain: int = 3
    confirm_sweeps: int = 1
    max_gpu_temp_c: float = 90.0
    gpu_temp_warn_c: float | None = None
    max_power_overshoot_pct: float = 5.0
    xid_window_s: float = 3600.0
    # NVLink error counters judged as rates over this window (mctl/checks/nvlink_errors.py; DCGM's health watch:
    # CRC errors at 100 a second fail, any replay or recovery error fails)
    nvlink_error_window_s: float = 600.0
    nvlink_error_rate_critical: float = 100.0
    # HW slowdown or HW power brake active this many sweeps in a row is critical (one sweep warns)
    clock_event_sweeps: int = 3
    boot_grace_s: float = 120.0             # start-up checks warn (neither drain nor count healthy) this long after boot
    fabric_flags: Mapping[str, Severity] = field(default_factory=lambda: dict(FABRIC_FLAG_DEFAULTS))
    driver_mismatch: Severity = Severity.WARN
    imex: str = "auto"                      # auto | required | ignore
    # DCGM's health watches (`dcgmi health -c -j`, mctl/checks/dcgm.py): auto where dcgmi is installed, required
    # (a tray without it warns), off (not asked: no dcgmi run by the probe)
    dcgm: str = "auto"                      # DCGM_MODES
    disk_paths: tuple[str, ...] = ("/", "/var", "/tmp")
    disk_warn_pct: float = 90.0
    disk_critical_pct: float = 98.0
    memory_warn_available_pct: float = 5.0
    breaker_max_share: float = 0.25
    breaker_window_s: float = 3600.0
    breaker_scope: str = "rack"             # rack | site
    remediate: bool = True
    k8s_taint: str = "mctl.io/unhealthy=true:NoSchedule"
    k8s_evict: bool = False                 # Kubernetes: a drained node's GPU pods evicted (not DaemonSets')
    # hysteresis for flapping findings (mctl/health/hysteresis.py; docs/health.md "Flapping and storms")
    hysteresis_clear_sweeps: int = 1
    hysteresis_max_hold_sweeps: int = 64
    hysteresis_window_sweeps: int = 10
    hysteresis_checks: tuple[str, ...] = tuple(sorted(DEFAULT_HYSTERESIS_CHECKS))
    # leaks and power read from each tray's BMC (mctl/health/leaks.py; docs/health.md "Leaks and power")
    bmc_checks: str = "auto"                # auto: where the inventory has a bmc section | off
    # the watch reads each BMC beside the sweep (mctl/health/oob.py BmcWatch; docs/health.md "Leaks and power")
    leak_interval: float | None = None      # seconds between two reads of a BMC's leak detectors (None: the watch's
                                            # interval, every sweep: a leak is critical and costs 1 GET a tray)
    bmc_interval: float | None = None       # seconds between two reads of a tray's BMC health, its power subsystem
                                            # (None: the leak interval, at least 60: warn-only, slow to change)
    bmc_stale_after: int = 3                # a view older than this many leak intervals is bmc.stale
    bmc_events: BmcEventSettings = field(default_factory=BmcEventSettings)   # leaks pushed by the BMCs (EventService)
    leak_power_off: bool = True             # power a tray with a critical leak off through its BMC ...
    leak_power_off_after_s: float = 600.0   # ... this long after the leak was first seen (BCM: 10 min)
    leak_clear_sweeps: int = 3              # sweeps without a critical reading that end a leak episode
    leak_exclude: tuple[str, ...] = ()      # trays (compute or switch) never powered off automatically for a leak
    leak_rack_share: float = 0.25           # critical leaks on more than this share of a rack's trays: the whole rack
    leak_rack_power_off: bool = True        # false: the rack-wide response only drains and alerts
    leak_switch_tray: str = "power-off"     # power-off | rack | alert (LEAK_SWITCH_TRAY)
    # Read on the operator's machine only (the watch, rack inventory, audit); travel with the rest all the same.
    tray_deadline: float | None = None      # seconds per tray probe (default: from the interval, 5..15)
    metrics_textfile: str | None = None     # Prometheus textfile (node_exporter collector)
    metrics_port: int | None = None         # HTTP /metrics on metrics_listen
    metrics_listen: str = "127.0.0.1"       # address /metrics binds (an IP; checked at the CLI)
    ladder: LadderSettings = field(default_factory=LadderSettings)   # the recovery ladder (all rungs off)
    escalation: EscalationSettings = field(default_factory=EscalationSettings)   # one hold per failing rack
    # isolate a tray drained for a hardware fault from its NVLink partition (mctl/health/isolate.py)
    isolate: bool = False
    isolate_to: str = "quarantine"          # quarantine | default (as `mctl partition isolate --to`)
    # where every finding change and action goes, as JSON lines (mctl/health/events.py, docs/events.md)
    events: tuple[EventSink, ...] = ()
    # the site's watches, one per shard (name -> its racks; empty: one watch for the site) and their lease
    shards: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    failover: FailoverSettings = field(default_factory=FailoverSettings)

    def event_sinks(self) -> tuple[EventSink, ...]:
        """Every sink of the event stream: `health.events`, and `health.ladder.repair_hook` as the exec sink
        of `repair` events it always was (run by the ladder with its timeout, its result in the action log)."""
        hook = ()
        if self.ladder.repair_hook:
            hook = (EventSink("exec", name="repair_hook", command=self.ladder.repair_hook,
                              timeout_s=self.ladder.repair_hook_timeout_s, kinds=("action",), actions=("repair",)),)
        return tuple(e if e.name else replace(e, name=e.label(i)) for i, e in enumerate(self.events)) + hook

    def repair_sinks(self) -> tuple[EventSink, ...]:
        """The exec sinks a tray marked for repair runs (the repair hook and any exec sink of `repair`)."""
        return tuple(s for s in self.event_sinks() if s.type == "exec" and s.takes("action", "repair"))

    @property
    def hysteresis(self) -> "HysteresisSettings":
        return HysteresisSettings(self.hysteresis_clear_sweeps, self.hysteresis_max_hold_sweeps,
                                  frozenset(self.hysteresis_checks), self.hysteresis_window_sweeps)

    @property
    def temp_warn_c(self) -> float:
        return self.gpu_temp_warn_c if self.gpu_temp_warn_c is not None else self.max_gpu_temp_c - 5.0

    def flag_severity(self, flag: str) -> Severity:
        return self.fabric_flags.get(flag, FABRIC_FLAG_DEFAULTS.get(flag, Severity.WARN))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drain_xids"] = sorted(self.drain_xids)
        data["nvlink5_no_drain"] = subcode_texts(self.nvlink5_no_drain)
        data["fabric_flags"] = {k: Severity(v).value for k, v in self.fabric_flags.items()}
        data["driver_mismatch"] = self.driver_mismatch.value
        data["disk_paths"] = list(self.disk_paths)
        data["hysteresis_checks"] = list(self.hysteresis_checks)
        data["leak_exclude"] = list(self.leak_exclude)
        data["ladder"] = {**asdict(self.ladder), "repair_hook": list(self.ladder.repair_hook)}
        data["events"] = [e.to_dict() for e in self.events]
        data["shards"] = {k: list(v) for k, v in self.shards.items()}
        data["failover"] = {**asdict(self.failover), "etcd": list(self.failover.etcd)}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HealthSettings":
        """The JSON form (to_dict) back; unknown keys are refused so a typo cannot pass silently."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown health setting {unknown[0]!r}")
        kwargs: dict[str, Any] = dict(data)
        if "drain_xids" in kwargs:
            kwargs["drain_xids"] = frozenset(int(x) for x in kwargs["drain_xids"])
        if "nvlink5_drain" in kwargs:
            kwargs["nvlink5_drain"] = _mode(kwargs["nvlink5_drain"])
        if "nvlink5_no_drain" in kwargs:
            kwargs["nvlink5_no_drain"] = parse_subcodes(kwargs["nvlink5_no_drain"])
        if "fabric_flags" in kwargs:
            flags = dict(FABRIC_FLAG_DEFAULTS)
            flags.update({k: Severity(v) for k, v in kwargs["fabric_flags"].items()})
            kwargs["fabric_flags"] = flags
        if "driver_mismatch" in kwargs:
            kwargs["driver_mismatch"] = Severity(kwargs["driver_mismatch"])
        if "disk_paths" in kwargs:
            kwargs["disk_paths"] = tuple(kwargs["disk_paths"])
        if "hysteresis_checks" in kwargs:
            kwargs["hysteresis_checks"] = tuple(kwargs["hysteresis_checks"])
        if "leak_exclude" in kwargs:
            kwargs["leak_exclude"] = tuple(str(t) for t in kwargs["leak_exclude"])
        if "dcgm" in kwargs and kwargs["dcgm"] not in DCGM_MODES:
            raise ValueError(f"dcgm is {kwargs['dcgm']!r}; use one of {', '.join(DCGM_MODES)}")
        if "leak_switch_tray" in kwargs and kwargs["leak_switch_tray"] not in LEAK_SWITCH_TRAY:
            raise ValueError(f"leak_switch_tray is {kwargs['leak_switch_tray']!r}; use one of "
                             f"{', '.join(LEAK_SWITCH_TRAY)}")
        if "ladder" in kwargs:
            kwargs["ladder"] = LadderSettings.from_dict(kwargs["ladder"])
        if "bmc_events" in kwargs:
            got = dict(kwargs["bmc_events"] or {})
            bad = sorted(set(got) - {f.name for f in fields(BmcEventSettings)})
            if bad:
                raise ValueError(f"unknown health setting 'bmc_events.{bad[0]}'")
            kwargs["bmc_events"] = BmcEventSettings(**got)
        if "escalation" in kwargs:
            known = {f.name for f in fields(EscalationSettings)}
            bad = sorted(set(kwargs["escalation"]) - known)
            if bad:
                raise ValueError(f"unknown health.escalation setting {bad[0]!r}")
            kwargs["escalation"] = EscalationSettings(**kwargs["escalation"])
        if "events" in kwargs:
            kwargs["events"] = tuple(EventSink.from_dict(e) for e in kwargs["events"] or ())
        if "shards" in kwargs:
            kwargs["shards"] = {str(k): tuple(str(r) for r in v) for k, v in (kwargs["shards"] or {}).items()}
        if "failover" in kwargs:
            f = dict(kwargs["failover"] or {})
            bad = sorted(set(f) - {x.name for x in fields(FailoverSettings)})
            if bad:
                raise ValueError(f"unknown health.failover setting {bad[0]!r}")
            kwargs["failover"] = FailoverSettings(**{**f, "etcd": tuple(f.get("etcd") or ())})
        return cls(**kwargs)


# --- the rest of the site's settings (docs/inventory.md; bounds and choices: mctl.inventory.schema) ----------

@dataclass(frozen=True)
class SSHSettings:
    user: str = "root"
    port: int = 22
    identity_file: str | None = None
    known_hosts: str = "known_hosts"
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    concurrency: int = 64


@dataclass(frozen=True)
class NMXSettings:
    """One rack's NMX-Manager endpoint (docs/partitions.md)."""

    url: str
    credentials_file: str
    verify_tls: bool | str = True               # true, false, or a CA bundle path
    allow_http: bool = False                    # plain http:// on a routed address (else loopback only)


@dataclass(frozen=True)
class BMCSettings:
    """How mctl reaches the trays' BMCs over Redfish (docs/bmc.md); the addresses are each group's `bmc`."""

    credentials_file: str                       # one line username:password, mode 0600
    verify_tls: bool | str = True               # true, false, or a CA bundle path
    scheme: str = "https"                       # https | http
    port: int | None = None
    timeout_s: float = 10.0                     # each connect and each read
    deadline_s: float = 60.0                    # one tray, every request together
    concurrency: int = 32                       # trays read at once (one connection per BMC)


@dataclass(frozen=True)
class SlurmSettings:
    """`scheduler.slurm` (docs/scheduler.md); the defaults are right for a real GB200 site."""

    partition_name: str = "gpu"
    imex_channel_count: int = 2048
    health_check_interval: int = 300
    conf_dir: str = "/etc/slurm"
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)
    topology: str = "auto"                      # auto | block | tree (auto: block when Slurm supports it)
    imex_dev_major: int | None = None           # else the plugin reads /proc/devices
    imex_scope: str = "partition"               # partition: static IMEX domains; job: the per-job prolog/epilog
    slurmctld_port: int = 6817
    slurmd_port: int = 6818                     # a tray's `slurmd_port` var overrides it
    communication_parameters: str | None = None
    cgroup_plugin: str = "autodetect"           # "disabled" where there is no cgroup fs
    proctrack_type: str = "proctrack/cgroup"
    task_plugin: str = "task/cgroup,task/affinity"
    jobacct_gather_type: str = "jobacct_gather/cgroup"
    gpu_device_nodes: str = "expect"            # expect: the driver made /dev/nvidia*; create: make them (major 195)
    node_check: bool = True                     # HealthCheckProgram and the node check with the deployment
    node_check_installed: bool | None = None    # deprecated: the old name of node_check
    node_check_program: str = "/usr/local/sbin/mctl-node-check"
    health_check_node_state: str = "ANY,CYCLE"     # CYCLE spreads the checks over the interval (D67)
    state_save_location: str = "/var/spool/slurmctld"
    slurmd_spool_dir: str = "/var/spool/slurmd"
    log_dir: str = "/var/log/slurm"
    verify_timeout: float = 120                 # seconds for every tray to register


@dataclass(frozen=True)
class K8sSettings:
    """`scheduler.k8s` (docs/scheduler.md)."""

    kubeconfig: str | None = None
    namespace: str = "gpu-operator"
    context: str | None = None                  # kubeconfig context (default: its current-context)
    dra_namespace: str = "nvidia-dra-driver-gpu"
    workload_namespace: str = "default"         # ComputeDomains and example workloads
    operator_manages_driver: bool = False       # False: the trays' image delivers the NVIDIA driver
    dra_gpu_resources: bool = False             # True: the DRA driver also serves GPUs (not only IMEX channels)
    helm_repo: str | None = None                # NVIDIA's Helm repository URL (install.sh asks when unset)
    gpu_operator_version: str | None = None
    dra_driver_version: str | None = None
    example_image: str = "ubuntu:24.04"
    kubernetes_version: str = "1.32"            # the cluster's: manifests are checked for it


@dataclass(frozen=True)
class SchedulerSettings:
    type: str                                   # slurm | k8s
    cluster_name: str = "mctl"
    controller: str | None = None
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    k8s: K8sSettings = field(default_factory=K8sSettings)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, fields in the inventory's order (`mctl inventory show --json`)."""
        return asdict(self)



# --- what mctl may do by its own decision (`safety:` in mctl.yml; docs/health.md "The safety budget") -------------

@dataclass(frozen=True)
class BudgetSettings:
    """How many compute trays mctl may hold out of service by its own decision (drained, held, powered off,
    isolated), per rack and for the site: a share and an absolute cap each, the smaller one counting, as
    NVSentinel's breaker. The defaults leave a 4-tray rack one tray and a full NVL72 rack four. A budget that
    would let mctl empty a whole rack or the whole site is refused by the loader unless the inventory says
    `allow_whole_rack: true`."""

    rack_share: float = 0.25            # (0, 1]: share of a rack's compute trays
    rack_max: int = 4                   # >= 1: absolute cap per rack
    site_share: float = 0.25            # (0, 1]: share of the site's compute trays
    site_max: int = 64                  # >= 1: absolute cap for the site
    allow_whole_rack: bool = False      # the acknowledgement a budget that allows a whole rack or site needs

    def rack_limit(self, n_compute_trays: int) -> int:
        """Trays of a rack of *n_compute_trays* that mctl may hold out of service: min(⌊share·n⌋, max)."""
        return min(math.floor(self.rack_share * n_compute_trays), self.rack_max)

    def site_limit(self, n_compute_trays: int) -> int:
        """Trays of a site of *n_compute_trays* that mctl may hold out of service: min(⌊share·n⌋, max)."""
        return min(math.floor(self.site_share * n_compute_trays), self.site_max)

    def whole(self, racks: Mapping[str, int]) -> list[tuple[str, str]]:
        """(setting, why) for each way this budget lets mctl take a whole rack, or the whole site, out of
        service; *racks*: compute trays per rack. Empty when it does not, or when it is acknowledged."""
        if self.allow_whole_rack:
            return []
        out: list[tuple[str, str]] = []
        if self.rack_share >= 1:
            out.append(("rack_share", f"rack_share {self.rack_share:g} is every compute tray of a rack"))
        else:
            for rack, n in racks.items():
                if n > 0 and self.rack_limit(n) >= n:
                    out.append(("rack_share", f"the budget lets mctl take all {n} compute trays of rack {rack} "
                                              f"out of service (limit {self.rack_limit(n)})"))
        total = sum(racks.values())
        if self.site_share >= 1:
            out.append(("site_share", f"site_share {self.site_share:g} is every compute tray of the site"))
        elif total > 0 and self.site_limit(total) >= total:
            out.append(("site_share", f"the budget lets mctl take all {total} compute trays of the site out of "
                                      f"service (limit {self.site_limit(total)})"))
        return out


@dataclass(frozen=True)
class SafetySettings:
    """`safety:` in mctl.yml: the limits on what mctl does to a site by its own decision (Site.safety)."""

    budget: BudgetSettings = field(default_factory=BudgetSettings)
