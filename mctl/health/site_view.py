"""The inventory as the health checks need it: what each tray should be, and the partition plan.

Everything here is derived from the Site (and the trays' software images), so
the watch, `check` and the node-check configuration agree on expectations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mctl.model.tray import TrayExpectation
from mctl.model.settings import HealthSettings

if TYPE_CHECKING:
    from mctl.model.site import Host, Rack, Site


def _driver_versions(site: "Site", images: set[str]) -> dict[str, str | None]:
    """Driver version per image name; an image that cannot be read simply sets no expectation."""
    from mctl.errors import MctlError
    from mctl.images import ImageCatalog

    out: dict[str, str | None] = {}
    if not images or site.images_dir is None:
        return {name: None for name in images}
    try:
        catalog = ImageCatalog(site.images_dir)
    except MctlError:
        return {name: None for name in images}
    for name in images:
        try:
            driver = catalog.get(name).components.get("nvidia_driver")
        except MctlError:
            driver = None
        out[name] = driver.version if driver else None
    return out


def expectations(site: "Site", hosts: Sequence["Host"]) -> dict[str, TrayExpectation]:
    drivers = _driver_versions(site, {h.image for h in hosts if h.image})
    scheduler = site.scheduler.type if site.scheduler else None
    out = {}
    for h in hosts:
        rack = site.racks.get(h.rack or "")
        out[h.name] = TrayExpectation(host=h.name, rack=h.rack, gpus_per_tray=rack.gpus_per_tray if rack else 4,
                                      driver_version=drivers.get(h.image) if h.image else None, image=h.image,
                                      nvlink_domain=rack.nvlink_domain if rack else None, scheduler=scheduler)
    return out


def partition_plan(rack: "Rack") -> dict[str, str]:
    """tray -> planned NVLink partition; one 'default' partition when the inventory declares none."""
    if not rack.partitions:
        return {h.name: "default" for h in rack.compute}
    plan = {}
    for part in rack.partitions:
        for tray in part.trays:
            plan[tray] = part.name
    return plan


def rack_sizes(site: "Site") -> dict[str, int]:
    return {name: len(rack.compute) for name, rack in site.racks.items()}


def settings_of(site: "Site") -> HealthSettings:
    return site.health                  # converted once, by the inventory loader


@dataclass(frozen=True)
class Scope:
    """The trays one command looks at (a node set or racks), in inventory order."""

    hosts: tuple["Host", ...]

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def racks(self) -> list[str]:
        seen: list[str] = []
        for h in self.hosts:
            if h.rack and h.rack not in seen:
                seen.append(h.rack)
        return seen


def resolve_scope(site: "Site", expr: str | None) -> Scope:
    """Compute trays named by a node set or rack (every compute tray when None)."""
    from mctl.errors import UsageError
    from mctl.transport import resolve_hosts

    if not expr:
        hosts = site.compute_trays()
    else:
        hosts = [h for h in resolve_hosts(site, expr) if h.role == "compute"]
    if not hosts:
        raise UsageError(f"{expr!r} names no compute trays" if expr else "the inventory has no compute trays",
                         hint="health checks run on compute trays: give a rack name or a tray node set")
    return Scope(tuple(hosts))
