"""The site's safety budget as the actors see it: who holds a grant, and whether it is tripped (pure).

A grant is one tray out of service by mctl's own decision; the budget caps them per rack and per
site (mctl.model.settings.BudgetSettings) and, once a grant is refused, is tripped until a person
resets it. Where the grants are kept depends on the site's scheduler (Slurm: mctl.sched.slurm.budget);
every actor reads them as a `BudgetView`. Standard library only (the node check carries it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Grant:
    tray: str
    licenses: str = ""                  # what the grant holds (Slurm: the licenses of its reservation)
    start: str | None = None            # when it was granted, as the ledger prints it
    comment: str | None = None          # who asked, and why

    def to_dict(self) -> dict[str, Any]:
        return {"tray": self.tray, "licenses": self.licenses, "start": self.start, "comment": self.comment}


@dataclass(frozen=True)
class BudgetView:
    """The grants the ledger holds, and whether (and why) the budget is tripped."""

    grants: dict[str, Grant] = field(default_factory=dict)
    tripped: str | None = None          # the trip's words ("refused TRAY: ..."), or None
    tripped_at: str | None = None
    now: str | None = None              # the ledger's clock when read, in the form of a grant's start
    limits: dict[str, int] = field(default_factory=dict)    # what the ledger enforces: each cap by its name

    def age(self, tray: str) -> float | None:
        """Seconds since *tray*'s grant was made, by the ledger's own clock (None: not known)."""
        from datetime import datetime

        g = self.grants.get(tray)
        try:
            return (datetime.fromisoformat(self.now or "") - datetime.fromisoformat(g.start or "")).total_seconds() \
                if g is not None else None
        except ValueError:
            return None

    def held_by(self, rack_of: Mapping[str, str | None]) -> dict[str | None, list[str]]:
        """rack -> the trays of it that hold a grant."""
        out: dict[str | None, list[str]] = {}
        for tray in sorted(self.grants):
            out.setdefault(rack_of.get(tray), []).append(tray)
        return out

    def held_back(self) -> str | None:
        """Why no new tray may be taken out of service now (None: the ledger decides each grant)."""
        if self.tripped is None:
            return None
        return (f"held back by the safety budget: it is tripped ({self.tripped}); "
                "'mctl health breaker reset' once a person looked")

    def drift(self, expected: Mapping[str, int]) -> list[str]:
        """Where the ledger's caps differ from the inventory's (*expected*: cap name -> limit): the inventory
        was changed and not applied, and the ledger's numbers are the ones that hold. Empty when the caps
        were not read (an older ledger, or none)."""
        if not self.limits:
            return []
        out = []
        for name, want in sorted(expected.items()):
            have = self.limits.get(name)
            if have != want:
                out.append(f"{name}: the inventory says {want}, the scheduler enforces "
                           f"{'none' if have is None else have}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"grants": [g.to_dict() for _, g in sorted(self.grants.items())], "tripped": self.tripped,
                "tripped_at": self.tripped_at}
