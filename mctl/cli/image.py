"""mctl image list|show|diff"""

from __future__ import annotations

from typing import Annotated

import typer

from mctl.cli import render
from mctl.cli.context import options, want_json
from mctl.cli.options import JsonOpt
from mctl.errors import EXIT_FINDINGS

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
    if want_json(json_):
        render.print_json({"images_dir": str(catalog.folder), "images": rows})
        return

    table = render.data_table(title=f"images in {catalog.folder}", title_justify="left")
    for col in ("name", "os", "driver", "used by", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["os"], r["driver"] or "-", r["trays"] or "-", r["description"])
    render.console().print(table)


@app.command()
def show(name: Annotated[str, typer.Argument(help="Image name.")], json_: JsonOpt = False) -> None:
    """Show one image: OS, components and how each is delivered.

    Example: mctl -i inventories/example-gb200 image show gb200-ubuntu24.04
    """
    from mctl.images import ImageCatalog

    img = ImageCatalog(options().site().images_dir).get(name)
    if want_json(json_):
        render.print_json(img.ansible_vars())
        return
    con = render.console()
    con.print(f"{img.name}: {img.description}", markup=False)
    con.print(f"  os: {img.os.distribution} {img.os.release}, kernel {img.os.kernel or 'any'}", markup=False)
    for cname, comp in img.components.items():
        extra = f", branch {comp.branch}" if comp.branch else ""
        con.print(f"  {cname}: {comp.version}{extra} (from {comp.delivery})", markup=False)
    if img.packages:
        con.print(f"  packages: {', '.join(img.packages)}", markup=False)
    for k, v in img.sysctls.items():
        con.print(f"  sysctl {k} = {v}", markup=False)
    if img.kernel_parameters:
        con.print(f"  kernel parameters: {' '.join(img.kernel_parameters)}", markup=False)
