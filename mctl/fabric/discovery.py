"""What a rack's NMX-Manager holds now (read-only).

    discover_rack(site, rack) -> FabricState      compute nodes and partitions, from NMX-M
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mctl.fabric.reconcile import FabricState
    from mctl.model.site import Rack, Site


def discover_rack(site: "Site", rack: "Rack") -> "FabricState":
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover

    return discover(NMXClient.for_rack(site, rack), rack)
