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


@dataclass(frozen=True)
class Shard:
    """The racks one watch owns: a shard of `health.shards`, a `--rack-set` set, or the whole site."""

    name: str                       # the shard's name; for --rack-set, the shard of the map with those racks, else
                                    # "racks-<rack>+<rack>..."; "site" for the whole site
    racks: tuple[str, ...]          # in inventory order
    whole_site: bool = False


def resolve_shard(site: "Site", shard: str | None, racks: str | None) -> Shard:
    """The watch's shard from `--shard NAME` or `--rack-set SET` (a rack node set, e.g. r[01-08]); the whole
    site when neither. UsageError (exit 2) for an unknown shard or rack, or both options at once."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSetParseError

    from mctl.errors import UsageError

    shards = site.health.shards
    order = list(site.racks)
    if shard is not None and racks is not None:
        raise UsageError("--shard and --rack-set both given", hint="a watch owns one set of racks: give one of them")
    if shard is not None:
        if shard not in shards:
            known = ", ".join(sorted(shards)) or "none: the inventory has no health.shards"
            raise UsageError(f"unknown shard {shard!r}", hint=f"shards of health.shards: {known}")
        return Shard(shard, tuple(r for r in order if r in shards[shard]))
    if racks is None:
        return Shard("site", tuple(order), whole_site=True)
    try:
        named = list(NodeSet(racks))
    except (NodeSetParseError, RangeSetParseError) as exc:
        raise UsageError(f"bad rack set {racks!r}: {exc}", hint="a ClusterShell set of rack names, e.g. "
                                                                 "r[01-08] or r01,r02") from None
    unknown = [r for r in named if r not in site.racks]
    if unknown or not named:
        named_text = ", ".join(unknown) if unknown else repr(racks)
        raise UsageError(f"unknown rack{'s' if len(unknown) > 1 else ''} {named_text}",
                         hint=f"racks of this inventory: {', '.join(order)}")
    chosen = tuple(r for r in order if r in named)
    owners = {r: name for name, rs in shards.items() for r in rs}
    theirs = sorted({owners[r] for r in chosen if r in owners})
    for name in theirs:
        if set(shards[name]) == set(chosen):
            return Shard(name, chosen)          # the shard of the map with exactly these racks: its lease
    if theirs:
        raise UsageError(f"--rack-set {racks} cuts across health.shards ({', '.join(theirs)})",
                         hint="watch a shard of the map (--shard NAME), or racks in no shard")
    return Shard("racks-" + "+".join(chosen), chosen)
