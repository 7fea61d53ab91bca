"""Out-of-band checks: a tray's leak detectors and power subsystem, as its BMC reports them over Redfish.

The health sweep's BMC reader (mctl.health.oob: one read per BMC, each under its deadline; in the watch
beside the sweep, on its own cadence) gives each compute tray's view as `TrayFacts.bmc` and each switch
tray's as `SweepResult.switch_bmcs` (a BmcHealth below); these checks judge it. The leak detectors are
wherever the BMC's tree has them (mctl.health.oob.discover_leaks walks every chassis); the ids are the
real captures' (tests/fixtures/real/redfish):

    GB200 compute tray  Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/
                            Chassis_0_LeakDetector_{0,1}_{ColdPlate,Manifold}
    NVLink switch tray  Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors/leakage1..6, leakage_aggr
        DetectorState OK | Warning | Critical (DMTF LeakDetector; Unavailable, Absent since v1_5_0)
    Chassis/Chassis_0/PowerSubsystem              Status.Health (the capture: OK; compute trays only)
    Chassis/Chassis_0/PowerSubsystem/PowerSupplies  each member's Status.Health (the capture: no member;
                                                  the shelves' PSUs are on the shelves' own BMCs)

- `bmc.reachable`: the BMC answered within its deadline. One that did not is a warning naming why, and the
  leak and power checks say they were not read: an unanswered BMC is never reported healthy.
- `bmc.stale`: the view the sweep judged is older than `health.bmc_stale_after` reads (the watch reads
  BMCs beside the sweep and never waits for one): a warning naming its age and the last error, and the
  leak and power checks say they were not read (an old view is not today's health).
- `leak.detectors`: a detector in Critical is critical (the tray is drained at once and, after
  `health.leak.power_off_after`, powered off: mctl.health.leaks); Warning warns, and so do a detector that
  is Unavailable or disabled, a tray BMC that lists no detector and detectors that could not be read.
- `power.supplies`: the power subsystem or a PSU not OK warns (Warning or Critical alike: shelves are
  redundant, and a shelf fault seen by every tray it feeds must not drain a rack; docs/decisions.md D48).

Standard library only (the catalogue travels with `mctl node check`, which has no BMC facts: these
checks then return nothing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

BMC = "bmc.reachable"
STALE = "bmc.stale"
LEAK = "leak.detectors"
POWER = "power.supplies"

CHASSIS = "Chassis_0"                        # the compute tray's chassis in the GB200 capture
ROOT = "/redfish/v1"
# Where the GB200 compute tray's BMC keeps them (the reader finds them by walking the tree; tests, the lab)
LEAK_DETECTORS = f"{ROOT}/Chassis/{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
POWER_SUBSYSTEM = f"{ROOT}/Chassis/{CHASSIS}/PowerSubsystem"
DETECTOR_PREFIX = f"{CHASSIS}_LeakDetector_"
_WORDS = 64


def _word(value: Any) -> str | None:
    """A short enum-like value from the BMC, made safe to print (None when absent or not a string)."""
    if not isinstance(value, str):
        return None
    # the common case (every value of the real captures) without a Python loop over its characters
    text = (value if value.isprintable() else "".join(c if c.isprintable() else "?" for c in value)).strip()
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
    chassis: str | None = None        # the chassis whose LeakDetection lists it (Chassis_0, MGX_BMC_0)

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
    """What one tray's BMC said (or why it said nothing), as the sweep judges it.

    `mctl health check` reads every BMC before judging: `age` is None. The watch judges the reader's last
    view (mctl.health.oob.BmcReader): `age` is how old its information is (since the BMC last answered,
    or since it was first asked when it never did), `stale_after` the age past which it is stale,
    `in_flight` how long the read now running has waited, and `repeat` says the sweep before judged this
    same reading (a leak episode counts readings, not sweeps: mctl.health.leaks)."""

    error: str | None = None          # the BMC did not answer (then nothing below was read)
    error_kind: str | None = None     # timeout, unreachable, auth, tls, config, pending (not read yet), ...
    detectors: tuple[LeakDetector, ...] | None = None
    leak_error: str | None = None     # the leak detectors could not be read (404, malformed, ...)
    power_health: str | None = None   # PowerSubsystem Status.Health
    supplies: tuple[PowerSupply, ...] | None = None
    power_error: str | None = None
    elapsed: float = 0.0
    power_asked: bool = True          # False: a switch tray (its leak detectors only)
    age: float | None = None          # seconds; None: read for this sweep
    stale_after: float | None = None  # seconds; None: never stale
    in_flight: float | None = None    # seconds the read now running has waited; None: none
    repeat: bool = False              # the previous sweep judged this reading already
    never_answered: bool = False      # the watch has not had one answer from this BMC yet

    @property
    def answered(self) -> bool:
        return self.error is None

    @property
    def stale(self) -> bool:
        return self.stale_after is not None and self.age is not None and self.age > self.stale_after

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_detector(doc: Mapping[str, Any], chassis: str | None = None) -> LeakDetector:
    """One LeakDetector document (of *chassis*); ValueError when it has no Id."""
    ident = _word(doc.get("Id")) if isinstance(doc, Mapping) else None
    if not ident:
        raise ValueError("a leak detector without an Id")
    health, enabled = _status(doc)
    return LeakDetector(ident, _word(doc.get("DetectorState")), _word(doc.get("LeakDetectorType")), health, enabled,
                        chassis)


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
    return judge(facts.host, bmc)


def judge(host: str, bmc: BmcHealth, **where: Any) -> list[Finding]:
    """The findings of one BMC's view; *where* goes into each finding's details (a switch tray's rack)."""
    out = [*_stale(host, bmc)]
    if not bmc.answered:
        if bmc.error_kind == "pending":
            out.append(fail(host, BMC, f"the BMC was not read yet: {bmc.error}", "wait for the next sweep; "
                            "a BMC that never answers is named here once its read ends", kind=bmc.error_kind))
        else:
            out.append(fail(host, BMC, f"the BMC did not answer: {bmc.error}; leak detectors"
                            + (" and power supplies" if bmc.power_asked else "") + " not read",
                            "check the BMC (mctl bmc inventory TRAY) and its network; a leak is not seen while "
                            "it is silent", kind=bmc.error_kind))
        out += _unread(host, bmc, "not read yet" if bmc.error_kind == "pending" else "the BMC did not answer")
    else:
        ago = f", {bmc.age:.0f}s ago" if bmc.age is not None else ""
        out.append(ok(host, BMC, f"the BMC answered in {bmc.elapsed:.2f}s{ago}"))
        if bmc.stale:
            out += _unread(host, bmc, f"the BMC view is {bmc.age:.0f}s old")
        else:
            out += _leaks(host, bmc)
            out += _power(host, bmc) if bmc.power_asked else []
    if where:
        out = [replace(f, details={**f.details, **where}) for f in out]
    return out


def _unread(host: str, bmc: BmcHealth, why: str) -> list[Finding]:
    out = [finding(Severity.WARN, host, LEAK, f"leak detectors not read: {why}", "check the BMC", read=False)]
    if bmc.power_asked:
        out.append(finding(Severity.WARN, host, POWER, f"power supplies not read: {why}", "check the BMC",
                           read=False))
    return out


def _stale(host: str, bmc: BmcHealth) -> list[Finding]:
    if not bmc.stale:
        return []
    why = []
    if not bmc.answered and bmc.error_kind != "pending":
        why.append(f"last error: {bmc.error}")
    if bmc.in_flight is not None:
        why.append(f"a read has waited {bmc.in_flight:.0f}s for its answer")
    what = ("the BMC has not answered since it was first asked" if bmc.never_answered
            else "the BMC's last answer") + f" {bmc.age:.0f}s ago"
    return [fail(host, STALE, f"{what}, more than the {bmc.stale_after:g}s health.bmc_stale_after allows"
                 + (f" ({'; '.join(why)})" if why else ""),
                 "check the BMC (mctl bmc inventory TRAY): its leaks and power are not seen meanwhile",
                 age=round(bmc.age, 1), last_error=bmc.error if not bmc.answered else None)]


def _leaks(host: str, bmc: BmcHealth) -> list[Finding]:
    fresh = not bmc.repeat               # a reading the previous sweep judged already counts once (leaks.step)
    if bmc.leak_error or bmc.detectors is None:
        return [finding(Severity.WARN, host, LEAK, f"leak detectors not read: {bmc.leak_error or 'no answer'}",
                        "check the BMC's ThermalSubsystem/LeakDetection (mctl bmc inventory TRAY)", read=False)]
    if not bmc.detectors:
        return [finding(Severity.WARN, host, LEAK, "the BMC lists no leak detector (no chassis' ThermalSubsystem "
                        "links a LeakDetection with detectors)",
                        "a GB200 compute tray has four (cold plates and manifolds), a switch tray seven: check the "
                        "BMC firmware", read=False)]
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
                        short=f"leak critical {crit[0].short}", read=fresh, detectors=[d.id for d in crit]))
    if warn:
        out.append(finding(Severity.WARN, host, LEAK, "leak warning: " + ", ".join(f"{d.id} Warning" for d in warn),
                           "inspect the tray's cooling loop; a Critical reading drains it", read=fresh,
                           detectors=[d.id for d in warn]))
    if odd or disabled:
        seen = odd + [d for d in disabled if d not in odd]
        out.append(finding(Severity.WARN, host, LEAK, "leak detector state unknown: " + ", ".join(
            f"{d.id} {d.level or 'no state'}" + (" (disabled)" if d.enabled == "Disabled" else "") for d in seen),
            "a detector that reports nothing cannot see a leak: check it in the BMC", read=fresh))
    if not out:
        out.append(ok(host, LEAK, f"{len(ids)} leak detectors OK", read=fresh, detectors=ids))
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
