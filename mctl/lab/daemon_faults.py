"""`mctl lab fault service HOST --slurmd-down|--imex-crash|--slurmctld-down`: a lab host's daemons killed.

A daemon fault is kept in the host's faults.json while it lasts (mctl/lab/faults.py, "process,
transport and host faults"); what each stands for is in docs/lab.md ("Faults"). Kept down means a
unit drop-in whose ExecStartPre fails, so every `systemctl start` fails as for a daemon that crashes
at start; clearing removes it and starts the daemon again if it ran when the fault came. Everything
here acts inside the host's namespaces (hosts.run_inside), never over SSH.
"""

from __future__ import annotations

import signal
import time

from ClusterShell.NodeSet import NodeSet

from mctl.errors import UsageError
from mctl.lab import faults as faultlib
from mctl.lab import hosts
from mctl.lab.labdir import LabFiles, send_signal
from mctl.lab.layout import LabHost

# faults.json key -> (process name, unit, kept down while the fault lasts)
DAEMON_FAULTS = {"slurmd_down": ("slurmd", "slurmd.service", True),
                 "imex_crash": ("nvidia-imex", "nvidia-imex.service", False),
                 "slurmctld_down": ("slurmctld", "slurmctld.service", True)}
KEEP_DOWN_DROPIN = "90-mctl-lab-fault.conf"


def check_kind(host: LabHost, req: faultlib.FaultRequest, trays: list[str], heads: list[str]) -> None:
    """slurmctld runs on head nodes, slurmd and IMEX on compute trays: a fault elsewhere would do nothing."""
    for key in faultlib.HEAD_ONLY:
        if getattr(req, key) and host.kind != "head":
            raise UsageError(f"--{key.replace('_', '-')} applies to a head node (slurmctld runs there)",
                             hint=f"head nodes: {NodeSet.fromlist(heads)}")
    for key in faultlib.TRAY_ONLY:
        if getattr(req, key) and host.kind != "tray":
            raise UsageError(f"--{key.replace('_', '-')} applies to a compute tray",
                             hint=f"trays: {NodeSet.fromlist(trays)}")


def actions(current: dict, new: dict) -> list[str]:
    acts = []
    for key, (proc, unit, keep_down) in DAEMON_FAULTS.items():
        if new.get(key) and not current.get(key):
            acts.append(f"kill {proc} (SIGKILL)" + (f", and keep {unit} from starting until cleared" if keep_down
                                                    else f"; the lab's systemctl does not restart {unit}"))
        if current.get(key) and not new.get(key):
            was = current[key].get("restart", True) if isinstance(current[key], dict) else True
            acts.append(f"let {unit} start again" + (" and start it" if was else " (it was not running)"))
    return acts


def daemons_running(files: LabFiles, host: LabHost, current: dict, new: dict) -> dict[str, bool]:
    """For each daemon fault being injected now: whether its daemon runs (so clearing starts it again)."""
    starting = [k for k in DAEMON_FAULTS if new.get(k) and not current.get(k)]
    if not starting:
        return {}
    _init, members = hosts.members(files.host(host.name))
    return {k: any(p.comm == DAEMON_FAULTS[k][0] for p in members) for k in starting}


def _dropin(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.d/{KEEP_DOWN_DROPIN}"


def remove_keep_down(files: LabFiles, host: LabHost, unit: str) -> None:
    """Remove a keep-down drop-in and its folder when that is left empty: an empty
    /etc/systemd/system/UNIT.d hides the unit's other drop-ins from the image's systemctl (the lab's
    Type=forking one among them), and the next start of the daemon fails."""
    path = hosts.host_path(files.dir, host.name, _dropin(unit))
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        path.parent.rmdir()
    except OSError:
        pass


def forget(files: LabFiles, host: LabHost) -> None:
    """Every keep-down of the host removed (it loses power: its daemons start again as at boot)."""
    for _key, (_proc, unit, _keep) in DAEMON_FAULTS.items():
        remove_keep_down(files, host, unit)


def apply(files: LabFiles, host: LabHost, current: dict, new: dict) -> list[str]:
    """Kill (and keep down) the daemons of the faults *new* adds; start again those of the faults it drops.
    The problems met starting them, for the caller to raise once everything else is done."""
    problems: list[str] = []
    for key, (proc, unit, keep_down) in DAEMON_FAULTS.items():
        if new.get(key) and not current.get(key):
            if keep_down:
                from mctl.state.files import atomic_write

                path = hosts.host_path(files.dir, host.name, _dropin(unit))
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, f"# mctl lab fault service --{key.replace('_', '-')} (removed by mctl lab fault "
                                   f"clear): {unit} fails to start, as a crashed daemon that will not come back\n"
                                   "[Service]\nExecStartPre=/bin/sh -c 'echo \"mctl lab fault: "
                                   f"{proc} is kept down\" >&2; exit 1'\n")
            _init, members = hosts.members(files.host(host.name))
            for p in members:
                if p.comm == proc:
                    send_signal(p.pid, signal.SIGKILL)
        elif current.get(key) and not new.get(key):
            remove_keep_down(files, host, unit)
            restart = current[key].get("restart", True) if isinstance(current[key], dict) else True
            # The image's systemctl keeps the failed start's ActiveState in /run/UNIT.status and reports any
            # later start as failed ("forking start not active") although the daemon runs: forget it first.
            paths = files.host(host.name)
            hosts.run_inside(paths, ["rm", "-f", f"/run/{unit}.status"], timeout=30)
            if restart:
                rc, said = hosts.run_inside(paths, ["systemctl", "start", unit], timeout=90)
                # The image's systemctl may give up on a forking daemon that is slow to write its pid file
                # on a loaded machine: the daemon running is what counts.
                if rc != 0 and not _wait_process(files, host, proc, 10.0):
                    problems.append(f"systemctl start {unit} failed (exit {rc}): {said}")
    return problems


def _wait_process(files: LabFiles, host: LabHost, comm: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        _init, members = hosts.members(files.host(host.name))
        if any(p.comm == comm and p.state != "Z" for p in members):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
