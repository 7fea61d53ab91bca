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
from mctl.lab import bmcs, hosts, image, keys, prereq, procs, services
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
    return LabLayout(record["name"], record["racks"], record["trays"], record.get("net", DEFAULT_NET),
                     int(record.get("switch_trays") or 0))


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


# --- up -----------------------------------------------------------------------------------------

def up(lab_dir: Path, *, racks: int = 1, trays: int = 18, name: str = "lab", net: int = DEFAULT_NET,
       images_dir: Path = REPO_IMAGES, progress: Progress = _quiet, timeout: float = 180.0,
       rack_services: Sequence[services.RackService] | None = None, os_only: bool = False,
       switch_trays: int = 0) -> UpResult:
    """Start a lab in *lab_dir*. *rack_services* defaults to the registry (services.RACK_SERVICES).

    *os_only*: the trays start with the OS image only; the files of the lab's packages (the GPU
    tools, mctl/lab/aptrepo.py) come only with provisioning, through apt, as on a fresh real tray.
    *switch_trays*: NVLink switch trays per rack, each a BMC only (no host: mctl never logs in to NVOS).
    """
    from mctl.state.lock import file_lock

    started = time.monotonic()
    try:
        layout = LabLayout(name, racks, trays, net, switch_trays)
    except ValueError as exc:
        raise UsageError(f"invalid lab shape: {exc}", hint="e.g. mctl lab up --racks 1 --trays 18") from None
    rack_svcs = list(services.RACK_SERVICES if rack_services is None else rack_services)
    spec = image.load_spec(images_dir / f"{IMAGE_NAME}.yml")
    prereq.require(need_build=not image.is_built(spec))
    bmcs.require_emulator()
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
                "name": name, "racks": racks, "trays": trays, "net": net, "switch_trays": switch_trays,
                "image": {"name": spec.name, "key": spec.key, "dir": str(image_dir)},
                "rack_services": [{"name": s.name, "port": s.port} for s in rack_svcs], "os_only": os_only,
                "created_at": time.time(), "state": "starting", "pid": os.getpid()})
            try:
                progress(f"starting {len(layout.hosts())} hosts ({racks} rack(s) x {trays} trays + head)")
                missing = _start_hosts(files, layout, rootfs, rack_svcs, os_only=os_only)
                _wait_ready(files, layout, timeout)
                _start_rack_services(files, layout, rack_svcs)
                progress(f"starting {len(bmcs.bmc_units(layout))} tray BMCs (Redfish, sushy-tools)")
                bmcs.start(files.dir, layout, MARKER_ENV)
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
    wanted += [(u["address"], bmcs.PORT) for u in bmcs.bmc_units(layout)]
    busy = [f"{a}:{p}" for a, p in wanted if (a, p) in listening or ("0.0.0.0", p) in listening and p != 22]
    if busy:
        raise UsageError(f"address {busy[0]} is already in use on this machine (another lab?)",
                         hint="stop the other lab, or give this one other addresses with --net N "
                              f"(127.N.R.T; now {layout.net})")


def set_switch_trays(lab_dir: Path, count: int, *, timeout: float = 60.0) -> LabLayout:
    """Give a lab that is up *count* switch trays per rack (0: none), as `lab up --switch-trays` would have:
    the switch tray BMCs are stopped and the new ones started, the record and the inventory's racks
    (shape, `switches`) say so. The compute trays and their BMCs are left alone."""
    from mctl.lab.site import set_switch_trays as inventory_with
    from mctl.state.lock import file_lock

    files = LabFiles(Path(lab_dir).resolve())
    with file_lock(files.lock, purpose="mctl lab switch trays", label=f"lab {files.dir}"):
        record = load_record(files.dir)
        if record is None or not lab_launchers(files.dir):
            raise UsageError(f"no lab is up in {files.dir}", hint=f"start one with 'mctl lab up --dir {files.dir}'")
        try:
            layout = LabLayout(record["name"], record["racks"], record["trays"], record.get("net", DEFAULT_NET), count)
        except ValueError as exc:
            raise UsageError(f"invalid lab shape: {exc}") from None
        _stop_switch_bmcs(files, layout_of(record))
        for sw in layout_of(record).switches():
            _rmtree(bmcs.tray_bmc_dir(files.dir, sw.name).parent)
        with file_lock(ADDRESS_LOCK, purpose=f"mctl lab switch trays {files.dir}", timeout=600, label="lab addresses"):
            listening = procs.listening_tcp()
            busy = [u["address"] for u in bmcs.bmc_units(layout) if u["kind"] == "switch"
                    and (u["address"], bmcs.PORT) in listening]
            if busy:
                raise UsageError(f"address {busy[0]}:{bmcs.PORT} is already in use on this machine")
            bmcs.prepare_switches(files.dir, layout)
            record["switch_trays"] = count
            write_json(files.record, record)
            atomic_write(files.inventory, inventory_with(files.inventory.read_text(), layout))
            bmcs.start(files.dir, layout, MARKER_ENV, timeout=timeout, kinds=("switch",))
    return layout


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _stop_switch_bmcs(files: LabFiles, layout: LabLayout) -> None:
    """End the BMC emulators of *layout*'s switch trays (their launchers name the switch's bmc.json)."""
    configs = {str(bmcs.tray_bmc_dir(files.dir, sw.name) / "bmc.json") for sw in layout.switches()}
    if not configs:
        return
    table = procs.scan()
    mine = [p for p in lab_launchers(files.dir, table) if configs & set(p.cmdline)]
    for launcher in mine:
        for child in procs.children(table, launcher.pid):
            _signal(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        table = procs.scan()
        if not [p for p in lab_launchers(files.dir, table) if configs & set(p.cmdline)]:
            return
        time.sleep(0.1)
    table = procs.scan()
    for launcher in [p for p in lab_launchers(files.dir, table) if configs & set(p.cmdline)]:
        for p in procs.descendants(table, launcher):
            _signal(p.pid, signal.SIGKILL)


def _start_hosts(files: LabFiles, layout: LabLayout, rootfs: Path,
                 rack_svcs: Sequence[services.RackService], os_only: bool = False) -> list[str]:
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
        _write_host_files(w, ctx, h, hosts_text, lab_key, host_key, hostinit, missing, os_only=os_only)
    # known_hosts before any host starts: the first connection is already verified.
    atomic_write(files.known_hosts, "\n".join(known) + "\n")
    bmcs.prepare(files.dir, layout)
    atomic_write(files.inventory, inventory(layout, identity_file=files.key, known_hosts=files.known_hosts,
                                            images_dir=REPO_IMAGES,
                                            rack_extra=_rack_inventory(files, layout, rack_svcs),
                                            bmc=bmcs.inventory_section(files.dir)))
    for h in layout.hosts():
        hosts.spawn(files.host(h.name), rootfs, char_devices=hosts.TRAY_CHAR_DEVICES if h.kind == "tray" else ())
    return sorted(missing)


def _write_host_files(w: hosts.UpperWriter, ctx: services.HostContext, h: LabHost, hosts_text: str,
                      lab_key: keys.KeyPair, host_key: keys.KeyPair, hostinit: str, missing: set[str],
                      os_only: bool = False) -> None:
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
    w.put(hosts.SYSTEMCTL_IN_HOST, hosts.LAB_SYSTEMCTL, 0o755)
    w.mkdir("/var/log/mctl-lab")
    svc = [{"name": s.name, "argv": s.argv(ctx), "dirs": list(s.dirs), "restart": s.restart,
            "log": f"/var/log/mctl-lab/{s.name}.log"} for s in services.host_services(h.kind)]
    w.put(hosts.SERVICES_FILE, json.dumps({"services": svc}, indent=2) + "\n")
    if h.kind == "tray":
        w.put(hosts.GPUS_FILE, json.dumps(gpu_state(ctx.layout, h), indent=2) + "\n")
        w.put(hosts.KERN_LOG, "", 0o640)
        os.chown(w.upper / hosts.KERN_LOG.lstrip("/"), 0, 4)       # root:adm, as rsyslog makes it
    for f in services.host_files(h.kind):
        if os_only and f.package:
            continue                    # comes with provisioning, through the lab's apt repository
        data = f.content(ctx)
        if data is None:
            missing.add(f.dest)
            continue
        w.put(f.dest, data, f.mode)


def _wait_ready(files: LabFiles, layout: LabLayout, timeout: float, only: Sequence[str] | None = None) -> None:
    """Until every host's listening services accept connections; fail fast on a dead host."""
    want: dict[str, list[tuple[str, int]]] = {}
    for h in layout.hosts():
        if only is not None and h.name not in only:
            continue
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
                more = dict(svc.inventory(ctx))
                mine = extra.setdefault(rack, {})
                mine.setdefault("compute_vars", {}).update(more.pop("compute_vars", {}))   # several services' vars
                mine.update(more)
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
    for p in (files.dir / "hosts", files.dir / "racks", files.dir / "ssh", files.dir / "aptrepo", files.dir / "bmc"):
        if p.exists():
            shutil.rmtree(p)
            removed = True
    for p in (files.inventory, files.known_hosts, files.record, files.dir / "aptrepo-signing.key"):
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
        "switch_trays": [{"name": sw.name, "bmc": layout.switch_bmc_address(sw),
                          "bmc_listening": (layout.switch_bmc_address(sw), bmcs.PORT) in listening}
                         for sw in layout.switches()],
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
    if h.kind == "tray":                            # the tray's BMC faults (mctl/lab/bmc_faults.py)
        from mctl.lab import bmc_faults
        row["faults"] += bmc_faults.describe(bmc_faults.read(bmc_faults.faults_path(files.dir, h.name)))
    sshd = next((s for s in row["services"] if s["name"] == "sshd"), None)
    hang = Path(f"/proc/{init.pid}/root{hosts.SSHD_FAULT_DROPIN}").exists() or fdoc.get("hang") is True
    if sshd is None or sshd["state"] == "down" or not sshd["listening"]:
        row["ssh"] = "down"
    elif sshd["state"] == "stopped":
        row["ssh"] = "not answering"
    elif hang:
        row["ssh"] = "commands hang"
    elif isinstance(fdoc.get("slow"), (int, float)):
        row["ssh"] = f"commands slow ({fdoc['slow']:g}s)"
    else:
        row["ssh"] = "ok"
    row["boot_id"] = _read_boot_id(files, h.name)
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
    _check_host_fault_kind(host, req, trays, heads)
    faults_path = hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE)
    try:
        current = faultlib.normalize(json.loads(faults_path.read_text()))
    except (FileNotFoundError, ValueError):
        current = faultlib.empty()
    new = faultlib.apply(current, req, now if now is not None else time.time())
    if req.reboot:
        new = faultlib.without_host_faults(new)
    actions = _fault_actions(host, current, new, req)
    result = FaultResult(host.name, faultlib.active(current), faultlib.active(new), actions, not dry_run)
    if req.clear and host.kind == "tray":           # the tray's BMC faults too (mctl/lab/bmc_faults.py)
        from mctl.lab import bmc_faults
        bres = bmc_faults.apply(files.dir, host.name, clear=True, dry_run=dry_run)
        result.actions.extend(bres.actions)
    if dry_run:
        return result
    if req.reboot:
        _reboot(files, layout, record, host, current, req.down_for)
        return result
    if req.sshd_restart:
        _sshd_restart(files, host)
        return result
    faults_path.parent.mkdir(parents=True, exist_ok=True)
    if _sshrc_text(new) is not None:
        _check_sshrc_free(files, host)          # before faults.json says so
    restart = _daemons_running(files, host, current, new)
    for key, was_running in restart.items():
        new[key] = {"restart": was_running}
    write_json(faults_path, new)
    if req.xid is not None:
        _append_xid(files, host, req.gpu or 0, req.xid, new["xid"][-1]["time"], new["xid"][-1])
    _emulator_kernel_log(files, host, req, new)
    if (current["unreachable"] and not new["unreachable"]) or req.clear:
        _freeze(files, host, False)
    if new["hang"] != current["hang"] or new.get("slow") != current.get("slow") or req.clear:
        _set_hang(files, host, new)
    problems = _daemon_faults(files, host, current, new, req.clear)
    if new["unreachable"] and not current["unreachable"]:
        _freeze(files, host, True)
    if problems:
        raise EnvironmentProblem(f"{host.name}: {'; '.join(problems)}",
                                 hint=f"the fault is cleared; see {files.host(host.name).dir / FAULT_EXEC_LOG}")
    return result


def _fault_actions(host: LabHost, current: dict, new: dict, req: faultlib.FaultRequest) -> list[str]:
    if req.events():
        return _host_fault_actions(host, current, new, req)
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
        acts.append("freeze every process of the host (SIGSTOP): open and new connections get no answer, no reset")
    if current["unreachable"] and not new["unreachable"]:
        acts.append("resume the processes the freeze stopped (SIGCONT)")
    if new["hang"] and not current["hang"]:
        acts.append(f"install {SSHRC} ({hosts.HANG_IN_HOST}): logins work, every command on any connection, "
                    "open or new, never starts")
    if current["hang"] and not new["hang"]:
        acts.append(f"remove {SSHRC} and end the waits of hung sessions (their commands then run)")
    acts += _host_fault_actions(host, current, new, req)
    return acts


def _append_xid(files: LabFiles, host: LabHost, gpu: int, code: int, when: float, record: dict | None = None) -> None:
    from mctl.lab.emulators.nvidia_smi import event_line

    state = json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())
    pci = next(g["pci_bus_id"] for g in state["gpus"] if g["index"] == gpu)
    record = record or {}
    line = event_line(host.name, pci, code, when, uptime=hosts.host_uptime(files.dir, host.name, when),
                      nonfatal=bool(record.get("nonfatal")), recovery=record.get("recovery") or "drain-reset")
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
        lines += emu.fell_off_bus_lines(host.name, pci, when=now, uptime=hosts.host_uptime(files.dir, host.name, now))
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


def _set_hang(files: LabFiles, host: LabHost, doc: dict) -> None:
    """--hang and --slow: sshd runs /etc/ssh/sshrc before every session's command (sshd(8), SSHRC).

    sshd-session checks for the file each time a channel starts a command, so the fault reaches
    connections that were open before it as well as new ones; logins and channel opens still work.
    """
    if Path(hosts.host_path(files.dir, host.name, hosts.SSHD_FAULT_DROPIN)).exists():
        _remove_forcecommand_hang(files, host)          # a hang injected by an older mctl
    text = _sshrc_text(doc)
    sshrc = hosts.host_path(files.dir, host.name, SSHRC)
    if text is not None:
        _check_sshrc_free(files, host)
        atomic_write(sshrc, text)
        return
    try:
        if sshrc.read_text().startswith(SSHRC_MARK):
            sshrc.unlink()
    except FileNotFoundError:
        pass
    _end_hang_waits(files, host)


def _check_sshrc_free(files: LabFiles, host: LabHost) -> None:
    """The host's own sshrc is not replaced, and a ~/.ssh/rc (which sshd runs instead) would make the fault a no-op."""
    try:
        old = hosts.host_path(files.dir, host.name, SSHRC).read_text()
    except FileNotFoundError:
        old = None
    if old is not None and not old.startswith(SSHRC_MARK):
        raise EnvironmentProblem(f"{host.name} has an {SSHRC} of its own; the lab will not replace it",
                                 hint="remove it from the host to use --hang or --slow")
    if hosts.host_path(files.dir, host.name, "/root/.ssh/rc").exists():
        raise EnvironmentProblem(f"{host.name} has /root/.ssh/rc, which sshd runs instead of {SSHRC}",
                                 hint="remove it from the host to use --hang or --slow")


def _new_listener(where: tuple[str, int], before: object, seconds: float) -> bool:
    """Whether a listening socket other than *before* appears on *where* within *seconds* (sshd came back)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = procs.listening_sockets().get(where)
        if now is not None and now != before:
            return True
        time.sleep(0.05)
    return False


def _remove_forcecommand_hang(files: LabFiles, host: LabHost) -> None:
    """The hang of earlier versions (an sshd ForceCommand, new logins only): only ever removed now."""
    dropin = hosts.host_path(files.dir, host.name, hosts.SSHD_FAULT_DROPIN)
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
        if hosts.HANG_IN_HOST in p.cmdline:
            _signal(p.pid, signal.SIGKILL)
    if frozen:
        return
    # The re-exec closes the listening socket and opens a new one; return once the new one is there.
    if _new_listener(where, before, 10):
        return
    raise EnvironmentProblem(f"sshd on {host.name} did not come back after reloading its configuration",
                             hint=f"see /var/log/mctl-lab/sshd.log on the host ({files.host(host.name).dir})")


# --- process, transport and host faults --------------------------------------------------------
# --freeze/--unreachable, --hang, --slow, --sshd-restart, --reboot, --slurmd-down, --imex-crash,
# --slurmctld-down. What each stands for is in docs/lab.md ("Faults").

SSHRC = "/etc/ssh/sshrc"
SSHRC_MARK = "# mctl lab fault"
FROZEN_RECORD = "frozen.json"            # hosts/<name>/frozen.json: the pids --freeze stopped
FAULT_EXEC_LOG = "fault-exec.log"        # hosts/<name>/fault-exec.log: commands the lab ran inside the host
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Daemon faults: faults.json key -> (process name, unit, kept down while the fault lasts)
DAEMON_FAULTS = {"slurmd_down": ("slurmd", "slurmd.service", True),
                 "imex_crash": ("nvidia-imex", "nvidia-imex.service", False),
                 "slurmctld_down": ("slurmctld", "slurmctld.service", True)}
KEEP_DOWN_DROPIN = "90-mctl-lab-fault.conf"
# Units a rebooted host starts when they are enabled, in order (the lab's init starts sshd itself).
BOOT_UNITS = {"tray": ["munge.service", "nvidia-imex.service", "slurmd.service"],
              "head": ["munge.service", "slurmctld.service"]}


def _check_host_fault_kind(host: LabHost, req: faultlib.FaultRequest, trays: list[str], heads: list[str]) -> None:
    for key in faultlib.HEAD_ONLY:
        if getattr(req, key) and host.kind != "head":
            raise UsageError(f"--{key.replace('_', '-')} applies to a head node (slurmctld runs there)",
                             hint=f"head nodes: {NodeSet.fromlist(heads)}")
    for key in faultlib.TRAY_ONLY:
        if getattr(req, key) and host.kind != "tray":
            raise UsageError(f"--{key.replace('_', '-')} applies to a compute tray",
                             hint=f"trays: {NodeSet.fromlist(trays)}")


def _host_fault_actions(host: LabHost, current: dict, new: dict, req: faultlib.FaultRequest) -> list[str]:
    acts = []
    if req.reboot:
        down = faultlib.REBOOT_DOWN_S if req.down_for is None else req.down_for
        acts = [f"reboot {host.name}: process faults cleared, every process stopped, off for {down:g}s, "
                "started again with a new boot id (kern.log kept); enabled units among "
                f"{', '.join(BOOT_UNITS[host.kind])} started as at boot"]
    if req.sshd_restart:
        acts = [f"reset every open SSH connection of {host.name} and kill sshd; its init starts it again"]
    if new.get("slow") is not None and new.get("slow") != current.get("slow") and not new["hang"]:
        acts.append(f"install {SSHRC}: every command on any connection, open or new, starts {new['slow']:g}s late")
    if current.get("slow") is not None and new.get("slow") is None and not current["hang"]:
        acts.append(f"remove {SSHRC}: commands run at once again")
    for key, (proc, unit, keep_down) in DAEMON_FAULTS.items():
        if new.get(key) and not current.get(key):
            acts.append(f"kill {proc} (SIGKILL)" + (f", and keep {unit} from starting until --clear" if keep_down
                                                    else f"; the lab's systemctl does not restart {unit}"))
        if current.get(key) and not new.get(key):
            was = current[key].get("restart", True) if isinstance(current[key], dict) else True
            acts.append(f"let {unit} start again" + (" and start it" if was else " (it was not running)"))
    return acts


def _sshrc_text(doc: dict) -> str | None:
    if doc.get("hang"):
        return (f"{SSHRC_MARK} --hang (removed by --clear). sshd runs this before every session's command:\n"
                f"exec {hosts.HANG_IN_HOST}\n")
    slow = doc.get("slow")
    if isinstance(slow, (int, float)):
        return f"{SSHRC_MARK} --slow {slow:g} (removed by --clear). Runs before every session's command.\nsleep {slow:g}\n"
    return None


def _end_hang_waits(files: LabFiles, host: LabHost) -> None:
    """Kill the hang helpers (and their sleep): the sessions waiting on them go on with their commands."""
    _init, members = _host_members(files, host)
    waits = {p.pid for p in members if hosts.HANG_IN_HOST in " ".join(p.cmdline[:2])}
    for p in members:
        if p.pid in waits or p.ppid in waits:
            _signal(p.pid, signal.SIGKILL)


def _freeze(files: LabFiles, host: LabHost, on: bool) -> None:
    """Stop (or continue) every process of the host: power loss or a panic as the network sees it.

    The kernel still accepts TCP connections and data on the host's address, but no process
    answers: no SSH banner on a new connection, no reply to a channel open or a running
    command's output on an open one, no reset either. Only the pids stopped here are continued.
    """
    record = files.host(host.name).dir / FROZEN_RECORD
    if on:
        stopped: set[int] = set()
        deadline = time.monotonic() + 15
        pidns = None
        while True:
            init, members = _host_members(files, host)
            pidns = init.pidns
            todo = [p for p in members if p.pid not in stopped and p.state not in ("T", "t", "Z", "X")]
            if not todo:
                break
            for p in todo:              # a fork racing with this pass is caught by the next one
                _signal(p.pid, signal.SIGSTOP)
                stopped.add(p.pid)
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"{host.name}: processes kept appearing while freezing the host",
                                         hint=f"mctl lab fault {host.name} --clear continues what was stopped")
            time.sleep(0.02)
        write_json(record, {"pidns": pidns, "pids": sorted(stopped)})
        return
    try:
        data = json.loads(record.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    table = procs.scan()
    for pid in data.get("pids", []):
        p = table.get(pid)
        if p is not None and p.pidns == data.get("pidns"):
            _signal(pid, signal.SIGCONT)
    init = hosts.init_proc(files.host(host.name), table)
    if init is not None:            # sshd stopped by an older mctl's --unreachable
        for p in procs.in_namespace(table, init):
            if p.comm.startswith("sshd") and p.state in ("T", "t"):
                _signal(p.pid, signal.SIGCONT)
    try:
        record.unlink()
    except FileNotFoundError:
        pass


def _is_frozen(files: LabFiles, host: LabHost) -> bool:
    return (files.host(host.name).dir / FROZEN_RECORD).exists()


def _sshd_restart(files: LabFiles, host: LabHost) -> None:
    """Reset every open SSH connection, kill sshd and its sessions; the host's init starts sshd again."""
    import shutil
    import subprocess

    if _is_frozen(files, host):
        raise UsageError(f"{host.name} is frozen: nothing on it restarts", hint=f"mctl lab fault {host.name} --clear")
    init, members = _host_members(files, host)
    where = (host.address, 22)
    before = procs.listening_sockets().get(where)
    if shutil.which("ss"):
        # The kernel aborts the host's established sshd sockets: each client gets a TCP reset.
        subprocess.run(["ss", "-K", "-t", "-n", "state", "established", "( sport = :22 )", "src", host.address],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
    for p in members:
        if p.comm.startswith("sshd"):
            _signal(p.pid, signal.SIGKILL)
    # hostinit restarts a service after 1 s, doubling (up to 30 s) when it ran less than 10 s.
    if _new_listener(where, before, 45):
        return
    raise EnvironmentProblem(f"sshd on {host.name} did not come back after the restart",
                             hint=f"see {files.host(host.name).console} and /var/log/mctl-lab/sshd.log on the host")


def _daemons_running(files: LabFiles, host: LabHost, current: dict, new: dict) -> dict[str, bool]:
    """For each daemon fault being injected now: whether its daemon runs (so --clear starts it again)."""
    starting = [k for k in DAEMON_FAULTS if new.get(k) and not current.get(k)]
    if not starting:
        return {}
    _init, members = _host_members(files, host)
    return {k: any(p.comm == DAEMON_FAULTS[k][0] for p in members) for k in starting}


def _remove_keep_down(files: LabFiles, host: LabHost, dropin: str) -> None:
    """Remove a keep-down drop-in and its folder when that is left empty: an empty
    /etc/systemd/system/UNIT.d hides the unit's other drop-ins from the image's systemctl (the lab's
    Type=forking one among them), and the next start of the daemon fails."""
    path = hosts.host_path(files.dir, host.name, dropin)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        path.parent.rmdir()
    except OSError:
        pass


def _daemon_faults(files: LabFiles, host: LabHost, current: dict, new: dict, clear: bool) -> list[str]:
    problems: list[str] = []
    for key, (proc, unit, keep_down) in DAEMON_FAULTS.items():
        dropin = f"/etc/systemd/system/{unit}.d/{KEEP_DOWN_DROPIN}"
        if new.get(key) and not current.get(key):
            if keep_down:
                path = hosts.host_path(files.dir, host.name, dropin)
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, f"# mctl lab fault --{key.replace('_', '-')} (removed by --clear): "
                                   f"{unit} fails to start, as a crashed daemon that will not come back\n"
                                   "[Service]\nExecStartPre=/bin/sh -c 'echo \"mctl lab fault: "
                                   f"{proc} is kept down\" >&2; exit 1'\n")
            _init, members = _host_members(files, host)
            for p in members:
                if p.comm == proc:
                    _signal(p.pid, signal.SIGKILL)
        elif current.get(key) and (clear or not new.get(key)):
            _remove_keep_down(files, host, dropin)
            restart = current[key].get("restart", True) if isinstance(current[key], dict) else True
            # The image's systemctl keeps the failed start's ActiveState in /run/UNIT.status and reports any
            # later start as failed ("forking start not active") although the daemon runs: forget it first.
            _host_exec(files, host, ["rm", "-f", f"/run/{unit}.status"], timeout=30)
            if restart:
                rc, said = _host_exec(files, host, ["systemctl", "start", unit], timeout=90)
                # The image's systemctl may give up on a forking daemon that is slow to write its pid file
                # on a loaded machine: the daemon running is what counts.
                if rc != 0 and not _wait_process(files, host, proc, 10.0):
                    problems.append(f"systemctl start {unit} failed (exit {rc}): {said}")
    return problems


def _wait_process(files: LabFiles, host: LabHost, comm: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        _init, members = _host_members(files, host)
        if any(p.comm == comm and p.state != "Z" for p in members):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _host_exec(files: LabFiles, host: LabHost, argv: list[str], *, timeout: float) -> tuple[int, str]:
    """Run a command inside the host's namespaces and root (as its init would), output to FAULT_EXEC_LOG.

    Not over SSH: a host with --hang or --slow must still be put right by --clear.
    """
    import subprocess

    init, _members = _host_members(files, host)
    enter = ["nsenter", "-t", str(init.pid), "-m", "-u", "-i", "-p"]
    try:
        if os.readlink(f"/proc/{init.pid}/ns/time") != os.readlink("/proc/self/ns/time"):
            enter.append("-T")
    except OSError:
        pass
    enter += ["-r", "-w", "--", "/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME=/root", "LANG=C.UTF-8", *argv]
    log_path = files.host(host.name).dir / FAULT_EXEC_LOG
    with open(log_path, "ab") as log:
        start = log.tell()
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        # A pipe would be held open by the daemon the command starts; a file is not waited for.
        proc = subprocess.Popen(enter, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = 124
    with open(log_path, "rb") as fh:
        fh.seek(start)
        said = [l.strip() for l in fh.read().decode(errors="replace").splitlines()[1:] if l.strip()]
    errors = [l for l in said if "ERROR" in l or "error" in l]
    return rc, ((errors or said)[-1][:200] if said else "no output")


def _read_boot_id(files: LabFiles, name: str) -> str | None:
    try:
        return (files.host(name).dir / hosts.BOOT_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def _stop_host(files: LabFiles, host: LabHost, *, force: bool = False) -> None:
    """Every process of one host ends (init first, as at shutdown), and with them its namespaces and mounts."""
    paths = files.host(host.name)
    table = procs.scan()
    init = hosts.init_proc(paths, table)
    if init is None:
        return
    launcher = init.ppid
    # The host's processes are those of its pid namespace, but only while its init lives: once the namespace
    # is gone the kernel may hand its inode number (what /proc/PID/ns/pid names) to a new one, and a host
    # booting meanwhile (trays of a rack rebooting together) would be taken for this one and killed. So
    # after its init is gone only the processes already seen as its own are waited for.
    members: set[int] = set()

    def alive() -> list[procs.Proc]:
        t = procs.scan()
        now = t.get(init.pid)
        if now is not None and now.pidns == init.pidns and now.state != "Z":
            members.update(p.pid for p in t.values() if p.pidns == init.pidns)
        out = [p for p in t.values() if p.pid in members and p.pidns == init.pidns and p.state != "Z"]
        lp = t.get(launcher)
        return out + ([lp] if lp is not None and lp.comm == "unshare" and lp.state != "Z" else [])

    alive()
    if not force:
        _signal(init.pid, signal.SIGTERM)
        _signal(init.pid, signal.SIGCONT)
    for wait, sig in ((0.0 if force else 8.0, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive():
            time.sleep(0.05)
        left = alive()
        if not left:
            return
        if sig is None:
            raise EnvironmentProblem(f"{len(left)} process(es) of {host.name} did not stop "
                                     f"(e.g. pid {left[0].pid} {left[0].comm})",
                                     hint="a process in uninterruptible sleep; retry shortly")
        for p in left:
            if p.pid != launcher:
                _signal(p.pid, sig)


def _reboot(files: LabFiles, layout: LabLayout, record: dict, host: LabHost, current: dict,
            down_for: float | None) -> None:
    """The host goes away (every process ends, SSH refused) and boots again: new boot id, uptime from 0,
    /run and /tmp empty, kern.log kept (it is on disk), enabled units started as at boot."""
    power_off(files, host, current)
    time.sleep(faultlib.REBOOT_DOWN_S if down_for is None else down_for)
    power_on(files, layout, record, host)


def power_off(files: LabFiles, host: LabHost, current: dict | None = None, *, force: bool = False) -> None:
    """The host loses power: its process faults end with it (a freeze, hung or slow commands, daemons kept
    down; GPU faults are hardware: they stay), every process ends, SSH is refused. Used by --reboot and by
    the tray's BMC (mctl.lab.bmc_emulator); *force* kills at once instead of SIGTERM first."""
    if current is None:
        try:
            current = faultlib.normalize(json.loads(
                hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE).read_text()))
        except (OSError, ValueError):
            current = faultlib.empty()
    if current["unreachable"] or _is_frozen(files, host):
        _freeze(files, host, False)
    sshrc = hosts.host_path(files.dir, host.name, SSHRC)
    try:
        if sshrc.read_text().startswith(SSHRC_MARK):
            sshrc.unlink()
    except FileNotFoundError:
        pass
    for _key, (_proc, unit, _keep) in DAEMON_FAULTS.items():
        _remove_keep_down(files, host, f"/etc/systemd/system/{unit}.d/{KEEP_DOWN_DROPIN}")
    write_json(hosts.host_path(files.dir, host.name, hosts.FAULTS_FILE), faultlib.without_host_faults(current))
    gpus = 0
    if host.kind == "tray":
        try:
            gpus = len(json.loads(hosts.host_path(files.dir, host.name, hosts.GPUS_FILE).read_text())["gpus"])
        except (OSError, ValueError, KeyError, TypeError):
            gpus = 0
    atomic_write(hosts.host_path(files.dir, host.name, hosts.BOOT_UNITS_FILE),
                 json.dumps({"units": BOOT_UNITS[host.kind], "gpus": gpus}) + "\n")
    _stop_host(files, host, force=force)


def power_on(files: LabFiles, layout: LabLayout, record: dict, host: LabHost) -> None:
    """The host boots (new boot id, uptime from 0, enabled units started) and waits until it listens."""
    paths = files.host(host.name)
    if hosts.init_proc(paths) is not None:
        return
    rootfs = Path((record.get("image") or {}).get("dir", "")) / "rootfs"
    if not rootfs.is_dir():
        raise EnvironmentProblem(f"cannot boot {host.name} again: its image {rootfs} is gone",
                                 hint="mctl lab down, then mctl lab up")
    hosts.spawn(paths, rootfs, fresh_clock=True,
                char_devices=hosts.TRAY_CHAR_DEVICES if host.kind == "tray" else ())
    _wait_ready(files, layout, 60.0, only=[host.name])
    if host.kind == "tray" and any(s.get("name") == services.NMX_SERVICE.name
                                   for s in record.get("rack_services", [])):
        services.refresh_nmx(_rack_context(files, layout, host.rack))      # its files moved to a new /proc/<pid>


def host_running(files: LabFiles, host: LabHost) -> bool:
    return hosts.init_proc(files.host(host.name)) is not None


def host_frozen(files: LabFiles, host: LabHost) -> bool:
    return _is_frozen(files, host)


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
