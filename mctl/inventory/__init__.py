from mctl.inventory.loader import find_inventory_file, load_site, validate_inventory

__all__ = ["find_inventory_file", "load_site", "validate_inventory"]
