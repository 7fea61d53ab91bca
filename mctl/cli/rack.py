"""mctl rack inventory: what is really in a rack, over SSH."""

from __future__ import annotations

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import AllRacksOpt, JsonOpt, NoSaveOpt, RacksArg, SnapshotDiffOpt, TimeoutOpt
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL, PartialFailure

app = typer.Typer(help="Racks: inventory what is really there, bring a rack up, validate its NVLink partitions.", no_args_is_help=True)


@app.command()
def inventory(
    racks: RacksArg = None,
    all_racks: AllRacksOpt = False,
    diff: SnapshotDiffOpt = False,
    timeout: TimeoutOpt = None,
    no_save: NoSaveOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Collect every compute tray's facts over SSH and check them against the rack's shape.

    One SSH round trip per tray gathers nvidia-smi -q -x, OS release, kernel, IMEX and slurmd
    service state, the IMEX config checksum and XID lines. The rack must show its compute trays
    with 4 GPUs each, one NVLink domain (cluster UUID) not shared with another rack, the 4 GPUs
    of a tray in one clique, and fabric Completed/Success. Each run is saved under
    <state>/snapshots/inventory/RACK/; --diff compares with the previous one (a changed GPU
    serial is a hardware swap, a changed clique a partition change). --timeout: each tray's whole
    probe (default: health.tray_deadline, else 15, at most ssh.command_timeout).

    Exit 0 ok, 1 critical findings, 2 bad input, 3 some trays unreachable or hung.

    Example: mctl -i inventories/lab rack inventory lab-r1 --diff
    """
    from mctl.rackinv.service import run_inventory, select_racks

    opts = options()
    site = opts.site()
    chosen = select_racks(site, racks or [], all_racks)
    out = render.output(json_)
    report = run_inventory(site, chosen, state_dir=opts.state_dir, timeout=timeout, save=not no_save, diff=diff)
    out.result(report.to_dict(), lambda: _print_report(out, report, diff))
    code = report.exit_code
    if code == EXIT_PARTIAL:
        from mctl.model.site import fold

        dark = [t for r in report.racks for t in r.unreached]
        kinds: dict[str, list[str]] = {}
        for t in dark:
            kinds.setdefault(t.reach, []).append(t.host)
        raise PartialFailure(f"{len(dark)} tray{'s' if len(dark) > 1 else ''} not inventoried: "
                             + "; ".join(f"{k} {fold(v)}" for k, v in kinds.items()),
                             hint="every other tray was inventoried; see the findings above")
    if code == EXIT_FINDINGS:
        raise typer.Exit(EXIT_FINDINGS)


from mctl.cli.rack_bringup import bring_up as _bring_up  # noqa: E402

app.command("bring-up")(_bring_up)

from mctl.cli.rack_validate import validate as _validate  # noqa: E402

app.command("validate")(_validate)


def _fabric_cell(t) -> str:
    states = sorted({f"{g.fabric.state}/{g.fabric.status}" if g.fabric.status != "Success" or g.fabric.state != "Completed"
                     else "Completed" for g in t.gpus.gpus})
    return ",".join(states) if states else "-"


def _findings_cell(findings) -> str:
    crit = sum(f.severity.value == "critical" for f in findings)
    wrn = sum(f.severity.value == "warn" for f in findings)
    parts = ([f"{crit} critical"] if crit else []) + ([f"{wrn} warn"] if wrn else [])
    return ", ".join(parts) if parts else "ok"


def _print_report(out: render.Output, report, show_diff: bool) -> None:
    for r in report.racks:
        rack = r.rack
        domain = rack.nvlink_domain or "not declared"
        by_host: dict[str, list] = {}
        for f in r.findings:
            by_host.setdefault(f.host, []).append(f)
        rows = []
        for t in r.trays:
            mine = by_host.get(t.host, [])
            if not t.reached:
                rows.append((t.host, t.address, "-", "-", "-", "-", "-", t.reach))
                continue
            if t.gpus is None:
                rows.append((t.host, t.address, "?", "-", "-", "-", "-", _findings_cell(mine)))
                continue
            g = t.gpus
            rows.append((t.host, t.address, f"{len(g.gpus)}/{rack.gpus_per_tray}", g.driver_version or "-",
                         ",".join(u.split("-")[0] for u in g.cluster_uuids) or "none",
                         ",".join(str(c) for c in g.clique_ids) or "-", _fabric_cell(t), _findings_cell(mine)))
        out.table(f"rack {rack.name}: {rack.model}, {rack.compute_trays} compute trays x "
                     f"{rack.gpus_per_tray} GPUs, NVLink domain {domain}",
                     ("tray", "address", "GPUs", "driver", "cluster", "clique", "fabric", "findings"), rows)
        if r.changes is not None or show_diff:
            _print_changes(out, r)
    findings = [f for f in report.findings if f.severity.value != "ok" or f.action]
    if findings:
        out.line("findings:")
        for f in findings:
            out.line(f"  {f.severity.value.upper():8} {f.host or '-'}  {f.check}: {f.message}")
            if f.action:
                out.line(f"           action: {f.action}")
    trays = sum(len(r.trays) for r in report.racks)
    dark = sum(len(r.unreached) for r in report.racks)
    crit = sum(f.severity.value == "critical" for f in report.findings)
    wrn = sum(f.severity.value == "warn" for f in report.findings)
    saved = [str(r.snapshot_path) for r in report.racks if r.snapshot_path]
    out.line(f"{trays} trays, {trays - dark} inventoried, {dark} not reached; {crit} critical, {wrn} warn "
                f"({report.elapsed:.1f}s)" + (f"; snapshot {', '.join(saved)}" if saved else ""))


def _print_changes(out: render.Output, r) -> None:
    if r.previous_path is None:
        out.line(f"diff: no earlier snapshot of rack {r.rack.name}; this run is the baseline")
        return
    since = r.previous_taken_at.strftime("%Y-%m-%d %H:%M:%S UTC") if r.previous_taken_at else str(r.previous_path)
    if not r.changes:
        out.line(f"diff since {since}: no changes")
        return
    out.line(f"diff since {since}: {len(r.changes)} change{'s' if len(r.changes) > 1 else ''}")
    for c in r.changes:
        out.line(f"  {c.host}  {c.kind}: {c.message}")

from mctl.cli.power import rack_power_app as _rack_power  # noqa: E402

app.add_typer(_rack_power, name="power")
