"""mctl inventory validate|show"""

from __future__ import annotations

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import JsonOpt, OneRackArg
from mctl.errors import EXIT_USAGE, UsageError

app = typer.Typer(help="Check and show the site inventory.", no_args_is_help=True)


@app.command()
def validate(json_: JsonOpt = False) -> None:
    """Validate the inventory: syntax, keys, types, node sets, tray counts, partitions, images.

    Example: mctl -i inventories/example-gb200 inventory validate
    """
    from mctl.inventory import validate_inventory

    opts = options()
    if not opts.inventory:
        opts.site()  # raises the standard "no inventory" error
    site, problems = validate_inventory(opts.inventory)
    out = render.output(json_)
    out.result({"inventory": opts.inventory, "valid": not problems, "problems": [p.to_dict() for p in problems]},
               lambda: _print_problems(out, site, problems))
    if problems:
        raise typer.Exit(EXIT_USAGE)


def _print_problems(out: render.Output, site, problems) -> None:
    for p in problems:
        out.line(f"error: {p.render()}", tty=[("✗", "red"), (f" {p.render()}", "")])
        if p.hint:
            out.line(f"    hint: {p.hint}")
    if not problems and site is not None:
        trays = sum(len(r.compute) for r in site.racks.values())
        out.line(f"ok: site {site.name}: {len(site.racks)} racks, {trays} compute trays, "
                 f"{sum(len(r.partitions) for r in site.racks.values())} partitions")


@app.command()
def show(rack: OneRackArg = None, json_: JsonOpt = False) -> None:
    """Show racks, trays, addresses and partitions as mctl understands them.

    Example: mctl -i inventories/example-gb200 inventory show rack-a --json
    """
    site = options().site()
    racks = list(site.racks.values())
    if rack:
        if rack not in site.racks:
            raise UsageError(f"unknown rack {rack!r}", hint=f"known racks: {', '.join(site.racks)}")
        racks = [site.racks[rack]]
    doc = {"site": site.name, "inventory": str(site.file), "racks": [
        {"name": r.name, "model": r.model, "nvlink_domain": r.nvlink_domain,
         "compute_trays": r.compute_trays, "switch_trays": r.switch_trays,
         "nmx": r.nmx.url if r.nmx else None,
         "hosts": [{"name": h.name, "role": h.role, "address": h.address, "bmc": h.bmc,
                    "image": h.image, "partition": (r.partition_of(h.name).name if r.partition_of(h.name) else None),
                    "vars": h.vars} for h in r.hosts],
         "partitions": [{"name": p.name, "trays": p.nodeset} for p in r.partitions]} for r in racks],
        "scheduler": site.scheduler.to_dict() if site.scheduler else None}
    out = render.output(json_)
    out.result(doc, lambda: _print_site(out, site, racks))


def _print_site(out: render.Output, site, racks) -> None:
    out.line(f"site {site.name} ({site.file})")
    for r in racks:
        rows = []
        for h in r.hosts:
            part = r.partition_of(h.name)
            rows.append((h.name, h.role, h.address, h.bmc or "-", h.image or "-", part.name if part else "-"))
        out.table(f"rack {r.name} ({r.model}, NVLink domain {r.nvlink_domain or 'not declared'})",
                  ("host", "role", "address", "bmc", "image", "partition"), rows, boxed=True)
        if r.partitions:
            out.line("partitions: " + "; ".join(f"{p.name}={p.nodeset}" for p in r.partitions))
        else:
            out.line("partitions: none declared (whole rack in the default partition)")

