"""mctl partition list|show|templates|create|delete|apply: NVLink partitions through NMX-Manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import (ByLocationOpt, DrainOpt, DryRunOpt, ForceOpt, JsonOpt, NmxOnlyOpt, NoApplyOpt, RackArg,
                              ResumeOpt, TraysOpt, WaitOpt, YesOpt)
from mctl.errors import PartialFailure, UsageError

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

app = typer.Typer(help="NVLink partitions: desired in the inventory, applied through NMX-Manager.\n\n"
                       "Example: mctl -i inventories/lab partition create lab-r1 --template 2x9",
                  no_args_is_help=True)

def _rack(site: "Site", name: str) -> "Rack":
    from mctl.change.service import rack_of
    return rack_of(site, name)


# ------------------------------------------------------------------ reports

@app.command("list")
def list_(rack: Annotated[Optional[str], typer.Argument(help="Only this rack.", show_default=False)] = None,
          offline: Annotated[bool, typer.Option("--offline", help="Show the inventory only; do not ask NMX-M.")]
          = False,
          json_: JsonOpt = False) -> None:
    """List partitions: what the inventory wants next to what NMX-M holds.

    States: in-sync, differs, missing (in the inventory, not on NMX-M), unmanaged (on NMX-M,
    not in the inventory), default (NMX-M's Default Partition, ID 32766), declared (--offline
    or no NMX-M endpoint). Exit 3 when an NMX-M could not be asked.

    Example: mctl -i inventories/lab partition list lab-r1
    """
    from mctl.fabric.report import partition_report

    out = render.output(json_)
    site = options().site()
    racks = [_rack(site, rack)] if rack else list(site.racks.values())
    report = partition_report(site, racks, offline=offline)
    errors = report.errors
    out.result(report.to_dict(), lambda: out.table(
        None, ("rack", "partition", "state", "id", "health", "gpus", "trays (NMX-M)", "trays (inventory)"),
        [(row.rack, row.name, row.state, str(row.partition_id or "-"), row.health or "-", str(row.gpus),
          row.trays if row.state not in ("declared", "missing") else "-", row.desired or "-") for row in report.rows],
        boxed=True))
    for name, msg in errors.items():
        out.warn(f"rack {name}: {msg}", in_result=True)
    if errors:
        raise PartialFailure(f"NMX-M could not be asked for {len(errors)} of {len(racks)} racks "
                             f"({', '.join(errors)})", hint="the inventory's partitions are shown as 'declared'")


@app.command()
def show(rack: RackArg, name: Annotated[str, typer.Argument(help="Partition name.", show_default=False)],
         json_: JsonOpt = False) -> None:
    """Show one partition: the inventory's trays and, from NMX-M, its ID, health and members per tray.

    Example: mctl -i inventories/lab partition show lab-r1 p0 --json
    """
    from mctl.fabric.report import partition_detail

    out = render.output(json_)
    r = _rack(options().site(), rack)
    data = partition_detail(options().site(), r, name)
    found = data.pop("found")
    if out.json:
        out.result(data)
        return
    from mctl.cli.partition_change import render_detail
    render_detail(out, r, name, data, found)


@app.command()
def templates(rack: Annotated[Optional[str], typer.Argument(help="Show what each template makes of this rack.",
                                                            show_default=False)] = None,
              json_: JsonOpt = False) -> None:
    """List partition templates (all, 2x9, 3x6, 6x3, 18x1) and what they make of a rack.

    A template names equal partitions of an 18-tray rack; on a partly populated rack it divides
    the trays the rack has, and does not fit when they do not divide.

    Example: mctl -i inventories/lab partition templates lab-r1
    """
    from mctl.fabric.partitions import TEMPLATES, template_table

    if rack:
        r = _rack(options().site(), rack)
        rows = template_table(r)
        title = f"templates for rack {rack} ({len(r.compute)} compute trays)"
    else:
        rows = [{"template": t, "partitions": c, "trays_each": 18 // c, "fits": True,
                 "result": f"{c} partition{'s' if c > 1 else ''} of {18 // c} tray{'s' if 18 // c > 1 else ''} "
                           "(full NVL72 rack)"} for t, c in TEMPLATES.items()]
        title = "templates (for a full 18-tray rack; give RACK for a partly populated one)"
    out = render.output(json_)
    out.result({"rack": rack, "templates": rows},
               lambda: out.lines([title] + [f"  {row['template']:<5} {row['result']}" for row in rows]))


# ------------------------------------------------------------------ changes (through mctl.change.service)

def _run(req, json_: bool) -> None:
    """Run the change through the change service with the terminal's UI, then render its result."""
    from mctl.change.service import execute
    from mctl.cli import partition_change as change

    ui = change.TerminalUI(render.output(json_), yes=req.yes)
    ui.render(execute(options().site(), req, options().state_dir, ui))


@app.command()
def apply(rack: Annotated[Optional[str], typer.Argument(help="Only this rack (default: every rack with an "
                                                              "NMX-M endpoint).", show_default=False)] = None,
          prune: Annotated[bool, typer.Option("--prune", help="Also delete NMX-M partitions the inventory does "
                                                              "not declare.")] = False,
          by_location: ByLocationOpt = False, drain: DrainOpt = False, wait: WaitOpt = None,
          force: ForceOpt = False, yes: YesOpt = False, nmx_only: NmxOnlyOpt = False, resume: ResumeOpt = False,
          dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Make NMX-M's partitions match the inventory, and every layer follow: create, update, delete, in a safe order.

    A partition's name is its identity; identical partitions are left alone, so a second run
    changes nothing. Partitions on NMX-M that the inventory does not declare are left alone
    unless they hold trays a declared partition needs (then they are deleted) or --prune is given.

    The plan covers every layer that follows the partitions (per tray before and after, NMX-M,
    IMEX node lists and restarts, Slurm blocks, Kubernetes labels) and the jobs and pods on the
    trays it touches: with running work there the change is refused (exit 2) unless --drain or
    --force (docs/partitions.md).

    Every change runs journaled, in this order: hold the affected trays in Slurm, record, NMX-M,
    wait for the GPUs' cliques, IMEX files and restart (affected trays only), IMEX domains UP,
    Slurm topology.conf and reconfigure, verify 'scontrol show topology', Kubernetes labels,
    release. A failed step rolls every layer back to the partitions before; a stopped change
    (kill, power cut, a rollback that could not finish) is finished by --resume.

    Example: mctl -i inventories/lab partition apply lab-r1 --dry-run
    """
    from mctl.change.request import ChangeRequest, check_consent
    from mctl.fabric.service import kind_of

    check_consent(drain, wait, force, yes)
    options().site()
    if resume:
        return _resume(rack, json_, dry_run=dry_run, other=prune or by_location or drain or force or yes or nmx_only)
    _run(ChangeRequest("apply", rack=rack, prune=prune, kind=kind_of(by_location), drain=drain, wait=wait,
                       force=force, yes=yes, nmx_only=nmx_only, dry_run=dry_run), json_)


def _resume(rack: str | None, json_: bool, *, dry_run: bool, other: bool) -> None:
    from mctl.change.request import ChangeRequest

    if rack is None:
        raise UsageError("--resume needs the rack", hint="e.g. 'mctl partition apply lab-r1 --resume'")
    if dry_run or other:
        raise UsageError("--resume continues the last change with its own options; it takes no other option",
                         hint=f"'mctl partition apply {rack} --resume'")
    _run(ChangeRequest("resume", rack=rack), json_)


@app.command()
def create(rack: RackArg,
           name: Annotated[Optional[str], typer.Argument(help="Partition name (with --trays or --gpus).",
                                                        show_default=False)] = None,
           template: Annotated[Optional[str], typer.Option("--template", help="all, 2x9, 3x6, 6x3 or 18x1: "
                                                           "replace the rack's partitions with equal ones.")] = None,
           trays: TraysOpt = None,
           gpus: Annotated[Optional[List[str]], typer.Option("--gpus", help="TRAYS:GPUS members, e.g. "
                                                            "lab-r1-tray01:0-1 (needs --gpu-granularity).")] = None,
           gpu_granularity: Annotated[bool, typer.Option("--gpu-granularity", help="Allow a partition that "
                                                         "splits a tray (IMEX and Slurm cannot follow it).")] = False,
           no_apply: NoApplyOpt = False, by_location: ByLocationOpt = False, drain: DrainOpt = False, wait: WaitOpt = None,
           force: ForceOpt = False, yes: YesOpt = False, nmx_only: NmxOnlyOpt = False, dry_run: DryRunOpt = False,
           json_: JsonOpt = False) -> None:
    """Create partitions: record them in the inventory (mctl.yml, previous copy in mctl.yml.bak), then apply.

    The plan covers every layer (see 'partition apply'); running jobs or pods on the trays the
    change touches refuse it (exit 2, nothing recorded) unless --drain or --force.

    --template replaces all of the rack's partitions; NAME --trays adds one. --gpus with
    --gpu-granularity creates a partition of single GPUs on NMX-M directly: the inventory holds
    whole trays only, so it is not recorded (and 'partition apply --prune' would remove it).

    Example: mctl -i inventories/lab partition create lab-r1 --template 2x9
    """
    from mctl.change.request import ChangeRequest, check_consent
    from mctl.change.service import rack_of
    from mctl.fabric.partitions import check_partition_name, parse_gpu_members, parse_trays
    from mctl.fabric.service import kind_of

    r = rack_of(options().site(), rack)
    given = [x for x in (template, trays, gpus) if x]
    if len(given) != 1:
        raise UsageError("give exactly one of --template, --trays or --gpus",
                         hint=f"e.g. 'mctl partition create {rack} --template 2x9' or "
                              f"'mctl partition create {rack} p0 --trays {r.compute[0].name if r.compute else 'TRAYS'}'")
    if template and name:
        raise UsageError("a template names its partitions itself; drop NAME", hint="names: all, or p0, p1, ...")
    if (trays or gpus) and not name:
        raise UsageError("NAME is required with --trays or --gpus")
    if name is not None:
        check_partition_name(name)
    check_consent(drain, wait, force, yes)
    _run(ChangeRequest("create", rack=rack, name=name, template=template,
                       trays=parse_trays(r, trays) if trays else (),
                       gpus=tuple(parse_gpu_members(r, gpus)) if gpus else (), gpu_granularity=gpu_granularity,
                       no_apply=no_apply, kind=kind_of(by_location), drain=drain, wait=wait, force=force, yes=yes,
                       nmx_only=nmx_only, dry_run=dry_run), json_)


@app.command()
def delete(rack: RackArg, name: Annotated[str, typer.Argument(help="Partition name.", show_default=False)],
           no_apply: NoApplyOpt = False, drain: DrainOpt = False, wait: WaitOpt = None, force: ForceOpt = False, yes: YesOpt = False,
           nmx_only: NmxOnlyOpt = False, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Delete a partition: remove it from the inventory and from NMX-M; its GPUs return to the default partition.

    The plan covers every layer (see 'partition apply'); running jobs or pods on its trays
    refuse it (exit 2) unless --drain or --force.

    Example: mctl -i inventories/lab partition delete lab-r1 p1 --dry-run
    """
    from mctl.change.request import ChangeRequest, check_consent
    from mctl.change.service import rack_of

    rack_of(options().site(), rack)
    check_consent(drain, wait, force, yes)
    _run(ChangeRequest("delete", rack=rack, name=name, no_apply=no_apply, drain=drain, wait=wait, force=force,
                       yes=yes, nmx_only=nmx_only, dry_run=dry_run), json_)


# ------------------------------------------------------------------ around a failed tray

TrayArg = Annotated[str, typer.Argument(help="Compute tray (its inventory name).", show_default=False)]


@app.command()
def isolate(tray: TrayArg,
            to: Annotated[str, typer.Option("--to", help="quarantine: a one-tray partition of its own "
                                            "(quarantine-TRAY, its own IMEX domain and Slurm block); default: "
                                            "out of every partition (NMX-M's default partition).")] = "quarantine",
            drain: DrainOpt = False, wait: WaitOpt = None, force: ForceOpt = False, yes: YesOpt = False,
            dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Move a drained tray out of its partition, so the others keep a healthy IMEX domain and a matching block.

    The tray must be drained (or down) in Slurm first. The rest of its partition keeps its name
    with one tray less: their IMEX node list no longer names the failed tray, and Slurm's block
    matches them. The same journaled change as 'partition create' (every layer, rollback,
    --resume); the failed tray itself need not answer. 'partition restore TRAY' puts it back.

    Example: mctl -i inventories/lab partition isolate lab-r1-tray07 --dry-run
    """
    from mctl.change.request import ChangeRequest, check_consent
    from mctl.change.service import rack_of_tray

    rack_of_tray(options().site(), tray)
    check_consent(drain, wait, force, yes)
    _run(ChangeRequest("isolate", tray=tray, to=to, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run),
         json_)


@app.command()
def restore(tray: TrayArg, drain: DrainOpt = False, wait: WaitOpt = None, force: ForceOpt = False,
            yes: YesOpt = False, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Put an isolated tray back into the partition it was in, once it is healthy again.

    The tray must answer and its GPUs be readable (nvidia-smi); its Slurm drain is left as it
    is (resume it with 'mctl health resume' once you trust it).

    Example: mctl -i inventories/lab partition restore lab-r1-tray07
    """
    from mctl.change.request import ChangeRequest, check_consent
    from mctl.change.service import rack_of_tray

    rack_of_tray(options().site(), tray)
    check_consent(drain, wait, force, yes)
    _run(ChangeRequest("restore", tray=tray, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run), json_)
