"""One `mctl lab fault` on a lab host, and every clear: the conductor over the families of faults.

`fault` validates a FaultRequest against the host, computes the host's next faults.json
(mctl/lab/faults.py, pure), writes it and runs each family's effects in the one order that works:
GPU kernel-log lines (gpu_faults), a freeze ended, hung or slow commands (host_faults), daemons
(daemon_faults), and a new freeze last, once nothing else needs the host's processes running.
Events (an sshd restart, a reboot) go alone. `clear` is the one place that says what clearing a
name means: a host's faults (and a compute tray's BMC faults), a switch tray's BMC faults, or a
rack's NMX-M faults.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet

from mctl.errors import EnvironmentProblem, UsageError
from mctl.lab import bmc_faults, daemon_faults, gpu_faults, host_faults, hosts, nmx_faults
from mctl.lab import faults as faultlib
from mctl.lab.labdir import LabFiles, open_lab
from mctl.lab.layout import LabHost
from mctl.state.files import write_json

CLEAR_TARGETS = (*faultlib.TARGETS, "bmc", "nmx")


@dataclass
class FaultResult:
    host: str
    before: list[str]
    after: list[str]
    actions: list[str]
    applied: bool


def fault(lab_dir: Path, host_name: str, req: faultlib.FaultRequest, *, dry_run: bool = False,
          now: float | None = None) -> FaultResult:
    lab = open_lab(lab_dir)
    files, layout, record = lab.files, lab.layout, lab.record
    host = lab.host(host_name)
    faultlib.validate(req)
    gpu_faults.check_kind(host, req, layout)
    daemon_faults.check_kind(host, req, [h.name for h in layout.hosts() if h.kind == "tray"],
                             [h.name for h in layout.hosts() if h.kind == "head"])
    faults_path = hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE)
    if record.get("fleet"):
        return _fleet_fault(files, host, req, faults_path, dry_run=dry_run, now=now)
    try:
        current = faultlib.normalize(json.loads(faults_path.read_text()))
    except (FileNotFoundError, ValueError):
        current = faultlib.empty()
    new = faultlib.apply(current, req, now if now is not None else time.time())
    if req.reboot:
        new = faultlib.without_host_faults(new)
    result = FaultResult(host.name, faultlib.active(current), faultlib.active(new),
                         fault_actions(host, current, new, req), not dry_run)
    if req.clear and req.target is None and host.kind == "tray":      # the tray's BMC faults too
        result.actions.extend(bmc_faults.apply(files.dir, host.name, clear=True, dry_run=dry_run).actions)
    if dry_run:
        return result
    if req.reboot:
        host_faults.reboot(files, layout, record, host, current, req.down_for)
        return result
    if req.sshd_restart:
        host_faults.sshd_restart(files, host)
        return result
    clearing = req.clear and req.target in (None, "host")
    faults_path.parent.mkdir(parents=True, exist_ok=True)
    if host_faults.sshrc_text(new) is not None:
        host_faults.check_sshrc_free(files, host)          # before faults.json says so
    restart = daemon_faults.daemons_running(files, host, current, new)
    for key, was_running in restart.items():
        new[key] = {"restart": was_running}
    write_json(faults_path, new)
    gpu_faults.log(files, host, req, new)
    if (current["unreachable"] and not new["unreachable"]) or clearing:
        host_faults.freeze(files, host, False)
    if new["hang"] != current["hang"] or new.get("slow") != current.get("slow") or clearing:
        host_faults.set_hang(files, host, new)
    problems = daemon_faults.apply(files, host, current, new)
    if new["unreachable"] and not current["unreachable"]:
        host_faults.freeze(files, host, True)
    if problems:
        raise EnvironmentProblem(f"{host.name}: {'; '.join(problems)}",
                                 hint=f"the fault is cleared; see {files.host(host.name).dir / hosts.FAULT_EXEC_LOG}")
    return result


def _fleet_fault(files: LabFiles, host: LabHost, req: faultlib.FaultRequest, faults_path: Path, *,
                 dry_run: bool, now: float | None) -> FaultResult:
    """Fleet mode (mctl/lab/fleet.py): a tray's GPU faults and clears. Its OS is one identity of a
    rack host shared with the rack's other trays, so host and service faults (freezing processes, killing
    daemons, sshrc) cannot be one tray's: refused, naming the full lab (docs/lab.md, "Fleet mode")."""
    for target in ("host", "service"):
        if faultlib.given(req, target):
            raise UsageError(f"{host.name} is a fleet-mode tray: `mctl lab fault {target}` needs the full lab",
                             hint="in fleet mode a tray's OS is shared with its rack; gpu, bmc and nmx faults "
                                  "work, host and service faults need `mctl lab up` without --fleet")
    try:
        current = faultlib.normalize(json.loads(faults_path.read_text()))
    except (FileNotFoundError, ValueError):
        current = faultlib.empty()
    new = faultlib.apply(current, req, now if now is not None else time.time())
    result = FaultResult(host.name, faultlib.active(current), faultlib.active(new),
                         [f"write {hosts.FAULTS_FILE} on {host.name}: {', '.join(faultlib.active(new)) or 'no faults'}"]
                         + gpu_faults.actions(req), not dry_run)
    if req.clear and req.target is None and host.kind == "tray":      # the tray's BMC faults too
        result.actions.extend(bmc_faults.apply(files.dir, host.name, clear=True, dry_run=dry_run).actions)
    if dry_run:
        return result
    write_json(faults_path, new)
    gpu_faults.log(files, host, req, new)
    return result


def fault_actions(host: LabHost, current: dict, new: dict, req: faultlib.FaultRequest) -> list[str]:
    """What `fault` does (and `--dry-run` says it would), in its order."""
    if req.events():
        return host_faults.actions(host, current, new, req) + daemon_faults.actions(current, new)
    return ([f"write {hosts.FAULTS_FILE} on {host.name}: {', '.join(faultlib.active(new)) or 'no faults'}"]
            + gpu_faults.actions(req) + host_faults.actions(host, current, new, req)
            + daemon_faults.actions(current, new))


def clear(lab_dir: Path, name: str, *, target: str | None = None,
          dry_run: bool = False) -> FaultResult | bmc_faults.BmcFaultResult | nmx_faults.NmxFaultResult:
    """Remove the faults of *name*: every fault of a host (a compute tray's BMC faults too), a switch tray's
    BMC faults, or a rack's NMX-M faults; with *target*, only that family's (nmx: the rack of *name*)."""
    if target is not None and target not in CLEAR_TARGETS:
        raise UsageError(f"--target {target!r}: unknown target", hint=f"one of {', '.join(CLEAR_TARGETS)}")
    lab = open_lab(lab_dir)
    layout = lab.layout
    if name in layout.rack_names():
        if target not in (None, "nmx"):
            trays = NodeSet.fromlist([h.name for h in layout.trays_of(name)])
            raise UsageError(f"{name} is a rack: its own faults are its NMX-M's (--target nmx)",
                             hint=f"clear a host's instead: mctl lab fault clear TRAY --target {target} "
                                  f"(trays: {trays})")
        return nmx_faults.apply(lab.files.dir, name, "clear", dry_run=dry_run)
    if target == "nmx":
        return nmx_faults.apply(lab.files.dir, name, "clear", dry_run=dry_run)      # the rack of *name*
    if layout.switch(name) is not None:
        if target not in (None, "bmc"):
            raise UsageError(f"{name} is a switch tray: the lab has its BMC alone (--target bmc)",
                             hint=f"mctl lab fault clear {name}")
        return bmc_faults.apply(lab.files.dir, name, clear=True, dry_run=dry_run)
    if target == "bmc":
        return bmc_faults.apply(lab.files.dir, lab.bmc_of(name).name, clear=True, dry_run=dry_run)
    return fault(lab.files.dir, name, faultlib.FaultRequest(clear=True, target=target), dry_run=dry_run)
