"""mctl lab up|status|down|fault|ssh: the virtual NVL72 rack."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, HangOpt, JsonOpt, LabDirOpt, SlowOpt, finite

app = typer.Typer(
    help="The virtual NVL72 lab: real Linux hosts (namespaces, overlay roots, sshd, Slurm) with emulated GPUs.\n\n"
         "Example: mctl lab up --racks 1 --compute-trays 18",
    no_args_is_help=True,
)



def _lab_dir(value: Path | None) -> Path:
    return (value or options().state_dir / "lab").resolve()


def _dir_flag(lab_dir: Path) -> str:
    default = (options().state_dir / "lab").resolve()
    return "" if lab_dir == default else f" --dir {lab_dir}"


@app.command()
def up(
    racks: Annotated[int, typer.Option("--racks", min=1, max=99, help="Racks (each its own NVLink domain).")] = 1,
    trays: Annotated[int, typer.Option("--compute-trays", min=1, max=18, help="Compute trays per rack.")] = 18,
    switch_trays: Annotated[int, typer.Option("--switch-trays", min=0, max=9,
                                              help="NVLink switch trays per rack: each is a BMC only "
                                                   "(Redfish, the real switch tray's tree), no host.")] = 0,
    lab_dir: LabDirOpt = None,
    net: Annotated[int, typer.Option("--net", min=1, max=254,
                                     help="Second address octet: hosts get 127.NET.RACK.TRAY.")] = 77,
    timeout: Annotated[float, typer.Option("--start-timeout", click_type=finite(),
                                           help="Seconds to wait for every host's sshd.")] = 180.0,
    pre_tooled: Annotated[Optional[bool], typer.Option("--pre-tooled/--os-only",
                                             help="--os-only (the default): trays start with the OS image only, "
                                                  "as they arrive; the GPU tools come with provisioning, through "
                                                  "the lab's apt repository. --pre-tooled: the GPU tools' "
                                                  "packages are installed already, as in an image that "
                                                  "carries them. With --fleet: pre-tooled.",
                                             show_default=False)] = None,
    fleet: Annotated[bool, typer.Option("--fleet",
                                        help="Fleet mode: per rack one host whose sshd answers as every "
                                             "tray and the head node (by the address reached) and one BMC "
                                             "process answering as every BMC; ~30x less memory per tray, "
                                             "no Slurm, no host or service faults (docs/lab.md, "
                                             "\"Fleet mode\").")] = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Start the lab: per rack, N compute trays and a head node, each a real host with its own sshd.

    Writes an inventory (mctl.yml), an SSH key and a known_hosts file into the lab folder,
    so every other command works on the lab as on any site. The image is built on first use
    (a few minutes, then cached).

    Example: mctl lab up --racks 1 --compute-trays 18
    """
    from mctl.lab import control, image
    from mctl.lab.layout import LabLayout
    from mctl.lab.site import IMAGE_NAME, REPO_IMAGES

    from mctl.errors import UsageError

    out = render.output(json_)
    path = _lab_dir(lab_dir)
    if fleet and pre_tooled is False:
        raise UsageError("--fleet starts the trays pre-tooled (their rack's one root holds the GPU tools); "
                         "--os-only cannot be given with it",
                         hint="mctl lab up --fleet --racks N; provisioning through apt needs the full lab")
    pre_tooled = bool(fleet if pre_tooled is None else pre_tooled)
    if dry_run:
        layout = LabLayout("lab", racks, trays, net, switch_trays)
        spec = image.load_spec(REPO_IMAGES / f"{IMAGE_NAME}.yml")
        plan = {"dir": str(path), "image": spec.name, "image_cached": image.is_built(spec),
                "image_dir": str(spec.cache_dir),
                "hosts": [{"name": h.name, "kind": h.kind, "address": h.address} for h in layout.hosts()],
                "switch_trays": [{"name": sw.name, "address": sw.address, "bmc": layout.switch_bmc_address(sw)}
                                 for sw in layout.switches()],
                "inventory": str(path / control.INVENTORY), "fleet": fleet, "os_only": not pre_tooled}
        out.result({"dry_run": True, "plan": plan}, lambda: out.lines(
            [f"would start {len(plan['hosts'])} hosts"
             + (f" as {racks} fleet rack host(s)" if fleet else "") + f" in {path} (image {spec.name}: "
             f"{'cached' if plan['image_cached'] else 'to build'} at {spec.cache_dir})"]
            + [f"  {h['name']:<18} {h['kind']:<5} {h['address']}" for h in plan["hosts"]]
            + [f"  {sw['name']:<18} {'switch':<6} BMC {sw['bmc']} (no host)" for sw in plan["switch_trays"]]))
        return
    result = control.up(path, racks=racks, trays=trays, net=net, timeout=timeout, os_only=not pre_tooled,
                        switch_trays=switch_trays, fleet=fleet, progress=(lambda _m: None) if out.json else out.event)
    flag = _dir_flag(result.dir)
    for dest in result.missing_files:
        out.warn(f"{dest} not installed: its source is not in this checkout yet")
    if out.json:
        out.result({"dir": str(result.dir), "inventory": str(result.inventory),
                    "seconds": round(result.seconds, 2), "image_dir": str(result.image_dir),
                    "racks": racks, "trays": trays, "switch_trays": switch_trays, "os_only": not pre_tooled, "fleet": fleet,
                    "missing_files": result.missing_files,
                    "hosts": [{"name": h.name, "kind": h.kind, "rack": h.rack, "address": h.address}
                              for h in result.layout.hosts()]})
        return
    first = result.layout.trays_of(result.layout.rack_names()[0])[0].name
    lines = [
        f"lab up: {racks} rack(s) x {trays} trays + head node, {len(result.layout.hosts())} hosts "
        + (f"and {switch_trays} switch tray BMC(s) per rack " if switch_trays else "")
        + (f"as {racks} fleet rack host(s) (sshd on every address, one BMC process per rack) " if fleet else "")
        + f"in {result.seconds:.1f} s ({result.dir})",
        f"inventory: {result.inventory}",
        ("trays: pre-tooled (the GPU tools' packages installed)" if pre_tooled else
         "trays: OS only, as they arrive (provisioning installs the GPU tools: mctl rack bring-up lab-r1)"),
        "",
        "use it like any site:",
        f"  export MCTL_INVENTORY={result.dir}",
        "  mctl inventory show",
        f"  mctl lab ssh {first}{flag}",
        f"  mctl lab ssh {first}{flag} -- nvidia-smi -L" + ("" if pre_tooled else "   (after provisioning)"),
        f"  mctl lab fault gpu {first}{flag} --xid 79 --gpu 0",
        f"  mctl lab status{flag}",
        f"  mctl lab down{flag}",
    ]
    out.lines(lines)


@app.command()
def status(lab_dir: LabDirOpt = None, json_: JsonOpt = False) -> None:
    """Hosts, addresses, processes and faults of the lab, read from the running system.

    Example: mctl lab status --json
    """

    from mctl.lab import control

    out = render.output(json_)
    path = _lab_dir(lab_dir)
    st = control.status(path)
    if out.json:
        out.result(st)
        return
    if not st["configured"]:
        extra = f" ({len(st['stray_processes'])} leftover processes: run 'mctl lab down{_dir_flag(path)}')" \
            if st["stray_processes"] else ""
        out.line(f"no lab in {path}{extra}")
        return
    out.line(f"lab {st['name']} in {st['dir']}: {st['hosts_running']}/{st['hosts_total']} hosts running, "
             f"{st['processes']} processes, {st['rss_kib'] / 1024:.0f} MiB resident")
    out.line(f"inventory: {st['inventory']}")
    img = st.get("image") or {}
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted((img.get("packages") or {}).items()))
    out.line(f"image: {img.get('name')} ({img.get('dir')}){': ' + pkgs if pkgs else ''}")
    out.table(None, ("host", "kind", "address", "state", "ssh", "procs", "faults"),
              [(h["name"], h["kind"], h["address"], "running" if h["running"] else "down", h["ssh"],
                str(len(h["processes"])), ", ".join(h["faults"]) or "-") for h in st["hosts"]], boxed=True)
    for fr in st.get("fleet_racks", []):
        out.line(f"{fr['rack']} fleet host {fr['host']}: {'running' if fr['running'] else 'down'}, sshd {fr['sshd']}, "
                 f"{fr['processes']} processes, {fr['rss_kib'] / 1024:.0f} MiB; BMC process "
                 f"{fr['bmc_pid'] or 'down'} ({fr['bmc_rss_kib'] / 1024:.0f} MiB)")
    for svc in st["rack_services"]:
        out.line(f"{svc['rack']} {svc['name']} {svc['address']}:{svc['port']} "
                 f"{'running' if svc['running'] else 'down'}"
                 f"{' (' + ', '.join(svc['faults']) + ')' if svc.get('faults') else ''}")
    for sw in st.get("switch_trays", []):
        out.line(f"{sw['name']} switch tray BMC {sw['bmc']} {'listening' if sw['bmc_listening'] else 'down'}"
                 f"{' (' + ', '.join(sw['faults']) + ')' if sw['faults'] else ''}")


@app.command()
def down(lab_dir: LabDirOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Stop every lab host and service and remove the lab folder's hosts, keys and inventory.

    Leaves no process, mount or overlay behind. Nothing running is not an error.

    Example: mctl lab down
    """
    from mctl.lab import control

    out = render.output(json_)
    path = _lab_dir(lab_dir)
    if dry_run:
        running = control.lab_processes(path)
        plan = {"dir": str(path), "processes": len(running), "remove": path.is_dir()}
        out.result({"dry_run": True, "plan": plan},
                   lambda: out.line(f"would stop {len(running)} lab processes and remove the lab files in {path}"))
        return
    result = control.down(path, progress=(lambda _m: None) if out.json else out.event)
    out.result({"dir": str(result.dir), "stopped_processes": result.stopped, "removed": result.removed,
                "seconds": round(result.seconds, 2)},
               lambda: out.line(f"no lab in {path}; nothing to do" if not result.stopped and not result.removed
                                else f"lab down: stopped {result.stopped} processes, removed {path} "
                                     f"in {result.seconds:.1f} s"))


# --- mctl lab fault TARGET ... -------------------------------------------------------------------

class _FaultTargets(TyperGroup):
    """`mctl lab fault TARGET NAME [OPTIONS]`. The flat form it replaced (`mctl lab fault TRAY --xid ...`,
    docs/decisions.md D63) is answered with the command that does it now, not a bare "no such command"."""

    RENAMED = {"--leak-detector": "--detector"}

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            from mctl.errors import UsageError

            raise UsageError(f"{args[0]!r} is not a fault target (one of {', '.join(self.commands)})",
                             hint=self._now(args))
        return super().resolve_command(ctx, args)

    def _now(self, args: list[str]) -> str:
        """The target-first command line for the flat form *args* (NAME, then its flags)."""
        name, rest = args[0], [self.RENAMED.get(a, a) for a in args[1:]]
        shared = set.intersection(*({o for p in cmd.params for o in p.opts} for cmd in self.commands.values()))
        for i, arg in enumerate(rest):
            flag = arg.split("=", 1)[0]
            if flag in shared:
                continue
            for target, cmd in self.commands.items():
                if flag == f"--{target}":               # --clear, --nmx KIND
                    value = rest[i + 1:i + 2] if target == "nmx" and "=" not in arg else []
                    kept = rest[:i] + ([arg.split("=", 1)[1]] if "=" in arg else value) + rest[i + 1 + len(value):]
                    return f"the target comes first now: mctl lab fault {target} {' '.join([name, *kept])}"
                if any(flag in p.opts for p in cmd.params):
                    return f"the target comes first now: mctl lab fault {target} {' '.join([name, *rest])}"
        return "e.g. mctl lab fault gpu lab-r1-tray01 --xid 79 --gpu 0; see 'mctl lab fault --help'"


fault_app = typer.Typer(
    cls=_FaultTargets, no_args_is_help=True,
    help="Inject a fault into the lab, by target; it shows wherever a real one would and stays until "
         "'mctl lab fault clear'.\n\n"
         "Targets: gpu (a compute tray's GPUs: nvidia-smi, kern.log), host (a tray's or head node's OS: SSH, "
         "processes), service (its daemons), bmc (a compute or switch tray's BMC: Redfish), nmx (a rack's "
         "NMX-M). Every fault command takes --dry-run and --json.\n\n"
         "Example: mctl lab fault gpu lab-r1-tray03 --xid 79 --gpu 0")
app.add_typer(fault_app, name="fault")


def _show_fault(res, dry_run: bool, json_: bool) -> None:
    """One fault command's result: what was (or would be) done, then the target's faults now."""
    from mctl.lab.bmc_faults import BmcFaultResult
    from mctl.lab.nmx_faults import NmxFaultResult

    if isinstance(res, NmxFaultResult):
        key, name, label = "rack", res.rack, f"{res.rack} nmx"
    else:
        key, name = "host", res.host
        label = f"{res.host} bmc" if isinstance(res, BmcFaultResult) else res.host
    out = render.output(json_)
    out.result({key: name, "dry_run": dry_run, "before": res.before, "after": res.after, "actions": res.actions},
               lambda: out.lines([f"{'would' if dry_run else 'did'}: {act}" for act in res.actions]
                                 + [f"{label}: {', '.join(res.after) or 'no faults'}"]))


def _inject(lab_dir: Path | None, host: str, req, dry_run: bool, json_: bool) -> None:
    from mctl.lab import inject

    _show_fault(inject.fault(_lab_dir(lab_dir), host, req, dry_run=dry_run), dry_run, json_)


@fault_app.command("gpu")
def fault_gpu(
    tray: Annotated[str, typer.Argument(help="Compute tray.")],
    xid: Annotated[Optional[int], typer.Option("--xid", metavar="CODE",
                                               help="An XID event on --gpu N: its kern.log line and its lasting "
                                                    "effect in nvidia-smi (79: off the bus).")] = None,
    gpu: Annotated[Optional[int], typer.Option("--gpu", metavar="N", help="GPU index 0-3 for --xid, --xid-storm, "
                                               "--ecc-uncorrectable, --fell-off-bus.")] = None,
    nonfatal: Annotated[bool, typer.Option("--nonfatal",
                                           help="With --xid/--xid-storm 144-150: the Nonfatal NVLink5 line.")] = False,
    recovery_action: Annotated[Optional[str], typer.Option(
        "--recovery-action", metavar="ACTION", help="With --xid 154: reset | reboot | drain-reset (default).")] = None,
    ecc_uncorrectable: Annotated[Optional[int], typer.Option("--ecc-uncorrectable", metavar="COUNT",
                                                             help="Uncorrectable DRAM ECC count (with --gpu).")] = None,
    fabric: Annotated[Optional[str], typer.Option("--fabric", metavar="STATE",
                                                  help="in-progress | degraded | unhealthy")] = None,
    gpu_missing: Annotated[Optional[int], typer.Option("--gpu-missing", metavar="N",
                                                       help="GPU index that vanishes.")] = None,
    fell_off_bus: Annotated[bool, typer.Option("--fell-off-bus",
                                               help="GPU (--gpu N) fell off the bus, logged without an Xid.")] = False,
    nvlink_down: Annotated[Optional[str], typer.Option("--nvlink-down", metavar="GPU:LINK",
                                                       help="Link reported inactive (GPU:all: every link).")] = None,
    nvlink_flap: Annotated[Optional[str], typer.Option("--nvlink-flap", metavar="GPU:LINK",
                                                       help="Link goes down and up every 3 s.")] = None,
    xid_storm: Annotated[Optional[int], typer.Option("--xid-storm", metavar="CODE",
                                                     help="Hundreds of XID lines, more each second (--gpu N).")] = None,
    smi_hang: Annotated[bool, typer.Option("--smi-hang", help="nvidia-smi never returns (a wedged driver).")] = False,
    driver_branch: Annotated[Optional[str], typer.Option(
        "--driver-branch", metavar="BRANCH",
        help="535 | 570 | 580: nvidia-smi answers in that branch's XML shape.")] = None,
    tool_fault: Annotated[Optional[str], typer.Option(
        "--tool-fault", metavar="TOOL:MODE",
        help="dcgmi, all_reduce_perf or nvidia-bug-report.sh: hang, crash, garbage or truncated.")] = None,
    nvlink_errors: Annotated[Optional[str], typer.Option(
        "--nvlink-errors", metavar="GPU:LINK:RATE",
        help="The link's error counter (nvidia-smi nvlink -e, Rx Errors) grows RATE a second.")] = None,
    clock_event: Annotated[Optional[str], typer.Option(
        "--clock-event", metavar="GPU:REASON",
        help="A clock-event reason active in nvidia-smi -q -x: hw-slowdown | hw-power-brake | hw-thermal | "
             "sw-thermal | sw-power-cap.")] = None,
    gpu_process: Annotated[Optional[str], typer.Option(
        "--gpu-process", metavar="GPU:NAME",
        help="A compute process NAME holds the GPU (nvidia-smi --query-compute-apps lists it).")] = None,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """A fault of a compute tray's GPUs, as nvidia-smi and the kernel log show it; several may be combined.

    Example: mctl lab fault gpu lab-r1-tray03 --xid 79 --gpu 0
    """
    from mctl.lab.faults import FaultRequest

    _inject(lab_dir, tray, FaultRequest(
        target="gpu", xid=xid, gpu=gpu, nonfatal=nonfatal, recovery_action=recovery_action,
        ecc_uncorrectable=ecc_uncorrectable, fabric=fabric, gpu_missing=gpu_missing, fell_off_bus=fell_off_bus,
        nvlink_down=nvlink_down, nvlink_flap=nvlink_flap, xid_storm=xid_storm, smi_hang=smi_hang,
        driver_branch=driver_branch, tool_fault=tool_fault, nvlink_errors=nvlink_errors, clock_event=clock_event,
        gpu_process=gpu_process), dry_run, json_)


@fault_app.command("host")
def fault_host(
    host: Annotated[str, typer.Argument(help="Compute tray or head node.")],
    freeze: Annotated[bool, typer.Option("--freeze", "--unreachable",
                                         help="Every process of the host stops: open and new connections get no "
                                              "answer (power loss, panic).")] = False,
    hang: HangOpt = False,
    slow: SlowOpt = None,
    sshd_restart: Annotated[bool, typer.Option("--sshd-restart", help="Event: open connections reset, sshd "
                                                                      "restarted.")] = False,
    reboot: Annotated[bool, typer.Option("--reboot", help="Event: the host stops and boots again (new boot id, "
                                                          "kern.log kept).")] = False,
    down_for: Annotated[Optional[float], typer.Option("--down-for", metavar="SECONDS", click_type=finite(min=0),
                                                      help="With --reboot: seconds the host stays off "
                                                           "(default 2).")] = None,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """A fault of a host's OS, as SSH sees it: frozen, hung or slow commands, or the events sshd restart and reboot.

    Example: mctl lab fault host lab-r1-tray03 --freeze
    """
    from mctl.lab.faults import FaultRequest

    _inject(lab_dir, host, FaultRequest(target="host", unreachable=freeze, hang=hang, slow=slow,
                                        sshd_restart=sshd_restart, reboot=reboot, down_for=down_for), dry_run, json_)


@fault_app.command("service")
def fault_service(
    host: Annotated[str, typer.Argument(help="Compute tray (slurmd, IMEX) or head node (slurmctld).")],
    slurmd_down: Annotated[bool, typer.Option("--slurmd-down", help="slurmd killed and kept down.")] = False,
    imex_crash: Annotated[bool, typer.Option("--imex-crash", help="The IMEX daemon killed.")] = False,
    slurmctld_down: Annotated[bool, typer.Option("--slurmctld-down",
                                                 help="Head node: slurmctld killed and kept down.")] = False,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """A daemon of a host crashed: killed, and the Slurm daemons kept from starting until cleared.

    Example: mctl lab fault service lab-r1-tray03 --slurmd-down
    """
    from mctl.lab.faults import FaultRequest

    _inject(lab_dir, host, FaultRequest(target="service", slurmd_down=slurmd_down, imex_crash=imex_crash,
                                        slurmctld_down=slurmctld_down), dry_run, json_)


@fault_app.command("bmc")
def fault_bmc(
    tray: Annotated[str, typer.Argument(help="Compute tray or switch tray.")],
    leak: Annotated[Optional[str], typer.Option(
        "--leak", metavar="LEVEL",
        help="warning | critical: a leak detector reads so (Redfish LeakDetection).")] = None,
    detector: Annotated[Optional[str], typer.Option(
        "--detector", metavar="NAME", help="With --leak: which detector (default: a compute tray's "
                                           "Chassis_0_LeakDetector_0_ColdPlate, a switch tray's leakage1).")] = None,
    psu_fail: Annotated[bool, typer.Option(
        "--psu-fail", help="A compute tray's BMC reports its power subsystem Critical (a failed supply).")] = False,
    hang: HangOpt = False,
    slow: SlowOpt = None,
    no_events: Annotated[bool, typer.Option(
        "--no-events", help="The BMC offers no EventService (ServiceEnabled false): no subscription, no event "
                            "pushed; its leaks are seen by polling alone.")] = False,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """A fault of a tray's BMC, as Redfish shows it: a leak, a failed supply, a hung or a slow BMC, no EventService.

    Example: mctl lab fault bmc lab-r1-tray03 --leak critical
    """
    from mctl.lab import bmc_faults

    _show_fault(bmc_faults.apply(_lab_dir(lab_dir), tray, leak=leak, detector=detector, psu_fail=psu_fail, hang=hang,
                                 slow=slow, dry_run=dry_run, no_events=no_events), dry_run, json_)


@fault_app.command("nmx")
def fault_nmx(
    rack: Annotated[str, typer.Argument(help="Rack (or one of its trays, or a switch tray).")],
    kind: Annotated[str, typer.Argument(help="500 (every request fails) | timeout (never answered) "
                                             "| slow (answers 3 s late) | switch-unhealthy | switch-missing-nvlink "
                                             "| port-down | partition-degraded | clear.")],
    switch: Annotated[Optional[int], typer.Option("--switch", help="Switch tray number, from 1 (switch-unhealthy, "
                                                  "switch-missing-nvlink, port-down; a switch tray target names it)."
                                                  )] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="The switch's port number (port-down).")] = None,
    partition: Annotated[Optional[str], typer.Option("--nmx-partition", help="NMX-M partition name "
                                                     "(partition-degraded).")] = None,
    health: Annotated[Optional[str], typer.Option("--health", help="DEGRADED (default) | DEGRADED_BANDWIDTH | "
                                                  "UNHEALTHY (partition-degraded).")] = None,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """A fault of a rack's NMX-M: every request failing, never answered, or answered late; or of its switch side:
    a switch tray UNHEALTHY, a switch port down, a partition DEGRADED.

    Example: mctl lab fault nmx lab-r1 timeout; mctl lab fault nmx lab-r1 port-down --switch 2 --port 1
    """
    from mctl.lab import nmx_faults

    _show_fault(nmx_faults.apply(_lab_dir(lab_dir), rack, kind, switch=switch, port=port, partition=partition,
                                 health=health, dry_run=dry_run), dry_run, json_)


@fault_app.command("clear")
def fault_clear(
    name: Annotated[str, typer.Argument(help="Host (tray or head node), switch tray, or rack.")],
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="TARGET",
        help="Only these faults: gpu | host | service | bmc | nmx (the rack's). Default: all of a host's (a compute "
             "tray's BMC too), a switch tray's BMC, a rack's NMX-M.")] = None,
    lab_dir: LabDirOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Remove faults: every fault of a host and its BMC, of a switch tray's BMC, or of a rack's NMX-M.

    Example: mctl lab fault clear lab-r1-tray03
    """
    from mctl.lab import inject

    _show_fault(inject.clear(_lab_dir(lab_dir), name, target=target, dry_run=dry_run), dry_run, json_)


@app.command()
def ssh(
    host: Annotated[str, typer.Argument(help="Lab host (tray or head node).")],
    command: Annotated[Optional[list[str]], typer.Argument(help="Command to run (after --).")] = None,
    lab_dir: LabDirOpt = None,
) -> None:
    """Open a shell on a lab host with the lab's key and known_hosts, or run a command there.

    Example: mctl lab ssh lab-r1-tray01 -- nvidia-smi -L
    """
    from mctl.lab import control

    argv = control.ssh_argv(_lab_dir(lab_dir), host, list(command or []),
                            tty=not command and sys.stdin.isatty())
    render.output().flush()             # what was written goes out before ssh replaces this process
    os.execvp(argv[0], argv)
