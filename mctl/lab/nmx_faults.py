"""`mctl lab fault nmx RACK-or-TRAY 500|timeout|slow|clear`: faults of a rack's NMX-M emulator.

The fault is state in the rack's `nmx-faults.json` (next to the emulator's config
under racks/<rack>/), which the running emulator re-reads when it changes; it
stays until `mctl lab fault clear RACK` (or `mctl lab fault nmx RACK clear`). What
each stands for on a real rack:

  500      NMX-M answers every request with HTTP 500 (a crashed backend behind
           the gateway, a database that is down): mctl retries, then reports
           NMX-M unavailable (exit 3).
  timeout  NMX-M takes requests and never answers (a hung pod, a black-holed
           route): every call ends at its deadline.
  slow     every answer comes SLOW_S late (an overloaded NMX-M): calls still
           succeed, inside the deadline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mctl.errors import UsageError
from mctl.lab.labdir import LabFiles, open_lab

NMX_FAULTS = ("500", "timeout", "slow", "clear")
SLOW_S = 3.0                    # well inside the client's 15 s per-request deadline
FAULTS_NAME = "nmx-faults.json"

_DOCS = {"500": {"fail_all": True, "status": 500}, "timeout": {"hang": True}, "slow": {"delay_s": SLOW_S},
         "clear": {}}


def fault_doc(kind: str) -> dict:
    if kind not in NMX_FAULTS:
        raise UsageError(f"{kind!r}: unknown NMX-M fault", hint=f"one of {', '.join(NMX_FAULTS)}")
    return dict(_DOCS[kind])


def describe(doc: dict | None) -> list[str]:
    """Short labels of the faults in an nmx-faults.json document."""
    d = doc or {}
    out = []
    if d.get("fail_all"):
        out.append(f"nmx answers {d.get('status', 500)}")
    if d.get("hang"):
        out.append("nmx never answers")
    if d.get("delay_s"):
        out.append(f"nmx answers {float(d['delay_s']):g} s late")
    return out


@dataclass
class NmxFaultResult:
    rack: str
    before: list[str]
    after: list[str]
    actions: list[str]
    applied: bool


def rack_of(lab_dir: Path, name: str) -> str | None:
    """The rack *name* is, or whose tray, head node or switch tray it is; None for an unknown name."""
    layout = open_lab(lab_dir).layout
    if name in layout.rack_names():
        return name
    host = layout.host(name) or layout.switch(name)
    return host.rack if host is not None else None


def faults_path(lab_dir: Path, rack: str) -> Path:
    return LabFiles(Path(lab_dir).resolve()).rack_dir(rack) / FAULTS_NAME


def current(lab_dir: Path, rack: str) -> list[str]:
    """Labels of the rack's NMX-M faults now (empty when none, or the file is unreadable)."""
    try:
        doc = json.loads(faults_path(lab_dir, rack).read_text())
    except (OSError, ValueError):
        return []
    return describe(doc if isinstance(doc, dict) else {})


def apply(lab_dir: Path, target: str, kind: str, *, dry_run: bool = False) -> NmxFaultResult:
    doc = fault_doc(kind)
    rack = rack_of(lab_dir, target)
    if rack is None:
        layout = open_lab(lab_dir).layout
        raise UsageError(f"unknown lab rack or tray {target!r}", hint=f"racks: {', '.join(layout.rack_names())}")
    path = faults_path(lab_dir, rack)
    try:
        before = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        before = {}
    actions = [f"write {path.name} for {rack}'s NMX-M emulator: {', '.join(describe(doc)) or 'no faults'}"]
    result = NmxFaultResult(rack, describe(before if isinstance(before, dict) else {}), describe(doc), actions,
                            not dry_run)
    if not dry_run:
        from mctl.state.files import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, doc)
    return result
