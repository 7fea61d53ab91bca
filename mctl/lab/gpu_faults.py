"""`mctl lab fault gpu TRAY ...`: what a GPU fault leaves on the tray besides its faults.json.

The faults themselves are state in faults.json, which the tray's nvidia-smi emulator
(mctl/lab/emulators/nvidia_smi.py) reads on every call. The few that are also events leave the
kernel-log lines a real driver writes, here: an XID line, the fallen-off-the-bus message (no Xid),
an XID storm's first burst.
"""

from __future__ import annotations

import json
import time

from ClusterShell.NodeSet import NodeSet

from mctl.errors import UsageError
from mctl.lab import faults as faultlib
from mctl.lab import hosts
from mctl.lab.labdir import LabFiles
from mctl.lab.layout import LabHost, LabLayout


def check_kind(host: LabHost, req: faultlib.FaultRequest, layout: LabLayout) -> None:
    if host.kind != "tray" and faultlib.given(req, "gpu"):
        trays = [h.name for h in layout.hosts() if h.kind == "tray"]
        raise UsageError(f"{host.name} has no GPUs; GPU faults apply to compute trays",
                         hint=f"trays: {NodeSet.fromlist(trays)}")


def actions(req: faultlib.FaultRequest) -> list[str]:
    acts = []
    if req.xid is not None:
        acts.append(f"append an XID {req.xid} line for GPU {req.gpu} to {hosts.KERN_LOG}")
    if req.fell_off_bus:
        acts.append(f"append the fallen-off-the-bus lines (no Xid) for GPU {req.gpu} to {hosts.KERN_LOG}")
    if req.xid_storm is not None:
        from mctl.lab.emulators.nvidia_smi import STORM_BURST, STORM_RATE

        acts.append(f"append {STORM_BURST} XID {req.xid_storm} lines for GPU {req.gpu} to {hosts.KERN_LOG}, "
                    f"then {STORM_RATE} a second (written by each nvidia-smi call) until cleared")
    return acts


def log(files: LabFiles, host: LabHost, req: faultlib.FaultRequest, new: dict) -> None:
    """The kernel-log lines of the faults *req* injects (written after *new* is the tray's faults.json)."""
    if req.xid is not None:
        _append_xid(files, host, req.gpu or 0, req.xid, new["xid"][-1]["time"], new["xid"][-1])
    _emulator_kernel_log(files, host, req, new)


def _pci(files: LabFiles, host: LabHost, gpu: int) -> tuple[dict, str]:
    state = json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())
    return state, next(g["pci_bus_id"] for g in state["gpus"] if g["index"] == gpu)


def _append(files: LabFiles, host: LabHost, lines: list[str]) -> None:
    with open(hosts.host_path(files.dir, host.name, hosts.KERN_LOG), "a") as fh:
        fh.write("\n".join(lines) + "\n")


def _append_xid(files: LabFiles, host: LabHost, gpu: int, code: int, when: float, record: dict | None = None) -> None:
    from mctl.lab.emulators.nvidia_smi import event_line

    _state, pci = _pci(files, host, gpu)
    record = record or {}
    line = event_line(host.name, pci, code, when, uptime=hosts.host_uptime(files.dir, host.name, when),
                      nonfatal=bool(record.get("nonfatal")), recovery=record.get("recovery") or "drain-reset")
    _append(files, host, [line])


def _emulator_kernel_log(files: LabFiles, host: LabHost, req: faultlib.FaultRequest, new: dict) -> None:
    """Kernel-log lines of the GPU-emulator faults: fallen off the bus (no Xid), an XID storm's first burst."""
    if not (req.fell_off_bus or req.xid_storm is not None):
        return
    from mctl.lab.emulators import nvidia_smi as emu

    state, pci = _pci(files, host, req.gpu)
    now = time.time()
    lines: list[str] = []
    if req.fell_off_bus:
        lines += emu.fell_off_bus_lines(host.name, pci, when=now, uptime=hosts.host_uptime(files.dir, host.name, now))
    if req.xid_storm is not None:
        storm = next(s for s in new["xid_storm"] if (s["gpu"], s["code"]) == (req.gpu, req.xid_storm))
        lines += emu.storm_lines(state, storm, emu.STORM_BURST, now - emu.STORM_BURST / emu.STORM_RATE, now)
    _append(files, host, lines)
