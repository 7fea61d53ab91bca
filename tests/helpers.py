"""What test modules share, in one place: no test module imports another (tests/unit/test_test_imports.py).

Fixtures live in conftest files (tests/conftest.py: the tiers, `held_lock`; tests/integration/conftest.py:
the health and Slurm sites) and in tests/lab_fixture.py (the labs, `slurm_lab`); this module has the plain
functions and builders they and the tests use:

    waiting         wait_for
    Slurm views     sinfo, node_state, responding, settled, srun, resume_if_rebooted
    the lab         fault, bmc_address, redfish, power_state, ssh_ok, power_restored
    Slurm sites     PARTITIONS, write_site, deploy_slurm
    health          HEALTH, write_health_site, actions, Watch
    locks           held_lock (through the `held_lock` fixture, which puts a test in the emulators tier)
    unit builders   what more than one unit module builds on: captured_lab_site, fabric_for; tray, expect,
                    xid_line; CaptureClient, BMC_CASES; probe_here; EmulatedTray, contract_state;
                    PolicySite; example_engine; FakeTray, fake_trays; watch_result; site_with, plan_for;
                    lab_like_site; k8s_site; make_rack, make_nodes; real_text and the real samples' tables

A helper that starts a process or opens a socket says so in its docstring: the test using it requests
`processes` or `sockets` (tests/conftest.py), or it fails in the pure tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[1]

T = TypeVar("T")


# ------------------------------------------------------------------ waiting

def wait_for(what: str, probe: Callable[[], T], timeout: float = 60.0, every: float = 0.5) -> T:
    """probe() until it returns something true, which is returned; after *timeout* seconds the test fails
    naming *what* and the last answer (a loaded machine is slow, not broken: give it room, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(every)


# ------------------------------------------------------------------ Slurm views (on a lab's head node)

def sinfo(lab) -> dict[str, tuple[str, str]]:
    """node -> (state, reason) as Slurm reports it now. Slurm keeps the last reason on a node it
    resumed (`scontrol show node` still prints it); like `sinfo -R`, only a drained, down or failed
    node's reason is shown here."""
    out = lab.run(lab.head, "sinfo -h -N -o '%N|%T|%E'").stdout
    rows = [line.split("|", 2) for line in out.splitlines() if line.strip()]
    return {n: (s, "" if r == "none" or not any(w in s for w in ("drain", "down", "fail")) else r)
            for n, s, r in rows}


def node_state(lab, tray: str) -> str:
    """The tray's State= in `scontrol show node` ("" when Slurm does not answer)."""
    import re

    out = lab.run(lab.head, f"scontrol show node {tray} -o", check=False, timeout=30).stdout
    state = re.search(r"\bState=(\S+)", out)
    return state[1] if state else ""


def responding(lab, tray: str) -> bool:
    state = node_state(lab, tray)
    return bool(state) and "*" not in state and "NOT_RESPONDING" not in state


def settled(lab, tray: str) -> None:
    """The tray is idle with no reason. Right after a RESUME, slurmctld marks the node not responding
    (`idle*`) until its ping comes back; on a loaded machine that takes a moment."""
    wait_for(f"{tray} idle and responding", lambda: sinfo(lab)[tray] == ("idle", ""), 30, every=0.3)


def srun(lab, args: str, check: bool = True) -> subprocess.CompletedProcess:
    return lab.run(lab.head, f"srun --immediate=30 {args}", timeout=90, check=check)


def resume_if_rebooted(lab, tray: str) -> None:
    """A real slurmctld marks an unexpected reboot DOWN (ReturnToService=1); the test leaves the node as it was."""
    res = lab.run(lab.head, f"scontrol show node {tray} 2>/dev/null", check=False, timeout=30)
    # The reason text outlives the DOWN state (Slurm keeps it on the idle node): only a node still DOWN
    # for the reboot is resumed (RESUME of an idle node is refused: "Invalid node state specified").
    state = next((w.split("=", 1)[1] for w in res.stdout.split() if w.startswith("State=")), "")
    if res.returncode != 0 or "unexpectedly rebooted" not in res.stdout or "DOWN" not in state:
        return
    wait_for("slurmd on the rebooted tray", lambda: lab.run(tray, "pgrep -x slurmd", check=False).returncode == 0,
             60, every=0.2)
    lab.run(lab.head, f"scontrol update NodeName={tray} State=RESUME", timeout=30)
    # (Slurm keeps the reason text on the idle node; only the state says it is back.)
    wait_for(f"{tray} back in service in Slurm", lambda: responding(lab, tray) and "DOWN" not in node_state(lab, tray),
             60, every=0.2)


# ------------------------------------------------------------------ the lab: faults, BMCs

def fault(lab, host: str, **request):
    """`mctl lab fault` in-process: the fault lands at a known moment, without a CLI start-up in between."""
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    return control.fault(lab.dir, host, FaultRequest(**request))


def bmc_address(lab, tray: str) -> str:
    from mctl.lab import control

    layout = control.layout_of(control.load_record(lab.dir))
    sw = layout.switch(tray)
    return layout.switch_bmc_address(sw) if sw else layout.bmc_address(layout.host(tray))


def redfish(lab, tray: str, path: str, *, method: str = "GET", body=None, password: str | None = None):
    """One Redfish request with curl (an independent client): (HTTP status, JSON or None)."""
    from mctl.lab import bmcs

    d = bmcs.lab_bmc_dir(lab.dir)
    user, _, pw = (d / "credentials").read_text().strip().partition(":")
    argv = ["curl", "-sS", "--max-time", "20", "--cacert", str(d / "ca.pem"), "-u", f"{user}:{password or pw}",
            "-o", "-", "-w", "\n%{http_code}", "-X", method, f"https://{bmc_address(lab, tray)}{path}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    text, _, code = out.stdout.rpartition("\n")
    try:
        doc = json.loads(text) if text.strip() else None
    except ValueError:
        doc = None
    return int(code), doc


def power_state(lab, tray: str) -> str:
    code, doc = redfish(lab, tray, "/redfish/v1/Systems/System_0")
    assert code == 200, (code, doc)
    return doc["PowerState"]


def ssh_ok(lab, tray: str) -> bool:
    return lab.run(tray, "true", check=False, timeout=20, connect_timeout=3).returncode == 0


def power_restored(lab) -> None:
    """Every tray on and, if Slurm runs on the lab, back in service (a real slurmctld marks the reboot DOWN)."""
    from mctl.lab import control

    files = control.LabFiles(lab.dir)
    layout = control.layout_of(control.load_record(lab.dir))
    for tray in lab.trays:
        if not control.host_running(files, layout.host(tray)):
            redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                    body={"ResetType": "On"})
    for tray in lab.trays:
        wait_for(f"SSH on {tray}", lambda: ssh_ok(lab, tray), 120)
        resume_if_rebooted(lab, tray)


# ------------------------------------------------------------------ Slurm sites

#: The NVLink partitions an operator records for the 4-tray lab rack: p0 = trays 1-2, p1 = trays 3-4.
PARTITIONS = [{"name": "p0", "trays": "lab-r1-tray[01-02]"}, {"name": "p1", "trays": "lab-r1-tray[03-04]"}]


def write_site(lab, folder: Path, partitions: list[dict]) -> Path:
    """The lab's own inventory with *partitions* recorded on its rack, as `folder/mctl.yml`; the folder."""
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["racks"][lab.rack]["partitions"] = partitions
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def deploy_slurm(lab, site: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`mctl --json deploy slurm` of *site* on the lab: the process and its JSON (None when it printed none)."""
    proc = lab.mctl("-i", str(site), "--json", "deploy", "slurm", *args, timeout=900)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    return proc, data


# ------------------------------------------------------------------ health

#: Short health settings for the lab: 1 s interval, 2 healthy sweeps to resume, 2 misses before an
#: unreachable tray is drained, a 15 s XID window, and `imex: ignore` (whether the session's IMEX daemons
#: run is another test module's business).
HEALTH = {"interval": 1, "resume_after_healthy_sweeps": 2, "unreachable_sweeps_before_drain": 2,
          "xid_window": "15s", "imex": "ignore", "breaker": {"max_drained_share": 0.25, "window": "1h"}}


def write_health_site(lab, folder: Path, health: dict = HEALTH) -> Path:
    """The lab's own inventory with *health* as its health settings, as `folder/mctl.yml`; the folder."""
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["health"] = health
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def actions(state: Path) -> list[dict]:
    """The action log without the intent lines (each drain and resume is preceded by one)."""
    path = state / "health" / "actions.jsonl"
    log = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    intents = {e["intent_id"] for e in log if e["action"] == "intent"}
    assert intents <= {e.get("intent_id") for e in log if e["action"] != "intent"}, "an intent without its result"
    return [e for e in log if e["action"] != "intent"]


class Watch:
    """`mctl health watch` in the background with plain log lines (stdout is a pipe)."""

    def __init__(self, lab, site: Path, state: Path, *args: str):
        env = dict(lab._env)
        self.proc = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(site), "--state-dir", str(state),
                                      "health", "watch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, bufsize=1)
        self.lines: list[str] = []
        os.set_blocking(self.proc.stdout.fileno(), False)

    def read(self) -> list[str]:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
        return self.lines

    def sweeps(self) -> int:
        return sum(" SWEEP " in l for l in self.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.set_blocking(self.proc.stdout.fileno(), True)
        self.lines += [l.rstrip("\n") for l in self.proc.stdout.read().splitlines()]
        return self.proc.returncode


# ------------------------------------------------------------------ locks

@contextlib.contextmanager
def held_lock(path: Path, purpose: str = "", *, within: float = 30.0) -> Iterator[int]:
    """The lock file *path* held by another process (as another mctl command holds it) for the block; that
    process's pid. Tests reach it through the `held_lock` fixture (tests/conftest.py), so they say that
    they start a process. The holder is a fork of this process: it starts at once, and ends with the block
    (or with this process)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(path), purpose, ready, release), daemon=True)
    proc.start()
    try:
        assert ready.wait(within), f"the lock {path} was not taken by its holder within {within:g} s"
        yield proc.pid
    finally:
        release.set()
        proc.join(within)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _hold(path: str, purpose: str, ready, release) -> None:
    from mctl.state.lock import file_lock

    with file_lock(path, purpose=purpose):
        ready.set()
        release.wait(600)


# ================================================================== unit builders
# Sites, trays, findings and fakes that more than one unit module builds on. Product imports are made
# inside the builders, so a module that needs only a wait_for does not load them.

# ------------------------------------------------------------------ a lab-shaped site of captured addresses

CAPTURED = REPO / "tests" / "fixtures" / "golden" / "slurm" / "captured"
CAPTURED_DOMAIN = str(uuid.uuid5(uuid.NAMESPACE_URL, "mctl-lab/lab/lab-r1"))


def captured_lab_site(folder: Path, *, partitions=(("p0", "lab-r1-tray[01-02]"), ("p1", "lab-r1-tray[03-04]")),
                      nmx: bool = True) -> Path:
    """A lab-shaped site (4 trays at the captured addresses 127.83.1.x, Slurm, NMX-M)."""
    rack = {
        "model": "nvl72", "shape": {"compute_trays": 4, "switch_trays": 0}, "nvlink_domain": CAPTURED_DOMAIN,
        "head": {"name": "lab-r1-head", "address": "127.83.1.100"},
        "compute": {"nodes": "lab-r1-tray[01-04]", "addresses": "127.83.1.[1-4]", "image": "lab-debian13"},
        "partitions": [{"name": n, "trays": t} for n, t in partitions],
    }
    if nmx:
        rack["nmx"] = {"url": "http://127.83.1.200:8443", "credentials_file": "nmx.cred"}
    doc = {"plugin": "mctl", "site": "lab", "images_dir": str(REPO / "images"),
           "ssh": {"user": "root", "known_hosts": "known_hosts"}, "racks": {"lab-r1": rack},
           "scheduler": {"type": "slurm", "cluster_name": "lab", "controller": "lab-r1-head"}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def fabric_for(rack, parts):
    """NMX-M's view of *rack* (one node per tray, 4 GPUs each) with *parts* as its partitions."""
    from mctl.fabric.partitions import map_fabric
    from mctl.fabric.reconcile import FabricState
    from mctl.model.fabric import NmxComputeNode

    nodes = [NmxComputeNode(id=f"n{i}", name=h.name, domain_uuid=CAPTURED_DOMAIN,
                            gpu_ids=tuple(f"gpu-{i}-{d}" for d in range(4)), health="HEALTHY", chassis_id=1,
                            chassis_serial="1", host_id=1, slot_id=i + 1, tray_index=i)
             for i, h in enumerate(rack.compute)]
    fabric = map_fabric(rack, nodes)
    return FabricState(tuple(nodes), (), tuple(parts), fabric)


def gpus_of(trays: range) -> tuple[str, ...]:
    """The GPU ids fabric_for gives the trays of index *trays*."""
    return tuple(f"gpu-{i}-{d}" for i in trays for d in range(4))


# ------------------------------------------------------------------ a tray's facts from the real GB200 capture

def _tray_captures():
    from mctl.facts.nvidia_smi import parse_nvlink_status, parse_xml

    fix = REPO / "tests" / "fixtures"
    return (parse_xml((fix / "gb200-nvidia-smi-q-x.xml").read_text()),
            parse_nvlink_status((fix / "lab" / "healthy-nvlink-status.txt").read_text()))


GB200_GPUS, LINKS_OK = _tray_captures()          # the real GB200 `nvidia-smi -q -x`; the lab's healthy links
GB200_DOMAIN = "889d2be1-4bbf-69e1-d3f2-97c465ee31aa"


def _tray_clock():
    from datetime import datetime

    from mctl.model.tray import Clock

    return Clock(epoch=1_764_441_600.0, local=datetime(2025, 11, 29, 18, 40, 0), uptime=86_400.0)


TRAY_CLOCK = _tray_clock()


def tray(host="t01", gpus=GB200_GPUS, **kw):
    """TrayFacts of a healthy tray: the GB200 capture's GPUs, links up, slurmd running, room on disk."""
    from mctl.model.tray import DiskUsage, Memory, ServiceState, TrayFacts

    base = dict(host=host, gpus=gpus, nvlinks=LINKS_OK, clock=TRAY_CLOCK, xid_source="/var/log/kern.log",
                slurmd=ServiceState("slurmd.service", True, "active", "running"),
                disks=(DiskUsage("/", "/", 1000, 100, 900),), memory=Memory(1000, 800))
    base.update(kw)
    return TrayFacts(**base)


def expect(host="t01", **kw):
    """The TrayExpectation the capture's tray meets (its driver, its NVLink domain, Slurm)."""
    from mctl.model.tray import TrayExpectation

    base = dict(host=host, rack="rack-a", driver_version="570.148.08", nvlink_domain=GB200_DOMAIN, scheduler="slurm")
    base.update(kw)
    return TrayExpectation(**base)


def by_check(findings, check):
    return [f for f in findings if f.check == check]


def xid_line(code: int, pci="0000:29:00", uptime=86_000.0, stamp="Nov 29 18:33:20", host="t01") -> str:
    """A kernel-log line of XID *code* as rsyslog writes it."""
    return (f"{stamp} {host} kernel: [{uptime:12.6f}] NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', "
            f"name=<unknown>, GPU has fallen off the bus.")


# ------------------------------------------------------------------ the GB200 capture as its BMC answers it

GB200_REDFISH = REPO / "tests" / "fixtures" / "real" / "redfish" / "nvidia_gb200"
CAPTURE_DETECTORS = ("Chassis_0_LeakDetector_0_ColdPlate", "Chassis_0_LeakDetector_0_Manifold",
                     "Chassis_0_LeakDetector_1_ColdPlate", "Chassis_0_LeakDetector_1_Manifold")


GB200_SWITCH_REDFISH = GB200_REDFISH.parent / "nvidia_gbswitch"      # a GB200 NVLink switch tray's BMC


def capture_doc(path: str, capture: Path = GB200_REDFISH) -> dict:
    """A document of the real capture by its Redfish path."""
    rel = path.removeprefix("/redfish/v1").strip("/")
    return json.loads((capture / "redfish" / "v1" / rel / "index.json").read_text())


class CaptureClient:
    """The capture as a BMC answers it (GET only), with *changes* laid over some documents: a pure stand-in
    for mctl.bmc.client.RedfishClient (the client itself is tested against the capture over HTTPS in
    test_bmc_redfish.py). A document the capture lacks (or *missing* names) answers 404, as a BMC that
    lacks it; *capture*: which capture (the compute tray's, or GB200_SWITCH_REDFISH)."""

    def __init__(self, changes: dict[str, dict] | None = None, missing: tuple[str, ...] = (),
                 silent: str | None = None, capture: Path = GB200_REDFISH):
        self.changes, self.missing, self.silent, self.paths = changes or {}, missing, silent, []
        self.capture = capture

    def get(self, path: str) -> dict:
        from mctl.bmc.client import BMCError

        self.paths.append(path)
        if self.silent:
            raise BMCError(self.silent, f"GET {path} timed out")
        rel = path.removeprefix("/redfish/v1").strip("/")
        if any(path.startswith(m) for m in self.missing) or \
                not (self.capture / "redfish" / "v1" / rel / "index.json").is_file():
            # the copied subset: a chassis' ThermalSubsystem not copied answers as a BMC that lacks it
            raise BMCError("http", f"GET {path} answered HTTP 404", status=404)
        out = capture_doc(path, self.capture)
        for key, value in self.changes.get(path, {}).items():
            out[key] = value
        return out

    def members(self, path: str) -> list[str]:
        return [m["@odata.id"] for m in self.get(path)["Members"]]

    def member_docs(self, path: str, need: tuple[str, ...] = ("Id",)) -> list[tuple[str, dict]]:
        return [(p, self.get(p)) for p in self.members(path)]      # a BMC without $expand


def detector_path(d: str) -> str:
    from mctl.checks import leak

    return f"{leak.LEAK_DETECTORS}/{d}"


def detector_state(d: str, value: str) -> dict:
    return {detector_path(d): {"DetectorState": value, "Status": {"Health": value, "State": "Enabled"}}}


def capture_reading(**changes):
    """The BmcHealth the health sweep reads from a CaptureClient(**changes)."""
    from mctl.health import oob

    return oob.read_tray(CaptureClient(**changes))


CAPTURE_DRY = detector_state(CAPTURE_DETECTORS[2], "OK")      # the capture with its one Critical detector reading OK


def _bmc_cases() -> dict:
    from mctl.checks import leak
    from mctl.checks.leak import BmcHealth

    psu = {leak.POWER_SUBSYSTEM: {"Status": {"Health": "Critical", "State": "Enabled"}}}
    return {
        "capture": capture_reading(changes=CAPTURE_DRY),
        "leak-critical": capture_reading(),                                        # the capture as it is
        "leak-warning": capture_reading(changes={**CAPTURE_DRY, **detector_state(CAPTURE_DETECTORS[3], "Warning")}),
        "leak-unavailable": capture_reading(changes={**CAPTURE_DRY,
                                                     **detector_state(CAPTURE_DETECTORS[1], "Unavailable")}),
        "leak-unread": capture_reading(missing=(leak.LEAK_DETECTORS,)),
        "psu-fail": capture_reading(changes={**CAPTURE_DRY, **psu}),
        "silent": BmcHealth(error="GET /redfish/v1/Systems/System_0 timed out", error_kind="timeout"),
    }


BMC_CASES = _bmc_cases()        # what a tray's BMC said, by case: the health checks' out-of-band inputs


# ------------------------------------------------------------------ the audit's tray probe on this machine

def probe_here(tmp_path: Path, *, smi: str | None, packages: Sequence[str] = (), dpkg_query: str | None = None):
    """The audit's tray probe on this machine (a process: request the `processes` fixture); *smi* is the
    stand-in nvidia-smi's body (None: none on PATH); *packages*: the Debian packages it asks dpkg-query
    about, *dpkg_query* a stand-in's body (None: this machine's own, where it has one). Its TrayFacts."""
    from mctl.facts.probe import AUDIT, from_result, probe_command
    from mctl.transport.results import HostResult, HostStatus

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    if dpkg_query is not None:
        (bin_dir / "dpkg-query").write_text("#!/bin/sh\n" + dpkg_query)
        (bin_dir / "dpkg-query").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    nonce = "00112233445566aa"
    proc = subprocess.run(["/bin/sh", "-c", probe_command(AUDIT, nonce, smi_timeout=20, packages=packages)],
                          capture_output=True, text=True, timeout=60, env=env)
    result = HostResult("lab-r1-tray01", "127.0.0.1", HostStatus.OK if proc.returncode == 0 else HostStatus.FAILED,
                        proc.returncode, proc.stdout, proc.stderr)
    return from_result(AUDIT, result, nonce, smi_timeout=20, packages=packages)


# ------------------------------------------------------------------ the lab's nvidia-smi on a state file

SMI_EMULATOR = REPO / "mctl" / "lab" / "emulators" / "nvidia_smi.py"
GPU_DOMAIN = "3f5c1a9e-2b7d-5e04-8c61-9d2a4b7e0f13"
GPU_BUSES = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def contract_state(**top) -> dict:
    """gpus.json for one 4-GPU tray, shaped as the lab contract writes it."""
    state = {
        "schema": 1, "hostname": "lab-r1-tray03", "driver_version": "570.148.08", "cuda_version": "12.8",
        "product_name": "NVIDIA GB200", "chassis_serial": "1825024170029", "tray_index": 2, "slot_number": 3,
        "host_id": 1, "cluster_uuid": GPU_DOMAIN, "clique_id": 32766, "fabric_state": "Completed",
        "fabric_status": "Success",
        "gpus": [{"index": i, "uuid": f"GPU-{i:08x}-7c3e-5a1b-9d2f-4e6a8b0c1d2e", "serial": f"165502400012{i // 2}",
                  "pci_bus_id": bus, "module_id": (2, 1, 4, 3)[i], "minor_number": i,
                  "gpu_fabric_guid": f"0x983400ac35e1fa{i:02x}", "memory_total_mib": 189471,
                  "power_limit_w": 1200.0, "temperature_c": 33 + i} for i, bus in enumerate(GPU_BUSES)],
    }
    state.update(top)
    return state


class EmulatedTray:
    """A temp gpus.json/faults.json pair and a way to run the emulator against them (a process: request the
    `processes` fixture)."""

    def __init__(self, tmp: Path, state: dict | None, faults: dict | None = None):
        self.state_path = tmp / "gpus.json"
        self.faults_path = tmp / "faults.json"
        if state is not None:
            self.state_path.write_text(json.dumps(state))
        if faults is not None:
            self.faults_path.write_text(json.dumps(faults))
        self.state = state

    def run(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
        from mctl.lab.emulators import nvidia_smi as emu

        env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LC_ALL": "C",
               emu.STATE_ENV: str(self.state_path), emu.FAULTS_ENV: str(self.faults_path)}
        return subprocess.run([sys.executable, "-I", str(SMI_EMULATOR), *args], env=env, capture_output=True,
                              text=True, timeout=timeout)

    def out(self, *args: str) -> str:
        proc = self.run(*args)
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout


# ------------------------------------------------------------------ the drain policy, sweep after sweep

class PolicySite:
    """Sweeps in a row against a scheduler whose node states follow the decisions (as Slurm's would)."""

    def __init__(self, hosts, settings=None, sizes=None):
        from mctl.health.breaker import BreakerState
        from mctl.model.drain import NodeView
        from mctl.model.settings import HealthSettings

        self.records: dict = {}
        self.breaker = BreakerState()
        self.nodes = {h: NodeView(h, state="IDLE") for h in hosts}
        self.settings = settings if settings is not None else HealthSettings()
        self.sizes = sizes or {"r1": len(hosts)}
        self.now = POLICY_NOW

    def sweep(self, verdicts, *, scheduler_up=True, apply=True, refuse=(), budget=None):
        """One sweep; *refuse*: trays whose drain the scheduler refuses (the site's safety budget did), the
        others are done; *budget*: the safety budget's view the sweep reads (a BudgetView)."""
        from dataclasses import replace

        from mctl.health.policy import decide, resolve, settle
        from mctl.model.drain import DRAIN, ActResult

        self.now += 60
        out = decide(self.records, verdicts, self.nodes if scheduler_up else None, self.settings, self.breaker,
                     self.sizes, now=self.now, budget=budget)
        if apply:
            for d in out.actions:
                if d.action == DRAIN and d.host in refuse:
                    settle(out, ActResult(d, False, "held back by the safety budget: refused", refused=True))
                    continue
                settle(out, ActResult(d, True))
                node = self.nodes[d.host]
                self.nodes[d.host] = replace(node, drained=d.action == DRAIN,
                                             reason=d.reason if d.action == DRAIN else None,
                                             state="IDLE+DRAIN" if d.action == DRAIN else "IDLE")
        resolve(out, self.settings, self.sizes, now=self.now)          # as the drain responder does, once settled
        self.records, self.breaker = out.records, out.breaker
        return out


POLICY_NOW = 1_800_000_000.0        # the clock of a PolicySite's first sweep (60 s more each sweep)


# ------------------------------------------------------------------ a health engine on the example site

EXAMPLE_SITE = REPO / "inventories" / "example-gb200"


class AnsweringPool:
    """Answers every tray at once as unreachable and records the deadline it was given (no network)."""

    def __init__(self, command_timeout: float = 60.0):
        from mctl.transport import SSHConfig

        self.config = SSHConfig(known_hosts=Path("/nonexistent"), command_timeout=command_timeout)
        self.deadlines: list[float | None] = []

    async def run(self, targets, command, *, timeout=None, deadline=None, on_result=None):
        from mctl.transport import HostResult, HostStatus

        self.deadlines.append(deadline)
        return [HostResult(t.name, t.address, HostStatus.UNREACHABLE, error="stand-in", phase="connect")
                for t in targets]


def example_engine(tmp_path, *, interval=None, timeout=None):
    """The health Engine of the example site's rack-a over an AnsweringPool: (engine, pool)."""
    from mctl.health.engine import Engine
    from mctl.health.site_view import resolve_scope, settings_of
    from mctl.inventory import load_site

    site = load_site(EXAMPLE_SITE)
    pool = AnsweringPool()
    engine = Engine(site, resolve_scope(site, "rack-a"), settings_of(site), tmp_path, pool, interval=interval,
                    timeout=timeout)
    return engine, pool


# ------------------------------------------------------------------ SSH servers that stand in for trays

class FakeTray:
    """A tiny SSH server (asyncssh, in-process, on 127.0.0.1: request the `sockets` fixture) whose 'shell'
    understands a few commands; counts connections."""

    def __init__(self, name: str, client_key, site_busy: dict | None = None):
        import asyncssh

        self.name = name
        self.site_busy = site_busy if site_busy is not None else {"now": 0, "peak": 0}
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = client_key
        self.connections = 0
        self.active = 0
        self.peak = 0
        self.server = None
        self.port = 0
        self.conns: list = []

    def public(self):
        from mctl.transport.known_hosts import HostKey

        return HostKey.from_openssh(self.host_key.export_public_key("openssh").decode())

    async def start(self, host_key=None) -> None:
        import asyncssh

        if host_key is not None:
            self.host_key = host_key
        tray = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn):
                tray.connections += 1
                tray.conns.append(conn)

        authorized = asyncssh.import_authorized_keys(self.client_key.export_public_key("openssh").decode())
        self.server = await asyncssh.listen("127.0.0.1", self.port, server_host_keys=[self.host_key],
                                            authorized_client_keys=authorized, process_factory=self._handle,
                                            server_factory=Server)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, process) -> None:
        cmd = process.command or ""
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.site_busy["now"] += 1
        self.site_busy["peak"] = max(self.site_busy["peak"], self.site_busy["now"])
        try:
            if cmd.startswith("echo "):
                process.stdout.write(cmd[5:] + "\n")
                process.exit(0)
            elif cmd == "hostname":
                process.stdout.write(self.name + "\n")
                process.exit(0)
            elif cmd.startswith("fail "):
                process.stderr.write("something broke\n")
                process.exit(int(cmd.split()[1]))
            elif cmd.startswith("sleep "):
                process.stdout.write("started\n")
                await asyncio.sleep(float(cmd.split()[1]))
                process.stdout.write("done\n")
                process.exit(0)
            else:
                process.stderr.write(f"sh: {cmd}: not found\n")
                process.exit(127)
        finally:
            self.active -= 1
            self.site_busy["now"] -= 1


def ssh_config(tmp_path: Path, client_key: Path, **kw):
    """The SSHConfig of a pool for FakeTrays: this test's known_hosts and *client_key*, short deadlines."""
    from mctl.transport import SSHConfig

    base = dict(known_hosts=tmp_path / "known_hosts", identity_file=client_key, user="root",
                connect_timeout=3.0, command_timeout=5.0, retry_wait=0.05)
    base.update(kw)
    return SSHConfig(**base)


def trust_trays(tmp_path: Path, trays: list[FakeTray]) -> None:
    """Every tray's host key in this test's known_hosts."""
    from mctl.transport.known_hosts import KnownHosts

    known = KnownHosts.load(tmp_path / "known_hosts")
    for t in trays:
        known.add(t.name, "127.0.0.1", t.port, t.public())
    known.save()


async def fake_trays(client_key: Path, n: int) -> list[FakeTray]:
    """*n* FakeTrays started, tray01 on, sharing one count of busy sessions."""
    import asyncssh

    key = asyncssh.read_private_key(str(client_key))
    busy = {"now": 0, "peak": 0}
    trays = [FakeTray(f"tray{i:02d}", key, busy) for i in range(1, n + 1)]
    for t in trays:
        await t.start()
    return trays


# ------------------------------------------------------------------ a sweep of the watch, for its outputs

WATCH_HOSTS = ["lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03", "lab-r1-tray04"]


def watch_result(number=3, tripped=False):
    """A SweepResult with one tray of each kind: healthy, drained for XID 79, unreachable, warned."""
    from mctl.health.breaker import BreakerState
    from mctl.health.record import TrayRecord, TrayVerdict
    from mctl.health.sweep import SweepResult
    from mctl.health.store import ActionEntry
    from mctl.model.drain import NodeView
    from mctl.model.findings import Finding, Severity
    from mctl.model.tray import TrayFacts

    hosts = WATCH_HOSTS
    xid = Finding(Severity.CRITICAL, hosts[1], "gpu.xid", "XID 79 on gpu0: GPU has fallen off the bus", None,
                  {"short": "xid 79 gpu0 (fell off bus)"})
    verdicts = [TrayVerdict(hosts[0], "lab-r1", "ok", Severity.OK),
                TrayVerdict(hosts[1], "lab-r1", "ok", Severity.CRITICAL, (xid,)),
                TrayVerdict(hosts[2], "lab-r1", "unreachable", Severity.CRITICAL),
                TrayVerdict(hosts[3], "lab-r1", "ok", Severity.WARN)]
    nodes = {h: NodeView(h, state="IDLE") for h in hosts}
    nodes[hosts[1]] = NodeView(hosts[1], drained=True, reason="mctl: xid 79 gpu0 (fell off bus)", state="IDLE+DRAIN")
    records = {hosts[1]: TrayRecord(hosts[1], "lab-r1", drained=True, reason="mctl: xid 79 gpu0 (fell off bus)"),
               hosts[2]: TrayRecord(hosts[2], "lab-r1", misses=2)}
    logged = [ActionEntry.from_dict({"action": "drain", "tray": hosts[1], "result": "ok",
                                     "reason": "mctl: xid 79 gpu0 (fell off bus)",
                                     "why": "1 of 4 trays of rack lab-r1 drained by mctl within 1h"})]
    return SweepResult(number, time.time(), 0.42, {h: TrayFacts(h, elapsed=0.1) for h in hosts}, [xid],
                       verdicts, nodes, "slurm", remediate=True, logged=logged,
                       breaker=BreakerState(True, time.time(), "draining x would make 2 of 4") if tripped
                       else BreakerState(), records=records)


# ------------------------------------------------------------------ a small Slurm site for partition changes

def site_with(tmp_path: Path, scheduler: str | None = "slurm", parts: list | None = None, trays: int = 4,
              k8s: dict | None = None):
    """A one-rack site (r1, *trays* trays at 10.0.1.x) with *parts* recorded, loaded (*k8s*: scheduler.k8s)."""
    from mctl.inventory import load_site

    rack = {"shape": {"compute_trays": trays, "switch_trays": 0},
            "head": {"name": "r1-head", "address": "10.0.1.100"},
            "compute": {"nodes": f"r1-tray[01-{trays:02d}]", "addresses": f"10.0.1.[1-{trays}]"}}
    if parts:
        rack["partitions"] = parts
    doc = {"plugin": "mctl", "site": "t", "racks": {"r1": rack}}
    if scheduler:
        doc["scheduler"] = {"type": scheduler, **({"k8s": k8s} if k8s else {})}
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_site(tmp_path)


def plan_for(site, after, work=(), nmx=None, **kw):
    """The cross-layer plan of changing rack r1 of *site* to the partitions *after*."""
    from mctl.change.plan import plan_change
    from mctl.model.imex import ImexSettings

    r = site.racks["r1"]
    return plan_change(site, r, after, nmx, settings=ImexSettings(), work=work, **kw)


# ------------------------------------------------------------------ a lab-like Slurm site for the renderers

SLURM_GOLDEN = REPO / "tests" / "fixtures" / "golden" / "slurm"
#: scheduler.slurm settings as the lab's inventory has them (no cgroups in the lab's namespaces)
SLURM_LAB_SETTINGS = {"cgroup_plugin": "disabled", "proctrack_type": "proctrack/linuxproc", "task_plugin": "task/none",
                      "jobacct_gather_type": "jobacct_gather/linux", "gpu_device_nodes": "create",
                      "communication_parameters": "NoCtldInAddrAny"}


def lab_like_site(tmp_path: Path, *, slurm: dict | None = None, partitions=None, trays: int = 4, racks: int = 1):
    """A site shaped like the lab's (racks lab-rN of *trays* trays on 127.77.N.x, Slurm), loaded."""
    from mctl.inventory import load_site

    doc = {"plugin": "mctl", "site": "lab", "racks": {}, "scheduler": {"type": "slurm", "cluster_name": "Lab",
                                                                       "controller": "lab-r1-head"}}
    for r in range(1, racks + 1):
        rack = {"shape": {"compute_trays": trays, "switch_trays": 0},
                "head": {"name": f"lab-r{r}-head", "address": f"127.77.{r}.100"},
                "compute": {"nodes": f"lab-r{r}-tray[01-{trays:02d}]", "addresses": f"127.77.{r}.[1-{trays}]",
                            "vars": {"slurmd_port": f"[{16000 + r * 100 + 1}-{16000 + r * 100 + trays}]"}}}
        if partitions and r == 1:
            rack["partitions"] = partitions
        doc["racks"][f"lab-r{r}"] = rack
    if slurm:
        doc["scheduler"]["slurm"] = slurm
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_site(tmp_path)


# ------------------------------------------------------------------ the example site, for Kubernetes

def k8s_site(tmp_path: Path, **k8s):
    """The example GB200 site with Kubernetes as its scheduler (scheduler.k8s: *k8s*), loaded."""
    from mctl.inventory import load_site

    tmp_path.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load((EXAMPLE_SITE / "mctl.yml").read_text())
    doc["images_dir"] = str(REPO / "images")
    doc["scheduler"] = {"type": "k8s", "k8s": k8s} if k8s else {"type": "k8s"}
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_site(tmp_path)


# ------------------------------------------------------------------ racks and NMX-M nodes for the planner

PLANNER_DOMAIN = "3fbfc98b-7f95-4749-ab11-bd351a2aab3e"


def make_rack(n: int = 18, name: str = "r1", domain: str | None = PLANNER_DOMAIN, vars_: dict | None = None):
    """A Rack model of *n* compute trays (name-trayNN at 10.0.<last letter>.N)."""
    from mctl.model.site import Host, Rack

    compute = tuple(Host(f"{name}-tray{i:02d}", f"10.0.{ord(name[-1])}.{i}", "compute", name,
                         vars=dict(vars_ or {})) for i in range(1, n + 1))
    return Rack(name, "nvl72", n, 9, domain, None, None, compute, (), ())


def make_nodes(rack, *, named: bool = True, domain: str = PLANNER_DOMAIN) -> list:
    """NMX-M's compute nodes of *rack*, one per tray with 4 GPUs (named after the trays unless not *named*)."""
    from mctl.model.fabric import NmxComputeNode

    nodes = []
    for i, host in enumerate(rack.compute):
        gpu_ids = tuple(f"{i:02d}{d:02d}{'a' * 20}" for d in range(4))
        nodes.append(NmxComputeNode(id=f"node-{rack.name}-{i}", name=host.name if named else f"node{i + 1}",
                                    domain_uuid=domain, gpu_ids=gpu_ids, health="HEALTHY", chassis_id=1,
                                    chassis_serial="1825024170029", host_id=1, slot_id=i + 1, tray_index=i))
    return nodes


# ------------------------------------------------------------------ the real samples (tests/fixtures/real)

REAL_SAMPLES = REPO / "tests" / "fixtures" / "real"


def real_text(name: str) -> str:
    return (REAL_SAMPLES / name).read_text(encoding="ascii")


# name -> what it is (the README row says where it comes from)
REAL_IMEX_SAMPLES = {
    "jpsnips-imex-ctl-q-ready.txt": "nvidia-imex-ctl -q, IMEX 570.00 on GH200",
    "jpsnips-imex-ctl-s-t-2000.txt": "nvidia-imex-ctl -s -t 2000 (wait for READY), same daemon",
    "jpsnips-imex-daemon-log-570-node0.txt": "IMEX 570.00 daemon log, node 0 of a 2-node domain",
    "issue-dra-driver-pr1465-imex-580-daemon-log.txt": "IMEX 580.159.04 daemon log start (stderr, host names)",
    "issue-dra-driver-pr298-imex-570-nodes-config-and-log.txt": "nodes_config.cfg and IMEX 570.124.06 log start",
    "issue-dra-driver-pr304-proc-devices-excerpt.txt": "/proc/devices with nvidia-caps-imex-channels (test_imex_job_deploy)",
}
REAL_SLURM_SAMPLES = {
    "slurm-on-aws-scontrol-show-node-down-cloud-powered-down.txt": "scontrol show node (no -o), Slurm 24.11",
    "slurm-on-aws-scontrol-show-node-idle-cloud.txt": "scontrol show node (no -o), Slurm 24.11.7",
    "slurm-on-aws-sinfo-N-down-powered-off.txt": "sinfo -N, the same two nodes powered off",
    "issue-arjuna-users-164-reason-stamp.txt": "a Reason= with Slurm's [slurm@time] stamp",
    "issue-arjuna-users-85-sinfo-state-suffixes.txt": "sinfo node states with $ and * suffixes",
    "crusoe-slurm-scontrol-show-topology-block-gb200.txt": "scontrol show topology, block plugin, 10 x 18 GB200",
    "crusoe-slurm-sinfo-down-not-responding.txt": "sinfo with a down* node",
    "minyang-chen-slurmd-C-slurmnode6.txt": "slurmd -C of a 12-core, 2-thread node, with UpTime=",
}
REAL_SCHED_SAMPLES = {**REAL_IMEX_SAMPLES, **REAL_SLURM_SAMPLES}      # the scheduler-side samples (test_real_formats_sched)
# burn-in's tools (tests/unit/test_burnin.py)
REAL_BURNIN_SAMPLES = {
    "glimmer-dcgm-4.5.2-diag-r2-gb10.json": "dcgmi diag -r 2 -j, DCGM 4.5.2 on GB10 (software Fail: persistence)",
    "glimmer-dcgm-4.2.3-diag-r1-gb10.json": "dcgmi diag -r 1 -j, DCGM 4.2.3 on GB10 (software Fail: persistence)",
    "virtualclient-dcgmi-health-check.json": "dcgmi health -c -j: Overall Health Healthy",
    "issue-coreweave-nccl-tests-pr43-gb200-nvl72-all-reduce.txt": "all_reduce_perf on a GB200 NVL72 rack, 512M-8G",
    "issue-nccl-tests-322-all-reduce-nccl-failure.txt": "all_reduce_perf rows, then Test NCCL failure lines",
}


# ------------------------------------------------------------------ an NMX-M for the shared lab's rack

def lab_nmx(lab, doc: dict, folder: Path, listen: str = "127.77.251.4"):
    """The lab rack's NMX-M in *doc* (the lab's inventory, edited in place): the rack's own when it has one,
    else an NMX-M emulator over the trays' GPU state files, started here (returned: stop() it; else None)."""
    import json

    from mctl.lab.hosts import host_path
    from mctl.lab.nmx_emulator import Config, NMXEmulator

    rack = doc["racks"][lab.rack]
    if "nmx" in rack:
        return None
    trays, state = [], {}
    for name in lab.trays:
        path = host_path(lab.dir, name, "/var/lib/mctl-lab/gpus.json")
        state = json.loads(path.read_text())
        trays.append({"name": name, "tray_index": state["tray_index"], "slot_id": state["slot_number"],
                      "host_id": state["host_id"], "gpus_json": str(path)})
    emulator = NMXEmulator(Config.from_dict({
        "listen": listen, "port": 0, "username": "admin", "password": "lab-secret",
        "domain_uuid": rack["nvlink_domain"], "chassis_serial": state["chassis_serial"],
        "state_file": str(folder / "nmx-state.json"), "operation_delay_s": 0.05, "fabric_delay_s": 0.05,
        "trays": trays})).start()
    cred = folder / "nmx.cred"
    cred.write_text("admin:lab-secret\n")
    cred.chmod(0o600)
    rack["nmx"] = {"url": emulator.url, "credentials_file": str(cred)}
    return emulator
