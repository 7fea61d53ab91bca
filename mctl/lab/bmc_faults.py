"""`mctl lab fault bmc TRAY --leak warning|critical|--psu-fail|--hang|--slow S|--no-events`: faults of a lab tray's BMC.

The fault is state in the tray's `hosts/<tray>/bmc/bmc-faults.json`, the lab's stand-in for the sensor
wiring and the BMC's own health: the tray's BMC emulator (mctl.lab.bmc_emulator) reads it on every
request, so mctl sees it only through Redfish, as on a real tray. It stays until `mctl lab fault clear
TRAY`. A compute tray and a switch tray (`mctl lab up --switch-trays N`, a BMC alone) both take them,
each where its real BMC shows them (TrayBmc). What each stands for on a real tray:

  --leak warning   a leak detector of the tray (`--detector` names one; default the compute tray's
                   `Chassis_0_LeakDetector_0_ColdPlate`, the switch tray's `leakage1`) reads Warning:
                   moisture the BMC does not yet call a leak (DMTF LeakDetector DetectorState Warning).
  --leak critical  the same detector reads Critical: liquid at a cold plate or the manifold. The
                   detector's Status goes Critical/Degraded, as the real capture's Critical detector shows.
  --psu-fail       a compute tray's power subsystem (`Chassis_0/PowerSubsystem`) reports Status.Health
                   Critical: the tray BMC's view of a failed supply feeding it (a shelf PSU that failed or
                   lost its AC input). The capture's tray BMC lists no PSU of its own (the shelves' PSUs are
                   on the shelves' BMCs), so the lab changes the subsystem's health, not a made-up PSU.
  --hang           the BMC takes connections and requests and answers none, on connections that were
                   already open too (a wedged bmcweb or its D-Bus backend): every read ends at the
                   client's deadline. Requests held when it is cleared are then answered.
  --slow SECONDS   every answer comes SECONDS late (an overloaded BMC: sensor polling, a firmware update).
  --no-events      the BMC offers no EventService (ServiceEnabled false, a POST of a subscription refused,
                   no event sent: mctl/lab/bmc_events.py): its leaks are seen by the watch's polling alone.

Healthy lab trays are dry: their detectors read OK (the captured compute tray's `1_ColdPlate` read Critical).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mctl.errors import UsageError

FAULTS_NAME = "bmc-faults.json"
LEVELS = ("warning", "critical")
ROOT = "/redfish/v1"
SLOW_MAX_S = 3600.0
HANG_POLL_S = 0.2           # how often a held request looks whether the hang was cleared


@dataclass(frozen=True)
class TrayBmc:
    """Where one kind of tray's BMC shows what its faults change, from its real capture."""

    kind: str
    chassis: str                    # the chassis whose detectors and rollups a leak changes
    detectors: tuple[str, ...]      # its leak detectors' ids
    aggregate: str | None = None    # a detector that reads the worst of the others
    power_subsystem: bool = True    # whether the lab serves its PowerSubsystem (--psu-fail)

    @property
    def default_detector(self) -> str:
        return self.detectors[0]

    @property
    def leak_detectors(self) -> str:
        return f"{self.chassis}/ThermalSubsystem/LeakDetection/LeakDetectors"


# The GB200 compute tray (tests/fixtures/real/redfish/nvidia_gb200): Chassis_0, four detectors.
COMPUTE = TrayBmc("compute", f"{ROOT}/Chassis/Chassis_0",
                  ("Chassis_0_LeakDetector_0_ColdPlate", "Chassis_0_LeakDetector_0_Manifold",
                   "Chassis_0_LeakDetector_1_ColdPlate", "Chassis_0_LeakDetector_1_Manifold"))
# The NVLink switch tray (nvidia_gbswitch): its detectors are on the BMC board's chassis, MGX_BMC_0, with
# `leakage_aggr` beside the six; the lab serves no power subsystem of it (not copied from the capture).
SWITCH = TrayBmc("switch", f"{ROOT}/Chassis/MGX_BMC_0",
                 ("leakage1", "leakage2", "leakage3", "leakage4", "leakage5", "leakage6", "leakage_aggr"),
                 aggregate="leakage_aggr", power_subsystem=False)
KINDS = {b.kind: b for b in (COMPUTE, SWITCH)}
# Kept for callers of the compute tray's names
DETECTORS = COMPUTE.detectors
DEFAULT_DETECTOR = COMPUTE.default_detector
CHASSIS = COMPUTE.chassis
LEAK_DETECTORS = COMPUTE.leak_detectors


def faults_path(lab_dir: Path, tray: str) -> Path:
    from mctl.lab.bmcs import tray_bmc_dir

    return tray_bmc_dir(Path(lab_dir).resolve(), tray) / FAULTS_NAME


def read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def describe(doc: dict[str, Any] | None, kind: str = "compute") -> list[str]:
    d = doc or {}
    out = []
    if d.get("leak"):
        out.append(f"leak {d['leak']} {d.get('detector') or KINDS[kind].default_detector}")
    if d.get("psu_fail"):
        out.append("psu failed")
    if d.get("hang"):
        out.append("bmc never answers")
    if d.get("slow"):
        out.append(f"bmc answers {float(d['slow']):g} s late")
    if d.get("no_events"):
        out.append("bmc offers no EventService")
    return out


# ------------------------------------------------------------------ what the emulator serves

def overlay(path: str, doc: dict[str, Any], faults: dict[str, Any], kind: str = "compute") -> dict[str, Any]:
    """The document at *path* as the faulted (or dry, healthy) lab tray's BMC answers it."""
    bmc = KINDS[kind]
    leak = faults.get("leak")
    detector = faults.get("detector") or bmc.default_detector
    chassis = bmc.chassis
    if path.startswith(bmc.leak_detectors + "/"):
        ident = path.rsplit("/", 1)[-1]
        if leak in LEVELS and ident in (detector, bmc.aggregate):
            word = leak.capitalize()
            doc["DetectorState"] = word
            doc["Status"] = {"Health": word, "State": "Degraded" if leak == "critical" else "Enabled"}
        elif "DetectorState" in doc:
            doc["DetectorState"] = "OK"
            doc["Status"] = {"Health": "OK", "State": "Enabled"}
    elif path == f"{chassis}/PowerSubsystem" and faults.get("psu_fail") and bmc.power_subsystem:
        doc["Status"] = {**(doc.get("Status") or {}), "Health": "Critical"}
    psu_fail = bool(faults.get("psu_fail")) and bmc.power_subsystem
    worst = "Critical" if leak == "critical" or psu_fail else "Warning" if leak == "warning" else None
    if worst and path == chassis and isinstance(doc.get("Status"), dict):
        doc["Status"] = {**doc["Status"], "HealthRollup": worst}
    if leak in LEVELS and path in (f"{chassis}/ThermalSubsystem", f"{chassis}/ThermalSubsystem/LeakDetection") \
            and isinstance(doc.get("Status"), dict):
        doc["Status"] = {**doc["Status"], "HealthRollup": leak.capitalize()}
    return doc


class Watched:
    """The faults file, re-read when it changes (the emulator asks on every request, from many threads)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._key: tuple | None = None
        self._doc: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self) -> dict[str, Any]:
        try:
            st = self.path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)      # a rename of a same-size file is a change too
        except OSError:
            key = None
        with self._lock:
            if key != self._key:
                self._key, self._doc = key, (read(self.path) if key else {})
            return self._doc


class Stall:
    """WSGI middleware outside everything the BMC does (authentication too): `--hang` holds each request
    unanswered while the fault lasts, `--slow` answers each one late. Checked per request, so a connection
    kept open since before the fault (HTTP keep-alive, as mctl's Redfish client keeps them) is hit too."""

    def __init__(self, app, faults: Watched):
        self.app = app
        self.faults = faults

    def __call__(self, environ, start_response):
        doc = self.faults.get()
        while doc.get("hang"):
            time.sleep(HANG_POLL_S)
            doc = self.faults.get()
        slow = doc.get("slow")
        if isinstance(slow, (int, float)) and slow > 0:
            time.sleep(float(slow))
        return self.app(environ, start_response)


# ------------------------------------------------------------------ `mctl lab fault bmc`

@dataclass
class BmcFaultResult:
    host: str
    before: list[str]
    after: list[str]
    actions: list[str]


def apply(lab_dir: Path, tray: str, *, leak: str | None = None, detector: str | None = None, psu_fail: bool = False,
          hang: bool = False, slow: float | None = None, clear: bool = False,
          dry_run: bool = False, no_events: bool = False) -> BmcFaultResult:
    """Set (or with *clear*, remove) a tray's BMC faults; the running emulator serves them from its next request."""
    from mctl.lab.faults import check_delay
    from mctl.lab.labdir import open_lab

    lab = open_lab(lab_dir)
    unit = lab.bmc_of(tray)
    kind = "switch" if lab.layout.switch(tray) is not None else "compute"
    bmc = KINDS[kind]
    what = "switch" if kind == "switch" else "GB200 compute"
    if leak is not None and leak not in LEVELS:
        raise UsageError(f"--leak {leak!r}: unknown level", hint=f"one of {', '.join(LEVELS)}")
    if detector is not None and detector not in bmc.detectors:
        raise UsageError(f"--detector {detector!r}: not a leak detector of the {what} tray",
                         hint=f"one of {', '.join(bmc.detectors)}")
    if detector is not None and leak is None:
        raise UsageError("--detector goes with --leak warning|critical")
    if psu_fail and not bmc.power_subsystem:
        raise UsageError(f"--psu-fail: the lab serves no power subsystem for the switch tray {unit.name}",
                         hint="a switch tray's BMC takes --leak, --hang and --slow")
    if slow is not None:
        check_delay(slow, "--slow", SLOW_MAX_S)
    given = bool(leak or psu_fail or hang or slow is not None or no_events)
    if clear and given:
        raise UsageError("--clear cannot be combined with other faults", hint="clear first, then inject")
    if not clear and not given:
        raise UsageError("no BMC fault given", hint=f"give one of --leak warning|critical [--detector NAME], "
                                                    f"--psu-fail, --hang, --slow SECONDS, --no-events; "
                                                    f"e.g. mctl lab fault bmc {unit.name} --leak critical")
    path = faults_path(lab.files.dir, unit.name)
    before = read(path)
    after = {} if clear else dict(before)
    if leak:
        after["leak"], after["detector"] = leak, detector or bmc.default_detector
    if psu_fail:
        after["psu_fail"] = True
    if hang:
        after["hang"] = True
    if slow is not None:
        after["slow"] = float(slow)
    if no_events:
        after["no_events"] = True
    actions = []
    if after != before:
        actions.append(f"{'remove' if not after else 'write'} {path}" + (f": {', '.join(describe(after, kind))}"
                                                                         if after else ""))
        if not dry_run:
            from mctl.state.files import atomic_write

            if after:
                atomic_write(path, json.dumps(after, indent=2) + "\n")
            elif path.exists():
                path.unlink()
    return BmcFaultResult(unit.name, describe(before, kind), describe(after if not dry_run else before, kind), actions)
