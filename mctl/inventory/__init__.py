"""Site inventory: load, validate, and expose to Ansible.

Imports are lazy: `import mctl.inventory` costs nothing until the loader is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["find_inventory_file", "load_site", "validate_inventory"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mctl.inventory import loader

        return getattr(loader, name)
    raise AttributeError(name)
