"""The lab folder: its files, its record (lab.json), and the processes on this machine that are the lab's.

Every lab module starts here: `mctl lab up|down|status` (control.py), each family of faults
(host_faults.py, daemon_faults.py, gpu_faults.py, bmc_faults.py, nmx_faults.py) and the BMC
emulator. lab.json records only what was asked for; which processes run is read from /proc, so
status and teardown work even when a host died or the record is stale.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet

from mctl.errors import EnvironmentProblem, UsageError
from mctl.lab import hosts, procs, services
from mctl.lab.layout import DEFAULT_NET, LabHost, LabLayout, LabSwitchTray

RECORD = "lab.json"
INVENTORY = "mctl.yml"
KNOWN_HOSTS = "known_hosts"
KEY = "ssh/id_ed25519"
MARKER_ENV = "MCTL_LAB_DIR"


@dataclass(frozen=True)
class LabFiles:
    dir: Path

    @property
    def record(self) -> Path:
        return self.dir / RECORD

    @property
    def inventory(self) -> Path:
        return self.dir / INVENTORY

    @property
    def known_hosts(self) -> Path:
        return self.dir / KNOWN_HOSTS

    @property
    def key(self) -> Path:
        return self.dir / KEY

    @property
    def lock(self) -> Path:
        return self.dir / ".lock"

    def host(self, name: str) -> hosts.HostPaths:
        return hosts.HostPaths(self.dir, name)

    def rack_dir(self, rack: str) -> Path:
        return self.dir / "racks" / rack


def load_record(lab_dir: Path) -> dict | None:
    try:
        return json.loads((Path(lab_dir) / RECORD).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise EnvironmentProblem(f"{Path(lab_dir) / RECORD} is damaged",
                                 hint="run 'mctl lab down' (it finds the lab's processes without it)") from None


def layout_of(record: dict) -> LabLayout:
    return LabLayout(record["name"], record["racks"], record["trays"], record.get("net", DEFAULT_NET),
                     int(record.get("switch_trays") or 0))


@dataclass(frozen=True)
class Lab:
    """A lab that has a record: what every fault and `mctl lab ssh` start from."""

    files: LabFiles
    record: dict
    layout: LabLayout

    def host(self, name: str) -> LabHost:
        """The tray or head node *name*; a usage error naming the lab's hosts (and what a switch tray is) if not."""
        host = self.layout.host(name)
        if host is not None:
            return host
        if self.layout.switch(name) is not None:
            raise UsageError(f"{name} is a switch tray: the lab has its BMC alone, no host",
                             hint=f"its faults: mctl lab fault bmc {name} --leak critical (or --hang, --slow S)")
        trays = [h.name for h in self.layout.hosts() if h.kind == "tray"]
        heads = [h.name for h in self.layout.hosts() if h.kind == "head"]
        raise UsageError(f"unknown lab tray {name!r}",
                         hint=f"trays: {NodeSet.fromlist(trays)}; head nodes: {NodeSet.fromlist(heads)}")

    def bmc_of(self, name: str) -> LabHost | LabSwitchTray:
        """The compute or switch tray whose BMC is *name*'s; a usage error for a head node or an unknown name."""
        switch = self.layout.switch(name)
        if switch is not None:
            return switch
        host = self.layout.host(name)
        if host is not None and host.kind == "tray":
            return host
        trays = [h.name for h in self.layout.hosts() if h.kind == "tray"] + [s.name for s in self.layout.switches()]
        if host is not None:
            raise UsageError(f"{name} is a head node: the lab gives it no BMC",
                             hint=f"trays with a BMC: {NodeSet.fromlist(trays)}")
        raise UsageError(f"{name!r} is not a compute or switch tray of the lab",
                         hint=f"trays with a BMC: {NodeSet.fromlist(trays)}")


def open_lab(lab_dir: Path) -> Lab:
    files = LabFiles(Path(lab_dir).resolve())
    record = load_record(files.dir)
    if record is None:
        raise UsageError(f"no lab in {files.dir}", hint=f"start one with 'mctl lab up --dir {files.dir}'")
    return Lab(files, record, layout_of(record))


def rack_context(files: LabFiles, layout: LabLayout, rack: str) -> services.RackContext:
    r = layout.rack_names().index(rack) + 1
    return services.RackContext(layout, rack, r, layout.service_address(r), files.dir, files.rack_dir(rack))


def send_signal(pid: int, sig: int) -> None:
    """Signal *pid*; one that is already gone is not an error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- processes belonging to a lab --------------------------------------------------------------

def _is_lab_launcher(p: procs.Proc, lab_dir: Path) -> bool:
    if p.comm != "unshare":
        return False
    prefix = str(lab_dir) + "/"
    return any(a.startswith(prefix) or a == f"{MARKER_ENV}={lab_dir}" for a in p.cmdline)


def lab_launchers(lab_dir: Path, table: dict[int, procs.Proc] | None = None) -> list[procs.Proc]:
    """The `unshare` of every host and rack service of this lab, found in /proc."""
    table = procs.scan() if table is None else table
    return [p for p in table.values() if _is_lab_launcher(p, Path(lab_dir)) and p.state != "Z"]


def lab_processes(lab_dir: Path, table: dict[int, procs.Proc] | None = None) -> list[procs.Proc]:
    """Every live process of the lab: launchers and everything in their PID namespaces."""
    table = procs.scan() if table is None else table
    out: dict[int, procs.Proc] = {}
    for launcher in lab_launchers(lab_dir, table):
        out[launcher.pid] = launcher
        for child in procs.children(table, launcher.pid):
            if child.pidns == launcher.pidns:       # a tray's BMC: no PID namespace (it boots hosts)
                for p in procs.descendants(table, child):
                    out[p.pid] = p
                continue
            for p in procs.in_namespace(table, child):
                out[p.pid] = p
    return [p for p in out.values() if p.state != "Z"]
