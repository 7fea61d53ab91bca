"""mctl partition list|show|templates|create|delete|apply: NVLink partitions through NMX-Manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from mctl.cli import partition_change as change
from mctl.cli import render
from mctl.cli.context import options, want_json
from mctl.cli.locking import hold_racks
from mctl.cli.partition_change import DrainOpt, ForceOpt, NmxOnlyOpt, WaitOpt, YesOpt
from mctl.cli.options import DryRunOpt, JsonOpt
from mctl.errors import MctlError, PartialFailure, UsageError

if TYPE_CHECKING:
    from mctl.model.fabric import PartitionPlan
    from mctl.model.site import Rack, Site

app = typer.Typer(help="NVLink partitions: desired in the inventory, applied through NMX-Manager.\n\n"
                       "Example: mctl -i inventories/lab partition create lab-r1 --template 2x9",
                  no_args_is_help=True)

RackArg = Annotated[str, typer.Argument(help="Rack name.", show_default=False)]
ByLocationOpt = Annotated[bool, typer.Option("--by-location", help="Create partitions with location members "
                                             "(domain, chassis, slot, host, device) instead of GPU IDs.")]


def _rack(site: "Site", name: str) -> "Rack":
    if name not in site.racks:
        raise UsageError(f"unknown rack {name!r}", hint=f"known racks: {', '.join(site.racks)}")
    return site.racks[name]


def _say(text: str) -> None:
    render.console().print(text, markup=False, highlight=False)


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
    from mctl.fabric.nmx import NMXClient, NMXError
    from mctl.fabric.partitions import PartitionRow, desired_from_rack, partition_rows
    from mctl.fabric.reconcile import discover

    site = options().site()
    racks = [_rack(site, rack)] if rack else list(site.racks.values())
    rows: list[PartitionRow] = []
    errors: dict[str, str] = {}
    endpoints: dict[str, str | None] = {}
    for r in racks:
        desired = desired_from_rack(r)
        endpoints[r.name] = r.nmx.url if r.nmx else None
        if offline or r.nmx is None:
            rows += [_declared(row) for row in partition_rows(r, desired, None, None)]
            continue
        client = NMXClient.for_rack(site, r)        # bad credentials file or URL: a usage error, raised
        try:
            state = discover(client, r)
            rows += partition_rows(r, desired, state.fabric, state.partitions)
        except NMXError as exc:
            errors[r.name] = exc.message
            rows += [_declared(row) for row in partition_rows(r, desired, None, None)]
    if want_json(json_):
        render.print_json({"racks": [{"rack": r.name, "nmx": endpoints[r.name], "error": errors.get(r.name),
                                      "partitions": [row.to_dict() for row in rows if row.rack == r.name]}
                                     for r in racks]})
    else:

        table = render.data_table(title_justify="left")
        for col in ("rack", "partition", "state", "id", "health", "gpus", "trays (NMX-M)", "trays (inventory)"):
            table.add_column(col)
        for row in rows:
            table.add_row(row.rack, row.name, row.state, str(row.partition_id or "-"), row.health or "-",
                          str(row.gpus), row.trays if row.state not in ("declared", "missing") else "-",
                          row.desired or "-")
        render.console().print(table)
        for name, msg in errors.items():
            render.warn(f"rack {name}: {msg}")
    if errors:
        raise PartialFailure(f"NMX-M could not be asked for {len(errors)} of {len(racks)} racks "
                             f"({', '.join(errors)})", hint="the inventory's partitions are shown as 'declared'")


def _declared(row):
    from dataclasses import replace
    return replace(row, state="declared")


@app.command()
def show(rack: RackArg, name: Annotated[str, typer.Argument(help="Partition name.", show_default=False)],
         json_: JsonOpt = False) -> None:
    """Show one partition: the inventory's trays and, from NMX-M, its ID, health and members per tray.

    Example: mctl -i inventories/lab partition show lab-r1 p0 --json
    """
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover
    from mctl.model.fabric import describe_members

    site = options().site()
    r = _rack(site, rack)
    declared = next((p for p in r.partitions if p.name == name), None)
    found = None
    state = None
    if r.nmx is not None:
        state = discover(NMXClient.for_rack(site, r), r)
        found = next((p for p in state.partitions if p.name == name), None)
    if declared is None and found is None:
        known = sorted({p.name for p in r.partitions} | ({p.name for p in state.partitions} if state else set()))
        raise UsageError(f"rack {rack} has no partition {name!r}",
                         hint=f"partitions: {', '.join(known) if known else 'none'}")
    members: list[dict] = []
    if found is not None and state is not None:
        have, foreign = state.fabric.resolve(found)
        for g in sorted(have):
            members.append({"tray": g.tray, "gpu": g.device_id, "gpu_id": g.gpu_id, "location": g.location.to_nmx()})
        members += [{"tray": None, "gpu": None, "gpu_id": f, "location": None} for f in foreign]
    data = {"rack": rack, "name": name, "nmx": r.nmx.url if r.nmx else None,
            "inventory_trays": list(declared.trays) if declared else None,
            "partition_id": found.partition_id if found else None, "id": found.id if found else None,
            "type": found.type if found else None, "health": found.health if found else None,
            "members": members}
    if want_json(json_):
        render.print_json(data)
        return
    _say(f"partition {name} of rack {rack}")
    _say(f"  inventory: {declared.nodeset if declared else 'not declared'}")
    if r.nmx is None:
        _say("  NMX-M: no endpoint configured for this rack")
        return
    if found is None:
        _say(f"  NMX-M ({r.nmx.url}): not present (run 'mctl partition apply {rack}')")
        return
    _say(f"  NMX-M: PartitionID {found.partition_id}, id {found.id}, {found.type}, health {found.health}")
    by_tray: dict[str, list[dict]] = {}
    for m in members:
        by_tray.setdefault(m["tray"] or "(not this rack)", []).append(m)
    for tray, ms in by_tray.items():
        gpus = ", ".join(f"{m['gpu']}={m['gpu_id']}" if m["gpu"] is not None else m["gpu_id"] for m in ms)
        _say(f"    {tray}: {gpus}")
    _say(f"  members: {describe_members([(m['tray'], m['gpu']) for m in members if m['tray']], r.gpus_per_tray)}")


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
    if want_json(json_):
        render.print_json({"rack": rack, "templates": rows})
        return
    _say(title)
    for row in rows:
        _say(f"  {row['template']:<5} {row['result']}")


# ------------------------------------------------------------------ changes

class _Show:
    """Prints a plan and then each step as it runs; silent with --json."""

    def __init__(self, r: "Rack", *, dry_run: bool, total: int = 0):
        self.rack = r
        self.dry_run = dry_run
        self.total = total

    def plan(self, plan: "PartitionPlan") -> None:
        self.total = len(plan.changes)
        if not options().json:
            _print_plan(plan, self.rack.gpus_per_tray, dry_run=self.dry_run)

    def step(self, number: int, change) -> None:
        if not options().json:
            _say(f"  [{number}/{self.total}] {change.action} {change.name} ...")


def _print_plan(plan: "PartitionPlan", gpus_per_tray: int, *, dry_run: bool) -> None:
    from mctl.fabric.partitions import describe_change

    head = f"rack {plan.rack} (NMX-M {plan.endpoint})"
    if plan.empty:
        _say(f"{head}: partitions match the inventory; nothing to change")
    else:
        verb = "would make" if dry_run else "makes"
        _say(f"{head}: {verb} {len(plan.changes)} change{'s' if len(plan.changes) > 1 else ''}")
        for i, change in enumerate(plan.changes, start=1):
            _say(f"  {i}. {describe_change(change, gpus_per_tray)}")
    if plan.unchanged:
        _say(f"  unchanged: {', '.join(plan.unchanged)}")
    if plan.unmanaged:
        _say(f"  left alone (on NMX-M, not in the inventory; --prune deletes them): {', '.join(plan.unmanaged)}")
    if plan.released:
        from mctl.model.fabric import describe_members
        _say(f"  back to the default partition: {describe_members(plan.released, gpus_per_tray)}")
    for w in plan.warnings:
        render.warn(w)


def _journaled(site: "Site", r: "Rack", command: str, after, nmx_plan, held, **kw):
    """Run the change across every layer (mctl.bringup.change_run); the run (its error not raised yet)."""
    from mctl.fabric.change import before_from_plan
    from mctl.bringup.change_run import ChangeSpec

    spec = ChangeSpec.of(r.name, command, before_from_plan(r, nmx_plan), tuple(after), held=tuple(held), **kw)
    return change.run_journaled(site, spec)


def _locked(r: "Rack", purpose: str):
    from mctl.state.lock import rack_lock
    return rack_lock(options().state_dir, r.name, purpose=purpose)


@app.command()
def apply(rack: Annotated[Optional[str], typer.Argument(help="Only this rack (default: every rack with an "
                                                              "NMX-M endpoint).", show_default=False)] = None,
          prune: Annotated[bool, typer.Option("--prune", help="Also delete NMX-M partitions the inventory does "
                                                              "not declare.")] = False,
          by_location: ByLocationOpt = False, drain: DrainOpt = False, wait: WaitOpt = None,
          force: ForceOpt = False, yes: YesOpt = False, nmx_only: NmxOnlyOpt = False,
          resume: Annotated[bool, typer.Option("--resume", help="Finish the rack's last partition change (create, "
                                               "apply, delete, isolate, restore) that was stopped: forward, or its "
                                               "rollback where one had begun.")] = False,
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
    from contextlib import nullcontext

    from mctl.fabric import partition_service as ps
    from mctl.fabric.partitions import desired_from_rack, validate_desired
    from mctl.fabric.service import kind_of

    want_json(json_)                    # before any plan is shown: --json may follow the subcommand
    change.check_flags(drain, wait, force, yes)
    site = options().site()
    if resume:
        return _resume(site, rack, dry_run=dry_run, other=prune or by_location or drain or force or yes or nmx_only)
    racks = [_rack(site, rack)] if rack else [r for r in site.racks.values() if r.nmx is not None]
    if rack and racks[0].nmx is None:
        raise UsageError(f"rack {rack} has no NMX-Manager endpoint",
                         hint=f"add racks.{rack}.nmx with url and credentials_file to the inventory")
    if not racks:
        raise UsageError("no rack has an NMX-Manager endpoint", hint="add racks.<rack>.nmx to the inventory")
    out = []
    failures: list[str] = []
    for r in racks:
        desired = desired_from_rack(r)
        validate_desired(r, desired, site=site)
        show = _Show(r, dry_run=dry_run)
        try:
            with nullcontext() if dry_run else _locked(r, "partition apply"):
                op = ps.plan_apply(site, r, desired, prune=prune, kind=kind_of(by_location), on_plan=show.plan)
                change.print_change(op.change, dry_run=dry_run)
                held = change.gate(site, op.change, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run)
                entry = op.to_dict()
                entry["steps"] = change.steps_of(op.change, has_nmx=True, record=False)
                if not dry_run and op.change.empty:
                    op.applied = True
                elif not dry_run and nmx_only:
                    ps.commit_apply(op, held=held, on_step=show.step)
                    change.release(site, held)
                    entry = op.to_dict()
                elif not dry_run:
                    run = _journaled(site, r, "apply", r.partitions, op.plan, held, prune=prune,
                                     kind=kind_of(by_location))
                    op.applied = run.error is None
                    entry = {**op.to_dict(), "run": run.to_dict()}
                    if run.error is not None:
                        if len(racks) == 1 and want_json(json_):
                            render.print_json({"dry_run": dry_run, "racks": [entry]})
                        raise run.error
            out.append(entry)
        except MctlError as exc:
            if len(racks) == 1:
                raise
            failures.append(f"{r.name}: {exc.message}")
            out.append({"rack": r.name, "error": exc.message, "applied": False})
            render.warn(f"rack {r.name}: {exc.message}")
    if want_json(json_):
        render.print_json({"dry_run": dry_run, "racks": out})
    if failures:
        raise PartialFailure(f"{len(failures)} of {len(racks)} racks failed: {'; '.join(failures)}")


def _resume(site: "Site", rack: str | None, *, dry_run: bool, other: bool) -> None:
    from mctl.bringup.change_run import last_change

    if rack is None:
        raise UsageError("--resume needs the rack", hint="e.g. 'mctl partition apply lab-r1 --resume'")
    if dry_run or other:
        raise UsageError("--resume continues the last change with its own options; it takes no other option",
                         hint=f"'mctl partition apply {rack} --resume'")
    r = _rack(site, rack)
    hold_racks([r.name], "partition apply --resume")
    last = last_change(options().state_dir, r.name)
    run = change.run_journaled(site, r.name, resume=True)
    if want_json(False):
        render.print_json({"rack": r.name, "resumed": True, "run": run.to_dict()})
    if run.error is not None:
        raise run.error
    if not options().json:
        _say(f"rack {rack}: partition change {run.journal.run_id} finished" + (
            f" (was {last.status})" if last is not None else ""))


@app.command()
def create(rack: RackArg,
           name: Annotated[Optional[str], typer.Argument(help="Partition name (with --trays or --gpus).",
                                                        show_default=False)] = None,
           template: Annotated[Optional[str], typer.Option("--template", "-t", help="all, 2x9, 3x6, 6x3 or 18x1: "
                                                           "replace the rack's partitions with equal ones.")] = None,
           trays: Annotated[Optional[str], typer.Option("--trays", help="Trays of the new partition (node set).")]
           = None,
           gpus: Annotated[Optional[List[str]], typer.Option("--gpus", help="TRAYS:GPUS members, e.g. "
                                                            "lab-r1-tray01:0-1 (needs --gpu-granularity).")] = None,
           gpu_granularity: Annotated[bool, typer.Option("--gpu-granularity", help="Allow a partition that "
                                                         "splits a tray (IMEX and Slurm cannot follow it).")] = False,
           no_apply: Annotated[bool, typer.Option("--no-apply", help="Only record in the inventory.")] = False,
           by_location: ByLocationOpt = False, drain: DrainOpt = False, wait: WaitOpt = None,
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
    from mctl.fabric import partition_service as ps
    from mctl.fabric.partitions import check_partition_name, parse_gpu_members, parse_trays
    from mctl.fabric.service import kind_of

    site = options().site()
    r = _rack(site, rack)
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
    change.check_flags(drain, wait, force, yes)
    tray_list: tuple[str, ...] = parse_trays(r, trays) if trays else ()
    members = parse_gpu_members(r, gpus) if gpus else ()
    # the arguments are read; the lock comes before anything is printed or planned
    hold_racks([r.name], "partition create", dry_run=dry_run)
    if gpus:
        whole = ps.whole_trays(site, r, name or "", members, gpu_granularity=gpu_granularity)
        if whole is None:
            return _create_gpu_partition(site, r, name or "", members, no_apply, by_location, dry_run, json_)
        tray_list = whole                   # whole trays after all: an ordinary, recorded partition

    op = ps.plan_create(site, r, name=name, template=template, trays=tray_list, no_apply=no_apply, dry_run=dry_run)
    quiet = want_json(json_)
    for w in op.warnings:
        render.warn(w)
    if not quiet:
        before = "; ".join(f"{p.name}={p.nodeset}" for p in op.before) or "none (default partition)"
        after = "; ".join(f"{p.name}={p.nodeset}" for p in op.partitions)
        _say(f"rack {rack} partitions in {op.edit.path}: {before} -> {after}" if op.edit.changed
             else f"rack {rack}: the inventory already declares {after}")
    if r.nmx is None and not no_apply and not quiet:
        render.warn(f"rack {rack} has no NMX-Manager endpoint: recorded in the inventory only")
    show = _Show(r, dry_run=dry_run)
    held: list[str] = []
    if op.apply:
        try:
            cp = ps.plan_create_on_nmx(site, op, kind=kind_of(by_location), on_plan=show.plan)
            change.print_change(cp, dry_run=dry_run, record=True)
            held = change.gate(site, cp, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run)
        except MctlError as exc:
            if quiet:
                render.print_json(op.to_dict(error=exc.message))
            raise
    if dry_run:
        if quiet:
            out = op.to_dict()
            if op.change is not None:
                out["steps"] = change.steps_of(op.change, has_nmx=True, record=True)
            render.print_json(out)
        return
    if not op.apply:                    # --no-apply, or no NMX-M endpoint: the inventory only
        ps.record_create(op)            # under the rack lock taken above
        if quiet:
            render.print_json(op.to_dict())
        return
    if nmx_only:                        # as before issue 18: the inventory, then NMX-M
        ps.record_create(op)
        try:
            ps.apply_create(op, held=held, on_step=show.step)
        except MctlError as exc:
            if quiet:
                render.print_json(op.to_dict(error=exc.message))
            raise
        change.release(site, held)
        if quiet:
            render.print_json(op.to_dict())
        else:
            _say(f"rack {rack}: partitions applied on NMX-M (--nmx-only: IMEX, Slurm and labels not changed)")
        return
    if not op.edit.changed and op.change is not None and op.change.empty:
        op.applied = True
        if quiet:
            render.print_json(op.to_dict())
        else:
            _say(f"rack {rack}: every layer holds these partitions already")
        return
    run = _journaled(site, r, "create", op.partitions, op.plan, held, record=True, kind=kind_of(by_location))
    op.applied = run.error is None
    if quiet:
        render.print_json({**op.to_dict(error=run.error.message if run.error else None), "run": run.to_dict()})
    if run.error is not None:
        raise run.error
    if not quiet:
        _say(f"rack {rack}: partitions applied on every layer")


def _create_gpu_partition(site, r, name, members, no_apply, by_location, dry_run, json_) -> None:
    from mctl.fabric import partition_service as ps
    from mctl.fabric.service import kind_of

    op = ps.check_gpu_partition(site, r, name, members, no_apply=no_apply, dry_run=dry_run)
    for w in op.warnings:
        render.warn(w)
    render.warn(f"partition {name!r} is created on NMX-M only: it is not recorded in the inventory, and IMEX domains "
                "and Slurm blocks are derived from whole trays")
    plan = ps.plan_gpu_partition(site, op, kind=kind_of(by_location))
    quiet = want_json(json_)
    if not quiet:
        _print_plan(plan, r.gpus_per_tray, dry_run=dry_run)
    if not dry_run:
        ps.commit_gpu_partition(op, on_step=_Show(r, dry_run=False, total=len(plan.changes)).step)
    if quiet:
        render.print_json(op.to_dict())


@app.command()
def delete(rack: RackArg, name: Annotated[str, typer.Argument(help="Partition name.", show_default=False)],
           no_apply: Annotated[bool, typer.Option("--no-apply", help="Only remove it from the inventory.")] = False,
           drain: DrainOpt = False, wait: WaitOpt = None, force: ForceOpt = False, yes: YesOpt = False,
           nmx_only: NmxOnlyOpt = False, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Delete a partition: remove it from the inventory and from NMX-M; its GPUs return to the default partition.

    The plan covers every layer (see 'partition apply'); running jobs or pods on its trays
    refuse it (exit 2) unless --drain or --force.

    Example: mctl -i inventories/lab partition delete lab-r1 p1 --dry-run
    """
    from mctl.fabric import partition_service as ps

    site = options().site()
    r = _rack(site, rack)
    change.check_flags(drain, wait, force, yes)
    hold_racks([r.name], "partition delete", dry_run=dry_run)   # before anything is printed or asked
    op = ps.plan_delete(site, r, name, no_apply=no_apply, dry_run=dry_run)
    quiet = want_json(json_)
    if not quiet:
        if op.edit is not None:
            _say(f"rack {rack}: {'would remove' if dry_run else 'removing'} partition {name} from {op.edit.path}")
        if op.plan is not None:
            _print_plan(op.plan, r.gpus_per_tray, dry_run=dry_run)
        elif op.asked_nmx:
            _say(f"rack {rack}: NMX-M holds no partition {name!r}")
    held: list[str] = []
    steps = None
    if not no_apply:
        cp = ps.plan_delete_change(site, op)
        change.print_change(cp, dry_run=dry_run, has_nmx=r.nmx is not None, record=op.edit is not None)
        steps = change.steps_of(cp, has_nmx=r.nmx is not None, record=op.edit is not None)
        held = change.gate(site, cp, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run)
    if dry_run:
        if quiet:
            render.print_json({**op.to_dict(), "steps": steps})
        return
    if nmx_only:                        # as before issue 18: the inventory, then NMX-M
        ps.commit_delete(op, held=held,
                         on_step=_Show(r, dry_run=False, total=len(op.plan.changes) if op.plan else 0).step)
        change.release(site, held)
        if quiet:
            render.print_json(op.to_dict())
        return
    if no_apply or r.nmx is None:       # the inventory only, under the rack lock taken above
        ps.commit_delete(op)
        if quiet:
            render.print_json(op.to_dict())
        return
    run = _journaled(site, r, "delete", op.after, op.plan, held, record=op.edit is not None, remove=(name,))
    if quiet:
        render.print_json({**op.to_dict(), "steps": steps, "run": run.to_dict()})
    if run.error is not None:
        raise run.error


# ------------------------------------------------------------------ around a failed tray

TrayArg = Annotated[str, typer.Argument(help="Compute tray (its inventory name).", show_default=False)]


def _rack_of(site: "Site", tray: str) -> "Rack":
    for r in site.racks.values():
        if tray in {h.name for h in r.compute}:
            return r
    raise UsageError(f"unknown compute tray {tray!r}", hint="see 'mctl inventory show'")


def _tray_drained(site: "Site", tray: str) -> str | None:
    """None when Slurm has the tray drained or down (or the site runs no Slurm); else its state."""
    from mctl.fabric.work import _controller_run
    from mctl.sched.slurm.drain import read_nodes, show_node_command

    if site.scheduler is None or site.scheduler.type != "slurm":
        return None
    views, _ = read_nodes(_controller_run(site, show_node_command([tray])).stdout)
    v = views.get(tray)
    if v is None:
        return "unknown to Slurm"
    return None if (v.drained or v.down) else (v.state or "not drained")


def _tray_change(site: "Site", r: "Rack", tray: str, after, command: str, *, drain: bool, wait: float | None,
                 force: bool, yes: bool, dry_run: bool, json_: bool, tolerate: tuple[str, ...]) -> None:
    from mctl.fabric import partition_service as ps
    from mctl.fabric.partitions import validate_desired
    from mctl.fabric.service import plan_partitions_for
    from mctl.model.fabric import DesiredPartition

    quiet = want_json(json_)
    desired = [DesiredPartition(p.name, r.name, tuple(p.trays)) for p in after]
    for w in validate_desired(r, desired, site=site):
        render.warn(w)
    if not quiet:
        before = "; ".join(f"{p.name}={p.nodeset}" for p in r.partitions) or "none (default partition)"
        _say(f"rack {r.name}: {command} {tray}: {before} -> " + "; ".join(f"{p.name}={p.nodeset}" for p in after))
    show = _Show(r, dry_run=dry_run)
    plan = None
    if r.nmx is not None:
        _, plan = plan_partitions_for(site, r, desired)
        show.plan(plan)
    cp = ps.change_plan(site, r, after, plan)
    change.print_change(cp, dry_run=dry_run, has_nmx=r.nmx is not None, record=True)
    out = {"rack": r.name, "tray": tray, "command": command, "dry_run": dry_run,
           "partitions": [{"name": p.name, "trays": str(p.nodeset)} for p in after],
           "plan": plan.to_dict() if plan else None, "change": cp.to_dict(),
           "steps": change.steps_of(cp, has_nmx=r.nmx is not None, record=True)}
    held = change.gate(site, cp, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run)
    if dry_run:
        if quiet:
            render.print_json(out)
        return
    run = _journaled(site, r, command, after, plan, held, record=True, tolerate=tolerate, tray=tray)
    if quiet:
        render.print_json({**out, "run": run.to_dict()})
    if run.error is not None:
        raise run.error
    if not quiet:
        _say(f"rack {r.name}: {tray} {'isolated' if command == 'isolate' else 'restored'} on every layer")


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
    from mctl.fabric.change import isolate_partitions

    site = options().site()
    r = _rack_of(site, tray)
    change.check_flags(drain, wait, force, yes)
    after = isolate_partitions(r, tray, to=to)
    hold_racks([r.name], "partition isolate", dry_run=dry_run)
    state = _tray_drained(site, tray)
    if state is not None:
        raise UsageError(f"{tray} is {state} in Slurm: isolate moves a drained tray",
                         hint=f"drain it first: scontrol update NodeName={tray} State=DRAIN Reason='...'")
    _tray_change(site, r, tray, after, "isolate", drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run,
                 json_=json_, tolerate=(tray,))


@app.command()
def restore(tray: TrayArg, drain: DrainOpt = False, wait: WaitOpt = None, force: ForceOpt = False,
            yes: YesOpt = False, dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Put an isolated tray back into the partition it was in, once it is healthy again.

    The tray must answer and its GPUs be readable (nvidia-smi); its Slurm drain is left as it
    is (resume it with 'mctl health resume' once you trust it).

    Example: mctl -i inventories/lab partition restore lab-r1-tray07
    """
    from mctl.fabric.change import restore_partitions
    from mctl.bringup.change_run import last_isolation, read_cliques

    site = options().site()
    r = _rack_of(site, tray)
    change.check_flags(drain, wait, force, yes)
    hold_racks([r.name], "partition restore", dry_run=dry_run)
    after = restore_partitions(r, tray, last_isolation(options().state_dir, r.name, tray))
    _, errors = read_cliques(site, [h for h in r.compute if h.name == tray])
    if errors:
        raise UsageError(f"{tray} is not healthy enough to go back: {errors[tray]}",
                         hint="fix it first; 'mctl health check " + tray + "' says more")
    _tray_change(site, r, tray, after, "restore", drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run,
                 json_=json_, tolerate=())
