"""`mctl rack inventory`: collect facts over SSH, validate the rack's shape, keep snapshots, diff them."""

from mctl.rackinv.service import InventoryReport, RackReport, run_inventory

__all__ = ["InventoryReport", "RackReport", "run_inventory"]
