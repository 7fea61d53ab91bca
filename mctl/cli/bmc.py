"""mctl bmc: the trays' BMCs over Redfish (docs/bmc.md)."""

from __future__ import annotations

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import JsonOpt, NoSaveOpt, SnapshotDiffOpt, TargetArg, TimeoutOpt
from mctl.errors import EXIT_PARTIAL, PartialFailure

app = typer.Typer(help="Tray BMCs over Redfish: inventory serials, power state and firmware.",
                  no_args_is_help=True)


@app.command()
def inventory(
    target: TargetArg = None,
    diff: SnapshotDiffOpt = False,
    timeout: TimeoutOpt = None,
    no_save: NoSaveOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Read every tray's BMC over Redfish: serials, slot, power state, firmware, sensors.

    A rack name reads its compute and switch trays; no argument, every tray. --timeout: what each
    tray's BMC may take in all (default: bmc.deadline_s, 60).

    GET only, one connection per BMC, trays in parallel: the service root, Systems, Managers,
    UpdateService/FirmwareInventory, every Chassis, and the tray chassis' PowerSubsystem,
    ThermalSubsystem and Sensors. Credentials come from the inventory's bmc.credentials_file
    (mode 0600); TLS is verified (bmc.verify_tls: a CA bundle path). Each run is saved under
    <state>/snapshots/bmc-inventory/RACK/; --diff compares with the previous one (a swapped tray
    shows as a serial change, an update as a firmware version change).

    Exit 0 every BMC read, 2 bad input, 3 some BMCs refused the credentials, timed out,
    answered an error or a malformed document (every other tray was read).

    Example: mctl -i inventories/lab bmc inventory lab-r1 --diff
    """
    from mctl.bmc.inventory import run_inventory

    opts = options()
    site = opts.site()
    hosts = _hosts(site, target)
    out = render.output(json_)
    report = run_inventory(site, hosts, state_dir=opts.state_dir, save=not no_save, diff=diff, timeout_s=timeout)
    out.result(report.to_dict(), lambda: _print(out, report, diff))
    if report.exit_code == EXIT_PARTIAL:
        raise partial_failure(report.failed, "BMC", "not read", hint="every other tray was read; see the errors above")


def partial_failure(failed, noun: str, what: str, *, hint: str, kinds_hint: dict[str, str] | None = None):
    """Exit 3 naming the trays that failed by kind of trouble ("2 BMCs not read: auth t[1-2]")."""
    from mctl.model.site import fold

    kinds: dict[str, list[str]] = {}
    for t in failed:
        kinds.setdefault(t.error_kind or "error", []).append(t.host)
    n = len(failed)
    extra = "".join(f"; {h}" for k, h in (kinds_hint or {}).items() if k in kinds)
    return PartialFailure(f"{n} {noun}{'s' if n > 1 else ''} {what}: "
                          + "; ".join(f"{k} {fold(v)}" for k, v in sorted(kinds.items())), hint=hint + extra)


def _hosts(site, target: str | None):
    if target is None:
        hosts = [h for r in site.racks.values() for h in r.compute + r.switches]
    elif target.strip() in site.racks:
        rack = site.racks[target.strip()]
        hosts = list(rack.compute + rack.switches)
    else:
        from mctl.transport.targets import resolve_hosts

        hosts = resolve_hosts(site, target, roles=("compute", "switch"))
    if not hosts:
        from mctl.errors import UsageError

        raise UsageError(f"{target or 'the inventory'} names no compute or switch trays")
    return hosts


def _cell(values: list[str] | None) -> str:
    return ",".join(values) if values else "-"


def _print(out: render.Output, report, show_diff: bool) -> None:
    rows = []
    for t in report.trays:
        if not t.ok:
            rows.append((t.host, t.bmc or "-", "-", "-", "-", "-", "-", "-", f"{t.error_kind}: {t.error}"))
            continue
        health = "/".join(x["health"] or "?" for x in (t.power, t.thermal) if x) or "-"
        rows.append((t.host, t.bmc or "-", t.serial or "-", "-" if t.slot is None else str(t.slot),
                     t.power_state or "-", _cell(t.versions.get("bmc")), _cell(t.versions.get("bios")),
                     ", ".join(f"{k} {_cell(v)}" for k, v in t.versions.items() if k not in ("bmc", "bios")) or "-",
                     f"power/thermal {health}, {t.sensors if t.sensors is not None else '?'} sensors"))
    out.table("BMC inventory", ("tray", "bmc", "serial", "slot", "power", "BMC fw", "BIOS", "other firmware",
                                   "sensors"), rows)
    if report.changes is not None or show_diff:
        for rack in sorted(report.previous):
            changes = (report.changes or {}).get(rack, [])
            if report.previous.get(rack) is None:
                out.line(f"diff: no earlier BMC snapshot of {rack}; this run is the baseline")
            elif not changes:
                out.line(f"diff {rack}: no changes")
            else:
                out.line(f"diff {rack}: {len(changes)} change{'s' if len(changes) > 1 else ''}")
                for c in changes:
                    out.line(f"  {c['host']}  {c['kind']}: {c['message']}")
    read = len(report.trays) - len(report.failed)
    saved = ", ".join(report.snapshot_paths.values())
    out.line(f"{len(report.trays)} trays, {read} BMCs read, {len(report.failed)} not read "
                f"({report.elapsed:.1f}s)" + (f"; snapshot {saved}" if saved else ""))
