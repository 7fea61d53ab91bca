"""Global options shared by every command (set by the root callback)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mctl.errors import UsageError

if TYPE_CHECKING:
    from mctl.model.site import Site

DEFAULT_STATE_DIR = "/var/lib/mctl"


@dataclass
class Options:
    inventory: str | None = None
    json: bool = False
    verbose: int = 0
    state_dir: Path = field(default_factory=lambda: Path(os.environ.get("MCTL_STATE_DIR") or DEFAULT_STATE_DIR))
    _site: "Site | None" = None

    def site(self) -> "Site":
        if self._site is None:
            if not self.inventory:
                raise UsageError("no inventory given",
                                 hint="pass -i/--inventory DIR or set MCTL_INVENTORY "
                                      "(e.g. -i inventories/example-gb200, or the path 'mctl lab up' printed)")
            from mctl.inventory import load_site
            self._site = load_site(self.inventory)
        return self._site


_current = Options()


def options() -> Options:
    return _current


def set_options(opts: Options) -> None:
    global _current
    _current = opts
