"""mctl lab up|status|down|fault|ssh: the virtual NVL72 rack."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options, want_json
from mctl.cli.options import DryRunOpt, JsonOpt, finite

app = typer.Typer(
    help="The virtual NVL72 lab: real Linux hosts (namespaces, overlay roots, sshd, Slurm) with emulated GPUs.\n\n"
         "Example: mctl lab up --racks 1 --trays 18",
    no_args_is_help=True,
)

DirOpt = Annotated[Optional[Path], typer.Option("--dir", envvar="MCTL_LAB_DIR", show_envvar=False,
                                                help="Lab folder (default <state dir>/lab).")]


def _lab_dir(value: Path | None) -> Path:
    return (value or options().state_dir / "lab").resolve()


def _dir_flag(lab_dir: Path) -> str:
    default = (options().state_dir / "lab").resolve()
    return "" if lab_dir == default else f" --dir {lab_dir}"


def _say(message: str) -> None:
    render.err_console().print(message, markup=False, highlight=False)


@app.command()
def up(
    racks: Annotated[int, typer.Option("--racks", min=1, max=99, help="Racks (each its own NVLink domain).")] = 1,
    trays: Annotated[int, typer.Option("--trays", min=1, max=18, help="Compute trays per rack.")] = 18,
    switch_trays: Annotated[int, typer.Option("--switch-trays", min=0, max=9,
                                              help="NVLink switch trays per rack: each is a BMC only "
                                                   "(Redfish, the real switch tray's tree), no host.")] = 0,
    lab_dir: DirOpt = None,
    net: Annotated[int, typer.Option("--net", min=1, max=254,
                                     help="Second address octet: hosts get 127.NET.RACK.TRAY.")] = 77,
    timeout: Annotated[float, typer.Option("--timeout", click_type=finite(),
                                           help="Seconds to wait for every host's sshd.")] = 180.0,
    os_only: Annotated[bool, typer.Option("--os-only", help="Trays start with the OS image only: the GPU tools "
                                          "come with provisioning, through the lab's apt repository.")] = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Start the lab: per rack, N compute trays and a head node, each a real host with its own sshd.

    Writes an inventory (mctl.yml), an SSH key and a known_hosts file into the lab folder,
    so every other command works on the lab as on any site. The image is built on first use
    (a few minutes, then cached).

    Example: mctl lab up --racks 1 --trays 18
    """
    from mctl.lab import control, image
    from mctl.lab.layout import LabLayout
    from mctl.lab.site import IMAGE_NAME, REPO_IMAGES

    path = _lab_dir(lab_dir)
    as_json = want_json(json_)
    if dry_run:
        layout = LabLayout("lab", racks, trays, net, switch_trays)
        spec = image.load_spec(REPO_IMAGES / f"{IMAGE_NAME}.yml")
        plan = {"dir": str(path), "image": spec.name, "image_cached": image.is_built(spec),
                "image_dir": str(spec.cache_dir),
                "hosts": [{"name": h.name, "kind": h.kind, "address": h.address} for h in layout.hosts()],
                "switch_trays": [{"name": sw.name, "address": sw.address, "bmc": layout.switch_bmc_address(sw)}
                                 for sw in layout.switches()],
                "inventory": str(path / control.INVENTORY)}
        if as_json:
            render.print_json({"dry_run": True, "plan": plan})
            return
        con = render.console()
        con.print(f"would start {len(plan['hosts'])} hosts in {path} "
                  f"(image {spec.name}: {'cached' if plan['image_cached'] else 'to build'} at {spec.cache_dir})",
                  markup=False, highlight=False)
        for h in plan["hosts"]:
            con.print(f"  {h['name']:<18} {h['kind']:<5} {h['address']}", markup=False, highlight=False)
        for sw in plan["switch_trays"]:
            con.print(f"  {sw['name']:<18} {'switch':<6} BMC {sw['bmc']} (no host)", markup=False, highlight=False)
        return
    result = control.up(path, racks=racks, trays=trays, net=net, timeout=timeout, os_only=os_only,
                        switch_trays=switch_trays, progress=(lambda _m: None) if as_json else _say)
    flag = _dir_flag(result.dir)
    for dest in result.missing_files:
        render.warn(f"{dest} not installed: its source is not in this checkout yet")
    if as_json:
        render.print_json({"dir": str(result.dir), "inventory": str(result.inventory),
                           "seconds": round(result.seconds, 2), "image_dir": str(result.image_dir),
                           "racks": racks, "trays": trays, "switch_trays": switch_trays,
                           "missing_files": result.missing_files,
                           "hosts": [{"name": h.name, "kind": h.kind, "rack": h.rack, "address": h.address}
                                     for h in result.layout.hosts()]})
        return
    con = render.console()
    first = result.layout.trays_of(result.layout.rack_names()[0])[0].name
    lines = [
        f"lab up: {racks} rack(s) x {trays} trays + head node, {len(result.layout.hosts())} hosts "
        + (f"and {switch_trays} switch tray BMC(s) per rack " if switch_trays else "")
        + f"in {result.seconds:.1f} s ({result.dir})",
        f"inventory: {result.inventory}",
        "",
        "use it like any site:",
        f"  export MCTL_INVENTORY={result.dir}",
        "  mctl inventory show",
        f"  mctl lab ssh {first}{flag}",
        f"  mctl lab ssh {first}{flag} -- nvidia-smi -L",
        f"  mctl lab fault {first}{flag} --xid 79 --gpu 0",
        f"  mctl lab status{flag}",
        f"  mctl lab down{flag}",
    ]
    for line in lines:
        con.print(line, markup=False, highlight=False)


@app.command()
def status(lab_dir: DirOpt = None, json_: JsonOpt = False) -> None:
    """Hosts, addresses, processes and faults of the lab, read from the running system.

    Example: mctl lab status --json
    """

    from mctl.lab import control

    path = _lab_dir(lab_dir)
    st = control.status(path)
    if want_json(json_):
        render.print_json(st)
        return
    con = render.console()
    if not st["configured"]:
        extra = f" ({len(st['stray_processes'])} leftover processes: run 'mctl lab down{_dir_flag(path)}')" \
            if st["stray_processes"] else ""
        con.print(f"no lab in {path}{extra}", markup=False, highlight=False)
        return
    con.print(f"lab {st['name']} in {st['dir']}: {st['hosts_running']}/{st['hosts_total']} hosts running, "
              f"{st['processes']} processes, {st['rss_kib'] / 1024:.0f} MiB resident", markup=False, highlight=False)
    con.print(f"inventory: {st['inventory']}", markup=False, highlight=False)
    img = st.get("image") or {}
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted((img.get("packages") or {}).items()))
    con.print(f"image: {img.get('name')} ({img.get('dir')}){': ' + pkgs if pkgs else ''}", markup=False,
              highlight=False)
    table = render.data_table(title_justify="left")
    for col in ("host", "kind", "address", "state", "ssh", "procs", "faults"):
        table.add_column(col)
    for h in st["hosts"]:
        table.add_row(h["name"], h["kind"], h["address"], "running" if h["running"] else "down", h["ssh"],
                      str(len(h["processes"])), ", ".join(h["faults"]) or "-")
    con.print(table)
    for svc in st["rack_services"]:
        con.print(f"{svc['rack']} {svc['name']} {svc['address']}:{svc['port']} "
                  f"{'running' if svc['running'] else 'down'}"
                  f"{' (' + ', '.join(svc['faults']) + ')' if svc.get('faults') else ''}", markup=False,
                  highlight=False)


@app.command()
def down(lab_dir: DirOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Stop every lab host and service and remove the lab folder's hosts, keys and inventory.

    Leaves no process, mount or overlay behind. Nothing running is not an error.

    Example: mctl lab down
    """
    from mctl.lab import control

    path = _lab_dir(lab_dir)
    as_json = want_json(json_)
    if dry_run:
        running = control.lab_processes(path)
        plan = {"dir": str(path), "processes": len(running), "remove": path.is_dir()}
        if as_json:
            render.print_json({"dry_run": True, "plan": plan})
        else:
            render.console().print(f"would stop {len(running)} lab processes and remove the lab files in {path}",
                                   markup=False, highlight=False)
        return
    result = control.down(path, progress=(lambda _m: None) if as_json else _say)
    if as_json:
        render.print_json({"dir": str(result.dir), "stopped_processes": result.stopped, "removed": result.removed,
                           "seconds": round(result.seconds, 2)})
        return
    if not result.stopped and not result.removed:
        render.console().print(f"no lab in {path}; nothing to do", markup=False, highlight=False)
    else:
        render.console().print(f"lab down: stopped {result.stopped} processes, removed {path} "
                               f"in {result.seconds:.1f} s", markup=False, highlight=False)


@app.command()
def fault(
    tray: Annotated[str, typer.Argument(help="Compute tray (or head node, for host faults such as --freeze).")],
    xid: Annotated[Optional[int], typer.Option("--xid", help="Inject an XID event (with --gpu).")] = None,
    gpu: Annotated[Optional[int], typer.Option("--gpu", help="GPU index 0-3 for --xid / --ecc-uncorrectable.")] = None,
    fabric: Annotated[Optional[str], typer.Option("--fabric", help="in-progress | degraded | unhealthy")] = None,
    gpu_missing: Annotated[Optional[int], typer.Option("--gpu-missing", help="GPU index that vanishes.")] = None,
    nvlink_down: Annotated[Optional[str], typer.Option("--nvlink-down",
                                                       help="GPU:LINK reported inactive (GPU:all: every link).")] = None,
    ecc_uncorrectable: Annotated[Optional[int], typer.Option("--ecc-uncorrectable",
                                                             help="Uncorrectable DRAM ECC count (with --gpu).")] = None,
    unreachable: Annotated[bool, typer.Option("--unreachable", "--freeze",
                                              help="Every process of the host stops: open and new connections "
                                                   "get no answer (power loss, panic).")] = False,
    hang: Annotated[bool, typer.Option("--hang", help="Logins work, every command (open connections too) "
                                                      "never returns.")] = False,
    slow: Annotated[Optional[float], typer.Option("--slow", metavar="SECONDS", click_type=finite(min=0),
                                                  help="Every command starts SECONDS late.")] = None,
    sshd_restart: Annotated[bool, typer.Option("--sshd-restart", help="Event: open connections reset, sshd "
                                                                      "restarted.")] = False,
    reboot: Annotated[bool, typer.Option("--reboot", help="Event: the host stops and boots again (new boot id, "
                                                          "kern.log kept).")] = False,
    down_for: Annotated[Optional[float], typer.Option("--down-for", metavar="SECONDS", click_type=finite(min=0),
                                                      help="With --reboot: seconds the host stays off "
                                                           "(default 2).")] = None,
    slurmd_down: Annotated[bool, typer.Option("--slurmd-down", help="slurmd killed and kept down.")] = False,
    imex_crash: Annotated[bool, typer.Option("--imex-crash", help="The IMEX daemon killed.")] = False,
    slurmctld_down: Annotated[bool, typer.Option("--slurmctld-down",
                                                 help="Head node: slurmctld killed and kept down.")] = False,
    clear: Annotated[bool, typer.Option("--clear", help="Remove every fault on the tray.")] = False,
    # GPU-emulator faults (nvidia-smi and the kernel log)
    nonfatal: Annotated[bool, typer.Option("--nonfatal",
                                           help="With --xid/--xid-storm 144-150: the Nonfatal NVLink5 line.")] = False,
    recovery_action: Annotated[Optional[str], typer.Option(
        "--recovery-action", help="With --xid 154: reset | reboot | drain-reset (default).")] = None,
    fell_off_bus: Annotated[bool, typer.Option("--fell-off-bus",
                                               help="GPU (--gpu N) fell off the bus, logged without an Xid.")] = False,
    nvlink_flap: Annotated[Optional[str], typer.Option("--nvlink-flap",
                                                       help="GPU:LINK goes down and up every 3 s.")] = None,
    xid_storm: Annotated[Optional[int], typer.Option("--xid-storm",
                                                     help="CODE: hundreds of XID lines, more each second (--gpu N).")] = None,
    smi_hang: Annotated[bool, typer.Option("--smi-hang", help="nvidia-smi never returns (a wedged driver).")] = False,
    driver_branch: Annotated[Optional[str], typer.Option(
        "--driver-branch", help="535 | 570 | 580: nvidia-smi answers in that branch's XML shape.")] = None,
    nmx: Annotated[Optional[str], typer.Option(
        "--nmx", help="500 | timeout | slow | clear: the NMX-M emulator of the rack (TRAY may be a rack name).")] = None,
    leak: Annotated[Optional[str], typer.Option(
        "--leak", help="warning | critical: a leak detector of the tray's BMC reads so (Redfish LeakDetection).")] = None,
    leak_detector: Annotated[Optional[str], typer.Option(
        "--leak-detector", help="With --leak: which detector (default Chassis_0_LeakDetector_0_ColdPlate).")] = None,
    psu_fail: Annotated[bool, typer.Option(
        "--psu-fail", help="The tray's BMC reports its power subsystem Critical (a failed supply).")] = False,
    lab_dir: DirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Inject a fault into a lab tray; it shows wherever a real one would and stays until --clear.

    Example: mctl lab fault lab-r1-tray03 --xid 79 --gpu 0
    """
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    # --- NMX-M faults act on a rack (self-contained: mctl/lab/nmx_faults.py) ---
    if nmx is not None or clear:
        from mctl.errors import UsageError
        from mctl.lab import nmx_faults

        is_rack = nmx_faults.rack_of(_lab_dir(lab_dir), tray) == tray
        if nmx is not None or is_rack:
            if nmx is not None and clear:
                raise UsageError("--nmx cannot be combined with --clear", hint="use --nmx clear")
            if nmx is not None and (unreachable or hang or nonfatal or fell_off_bus or smi_hang or sshd_restart
                                    or reboot or slurmd_down or imex_crash or slurmctld_down or any(
                    v is not None for v in (xid, gpu, fabric, gpu_missing, nvlink_down, ecc_uncorrectable,
                                            recovery_action, nvlink_flap, xid_storm, driver_branch, slow,
                                            down_for))):
                raise UsageError("--nmx acts on the rack's NMX-M; give tray faults in a separate call")
            nres = nmx_faults.apply(_lab_dir(lab_dir), tray, "clear" if nmx is None else nmx, dry_run=dry_run)
            if want_json(json_):
                render.print_json({"rack": nres.rack, "dry_run": dry_run, "before": nres.before,
                                   "after": nres.after, "actions": nres.actions})
                return
            con = render.console()
            for act in nres.actions:
                con.print(f"{'would' if dry_run else 'did'}: {act}", markup=False, highlight=False)
            con.print(f"{nres.rack} nmx: {', '.join(nres.after) or 'no faults'}", markup=False, highlight=False)
            return
    # --- end of the NMX-M block ---

    # --- BMC faults act on the tray's Redfish data (self-contained: mctl/lab/bmc_faults.py); --clear clears them too ---
    if leak is not None or psu_fail or leak_detector is not None:
        from mctl.errors import UsageError
        from mctl.lab import bmc_faults

        if clear or unreachable or hang or nonfatal or fell_off_bus or smi_hang or sshd_restart or reboot \
                or slurmd_down or imex_crash or slurmctld_down or nmx is not None or any(
                v is not None for v in (xid, gpu, fabric, gpu_missing, nvlink_down, ecc_uncorrectable,
                                        recovery_action, nvlink_flap, xid_storm, driver_branch, slow, down_for)):
            raise UsageError("--leak and --psu-fail act on the tray's BMC; give other faults (or --clear) "
                             "in a separate call")
        bres = bmc_faults.apply(_lab_dir(lab_dir), tray, leak=leak, detector=leak_detector, psu_fail=psu_fail,
                                dry_run=dry_run)
        if want_json(json_):
            render.print_json({"host": bres.host, "dry_run": dry_run, "before": bres.before, "after": bres.after,
                               "actions": bres.actions})
            return
        con = render.console()
        for act in bres.actions:
            con.print(f"{'would' if dry_run else 'did'}: {act}", markup=False, highlight=False)
        con.print(f"{bres.host} bmc: {', '.join(bres.after) or 'no faults'}", markup=False, highlight=False)
        return
    # --- end of the BMC block ---

    req = FaultRequest(xid=xid, gpu=gpu, fabric=fabric, gpu_missing=gpu_missing, nvlink_down=nvlink_down,
                       ecc_uncorrectable=ecc_uncorrectable, unreachable=unreachable, hang=hang, clear=clear,
                       nonfatal=nonfatal, recovery_action=recovery_action, fell_off_bus=fell_off_bus,
                       nvlink_flap=nvlink_flap, xid_storm=xid_storm, smi_hang=smi_hang, driver_branch=driver_branch)
    # host faults (issue 15), set apart from the call above so other fault families can extend it
    req.slow, req.sshd_restart, req.reboot, req.down_for = slow, sshd_restart, reboot, down_for
    req.slurmd_down, req.imex_crash, req.slurmctld_down = slurmd_down, imex_crash, slurmctld_down
    res = control.fault(_lab_dir(lab_dir), tray, req, dry_run=dry_run)
    if want_json(json_):
        render.print_json({"host": res.host, "dry_run": dry_run, "before": res.before, "after": res.after,
                           "actions": res.actions})
        return
    con = render.console()
    verb = "would" if dry_run else "did"
    for act in res.actions:
        con.print(f"{verb}: {act}", markup=False, highlight=False)
    con.print(f"{res.host}: {', '.join(res.after) or 'no faults'}", markup=False, highlight=False)


@app.command()
def ssh(
    host: Annotated[str, typer.Argument(help="Lab host (tray or head node).")],
    command: Annotated[Optional[list[str]], typer.Argument(help="Command to run (after --).")] = None,
    lab_dir: DirOpt = None,
) -> None:
    """Open a shell on a lab host with the lab's key and known_hosts, or run a command there.

    Example: mctl lab ssh lab-r1-tray01 -- nvidia-smi -L
    """
    from mctl.lab import control

    argv = control.ssh_argv(_lab_dir(lab_dir), host, list(command or []),
                            tty=not command and sys.stdin.isatty())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
