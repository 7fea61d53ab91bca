"""A partition change as asked for: which command, on what, and the consent it comes with (pure).

`ChangeRequest` is what the CLI builds from its options and the watch's isolation builds from its
decision; mctl.change.service runs it. The consent rule is one function for every caller:
--drain waits for the work, --force breaks it (and asks), --yes only answers --force's question.
"""

from __future__ import annotations

from dataclasses import dataclass

from mctl.errors import UsageError

COMMANDS = ("create", "apply", "delete", "isolate", "restore", "resume")


def check_consent(drain: bool, wait: float | None, force: bool, yes: bool) -> None:
    """--drain, --wait, --force and --yes that go together (UsageError otherwise)."""
    if drain and force:
        raise UsageError("--drain and --force exclude each other",
                         hint="--drain waits for the jobs to end; --force breaks them")
    if wait is not None and not drain:
        raise UsageError("--wait goes with --drain", hint="e.g. --drain --wait 900")
    if yes and not force:
        raise UsageError("--yes goes with --force", hint="it skips the question --force asks")


@dataclass(frozen=True)
class ChangeRequest:
    """One partition change to run. *rack* is None only for `apply` of every rack with an NMX-M endpoint."""

    command: str
    rack: str | None = None
    name: str | None = None                       # create NAME --trays/--gpus, delete NAME
    template: str | None = None                   # create --template
    trays: tuple[str, ...] = ()                   # create NAME --trays (already parsed)
    gpus: tuple[tuple[str, int], ...] = ()        # create NAME --gpus (already parsed)
    gpu_granularity: bool = False
    tray: str | None = None                       # isolate / restore TRAY
    to: str = "quarantine"                        # isolate --to
    prune: bool = False                           # apply --prune
    kind: str = "ID_BASED"                        # NMX-M partition members by GPU ID or by location
    no_apply: bool = False                        # record in the inventory only
    nmx_only: bool = False                        # the inventory and NMX-M only, not journaled
    drain: bool = False
    wait: float | None = None
    force: bool = False
    yes: bool = False
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise ValueError(f"not a partition change: {self.command!r}")
        check_consent(self.drain, self.wait, self.force, self.yes)
