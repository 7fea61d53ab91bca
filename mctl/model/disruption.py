"""What a provisioning would do to the work running on each tray (pure data, no I/O).

Provisioning tells its disruptive changes from its harmless ones before it runs: a check-mode pass of
the playbook says which task would change what on which host, and each task of the roles declares
what such a change does to running work (mctl.provision.disruption judges one by the other;
docs/decisions.md D71). A `TrayDisruption` is one host's answer; the jobs rule of provisioning
(mctl.rollout.service) and `mctl provision --dry-run` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# Declarations a task of playbooks/ carries as tags (docs/decisions.md D71).
DISRUPTIVE = "disruptive"        # a change replaces, removes or restarts something running work uses
HARMLESS = "harmless"            # a change touches nothing work uses live (a file read at the next start)
REBOOT = "reboot"                # with either: the change takes effect at the next boot
DECLARATIONS = (DISRUPTIVE, HARMLESS)


@dataclass(frozen=True)
class Declaration:
    """What a change of one task does, as the task declares it."""

    disruptive: bool
    reboot: bool = False


@dataclass(frozen=True)
class Change:
    """One task's change on one host, judged: what it disrupts (empty: harmless) and whether it needs a reboot."""

    task: str                              # "role: task name" (the playbook's own tasks: the name only)
    disrupts: tuple[str, ...] = ()         # what running work loses: components, or the task itself
    reboot: bool = False
    detail: str = ""                       # what it changes, in a line (packages, files)
    undeclared: bool = False               # the task declares nothing: counted as disruptive

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "disruptive": bool(self.disrupts), "disrupts": list(self.disrupts),
                "reboot": self.reboot, "detail": self.detail, "undeclared": self.undeclared}


@dataclass(frozen=True)
class TrayDisruption:
    """A host's changes as the check pass found them. *unknown*: why the pass could not tell (the host
    failed or did not answer), which counts as disruptive: provisioning never goes ahead blind."""

    host: str
    changes: tuple[Change, ...] = ()
    unknown: str | None = None

    @property
    def disruptive(self) -> bool:
        return self.unknown is not None or any(c.disrupts for c in self.changes)

    @property
    def reboot(self) -> bool:
        return any(c.reboot for c in self.changes)

    @property
    def changed(self) -> bool:
        return bool(self.changes) or self.unknown is not None

    def disrupting(self) -> list[str]:
        """What running work on the host would lose, in a few words each (the changes that are disruptive)."""
        out = [f"{c.task} ({c.detail})" if c.detail else c.task for c in self.changes if c.disrupts]
        if self.unknown is not None:
            out.append(f"unknown: {self.unknown}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "disruptive": self.disruptive, "reboot": self.reboot, "unknown": self.unknown,
                "changes": [c.to_dict() for c in self.changes]}


@dataclass(frozen=True)
class DisruptionReport:
    """The check pass over some hosts: each one's disruption, and the pass's run folder."""

    trays: Mapping[str, TrayDisruption] = field(default_factory=dict)
    run_dir: str | None = None

    def disruptive(self) -> list[str]:
        return [h for h, d in self.trays.items() if d.disruptive]

    def harmless(self) -> list[str]:
        """Hosts with changes, none of them disruptive."""
        return [h for h, d in self.trays.items() if d.changed and not d.disruptive]

    def unchanged(self) -> list[str]:
        return [h for h, d in self.trays.items() if not d.changed]

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "trays": {h: d.to_dict() for h, d in self.trays.items()}}
