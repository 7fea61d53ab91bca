"""A provisioning as asked for: the consent it comes with and how it is paced (pure).

The consent rule is the partition change's (mctl.change.request.check_consent): --drain waits for
the work, --force breaks it (and asks), --yes only answers --force's question. --rolling N paces a
--drain provisioning N trays at a time; --resume finishes the rack's last rollout that stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mctl.change.request import check_consent
from mctl.errors import UsageError

DEFAULT_WAIT = 600.0            # --drain's default wait for the jobs on a batch's held trays, seconds


@dataclass(frozen=True)
class ProvisionRequest:
    """How a provisioning treats the work on its trays."""

    drain: bool = False
    wait: float | None = None
    force: bool = False
    yes: bool = False
    rolling: int | None = None        # trays at a time (None: every disruptive tray in one batch)
    resume: bool = False
    dry_run: bool = False

    def __post_init__(self) -> None:
        check_consent(self.drain, self.wait, self.force, self.yes)
        if self.rolling is not None:
            if self.rolling < 1:
                raise UsageError(f"--rolling {self.rolling}: a batch is at least one tray", hint="e.g. --rolling 2")
            if not self.drain:
                raise UsageError("--rolling goes with --drain",
                                 hint="each batch is held in Slurm and its work waited for: --rolling N --drain")

    @property
    def seconds(self) -> float:
        return DEFAULT_WAIT if self.wait is None else self.wait


def check_resume(given: Sequence[str]) -> None:
    """--resume goes on with the stopped rollout's own plan and options: any other option is refused."""
    if given:
        raise UsageError(f"--resume takes no other option (given: {', '.join(given)})",
                         hint="it finishes the rack's stopped rollout with the image, tags and pace it started with")
