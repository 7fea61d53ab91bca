"""`mctl lab fault nmx RACK-or-TRAY KIND`: faults of a rack's NMX-M emulator.

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

The fabric's own faults, on the switch side (they add to the rack's faults, and to
each other; the three above replace each other and keep these):

  switch-unhealthy      switch tray --switch N (1-based; or the switch tray's name as the
                        target) reads UNHEALTHY (a loss of a switch)
  switch-missing-nvlink the same, MISSING_NVLINK
  port-down             port --port P of switch tray --switch N is down (DISABLED/STATE_DOWN on
                        the GPU end cabled to it: P is that GPU port's PeerPortNum)
  partition-degraded    partition --nmx-partition NAME reads --health (DEGRADED, the default;
                        DEGRADED_BANDWIDTH or UNHEALTHY)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mctl.errors import UsageError
from mctl.lab.labdir import LabFiles, open_lab

TRANSPORT_FAULTS = ("500", "timeout", "slow")
FABRIC_FAULTS = ("switch-unhealthy", "switch-missing-nvlink", "port-down", "partition-degraded")
NMX_FAULTS = TRANSPORT_FAULTS + FABRIC_FAULTS + ("clear",)
SLOW_S = 3.0                    # well inside the client's 15 s per-request deadline
FAULTS_NAME = "nmx-faults.json"
PARTITION_HEALTHS = ("DEGRADED", "DEGRADED_BANDWIDTH", "UNHEALTHY")
_FABRIC_KEYS = ("switch_health", "ports_down", "partition_health")

_DOCS = {"500": {"fail_all": True, "status": 500}, "timeout": {"hang": True}, "slow": {"delay_s": SLOW_S},
         "clear": {}}


def fault_doc(kind: str) -> dict:
    if kind not in NMX_FAULTS:
        raise UsageError(f"{kind!r}: unknown NMX-M fault", hint=f"one of {', '.join(NMX_FAULTS)}")
    return dict(_DOCS.get(kind, {}))


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
    for index, health in sorted((d.get("switch_health") or {}).items()):
        out.append(f"switch tray {int(index) + 1} {health}")
    for index, port in d.get("ports_down") or []:
        out.append(f"switch tray {int(index) + 1} port {port} down")
    for name, health in sorted((d.get("partition_health") or {}).items()):
        out.append(f"partition {name} {health}")
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


def merged(before: dict, kind: str, *, switch: int | None = None, port: int | None = None,
           partition: str | None = None, health: str | None = None) -> dict:
    """The faults document after *kind* (pure): transport faults replace each other, fabric faults add up."""
    if kind == "clear":
        return {}
    if kind in TRANSPORT_FAULTS:
        return {**fault_doc(kind), **{k: before[k] for k in _FABRIC_KEYS if before.get(k)}}
    doc = {k: v for k, v in before.items()}
    if kind in ("switch-unhealthy", "switch-missing-nvlink", "port-down"):
        if switch is None or switch < 1:
            raise UsageError(f"{kind} needs the switch tray: --switch N (from 1), or a switch tray's name as target")
        if kind == "port-down":
            if port is None or port < 1:
                raise UsageError("port-down needs --port P (the switch's port number, from 1)")
            ports = [list(p) for p in doc.get("ports_down") or []]
            if [switch - 1, port] not in ports:
                ports.append([switch - 1, port])
            doc["ports_down"] = ports
        else:
            doc["switch_health"] = {**(doc.get("switch_health") or {}),
                                    str(switch - 1): "UNHEALTHY" if kind == "switch-unhealthy" else "MISSING_NVLINK"}
        return doc
    if not partition:
        raise UsageError("partition-degraded needs --nmx-partition NAME (the NMX-M partition's name)")
    value = (health or "DEGRADED").upper()
    if value not in PARTITION_HEALTHS:
        raise UsageError(f"--health {health!r} is not a partition health", hint=f"one of {', '.join(PARTITION_HEALTHS)}")
    doc["partition_health"] = {**(doc.get("partition_health") or {}), partition: value}
    return doc


def apply(lab_dir: Path, target: str, kind: str, *, switch: int | None = None, port: int | None = None,
          partition: str | None = None, health: str | None = None, dry_run: bool = False) -> NmxFaultResult:
    fault_doc(kind)
    rack = rack_of(lab_dir, target)
    layout = open_lab(lab_dir).layout
    if rack is None:
        raise UsageError(f"unknown lab rack or tray {target!r}", hint=f"racks: {', '.join(layout.rack_names())}")
    sw = layout.switch(target)
    if sw is not None and switch is None:
        switch = sw.index
    path = faults_path(lab_dir, rack)
    try:
        before = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        before = {}
    before = before if isinstance(before, dict) else {}
    doc = merged(before, kind, switch=switch, port=port, partition=partition, health=health)
    actions = [f"write {path.name} for {rack}'s NMX-M emulator: {', '.join(describe(doc)) or 'no faults'}"]
    result = NmxFaultResult(rack, describe(before), describe(doc), actions, not dry_run)
    if not dry_run:
        from mctl.state.files import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, doc)
    return result
