"""Health settings as the checks and the policy read them (standard library only).

The inventory's `health:` section is validated (HealthSpec, mctl.inventory.spec) on the
operator's machine; a tray running `mctl node check` carries no inventory code, so the
same values travel to it as JSON and come back as this plain object. Both
paths end here, which keeps the watch and the node check on one set of rules.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from mctl.model.findings import Severity
from mctl.model.xid import DEFAULT_DRAIN_XIDS, DEFAULT_NVLINK5_NO_DRAIN, NVLINK5_MODES

REASON_MAX = 40          # sinfo -R shows 20 by default; 40 reads whole in `sinfo -R -o "%40E %N"`

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


def _subcode_texts(pairs) -> list[str]:
    return [f"{x}.{s}" for x, s in sorted(pairs)]


def parse_duration(text: str | int | float) -> float:
    """'90s', '5m', '1h', '2d' (or a number of seconds) -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 1h, 2d)")
    return float(int(match[1]) * _UNIT[match[2]])


def _spec_subcodes(spec: Any) -> frozenset[tuple[int, int]]:
    values = getattr(spec, "nvlink5_no_drain", None)
    if values is None:
        return DEFAULT_NVLINK5_NO_DRAIN
    try:
        return parse_subcodes(values)
    except ValueError as exc:
        from mctl.errors import UsageError

        raise UsageError(f"inventory health.nvlink5_no_drain: {exc}",
                         hint="quote each entry in the inventory, e.g. nvlink5_no_drain: ['149.38', '149.40']"
                         ) from None


def _mode(value) -> str:
    if value not in NVLINK5_MODES:
        raise ValueError(f"nvlink5_drain is {value!r}; use one of {', '.join(NVLINK5_MODES)}")
    return str(value)


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
    fabric_flags: Mapping[str, Severity] = field(default_factory=lambda: dict(FABRIC_FLAG_DEFAULTS))
    driver_mismatch: Severity = Severity.WARN
    imex: str = "auto"                      # auto | required | ignore
    disk_paths: tuple[str, ...] = ("/", "/var", "/tmp")
    disk_warn_pct: float = 90.0
    disk_critical_pct: float = 98.0
    memory_warn_available_pct: float = 5.0
    breaker_max_share: float = 0.25
    breaker_window_s: float = 3600.0
    breaker_scope: str = "rack"             # rack | site
    remediate: bool = True
    k8s_taint: str = "mctl.io/unhealthy=true:NoSchedule"
    # hysteresis for flapping findings (mctl/health/hysteresis.py; docs/health.md "Flapping and storms")
    hysteresis_clear_sweeps: int = 1
    hysteresis_max_hold_sweeps: int = 64
    hysteresis_window_sweeps: int = 10
    hysteresis_checks: tuple[str, ...] = ("fabric.state", "gpu.xid", "nvlink.links")

    @property
    def hysteresis(self):
        from mctl.health.hysteresis import HysteresisSettings

        return HysteresisSettings(self.hysteresis_clear_sweeps, self.hysteresis_max_hold_sweeps,
                                  frozenset(self.hysteresis_checks), self.hysteresis_window_sweeps)

    @property
    def temp_warn_c(self) -> float:
        return self.gpu_temp_warn_c if self.gpu_temp_warn_c is not None else self.max_gpu_temp_c - 5.0

    def flag_severity(self, flag: str) -> Severity:
        return self.fabric_flags.get(flag, FABRIC_FLAG_DEFAULTS.get(flag, Severity.WARN))

    @classmethod
    def from_spec(cls, spec: Any) -> "HealthSettings":
        """From the inventory's HealthSpec or anything with the same attributes."""
        flags = dict(FABRIC_FLAG_DEFAULTS)
        flags.update({k: Severity(v) for k, v in (getattr(spec, "fabric_flags", None) or {}).items()})
        breaker = spec.breaker
        return cls(
            interval=float(spec.interval),
            drain_xids=frozenset(int(x) for x in spec.drain_xids),
            nvlink5_drain=_mode(getattr(spec, "nvlink5_drain", "fatal")),
            nvlink5_no_drain=_spec_subcodes(spec),
            resume_after_healthy_sweeps=int(spec.resume_after_healthy_sweeps),
            unreachable_sweeps_before_drain=int(spec.unreachable_sweeps_before_drain),
            confirm_sweeps=int(spec.confirm_sweeps),
            max_gpu_temp_c=float(spec.max_gpu_temp_c),
            gpu_temp_warn_c=None if spec.gpu_temp_warn_c is None else float(spec.gpu_temp_warn_c),
            max_power_overshoot_pct=float(spec.max_power_overshoot_pct),
            xid_window_s=parse_duration(spec.xid_window),
            fabric_flags=flags,
            driver_mismatch=Severity(spec.driver_mismatch),
            imex=str(spec.imex),
            disk_paths=tuple(spec.disk_paths),
            disk_warn_pct=float(spec.disk_warn_pct),
            disk_critical_pct=float(spec.disk_critical_pct),
            memory_warn_available_pct=float(spec.memory_warn_available_pct),
            breaker_max_share=float(breaker.max_drained_share),
            breaker_window_s=parse_duration(breaker.window),
            breaker_scope=str(breaker.scope),
            remediate=bool(spec.remediate),
            k8s_taint=str(spec.k8s_taint),
            **_hysteresis_from_spec(getattr(spec, "hysteresis", None)),
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drain_xids"] = sorted(self.drain_xids)
        data["nvlink5_no_drain"] = _subcode_texts(self.nvlink5_no_drain)
        data["fabric_flags"] = {k: Severity(v).value for k, v in self.fabric_flags.items()}
        data["driver_mismatch"] = self.driver_mismatch.value
        data["disk_paths"] = list(self.disk_paths)
        data["hysteresis_checks"] = list(self.hysteresis_checks)
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
        return cls(**kwargs)


def _hysteresis_from_spec(spec: Any) -> dict[str, Any]:
    """HealthSettings keys from the inventory's `health.hysteresis` (HysteresisSpec); defaults when absent."""
    if spec is None:
        return {}
    return {"hysteresis_clear_sweeps": int(spec.clear_sweeps),
            "hysteresis_max_hold_sweeps": int(spec.max_hold_sweeps),
            "hysteresis_window_sweeps": int(spec.window_sweeps),
            "hysteresis_checks": tuple(sorted(str(c) for c in spec.checks))}
