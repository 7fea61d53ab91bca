"""Which scheduler the site runs: a deploy command must match the inventory, or nothing is done."""

from __future__ import annotations

from mctl.errors import UsageError
from mctl.model.site import Site


def check_scheduler(site: Site, wanted: str) -> None:
    if site.scheduler is None:
        raise UsageError(f"the inventory has no scheduler section, so there is nothing to deploy for {wanted}",
                         hint=f"add 'scheduler: {{type: {wanted}, controller: <head node>}}' to {site.file}")
    if site.scheduler.type != wanted:
        raise UsageError(f"the inventory's scheduler is {site.scheduler.type}, not {wanted}",
                         hint=f"run 'mctl deploy {site.scheduler.type}', or change scheduler.type in {site.file}")
