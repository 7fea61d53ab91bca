"""What every phase module shares: the Phase record and the few facts of the site they all ask."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from mctl.bringup.context import Context, Outcome

if TYPE_CHECKING:
    from mctl.model.site import Host


@dataclass(frozen=True)
class Phase:
    """One phase: its plan (read-only; `--dry-run` prints it) and its run."""

    name: str
    plan: Callable[[Context], list[str]]
    run: Callable[[Context], Outcome]


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


def slurm(ctx: Context) -> bool:
    return ctx.site.scheduler is not None and ctx.site.scheduler.type == "slurm"


def controller(ctx: Context) -> "Host":
    from mctl.sched.slurm.render import controller_of

    return controller_of(ctx.site)


def scheduler_skip(ctx: Context) -> str | None:
    """Why the Slurm phases have nothing to do on this site (None: they run)."""
    if ctx.site.scheduler is None:
        return "no scheduler in the inventory"
    if not slurm(ctx):
        return (f"scheduler {ctx.site.scheduler.type}: deploy it with 'mctl deploy {ctx.site.scheduler.type}' "
                "(bring-up drives Slurm)")
    return None


def finding_line(f) -> str:
    return f"{f.severity.value.upper()} {f.host or '-'} {f.check}: {f.message}"
