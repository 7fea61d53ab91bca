"""Out-of-band checks: the tray's leak detectors and power subsystem, as its BMC reports them over Redfish.

The health sweep reads each compute tray's BMC beside the SSH probe (mctl.health.oob, one deadline per
BMC) into `TrayFacts.bmc` (a BmcHealth below); these checks judge it. Resources and ids are the real
GB200 compute-tray capture's (tests/fixtures/real/redfish/nvidia_gb200):

    Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/Chassis_0_LeakDetector_{0,1}_{ColdPlate,Manifold}
        DetectorState OK | Warning | Critical (DMTF LeakDetector; Unavailable, Absent since v1_5_0)
    Chassis/Chassis_0/PowerSubsystem              Status.Health (the capture: OK)
    Chassis/Chassis_0/PowerSubsystem/PowerSupplies  each member's Status.Health (the capture: no member;
                                                  the shelves' PSUs are on the shelves' own BMCs)

- `bmc.reachable`: the BMC answered within its deadline. One that did not is a warning naming why, and the
  leak and power checks say they were not read: an unanswered BMC is never reported healthy.
- `leak.detectors`: a detector in Critical is critical (the tray is drained at once and, after
  `health.leak.power_off_after`, powered off: mctl.health.leaks); Warning warns, and so do a detector that
  is Unavailable or disabled, a tray BMC that lists no detector and detectors that could not be read.
- `power.supplies`: the power subsystem or a PSU not OK warns (Warning or Critical alike: shelves are
  redundant, and a shelf fault seen by every tray it feeds must not drain a rack; docs/decisions.md D48).

Standard library only (the catalogue travels with `mctl node check`, which has no BMC facts: these
checks then return nothing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

BMC = "bmc.reachable"
LEAK = "leak.detectors"
POWER = "power.supplies"

CHASSIS = "Chassis_0"                        # the compute tray's chassis in the GB200 capture
ROOT = "/redfish/v1"
LEAK_DETECTORS = f"{ROOT}/Chassis/{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
POWER_SUBSYSTEM = f"{ROOT}/Chassis/{CHASSIS}/PowerSubsystem"
DETECTOR_PREFIX = f"{CHASSIS}_LeakDetector_"
_WORDS = 64


def _word(value: Any) -> str | None:
    """A short enum-like value from the BMC, made safe to print (None when absent or not a string)."""
    if not isinstance(value, str):
        return None
    text = "".join(c if c.isprintable() else "?" for c in value).strip()
    return text[:_WORDS] or None


def _status(doc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    st = doc.get("Status") if isinstance(doc.get("Status"), Mapping) else {}
    return _word(st.get("Health")), _word(st.get("State"))


@dataclass(frozen=True)
class LeakDetector:
    id: str
    state: str | None                 # DetectorState
    kind: str | None = None           # LeakDetectorType (Moisture, FloatSwitch)
    health: str | None = None         # Status.Health
    enabled: str | None = None        # Status.State (Enabled, Disabled, Absent, ...)

    @property
    def short(self) -> str:
        """`0_ColdPlate` for `Chassis_0_LeakDetector_0_ColdPlate`: what a drain reason has room for."""
        return self.id[len(DETECTOR_PREFIX):] if self.id.startswith(DETECTOR_PREFIX) else self.id

    @property
    def level(self) -> str | None:
        """What the detector says: DetectorState, else (a BMC that omits it) Status.Health."""
        return self.state or self.health


@dataclass(frozen=True)
class PowerSupply:
    id: str
    health: str | None
    state: str | None = None
    line_input: str | None = None     # LineInputStatus (Normal, LossOfInput, OutOfRange)


@dataclass(frozen=True)
class BmcHealth:
    """What one tray's BMC said this sweep (or why it said nothing)."""

    error: str | None = None          # the BMC did not answer (then nothing below was read)
    error_kind: str | None = None     # timeout, unreachable, auth, tls, config, ...
    detectors: tuple[LeakDetector, ...] | None = None
    leak_error: str | None = None     # the leak detectors could not be read (404, malformed, ...)
    power_health: str | None = None   # PowerSubsystem Status.Health
    supplies: tuple[PowerSupply, ...] | None = None
    power_error: str | None = None
    elapsed: float = 0.0

    @property
    def answered(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_detector(doc: Mapping[str, Any]) -> LeakDetector:
    """One LeakDetector document; ValueError when it has no Id."""
    ident = _word(doc.get("Id")) if isinstance(doc, Mapping) else None
    if not ident:
        raise ValueError("a leak detector without an Id")
    health, enabled = _status(doc)
    return LeakDetector(ident, _word(doc.get("DetectorState")), _word(doc.get("LeakDetectorType")), health, enabled)


def parse_supply(doc: Mapping[str, Any]) -> PowerSupply:
    ident = _word(doc.get("Id")) if isinstance(doc, Mapping) else None
    if not ident:
        raise ValueError("a power supply without an Id")
    health, state = _status(doc)
    return PowerSupply(ident, health, state, _word(doc.get("LineInputStatus")))


def parse_power_subsystem(doc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(Status.Health, the PowerSupplies collection's @odata.id or None)."""
    health, _state = _status(doc)
    link = doc.get("PowerSupplies")
    path = link.get("@odata.id") if isinstance(link, Mapping) and isinstance(link.get("@odata.id"), str) else None
    return health, path


# ------------------------------------------------------------------ the checks

def check(facts, expect, settings) -> list[Finding]:
    bmc = getattr(facts, "bmc", None)
    if bmc is None:                   # not asked (node check, audit without a bmc section, bmc_checks: off)
        return []
    host = facts.host
    if not bmc.answered:
        return [fail(host, BMC, f"the BMC did not answer: {bmc.error}; leak detectors and power supplies not read",
                     "check the BMC (mctl bmc inventory TRAY) and its network; a leak is not seen while it is silent",
                     kind=bmc.error_kind),
                finding(Severity.WARN, host, LEAK, "leak detectors not read: the BMC did not answer",
                        "check the BMC", read=False),
                finding(Severity.WARN, host, POWER, "power supplies not read: the BMC did not answer",
                        "check the BMC", read=False)]
    out = [ok(host, BMC, f"the BMC answered in {bmc.elapsed:.2f}s")]
    out += _leaks(host, bmc)
    out += _power(host, bmc)
    return out


def _leaks(host: str, bmc: BmcHealth) -> list[Finding]:
    if bmc.leak_error or bmc.detectors is None:
        return [finding(Severity.WARN, host, LEAK, f"leak detectors not read: {bmc.leak_error or 'no answer'}",
                        "check the BMC's ThermalSubsystem/LeakDetection (mctl bmc inventory TRAY)", read=False)]
    if not bmc.detectors:
        return [finding(Severity.WARN, host, LEAK, f"the BMC lists no leak detector under {CHASSIS}",
                        "a GB200 compute tray has four (cold plates and manifolds): check the BMC firmware",
                        read=False)]
    crit = [d for d in bmc.detectors if d.level == "Critical"]
    warn = [d for d in bmc.detectors if d.level == "Warning"]
    odd = [d for d in bmc.detectors if d not in crit and d not in warn and d.level != "OK" and d.level != "Absent"]
    disabled = [d for d in bmc.detectors if d.enabled == "Disabled" and d not in crit and d not in warn]
    out: list[Finding] = []
    ids = [d.id for d in bmc.detectors]
    if crit:
        out.append(fail(host, LEAK, "leak: " + ", ".join(f"{d.id} Critical" + (f" ({d.kind})" if d.kind else "")
                                                           for d in crit),
                        "liquid at the tray: it is drained now and powered off after health.leak.power_off_after; "
                        "inspect the cold plates and manifold before powering it on",
                        short=f"leak critical {crit[0].short}", read=True, detectors=[d.id for d in crit]))
    if warn:
        out.append(finding(Severity.WARN, host, LEAK, "leak warning: " + ", ".join(f"{d.id} Warning" for d in warn),
                           "inspect the tray's cooling loop; a Critical reading drains it", read=True,
                           detectors=[d.id for d in warn]))
    if odd or disabled:
        seen = odd + [d for d in disabled if d not in odd]
        out.append(finding(Severity.WARN, host, LEAK, "leak detector state unknown: " + ", ".join(
            f"{d.id} {d.level or 'no state'}" + (" (disabled)" if d.enabled == "Disabled" else "") for d in seen),
            "a detector that reports nothing cannot see a leak: check it in the BMC", read=True))
    if not out:
        out.append(ok(host, LEAK, f"{len(ids)} leak detectors OK", read=True, detectors=ids))
    return out


def _power(host: str, bmc: BmcHealth) -> list[Finding]:
    if bmc.power_error:
        return [finding(Severity.WARN, host, POWER, f"power supplies not read: {bmc.power_error}",
                        "check the BMC's PowerSubsystem (mctl bmc inventory TRAY)")]
    bad = []
    if bmc.power_health not in (None, "OK"):
        bad.append(f"{CHASSIS} PowerSubsystem {bmc.power_health}")
    for s in bmc.supplies or ():
        if s.health not in (None, "OK") or s.line_input not in (None, "Normal"):
            bad.append(f"{s.id} {s.health or 'health unknown'}" + (f" input {s.line_input}" if s.line_input
                                                                     not in (None, "Normal") else ""))
    if bad:
        return [fail(host, POWER, "power: " + ", ".join(bad),
                     "check the power shelf and its PSUs feeding the tray (the shelf's BMC, or the rack's PDU)")]
    n = len(bmc.supplies or ())
    listed = f"{n} power supplies OK" if n else "the tray BMC lists no power supply"
    return [ok(host, POWER, f"power subsystem {bmc.power_health or 'health not reported'}; {listed}")]
