"""Bring a lab up, report on it, take it down.

The library side of `mctl lab up|status|down|ssh`: no printing (progress goes to a
callback), errors as MctlError. Truth about what runs comes from /proc (see procs.py);
lab.json only records what was asked for, so status and teardown work even when a
host died or the record is stale. The lab folder, its record and its processes are
labdir.py's; each family of faults has a module of its own (inject.py conducts them):
host_faults.py, daemon_faults.py, gpu_faults.py, bmc_faults.py, nmx_faults.py. The
names other code calls here (`fault`, `power_on`, `LabFiles`, ...) stay importable from
this module.
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
from mctl.lab import bmc_faults, bmcs, hosts, image, keys, nmx_faults, prereq, procs, services
from mctl.lab.gpus import gpu_state
from mctl.lab.host_faults import host_frozen, host_running, power_off, power_on  # noqa: F401 - the lab's API
from mctl.lab.inject import FaultResult, fault  # noqa: F401 - the lab's API
from mctl.lab.labdir import (INVENTORY, KEY, KNOWN_HOSTS, MARKER_ENV, RECORD, LabFiles,  # noqa: F401
                             lab_launchers, lab_processes, layout_of, load_record, open_lab, rack_context,
                             send_signal)
from mctl.lab.layout import DEFAULT_NET, LabHost, LabLayout, etc_hosts
from mctl.lab.site import IMAGE_NAME, REPO_IMAGES, inventory
from mctl.state.files import atomic_write, write_json

Progress = Callable[[str], None]
ADDRESS_LOCK = Path(tempfile.gettempdir()) / "mctl-lab-addresses.lock"


def _quiet(_msg: str) -> None:
    pass


@dataclass
class UpResult:
    dir: Path
    inventory: Path
    layout: LabLayout
    seconds: float
    image_dir: Path
    missing_files: list[str] = field(default_factory=list)


# --- up -----------------------------------------------------------------------------------------

def up(lab_dir: Path, *, racks: int = 1, trays: int = 18, name: str = "lab", net: int = DEFAULT_NET,
       images_dir: Path = REPO_IMAGES, progress: Progress = _quiet, timeout: float = 180.0,
       rack_services: Sequence[services.RackService] | None = None, os_only: bool = True,
       switch_trays: int = 0, fleet: bool = False) -> UpResult:
    """Start a lab in *lab_dir*. *rack_services* defaults to the registry (services.RACK_SERVICES).

    *os_only* (the default): the trays start with the OS image only; the lab's packages (the GPU
    tools, mctl/lab/aptrepo.py) come only with provisioning, through apt, as on a fresh real tray.
    os_only=False (`lab up --pre-tooled`): the lab image's packages are installed already, as in an
    image that carries them (their files, dpkg status and file lists), so the GPU tools answer at once.
    *switch_trays*: NVLink switch trays per rack, each a BMC only (no host: mctl never logs in to NVOS).
    *fleet* (`lab up --fleet`, mctl/lab/fleet.py): per rack one host whose sshd answers as every tray
    and the head node, and one BMC process answering as every BMC; pre-tooled (os_only must be False).
    """
    from mctl.state.lock import file_lock

    started = time.monotonic()
    try:
        layout = LabLayout(name, racks, trays, net, switch_trays)
    except ValueError as exc:
        raise UsageError(f"invalid lab shape: {exc}", hint="e.g. mctl lab up --racks 1 --compute-trays 18") from None
    if fleet and os_only:
        raise UsageError("fleet mode starts the trays pre-tooled: their rack's one root holds the GPU tools",
                         hint="mctl lab up --fleet (without --os-only); provisioning through apt needs the full lab")
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
                "fleet": fleet,
                "created_at": time.time(), "state": "starting", "pid": os.getpid()})
            try:
                if fleet:
                    progress(f"starting {len(layout.hosts())} hosts ({racks} rack(s) x {trays} trays + head) "
                             f"as {racks} fleet rack host(s), their sshd listening on every address")
                    missing = _start_fleet_hosts(files, layout, rootfs, rack_svcs, os_only=os_only)
                    hosts.wait_ready(files.dir, _fleet_listeners(layout), timeout)
                else:
                    progress(f"starting {len(layout.hosts())} hosts ({racks} rack(s) x {trays} trays + head)")
                    missing = _start_hosts(files, layout, rootfs, rack_svcs, os_only=os_only)
                    hosts.wait_ready(files.dir, services.listeners(layout), timeout)
                _start_rack_services(files, layout, rack_svcs)
                if fleet:
                    progress(f"starting {len(bmcs.bmc_units(layout))} tray BMCs (Redfish, sushy-tools) "
                             f"in {racks} process(es), one per rack")
                    bmcs.start_fleet(files.dir, layout, MARKER_ENV)
                else:
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
            send_signal(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        table = procs.scan()
        if not [p for p in lab_launchers(files.dir, table) if configs & set(p.cmdline)]:
            return
        time.sleep(0.1)
    table = procs.scan()
    for launcher in [p for p in lab_launchers(files.dir, table) if configs & set(p.cmdline)]:
        for p in procs.descendants(table, launcher):
            send_signal(p.pid, signal.SIGKILL)


def _host_files_prologue(files: LabFiles, layout: LabLayout, rootfs: Path, os_only: bool):
    """What every host's files are written from, full lab or fleet: the lab's SSH key (written), /etc/hosts, the
    host init script and the pre-installed packages' dpkg status (None for OS-only trays)."""
    lab_key = keys.ed25519(f"mctl-lab@{layout.name}")
    atomic_write(files.key, lab_key.private_openssh, mode=0o600)
    atomic_write(files.key.with_suffix(".pub"), lab_key.public_line + "\n")
    return lab_key, etc_hosts(layout), hosts.HOSTINIT.read_text(), None if os_only else _preinstall(rootfs)


def _start_hosts(files: LabFiles, layout: LabLayout, rootfs: Path,
                 rack_svcs: Sequence[services.RackService], os_only: bool = False) -> list[str]:
    lab_key, hosts_text, hostinit, dpkg = _host_files_prologue(files, layout, rootfs, os_only)
    known: list[str] = []
    missing: set[str] = set()
    for h in layout.hosts():
        paths = files.host(h.name)
        paths.dir.mkdir(parents=True, exist_ok=True)
        host_key = keys.ed25519(f"root@{h.name}")
        known.append(keys.known_hosts_line([h.name, h.address], host_key))
        w = hosts.UpperWriter(rootfs, paths.upper)
        ctx = services.HostContext(layout, h, files.dir)
        _write_host_files(w, ctx, h, hosts_text, lab_key, host_key, hostinit, missing, os_only=os_only, dpkg=dpkg)
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


def _fleet_listeners(layout: LabLayout) -> dict[str, list[tuple[str, int]]]:
    """rack host -> every address its sshd listens on (fleet mode)."""
    from mctl.lab import fleet

    return {fleet.rack_host(rack): [(h.address, 22) for h in fleet.identities(layout, rack)]
            for rack in layout.rack_names()}


def _start_fleet_hosts(files: LabFiles, layout: LabLayout, rootfs: Path,
                       rack_svcs: Sequence[services.RackService], os_only: bool = False) -> list[str]:
    """Fleet mode (mctl/lab/fleet.py): per rack one host with the trays' tools, sshd on every
    address of the rack and one state folder per identity (hostname, gpus.json, kern.log)."""
    from mctl.lab import fleet

    lab_key, hosts_text, hostinit, dpkg = _host_files_prologue(files, layout, rootfs, os_only)
    known: list[str] = []
    missing: set[str] = set()
    for rack in layout.rack_names():
        members = fleet.identities(layout, rack)
        first_tray = next(h for h in members if h.kind == "tray")
        paths = files.host(fleet.rack_host(rack))
        paths.dir.mkdir(parents=True, exist_ok=True)
        host_key = keys.ed25519(f"root@{fleet.rack_host(rack)}")
        known += [keys.known_hosts_line([h.name, h.address], host_key) for h in members]
        w = hosts.UpperWriter(rootfs, paths.upper)
        ctx = services.HostContext(layout, first_tray, files.dir)
        # the trays' root (tools, keys, init), with the rack host's name and sshd
        _write_host_files(w, ctx, first_tray, hosts_text, lab_key, host_key, hostinit, missing,
                          os_only=os_only, dpkg=dpkg)
        w.put("/etc/hostname", fleet.rack_host(rack) + "\n")
        w.put(hosts.SSHD_DROPIN, fleet.sshd_config(layout, rack))
        w.put(hosts.SERVICES_FILE, json.dumps({"services": [
            {"name": f"sshd-{n}", "argv": argv, "dirs": ["/run/sshd"], "restart": True,
             "log": f"/var/log/mctl-lab/sshd-{n}.log"}
            for n, argv in enumerate(fleet.sshd_argvs(layout, rack), 1)]}, indent=2) + "\n")
        w.put(fleet.FLEET_SESSION, fleet.SESSION_SCRIPT, 0o755)
        w.put(hosts.GPUS_FILE, "")          # the rack host is no tray: each identity has its own (below)
        for h in members:
            w.put(fleet.inner_path(h.name, "/etc/hostname"), h.name + "\n")
            w.mkdir(fleet.inner_path(h.name, hosts.STATE_IN_HOST))
            if h.kind == "tray":
                w.put(fleet.inner_path(h.name, hosts.GPUS_FILE), json.dumps(gpu_state(layout, h), indent=2) + "\n")
                w.put(fleet.inner_path(h.name, hosts.KERN_LOG), "", 0o640)
                os.chown(w.upper / fleet.inner_path(h.name, hosts.KERN_LOG).lstrip("/"), 0, 4)   # root:adm
    atomic_write(files.known_hosts, "\n".join(known) + "\n")
    bmcs.prepare(files.dir, layout, power_model="bmc")
    atomic_write(files.inventory, inventory(layout, identity_file=files.key, known_hosts=files.known_hosts,
                                            images_dir=REPO_IMAGES,
                                            rack_extra=_rack_inventory(files, layout, rack_svcs),
                                            bmc=bmcs.inventory_section(files.dir)))
    for rack in layout.rack_names():
        hosts.spawn(files.host(fleet.rack_host(rack)), rootfs, char_devices=hosts.TRAY_CHAR_DEVICES)
    return sorted(missing)


def _preinstall(rootfs: Path) -> tuple[str, str, list]:
    """What a pre-tooled tray's dpkg database starts from: (the image's dpkg status, dpkg's architecture,
    the lab image's repository packages)."""
    from mctl.lab import aptrepo

    status = (rootfs / "var/lib/dpkg/status").read_text()
    return status, aptrepo.arch(), aptrepo.packages_of(REPO_IMAGES, only=IMAGE_NAME)


def _write_dpkg(w: hosts.UpperWriter, ctx: services.HostContext, dpkg: tuple[str, str, list]) -> None:
    """The lab image's packages installed on a pre-tooled tray: their files, a status stanza each and their
    file lists, as dpkg leaves them (provisioning then finds them at their pinned versions)."""
    import hashlib

    from mctl.lab import aptrepo

    status, arch, packages = dpkg
    stanzas = []
    for p in packages:
        stanza, files = aptrepo.preinstalled(p, arch, ctx)
        stanzas.append(stanza)
        for dest, data, mode in files:
            w.put(dest, data, mode)
        w.put(f"/var/lib/dpkg/info/{p.name}.list", "".join(f"{dest}\n" for dest, _d, _m in files))
        w.put(f"/var/lib/dpkg/info/{p.name}.md5sums", "".join(
            f"{hashlib.md5(data if isinstance(data, bytes) else data.encode()).hexdigest()}  {dest.lstrip('/')}\n"
            for dest, data, _m in files))
    w.put("/var/lib/dpkg/status", status.rstrip("\n") + "\n\n" + "\n".join(stanzas))


def _write_host_files(w: hosts.UpperWriter, ctx: services.HostContext, h: LabHost, hosts_text: str,
                      lab_key: keys.KeyPair, host_key: keys.KeyPair, hostinit: str, missing: set[str],
                      os_only: bool = False, dpkg: tuple[str, str, list] | None = None) -> None:
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
    if dpkg is not None and h.kind == "tray":
        _write_dpkg(w, ctx, dpkg)       # pre-tooled: the GPU tools' packages as installed from the image
    for f in services.host_files(h.kind):
        if f.package and (os_only or (dpkg is not None and h.kind == "tray")):
            continue                    # os-only: comes with provisioning, through the lab's apt repository
        data = f.content(ctx)
        if data is None:
            missing.add(f.dest)
            continue
        w.put(f.dest, data, f.mode)


def _rack_inventory(files: LabFiles, layout: LabLayout,
                    rack_svcs: Sequence[services.RackService]) -> dict[str, dict]:
    extra: dict[str, dict] = {}
    for rack in layout.rack_names():
        ctx = rack_context(files, layout, rack)
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
        ctx = rack_context(files, layout, rack)
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
        send_signal(p.pid, signal.SIGTERM)
        send_signal(p.pid, signal.SIGCONT)
    if not _wait_gone(lab_dir, 8.0):
        for p in lab_processes(lab_dir):
            send_signal(p.pid, signal.SIGKILL)
        if not _wait_gone(lab_dir, 5.0):
            left = lab_processes(lab_dir)
            raise EnvironmentProblem(f"{len(left)} lab process(es) did not stop (e.g. pid {left[0].pid} {left[0].comm})",
                                     hint="a process in uninterruptible sleep; retry 'mctl lab down' shortly")
    return len(everything)


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
    fleet_racks = []
    if record.get("fleet"):
        from mctl.lab import fleet

        for rack in layout.rack_names():
            fleet_racks.append(_fleet_rack_status(files, layout, rack, table, listening))
            rows += [_fleet_host_status(files, h, fleet_racks[-1], listening) for h in fleet.identities(layout, rack)]
    else:
        for h in layout.hosts():
            rows.append(_host_status(files, layout, h, table, listening))
    racks = []
    for rack in layout.rack_names():
        ctx = rack_context(files, layout, rack)
        for svc in record.get("rack_services", []):
            racks.append(_rack_service_status(files, ctx, svc["name"], svc.get("port"), table, listening))
    running = sum(1 for r in rows if r["running"])
    total_rss = sum(p.rss_kb for p in stray)
    return {
        "dir": str(files.dir), "configured": True, "up": running > 0, "name": record["name"],
        "racks": record["racks"], "trays": record["trays"], "net": layout.net, "state": record.get("state"),
        "switch_trays": [{"name": sw.name, "bmc": layout.switch_bmc_address(sw),
                          "bmc_listening": (layout.switch_bmc_address(sw), bmcs.PORT) in listening,
                          "faults": bmc_faults.describe(bmc_faults.read(bmc_faults.faults_path(files.dir, sw.name)),
                                                        "switch")}
                         for sw in layout.switches()],
        "inventory": str(files.inventory), "known_hosts": str(files.known_hosts), "identity_file": str(files.key),
        "image": dict(record.get("image") or {},
                      packages=(image.read_manifest(Path((record.get("image") or {}).get("dir", "/nonexistent")))
                                or {}).get("packages", {})),
        "hosts_running": running, "hosts_total": len(rows),
        "processes": len(stray), "rss_kib": total_rss, "hosts": rows, "rack_services": racks,
        "fleet": bool(record.get("fleet")), "fleet_racks": fleet_racks,
    }


def _fleet_rack_status(files: LabFiles, layout: LabLayout, rack: str, table: dict[int, procs.Proc],
                       listening: set) -> dict:
    """Fleet mode: the rack host (its sshd answers as every host of the rack) and the rack's one BMC process."""
    from mctl.lab import fleet

    init = hosts.init_proc(files.host(fleet.rack_host(rack)), table)
    members = procs.in_namespace(table, init) if init else []
    sshds = [p for p in procs.children(table, init.pid) if p.comm == "sshd"] if init else []
    want = len(fleet.sshd_argvs(layout, rack))
    marker = f"MCTL_LAB_SERVICE={rack}/bmc"
    launcher = next((p for p in lab_launchers(files.dir, table) if marker in p.cmdline), None)
    bmc = procs.children(table, launcher.pid) if launcher else []
    return {"rack": rack, "host": fleet.rack_host(rack), "init_pid": init.pid if init else None,
            "running": init is not None,
            "sshd": ("stopped" if any(p.state == "T" for p in sshds) else "running") if len(sshds) == want else "down",
            "sshd_processes": len(sshds),
            "processes": len(members), "rss_kib": sum(p.rss_kb for p in members),
            "bmc_pid": bmc[0].pid if bmc else None, "bmc_rss_kib": sum(p.rss_kb for p in bmc)}


def _fleet_host_status(files: LabFiles, h: LabHost, rack: dict, listening: set) -> dict:
    """Fleet mode: one identity of a rack host (its processes are the rack host's: counted there)."""
    from mctl.lab import fleet

    row: dict = {"name": h.name, "kind": h.kind, "rack": h.rack, "address": h.address, "running": rack["running"],
                 "init_pid": rack["init_pid"], "processes": [], "services": [], "faults": [], "ssh": "down",
                 "fleet_host": rack["host"]}
    if not rack["running"]:
        return row
    try:
        fdoc = json.loads(Path(f"/proc/{rack['init_pid']}/root{fleet.inner_path(h.name, hosts.FAULTS_FILE)}").read_text())
    except (OSError, ValueError):
        fdoc = {}
    row["faults"] = faultlib.active(fdoc)
    if h.kind == "tray":
        row["faults"] += bmc_faults.describe(bmc_faults.read(bmc_faults.faults_path(files.dir, h.name)))
    listens = (h.address, 22) in listening
    row["ssh"] = "not answering" if rack["sshd"] == "stopped" else "ok" if rack["sshd"] == "running" and listens else "down"
    return row


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
    row["boot_id"] = hosts.boot_id(files.host(h.name))
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
    if name == "nmx":                   # `mctl lab fault nmx RACK ...` (mctl/lab/nmx_faults.py)
        out["faults"] = nmx_faults.current(files.dir, ctx.rack)
    return out


# --- ssh ----------------------------------------------------------------------------------------

def ssh_argv(lab_dir: Path, host_name: str, command: list[str], *, tty: bool) -> list[str]:
    lab = open_lab(lab_dir)
    files, layout = lab.files, lab.layout
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
