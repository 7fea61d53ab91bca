"""Bring-up's second look at trays without GPU tools: their BMCs and the rack's NMX-M, read beside each other.

The inventory (mctl.rackinv.service) reads the trays over SSH; on a tray that arrived with its
OS only, nvidia-smi is not installed yet. This reads what vouches for its GPUs out of band,
each source under its own deadline, and hands the witnesses to the pure judge
(mctl.checks.bare_tray): the BMC's GPU chassis (HGX_GPU_n) and tray serial of every tray of
the rack (the serials are compared rack-wide), and the GPUs NMX-M lists under each tray's
compute node. Read-only; a source the site does not have is simply not a witness.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Sequence

from mctl.checks.bare_tray import Witness
from mctl.errors import MctlError

if TYPE_CHECKING:
    from mctl.model.site import Host, Rack, Site


def _bmc(site: "Site", hosts: Sequence["Host"]) -> tuple[dict[str, Witness], dict[str, str]]:
    from mctl.bmc.inventory import collect, read_gpus, settings_for

    read = collect(list(hosts), settings_for(site), reader=read_gpus, warn=lambda _m: None)
    witnesses = {t.host: Witness("BMC", tuple(t.gpus) if t.ok else None, None if t.ok else t.error or t.error_kind)
                 for t in read}
    return witnesses, {t.host: t.serial for t in read if t.ok and t.serial}


def _nmx(site: "Site", rack: "Rack", hosts: Sequence["Host"]) -> dict[str, Witness]:
    from mctl.fabric.discovery import discover_rack

    try:
        state = discover_rack(site, rack)
    except MctlError as exc:
        return {h.name: Witness("NMX-M", None, exc.message) for h in hosts}
    fabric = state.fabric
    return {h.name: Witness("NMX-M", tuple(g.gpu_id for g in fabric.trays.get(h.name, ()))) for h in hosts}


def witnesses(site: "Site", rack: "Rack", bare: Sequence[str]) -> tuple[dict[str, list[Witness]], dict[str, str]]:
    """(tray -> its witnesses, for the *bare* trays; tray -> its BMC's chassis serial, for every tray of the rack)."""
    hosts = list(rack.compute)
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="bare") as pool:
        bmc = pool.submit(_bmc, site, hosts) if getattr(site, "bmc", None) is not None else None
        nmx = pool.submit(_nmx, site, rack, [h for h in hosts if h.name in bare]) if rack.nmx is not None else None
        by_bmc, serials = bmc.result() if bmc is not None else ({}, {})
        by_nmx = nmx.result() if nmx is not None else {}
    out: dict[str, list[Witness]] = {}
    for name in bare:
        out[name] = [w for w in (by_bmc.get(name), by_nmx.get(name)) if w is not None]
    return out, serials
