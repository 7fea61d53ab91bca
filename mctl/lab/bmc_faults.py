"""`mctl lab fault TRAY --leak warning|critical` and `--psu-fail`: faults of a lab tray's BMC (its Redfish data).

The fault is state in the tray's `hosts/<tray>/bmc/bmc-faults.json`, the lab's stand-in for the sensor
wiring: the tray's BMC emulator (mctl.lab.bmc_emulator) lays it over the documents it serves on every
GET, so mctl sees it only through Redfish, as on a real tray. It stays until `mctl lab fault TRAY
--clear`. What each stands for on a real GB200 compute tray:

  --leak warning   a leak detector of the tray (default `Chassis_0_LeakDetector_0_ColdPlate`, on a cold
                   plate; `--leak-detector` names another of the capture's four) reads Warning: moisture
                   the BMC does not yet call a leak (DMTF LeakDetector DetectorState Warning).
  --leak critical  the same detector reads Critical: liquid at a cold plate or the manifold. The
                   detector's Status goes Critical/Degraded, as the real capture's Critical detector shows.
  --psu-fail       the tray's power subsystem (`Chassis_0/PowerSubsystem`) reports Status.Health Critical:
                   the tray BMC's view of a failed supply feeding it (a shelf PSU that failed or lost its
                   AC input). The capture's tray BMC lists no PSU of its own (the shelves' PSUs are on the
                   shelves' BMCs), so the lab changes the subsystem's health, not a made-up PSU.

Healthy lab trays are dry: their detectors read OK (the captured tray's `1_ColdPlate` read Critical).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mctl.errors import UsageError

FAULTS_NAME = "bmc-faults.json"
LEVELS = ("warning", "critical")
ROOT = "/redfish/v1"
CHASSIS = f"{ROOT}/Chassis/Chassis_0"
DETECTORS = ("Chassis_0_LeakDetector_0_ColdPlate", "Chassis_0_LeakDetector_0_Manifold",
             "Chassis_0_LeakDetector_1_ColdPlate", "Chassis_0_LeakDetector_1_Manifold")
LEAK_DETECTORS = f"{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
DEFAULT_DETECTOR = DETECTORS[0]


def faults_path(lab_dir: Path, tray: str) -> Path:
    from mctl.lab.bmcs import tray_bmc_dir

    return tray_bmc_dir(Path(lab_dir).resolve(), tray) / FAULTS_NAME


def read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def describe(doc: dict[str, Any] | None) -> list[str]:
    d = doc or {}
    out = []
    if d.get("leak"):
        out.append(f"leak {d['leak']} {d.get('detector') or DEFAULT_DETECTOR}")
    if d.get("psu_fail"):
        out.append("psu failed")
    return out


# ------------------------------------------------------------------ what the emulator serves

def overlay(path: str, doc: dict[str, Any], faults: dict[str, Any]) -> dict[str, Any]:
    """The document at *path* as the faulted (or dry, healthy) lab tray's BMC answers it."""
    leak = faults.get("leak")
    detector = faults.get("detector") or DEFAULT_DETECTOR
    if path.startswith(LEAK_DETECTORS + "/"):
        ident = path.rsplit("/", 1)[-1]
        if leak in LEVELS and ident == detector:
            word = leak.capitalize()
            doc["DetectorState"] = word
            doc["Status"] = {"Health": word, "State": "Degraded" if leak == "critical" else "Enabled"}
        elif "DetectorState" in doc:
            doc["DetectorState"] = "OK"
            doc["Status"] = {"Health": "OK", "State": "Enabled"}
    elif path == f"{CHASSIS}/PowerSubsystem" and faults.get("psu_fail"):
        doc["Status"] = {**(doc.get("Status") or {}), "Health": "Critical"}
    worst = "Critical" if leak == "critical" or faults.get("psu_fail") else "Warning" if leak == "warning" else None
    if worst and path == CHASSIS and isinstance(doc.get("Status"), dict):
        doc["Status"] = {**doc["Status"], "HealthRollup": worst}
    if leak in LEVELS and path in (f"{CHASSIS}/ThermalSubsystem", f"{CHASSIS}/ThermalSubsystem/LeakDetection") \
            and isinstance(doc.get("Status"), dict):
        doc["Status"] = {**doc["Status"], "HealthRollup": leak.capitalize()}
    return doc


class Watched:
    """The faults file, re-read when it changes (the emulator asks on every GET)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._key: tuple | None = None
        self._doc: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        try:
            st = self.path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key != self._key:
            self._key, self._doc = key, (read(self.path) if key else {})
        return self._doc


# ------------------------------------------------------------------ `mctl lab fault`

@dataclass
class BmcFaultResult:
    host: str
    before: list[str]
    after: list[str]
    actions: list[str]


def apply(lab_dir: Path, tray: str, *, leak: str | None = None, detector: str | None = None, psu_fail: bool = False,
          clear: bool = False, dry_run: bool = False) -> BmcFaultResult:
    """Set (or with *clear*, remove) a tray's BMC faults; the running emulator serves them from its next GET."""
    from mctl.lab import control

    lab_dir = Path(lab_dir).resolve()
    record = control.load_record(lab_dir)
    if record is None:
        raise UsageError(f"no lab in {lab_dir}", hint=f"start one with 'mctl lab up --dir {lab_dir}'")
    host = control.layout_of(record).host(tray)
    if host is None or host.kind != "tray":
        raise UsageError(f"{tray!r} is not a compute tray of the lab", hint="see mctl lab status")
    if leak is not None and leak not in LEVELS:
        raise UsageError(f"--leak {leak!r}: unknown level", hint=f"one of {', '.join(LEVELS)}")
    if detector is not None and detector not in DETECTORS:
        raise UsageError(f"--leak-detector {detector!r}: not a detector of the GB200 compute tray",
                         hint=f"one of {', '.join(DETECTORS)}")
    if detector is not None and leak is None:
        raise UsageError("--leak-detector goes with --leak warning|critical")
    if clear and (leak or psu_fail):
        raise UsageError("--clear cannot be combined with other faults", hint="clear first, then inject")
    path = faults_path(lab_dir, tray)
    before = read(path)
    after = {} if clear else dict(before)
    if leak:
        after["leak"], after["detector"] = leak, detector or DEFAULT_DETECTOR
    if psu_fail:
        after["psu_fail"] = True
    actions = []
    if after != before:
        actions.append(f"{'remove' if not after else 'write'} {path}" + (f": {', '.join(describe(after))}"
                                                                         if after else ""))
        if not dry_run:
            from mctl.state.files import atomic_write

            if after:
                atomic_write(path, json.dumps(after, indent=2) + "\n")
            elif path.exists():
                path.unlink()
    return BmcFaultResult(tray, describe(before), describe(after if not dry_run else before), actions)
