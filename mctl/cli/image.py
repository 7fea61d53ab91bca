"""mctl image list|show|diff"""

from __future__ import annotations

from typing import Annotated

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import JsonOpt, NodesArg, TimeoutOpt
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL, UsageError

app = typer.Typer(help="Software image definitions and drift against trays.", no_args_is_help=True)


@app.command("list")
def list_(json_: JsonOpt = False) -> None:
    """List the site's software images and which trays use them.

    Example: mctl -i inventories/example-gb200 image list
    """
    from mctl.images import ImageCatalog
    from mctl.model.site import fold

    site = options().site()
    catalog = ImageCatalog(site.images_dir)
    users: dict[str, list[str]] = {}
    for h in site.hosts():
        if h.image:
            users.setdefault(h.image, []).append(h.name)
    rows = []
    for name in catalog.names():
        img = catalog.get(name)
        driver = img.components.get("nvidia_driver")
        rows.append({"name": name, "description": img.description, "os": f"{img.os.distribution} {img.os.release}",
                     "driver": driver.version if driver else None, "trays": fold(users.get(name, [])) or None})
    out = render.output(json_)
    out.result({"images_dir": str(catalog.folder), "images": rows}, lambda: out.table(
        f"images in {catalog.folder}", ("name", "os", "driver", "used by", "description"),
        [(r["name"], r["os"], r["driver"] or "-", r["trays"] or "-", r["description"]) for r in rows], boxed=True))


@app.command()
def show(name: Annotated[str, typer.Argument(help="Image name.")], json_: JsonOpt = False) -> None:
    """Show one image: OS, components and how each is delivered.

    Example: mctl -i inventories/example-gb200 image show gb200-ubuntu24.04
    """
    from mctl.images import ImageCatalog

    img = ImageCatalog(options().site().images_dir).get(name)
    out = render.output(json_)
    out.result(img.ansible_vars(), lambda: _print_image(out, img))


def _print_image(out: render.Output, img) -> None:
    out.line(f"{img.name}: {img.description}")
    out.line(f"  os: {img.os.distribution} {img.os.release}, kernel {img.os.kernel or 'any'}")
    for cname, comp in img.components.items():
        extra = f", branch {comp.branch}" if comp.branch else ""
        out.line(f"  {cname}: {comp.version}{extra} (from {comp.delivery})")
    if img.packages:
        out.line(f"  packages: {', '.join(img.packages)}")
    for k, v in img.sysctls.items():
        out.line(f"  sysctl {k} = {v}")
    if img.kernel_parameters:
        out.line(f"  kernel parameters: {' '.join(img.kernel_parameters)}")


@app.command()
def diff(
    nodeset: NodesArg,
    timeout: TimeoutOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Show, per tray, each component of its image: the version wanted and the version found.

    Reads the OS release, kernel, slurmd -V and nvidia-smi on every tray at once, each
    under its own deadline, and compares them with the same rules as 'mctl audit'
    (versions). Components whose version mctl does not read from a tray are listed as
    not-checked, never as a match. Read-only. Compute trays only. --timeout: how long the probe
    may run on each tray (default: ssh.command_timeout).

    Exit 0 no drift, 1 a tray drifts (a version differs or is not reported), 2 bad input,
    3 a tray could not be read (the others are still reported).

    Example: mctl -i inventories/lab image diff lab-r1
    """
    from mctl.audit.image_diff import diff as run_diff
    from mctl.model.site import fold
    from mctl.transport import resolve_hosts

    site = options().site()
    named = resolve_hosts(site, nodeset)
    hosts = [h for h in named if h.role == "compute"]
    others = [h.name for h in named if h.role != "compute"]
    if not hosts:
        raise UsageError(f"{nodeset!r} names no compute trays ({fold(others)} only)",
                         hint="image diff compares compute trays with their image, e.g. a rack name or @compute")
    out = render.output(json_)
    if others:
        out.warn(f"not compared (not compute trays): {fold(others)}")
    with out.status(f"reading versions on {fold([h.name for h in hosts])} ..."):
        report = run_diff(site, hosts, timeout=timeout)
    out.result(report.to_dict(), lambda: _print_diff(out, report))
    if report.unreadable:
        out.warn(f"not read: {fold(report.unreadable)}; the other trays are reported")
        raise typer.Exit(EXIT_PARTIAL)
    if report.drifted:
        raise typer.Exit(EXIT_FINDINGS)


def _print_diff(out: render.Output, report) -> None:
    rows = []
    for t in report.trays:
        if t.error is not None or t.image is None:
            rows.append([t.host, t.image or "-", "-", "-", "-", t.status])
            continue
        d = t.to_dict()
        for c in d["components"]:
            found = c["found"] if c["found"] is not None else "-"
            rows.append([t.host, t.image, c["component"], c["wanted"], found, c["status"]])
    out.table(None, ["tray", "image", "component", "wanted", "found", "status"], rows)
    for t in report.trays:
        if t.error is not None:
            out.line(f"{t.host}: could not be read: {t.error}")
        for comp, why in t.notes.items():
            if any(r.component == comp and r.found is None for r in t.rows):
                out.line(f"{t.host}: {comp}: {why}")
