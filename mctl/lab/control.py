"""Bring a lab up, report on it, inject faults, take it down.

The library side of `mctl lab`: no printing (progress goes to a callback),
errors as MctlError. Truth about what runs comes from /proc (see procs.py);
lab.json only records what was asked for, so status and teardown work even
when a host died or the record is stale.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ClusterShell.NodeSet import NodeSet

from mctl.errors import EnvironmentProblem, UsageError
from mctl.lab import faults as faultlib
from mctl.lab import hosts, image, keys, prereq, procs, services
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import DEFAULT_NET, LabHost, LabLayout, etc_hosts
from mctl.lab.site import IMAGE_NAME, REPO_IMAGES, inventory
from mctl.state.files import atomic_write, write_json

Progress = Callable[[str], None]
RECORD = "lab.json"
INVENTORY = "mctl.yml"
KNOWN_HOSTS = "known_hosts"
KEY = "ssh/id_ed25519"
MARKER_ENV = "MCTL_LAB_DIR"
ADDRESS_LOCK = Path(tempfile.gettempdir()) / "mctl-lab-addresses.lock"


def _quiet(_msg: str) -> None:
    pass


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


@dataclass
class UpResult:
    dir: Path
    inventory: Path
    layout: LabLayout
    seconds: float
    image_dir: Path
    missing_files: list[str] = field(default_factory=list)


def load_record(lab_dir: Path) -> dict | None:
    try:
        return json.loads((Path(lab_dir) / RECORD).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise EnvironmentProblem(f"{Path(lab_dir) / RECORD} is damaged",
                                 hint="run 'mctl lab down' (it finds the lab's processes without it)") from None


def layout_of(record: dict) -> LabLayout:
    return LabLayout(record["name"], record["racks"], record["trays"], record.get("net", DEFAULT_NET))


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
            for p in procs.in_namespace(table, child):
                out[p.pid] = p
    return [p for p in out.values() if p.state != "Z"]


# --- up -----------------------------------------------------------------------------------------

def up(lab_dir: Path, *, racks: int = 1, trays: int = 18, name: str = "lab", net: int = DEFAULT_NET,
       images_dir: Path = REPO_IMAGES, progress: Progress = _quiet, timeout: float = 180.0,
       rack_services: Sequence[services.RackService] | None = None) -> UpResult:
    """Start a lab in *lab_dir*. *rack_services* defaults to the registry (services.RACK_SERVICES)."""
    from mctl.state.lock import file_lock

    started = time.monotonic()
    try:
        layout = LabLayout(name, racks, trays, net)
    except ValueError as exc:
        raise UsageError(f"invalid lab shape: {exc}", hint="e.g. mctl lab up --racks 1 --trays 18") from None
    rack_svcs = list(services.RACK_SERVICES if rack_services is None else rack_services)
    spec = image.load_spec(images_dir / f"{IMAGE_NAME}.yml")
    prereq.require(need_build=not image.is_built(spec))
    files = LabFiles(Path(lab_dir).resolve())
    files.dir.mkdir(parents=True, exist_ok=True)
    with file_lock(files.lock, purpose="mctl lab up", label=f"lab {files.dir}"):
        running = lab_launchers(files.dir)
        if running:
            raise UsageError(f"a lab is already up in {files.dir} ({len(running)} hosts running)",
                             hint=f"see it with 'mctl lab status --dir {files.dir}', "
                                  f"stop it with 'mctl lab down --dir {files.dir}'")
        _remove_lab_files(files)            # leftovers of a lab whose processes are gone
        _check_addresses(layout, rack_svcs)
        image_dir = image.build(spec, progress)
        rootfs = image_dir / "rootfs"
        # Two labs starting at once (an operator's and a test run's) must not both take
        # an address: checking and binding happen under one machine-wide lock.
        with file_lock(ADDRESS_LOCK, purpose=f"mctl lab up {files.dir}", timeout=600, label="lab addresses"):
            _check_addresses(layout, rack_svcs)
            write_json(files.record, {
                "name": name, "racks": racks, "trays": trays, "net": net,
                "image": {"name": spec.name, "key": spec.key, "dir": str(image_dir)},
                "rack_services": [{"name": s.name, "port": s.port} for s in rack_svcs],
                "created_at": time.time(), "state": "starting", "pid": os.getpid()})
            try:
                progress(f"starting {len(layout.hosts())} hosts ({racks} rack(s) x {trays} trays + head)")
                missing = _start_hosts(files, layout, rootfs, rack_svcs)
                _wait_ready(files, layout, timeout)
                _start_rack_services(files, layout, rack_svcs)
                record = load_record(files.dir) or {}
                record["state"] = "up"
                record["up_seconds"] = round(time.monotonic() - started, 2)
                write_json(files.record, record)
            except BaseException:
                progress("start failed; stopping what was started")
                _stop_processes(files.dir)
                raise
    return UpResult(files.dir, files.inventory, layout, time.monotonic() - started, image_dir, missing)


def _check_addresses(layout: LabLayout, rack_svcs: Sequence[services.RackService]) -> None:
    listening = procs.listening_tcp()
    wanted = [(h.address, 22) for h in layout.hosts()]
    wanted += [(layout.service_address(r), s.port) for r in range(1, layout.racks + 1) for s in rack_svcs if s.port]
    busy = [f"{a}:{p}" for a, p in wanted if (a, p) in listening or ("0.0.0.0", p) in listening and p != 22]
    if busy:
        raise UsageError(f"address {busy[0]} is already in use on this machine (another lab?)",
                         hint="stop the other lab, or give this one other addresses with --net N "
                              f"(127.N.R.T; now {layout.net})")


def _start_hosts(files: LabFiles, layout: LabLayout, rootfs: Path,
                 rack_svcs: Sequence[services.RackService]) -> list[str]:
    lab_key = keys.ed25519(f"mctl-lab@{layout.name}")
    atomic_write(files.key, lab_key.private_openssh, mode=0o600)
    atomic_write(files.key.with_suffix(".pub"), lab_key.public_line + "\n")
    hosts_text = etc_hosts(layout)
    known: list[str] = []
    missing: set[str] = set()
    hostinit = hosts.HOSTINIT.read_text()
    for h in layout.hosts():
        paths = files.host(h.name)
        paths.dir.mkdir(parents=True, exist_ok=True)
        host_key = keys.ed25519(f"root@{h.name}")
        known.append(keys.known_hosts_line([h.name, h.address], host_key))
        w = hosts.UpperWriter(rootfs, paths.upper)
        ctx = services.HostContext(layout, h, files.dir)
        _write_host_files(w, ctx, h, hosts_text, lab_key, host_key, hostinit, missing)
    # known_hosts before any host starts: the first connection is already verified.
    atomic_write(files.known_hosts, "\n".join(known) + "\n")
    atomic_write(files.inventory, inventory(layout, identity_file=files.key, known_hosts=files.known_hosts,
                                            images_dir=REPO_IMAGES,
                                            rack_extra=_rack_inventory(files, layout, rack_svcs)))
    for h in layout.hosts():
        hosts.spawn(files.host(h.name), rootfs)
    return sorted(missing)


def _write_host_files(w: hosts.UpperWriter, ctx: services.HostContext, h: LabHost, hosts_text: str,
                      lab_key: keys.KeyPair, host_key: keys.KeyPair, hostinit: str, missing: set[str]) -> None:
    w.put("/etc/hostname", h.name + "\n")
    w.put("/etc/hosts", hosts_text)
    w.put("/etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    w.put("/etc/ssh/ssh_host_ed25519_key", host_key.private_openssh, 0o600)
    w.put("/etc/ssh/ssh_host_ed25519_key.pub", host_key.public_line + "\n")
    w.put(hosts.SSHD_DROPIN, hosts.sshd_config(h.address))
    w.mkdir("/root/.ssh", 0o700)
    w.put("/root/.ssh/authorized_keys", lab_key.public_line + "\n", 0o600)
    w.put(hosts.INIT_IN_HOST, hostinit, 0o755)
    w.put(hosts.HANG_IN_HOST, hosts.HANG_SCRIPT, 0o755)
    w.mkdir("/var/log/mctl-lab")
    svc = [{"name": s.name, "argv": s.argv(ctx), "dirs": list(s.dirs), "restart": s.restart,
            "log": f"/var/log/mctl-lab/{s.name}.log"} for s in services.host_services(h.kind)]
    w.put(hosts.SERVICES_FILE, json.dumps({"services": svc}, indent=2) + "\n")
    if h.kind == "tray":
        w.put(hosts.GPUS_FILE, json.dumps(gpu_state(ctx.layout, h), indent=2) + "\n")
        w.put(hosts.KERN_LOG, "", 0o640)
        os.chown(w.upper / hosts.KERN_LOG.lstrip("/"), 0, 4)       # root:adm, as rsyslog makes it
    for f in services.host_files(h.kind):
        data = f.content(ctx)
        if data is None:
            missing.add(f.dest)
            continue
        w.put(f.dest, data, f.mode)


def _wait_ready(files: LabFiles, layout: LabLayout, timeout: float) -> None:
    """Until every host's listening services accept connections; fail fast on a dead host."""
    want: dict[str, list[tuple[str, int]]] = {}
    for h in layout.hosts():
        want[h.name] = [(h.address, s.port) for s in services.host_services(h.kind) if s.port]
    deadline = time.monotonic() + timeout
    pending = set(want)
    next_dead_check = time.monotonic() + 2
    while pending:
        listening = procs.listening_sockets()
        maybe = {n for n in pending if all(w in listening for w in want[n])}
        if maybe:
            table = procs.scan()
            pending -= {n for n in maybe if _owns_sockets(files.host(n), table, {listening[w] for w in want[n]})}
        if not pending:
            return
        now = time.monotonic()
        if now >= next_dead_check:
            table = procs.scan()
            dead = [n for n in sorted(pending)
                    if files.host(n).pidfile.exists() and hosts.init_proc(files.host(n), table) is None]
            if dead:
                raise EnvironmentProblem(f"lab host {dead[0]} stopped while starting"
                                         + (f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""),
                                         hint=_console_hint(files, dead[0]))
            next_dead_check = now + 2
        if now >= deadline:
            first = sorted(pending)[0]
            raise EnvironmentProblem(f"{len(pending)} lab host(s) did not start within {timeout:.0f} s "
                                     f"(first: {first})", hint=_console_hint(files, first))
        time.sleep(0.1)


def _owns_sockets(paths: hosts.HostPaths, table: dict[int, procs.Proc], inodes: set[int]) -> bool:
    """Whether the listening sockets are this host's own (and not another lab's on the same address)."""
    init = hosts.init_proc(paths, table)
    if init is None:
        return False
    held: set[int] = set()
    for p in procs.in_namespace(table, init):
        held |= procs.socket_inodes(p.pid)
    return inodes <= held


def _console_hint(files: LabFiles, name: str) -> str:
    try:
        tail = files.host(name).console.read_text().strip().splitlines()[-3:]
    except OSError:
        tail = []
    return f"its console log {files.host(name).console} ends: {' | '.join(tail)}" if tail else \
        f"see {files.host(name).console}"


def _rack_context(files: LabFiles, layout: LabLayout, rack: str) -> services.RackContext:
    r = layout.rack_names().index(rack) + 1
    return services.RackContext(layout, rack, r, layout.service_address(r), files.dir, files.rack_dir(rack))


def _rack_inventory(files: LabFiles, layout: LabLayout,
                    rack_svcs: Sequence[services.RackService]) -> dict[str, dict]:
    extra: dict[str, dict] = {}
    for rack in layout.rack_names():
        ctx = _rack_context(files, layout, rack)
        for svc in rack_svcs:
            if svc.inventory is not None:
                extra.setdefault(rack, {}).update(svc.inventory(ctx))
    return extra


def _start_rack_services(files: LabFiles, layout: LabLayout, rack_svcs: Sequence[services.RackService]) -> None:
    import subprocess

    wanted: list[tuple[str, int]] = []
    for rack in layout.rack_names():
        ctx = _rack_context(files, layout, rack)
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        for svc in rack_svcs:
            if svc.prepare is not None:
                svc.prepare(ctx)
            with open(ctx.log_dir / f"{svc.name}.log", "ab") as log:
                proc = subprocess.Popen(
                    ["setsid", "-f", "unshare", "--pid", "--fork", "--kill-child", "--",
                     "env", f"{MARKER_ENV}={files.dir}", f"MCTL_LAB_SERVICE={rack}/{svc.name}", *svc.argv(ctx)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True)
            proc.wait()
            if svc.port:
                wanted.append((ctx.address, svc.port))
    deadline = time.monotonic() + 30
    while wanted and time.monotonic() < deadline:
        listening = procs.listening_tcp()
        wanted = [w for w in wanted if w not in listening]
        time.sleep(0.1)
    if wanted:
        raise EnvironmentProblem(f"lab rack service on {wanted[0][0]}:{wanted[0][1]} did not start",
                                 hint=f"see the logs under {files.dir / 'racks'}")


# --- down ---------------------------------------------------------------------------------------

@dataclass
class DownResult:
    dir: Path
    stopped: int            # processes that were running
    removed: bool           # lab files were there and are gone
    seconds: float


def down(lab_dir: Path, progress: Progress = _quiet) -> DownResult:
    from mctl.state.lock import file_lock

    started = time.monotonic()
    files = LabFiles(Path(lab_dir).resolve())
    if not files.dir.is_dir():
        return DownResult(files.dir, 0, False, 0.0)
    with file_lock(files.lock, purpose="mctl lab down", label=f"lab {files.dir}"):
        count = _stop_processes(files.dir, progress)
        left = procs.mounts_mentioning(str(files.dir))
        if left:
            raise EnvironmentProblem(f"{len(left)} mount(s) of the lab are still present, e.g. {left[0]}",
                                     hint="a process outside the lab holds them; find it with "
                                          f"grep -l {files.dir} /proc/*/mountinfo")
        removed = _remove_lab_files(files)
    try:
        files.lock.unlink()
        files.dir.rmdir()
    except OSError:
        pass
    return DownResult(files.dir, count, removed, time.monotonic() - started)


def _stop_processes(lab_dir: Path, progress: Progress = _quiet) -> int:
    """Stop every host and rack service: end each namespace's init, and with it the namespace."""
    table = procs.scan()
    everything = lab_processes(lab_dir, table)
    if not everything:
        return 0
    launchers = lab_launchers(lab_dir, table)
    inits = [c for launcher in launchers for c in procs.children(table, launcher.pid)]
    progress(f"stopping {len(launchers)} lab hosts/services ({len(everything)} processes)")
    for p in inits:
        _signal(p.pid, signal.SIGTERM)
        _signal(p.pid, signal.SIGCONT)
    if not _wait_gone(lab_dir, 8.0):
        for p in lab_processes(lab_dir):
            _signal(p.pid, signal.SIGKILL)
        if not _wait_gone(lab_dir, 5.0):
            left = lab_processes(lab_dir)
            raise EnvironmentProblem(f"{len(left)} lab process(es) did not stop (e.g. pid {left[0].pid} {left[0].comm})",
                                     hint="a process in uninterruptible sleep; retry 'mctl lab down' shortly")
    return len(everything)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(lab_dir: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not lab_processes(lab_dir):
            return True
        time.sleep(0.05)
    return not lab_processes(lab_dir)


def _remove_lab_files(files: LabFiles) -> bool:
    import shutil

    removed = False
    for p in (files.dir / "hosts", files.dir / "racks", files.dir / "ssh"):
        if p.exists():
            shutil.rmtree(p)
            removed = True
    for p in (files.inventory, files.known_hosts, files.record):
        if p.exists():
            p.unlink()
            removed = True
    return removed


# --- status -------------------------------------------------------------------------------------

def status(lab_dir: Path) -> dict:
    files = LabFiles(Path(lab_dir).resolve())
    record = load_record(files.dir)
    table = procs.scan()
    stray = lab_processes(files.dir, table)
    if record is None:
        return {"dir": str(files.dir), "up": bool(stray), "configured": False, "hosts": [], "rack_services": [],
                "stray_processes": [p.pid for p in stray]}
    layout = layout_of(record)
    listening = procs.listening_tcp()
    rows = []
    for h in layout.hosts():
        rows.append(_host_status(files, layout, h, table, listening))
    racks = []
    for rack in layout.rack_names():
        ctx = _rack_context(files, layout, rack)
        for svc in record.get("rack_services", []):
            racks.append(_rack_service_status(files, ctx, svc["name"], svc.get("port"), table, listening))
    running = sum(1 for r in rows if r["running"])
    total_rss = sum(p.rss_kb for p in stray)
    return {
        "dir": str(files.dir), "configured": True, "up": running > 0, "name": record["name"],
        "racks": record["racks"], "trays": record["trays"], "net": layout.net, "state": record.get("state"),
        "inventory": str(files.inventory), "known_hosts": str(files.known_hosts), "identity_file": str(files.key),
        "image": dict(record.get("image") or {},
                      packages=(image.read_manifest(Path((record.get("image") or {}).get("dir", "/nonexistent")))
                                or {}).get("packages", {})),
        "hosts_running": running, "hosts_total": len(rows),
        "processes": len(stray), "rss_kib": total_rss, "hosts": rows, "rack_services": racks,
    }


def _host_status(files: LabFiles, layout: LabLayout, h: LabHost, table: dict[int, procs.Proc],
                 listening: set) -> dict:
    paths = files.host(h.name)
    init = hosts.init_proc(paths, table)
    row: dict = {"name": h.name, "kind": h.kind, "rack": h.rack, "address": h.address, "running": init is not None,
                 "init_pid": init.pid if init else None, "processes": [], "services": [], "faults": [],
                 "ssh": "down"}
    if init is None:
        return row
    members = procs.in_namespace(table, init)
    row["processes"] = [{"pid": p.pid, "comm": p.comm, "state": p.state} for p in members]
    row["rss_kib"] = sum(p.rss_kb for p in members)
    ctx = services.HostContext(layout, h, files.dir)
    for svc in services.host_services(h.kind):
        comm = Path(svc.argv(ctx)[0]).name[:15]     # the kernel's name; daemons rewrite their argv
        svc_proc = next((p for p in procs.children(table, init.pid) if p.comm == comm), None)
        row["services"].append({
            "name": svc.name, "pid": svc_proc.pid if svc_proc else None,
            "state": ("stopped" if svc_proc.state == "T" else "running") if svc_proc else "down",
            "listening": (h.address, svc.port) in listening if svc.port else None,
        })
    try:
        fdoc = json.loads(Path(f"/proc/{init.pid}/root{hosts.FAULTS_FILE}").read_text())
    except (OSError, ValueError):
        fdoc = {}
    row["faults"] = faultlib.active(fdoc)
    sshd = next((s for s in row["services"] if s["name"] == "sshd"), None)
    hang = Path(f"/proc/{init.pid}/root{hosts.SSHD_FAULT_DROPIN}").exists()
    if sshd is None or sshd["state"] == "down" or not sshd["listening"]:
        row["ssh"] = "down"
    elif sshd["state"] == "stopped":
        row["ssh"] = "not answering"
    elif hang:
        row["ssh"] = "commands hang"
    else:
        row["ssh"] = "ok"
    return row


def _rack_service_status(files: LabFiles, ctx: services.RackContext, name: str, port: int | None,
                         table: dict[int, procs.Proc], listening: set) -> dict:
    marker = f"MCTL_LAB_SERVICE={ctx.rack}/{name}"
    launcher = next((p for p in lab_launchers(files.dir, table) if marker in p.cmdline), None)
    kids = procs.children(table, launcher.pid) if launcher else []
    members = procs.in_namespace(table, kids[0]) if kids else []
    out = {"rack": ctx.rack, "name": name, "address": ctx.address, "port": port,
           "pid": kids[0].pid if kids else None, "running": bool(kids), "processes": len(members),
           "listening": (ctx.address, port) in listening if port else None}
    if name == "nmx":                   # `mctl lab fault RACK --nmx ...` (mctl/lab/nmx_faults.py)
        from mctl.lab import nmx_faults

        out["faults"] = nmx_faults.current(files.dir, ctx.rack)
    return out


# --- fault --------------------------------------------------------------------------------------

@dataclass
class FaultResult:
    host: str
    before: list[str]
    after: list[str]
    actions: list[str]
    applied: bool


def fault(lab_dir: Path, host_name: str, req: faultlib.FaultRequest, *, dry_run: bool = False,
          now: float | None = None) -> FaultResult:
    files = LabFiles(Path(lab_dir).resolve())
    record = load_record(files.dir)
    if record is None:
        raise UsageError(f"no lab in {files.dir}", hint=f"start one with 'mctl lab up --dir {files.dir}'")
    layout = layout_of(record)
    host = layout.host(host_name)
    trays = [h.name for h in layout.hosts() if h.kind == "tray"]
    heads = [h.name for h in layout.hosts() if h.kind == "head"]
    if host is None:
        raise UsageError(f"unknown lab tray {host_name!r}",
                         hint=f"trays: {NodeSet.fromlist(trays)}; head nodes: {NodeSet.fromlist(heads)}")
    faultlib.validate(req)
    gpu_fault = any(v is not None for v in (req.xid, req.fabric, req.gpu_missing, req.nvlink_down,
                                            req.ecc_uncorrectable)) or faultlib._emulator_given(req)
    if host.kind != "tray" and gpu_fault:
        raise UsageError(f"{host_name} has no GPUs; GPU faults apply to compute trays",
                         hint=f"trays: {NodeSet.fromlist(trays)}")
    faults_path = hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE)
    try:
        current = faultlib.normalize(json.loads(faults_path.read_text()))
    except (FileNotFoundError, ValueError):
        current = faultlib.empty()
    new = faultlib.apply(current, req, now if now is not None else time.time())
    actions = _fault_actions(host, current, new, req)
    result = FaultResult(host.name, faultlib.active(current), faultlib.active(new), actions, not dry_run)
    if dry_run:
        return result
    faults_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(faults_path, new)
    if req.xid is not None:
        _append_xid(files, host, req.gpu or 0, req.xid, new["xid"][-1]["time"], new["xid"][-1])
    _emulator_kernel_log(files, host, req, new)
    if new["unreachable"] != current["unreachable"] or req.clear:
        _sshd_signal(files, host, signal.SIGSTOP if new["unreachable"] else signal.SIGCONT)
    if new["hang"] != current["hang"] or req.clear:
        _set_hang(files, host, new["hang"])
    return result


def _fault_actions(host: LabHost, current: dict, new: dict, req: faultlib.FaultRequest) -> list[str]:
    acts = [f"write {hosts.FAULTS_FILE} on {host.name}: {', '.join(faultlib.active(new)) or 'no faults'}"]
    if req.xid is not None:
        acts.append(f"append an XID {req.xid} line for GPU {req.gpu} to {hosts.KERN_LOG}")
    if req.fell_off_bus:
        acts.append(f"append the fallen-off-the-bus lines (no Xid) for GPU {req.gpu} to {hosts.KERN_LOG}")
    if req.xid_storm is not None:
        from mctl.lab.emulators.nvidia_smi import STORM_BURST, STORM_RATE

        acts.append(f"append {STORM_BURST} XID {req.xid_storm} lines for GPU {req.gpu} to {hosts.KERN_LOG}, "
                    f"then {STORM_RATE} a second (written by each nvidia-smi call) until --clear")
    if new["unreachable"] and not current["unreachable"]:
        acts.append("freeze sshd (SIGSTOP): connections open but no SSH banner ever comes")
    if current["unreachable"] and not new["unreachable"]:
        acts.append("resume sshd (SIGCONT)")
    if new["hang"] and not current["hang"]:
        acts.append(f"reload sshd with ForceCommand {hosts.HANG_IN_HOST}: logins work, commands never return")
    if current["hang"] and not new["hang"]:
        acts.append("reload sshd without the ForceCommand and end hung sessions")
    return acts


def _append_xid(files: LabFiles, host: LabHost, gpu: int, code: int, when: float, record: dict | None = None) -> None:
    from mctl.lab.emulators.nvidia_smi import event_line

    state = json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())
    pci = next(g["pci_bus_id"] for g in state["gpus"] if g["index"] == gpu)
    record = record or {}
    line = event_line(host.name, pci, code, when, nonfatal=bool(record.get("nonfatal")),
                      recovery=record.get("recovery") or "drain-reset")
    with open(hosts.host_path(files.dir, host.name, hosts.KERN_LOG), "a") as fh:
        fh.write(line + "\n")


def _emulator_kernel_log(files: LabFiles, host: LabHost, req: faultlib.FaultRequest, new: dict) -> None:
    """Kernel-log lines of the GPU-emulator faults: fallen off the bus (no Xid), an XID storm's first burst."""
    if not (req.fell_off_bus or req.xid_storm is not None):
        return
    from mctl.lab.emulators import nvidia_smi as emu

    state = json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())
    pci = next(g["pci_bus_id"] for g in state["gpus"] if g["index"] == req.gpu)
    now = time.time()
    lines: list[str] = []
    if req.fell_off_bus:
        lines += emu.fell_off_bus_lines(host.name, pci, when=now)
    if req.xid_storm is not None:
        storm = next(s for s in new["xid_storm"] if (s["gpu"], s["code"]) == (req.gpu, req.xid_storm))
        lines += emu.storm_lines(state, storm, emu.STORM_BURST, now - emu.STORM_BURST / emu.STORM_RATE, now)
    with open(hosts.host_path(files.dir, host.name, hosts.KERN_LOG), "a") as fh:
        fh.write("\n".join(lines) + "\n")


def _host_members(files: LabFiles, host: LabHost) -> tuple[procs.Proc, list[procs.Proc]]:
    table = procs.scan()
    init = hosts.init_proc(files.host(host.name), table)
    if init is None:
        raise EnvironmentProblem(f"lab host {host.name} is not running", hint="see 'mctl lab status'")
    return init, procs.in_namespace(table, init)


def _sshd_signal(files: LabFiles, host: LabHost, sig: int) -> None:
    """Every sshd process of the host: the listener and open sessions (a frozen host answers nothing)."""
    _init, members = _host_members(files, host)
    for p in members:
        if p.comm.startswith("sshd"):
            _signal(p.pid, sig)


def _set_hang(files: LabFiles, host: LabHost, on: bool) -> None:
    dropin = hosts.host_path(files.dir, host.name, hosts.SSHD_FAULT_DROPIN)
    if on:
        atomic_write(dropin, "# mctl lab fault --hang (cleared by --clear)\n"
                             f"ForceCommand {hosts.HANG_IN_HOST}\n")
    else:
        try:
            dropin.unlink()
        except FileNotFoundError:
            pass
    init, members = _host_members(files, host)
    where = (host.address, 22)
    before = procs.listening_sockets().get(where)
    frozen = False
    for p in members:
        if p.ppid == init.pid and p.comm == "sshd":
            _signal(p.pid, signal.SIGHUP)       # sshd re-execs itself and re-reads its configuration
            frozen = p.state == "T"             # --unreachable: it reloads once continued
        if not on and hosts.HANG_IN_HOST in p.cmdline:
            _signal(p.pid, signal.SIGKILL)
    if frozen:
        return
    # The re-exec closes the listening socket and opens a new one; return once the new one is there.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = procs.listening_sockets().get(where)
        if now is not None and now != before:
            return
        time.sleep(0.02)
    raise EnvironmentProblem(f"sshd on {host.name} did not come back after reloading its configuration",
                             hint=f"see /var/log/mctl-lab/sshd.log on the host ({files.host(host.name).dir})")


# --- ssh ----------------------------------------------------------------------------------------

def ssh_argv(lab_dir: Path, host_name: str, command: list[str], *, tty: bool) -> list[str]:
    files = LabFiles(Path(lab_dir).resolve())
    record = load_record(files.dir)
    if record is None:
        raise UsageError(f"no lab in {files.dir}", hint=f"start one with 'mctl lab up --dir {files.dir}'")
    layout = layout_of(record)
    host = layout.host(host_name)
    if host is None:
        names = [h.name for h in layout.hosts()]
        raise UsageError(f"unknown lab host {host_name!r}", hint=f"hosts: {NodeSet.fromlist(names)}")
    argv = ["ssh", "-F", "none", "-i", str(files.key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={files.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR", "-o", f"HostKeyAlias={host.name}"]
    argv.append("-t" if tty else "-T")
    argv.append(f"root@{host.address}")
    return argv + list(command)
