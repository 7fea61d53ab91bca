"""What the watch does about a sweep: responders, each deciding its own kind of action, one actuator acting.

    drain      the remediation policy: drain, resume, skip, forget, queue, adopt (mctl.health.policy), also
               as the trays' answers arrive (early drains), and the intents a killed watch left reconciled
    leak       a critical leak's power-off after its grace (mctl.health.leaks)
    ladder     the recovery ladder's rungs, repair marks and burn-ins (mctl.health.ladder)
    isolation  a tray drained for a hardware fault moved out of its partition (mctl.health.isolate)

A responder is told the sweep's result and the health state (under the state lock) and returns
the action-log lines of what it did; its decisions go through the pure module named above, its
actions through the one `Actuator` (mctl.health.actuator), so every action is written, sent,
settled and logged the same way. `dry_run` says what it would do, changing nothing on disk. The
engine (mctl.health.engine) runs them in this order after each sweep; a new responder plugs in
by being added to that list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.health.actuator import Actuator
    from mctl.health.site_view import Scope
    from mctl.health.store import ActionEntry, HealthState
    from mctl.health.sweep import SweepResult
    from mctl.model.drain import Decision
    from mctl.model.findings import Finding
    from mctl.model.settings import HealthSettings
    from mctl.model.site import Partition, Site
    from mctl.transport import SSHPool


@dataclass
class Context:
    """What a responder may use about the site and this sweep."""

    site: "Site"
    scope: "Scope"
    settings: "HealthSettings"
    sizes: Mapping[str, int]                      # compute trays per rack (the breaker's denominators)
    state_dir: Path
    who: str
    actuator: "Actuator"
    result: "SweepResult"
    now: float
    pool: "SSHPool | None" = None
    targets: Sequence[Any] = ()                   # the trays' SSH targets
    scheduler: Any = None                         # the scheduler adapter (mctl.sched.adapter), or None
    oob_settings: Any = None                      # the BMC client settings, or None
    oob_problem: str | None = None
    partitions_changed: Callable[[str, Sequence["Partition"]], None] = lambda rack, after: None
    decisions: list["Decision"] = field(default_factory=list)    # what this sweep decided, for its report


class Responder:
    """One kind of response to a sweep (see the module's docstring)."""

    name = "responder"

    async def respond(self, ctx: Context, state: "HealthState") -> list["ActionEntry"]:
        return []

    def dry_run(self, ctx: Context, state: "HealthState") -> list["Decision"]:
        """What it would do this sweep (state is the dry run's in-memory copy)."""
        return []

    def findings(self, records) -> list["Finding"]:
        """Findings of its own for the sweep's report (the ladder's repair marks)."""
        return []
