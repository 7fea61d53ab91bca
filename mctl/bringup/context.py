"""What every bring-up phase gets (the rack, the options, where to report) and what it gives back."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mctl.errors import EXIT_PARTIAL, MctlError

if TYPE_CHECKING:
    from mctl.bringup.journal import Journal
    from mctl.model.site import Host, Rack, Site
    from mctl.ansible.runner import HostEvent

PHASES: tuple[str, ...] = ("preflight", "inventory", "provision", "partitions", "imex", "scheduler", "health",
                           "burn-in", "open", "validate")
TITLES = {
    "preflight": "inventory valid, hosts reachable, host keys trusted, NMX-M answers",
    "inventory": "facts over SSH against the rack's expected shape",
    "provision": "site playbook on the hosts that need it",
    "partitions": "NVLink partitions on NMX-M",
    "imex": "IMEX domains that follow the partitions",
    "scheduler": "Slurm: deploy and verify, trays held until open",
    "health": "health gate",
    "burn-in": "DCGM diagnostics / NCCL tests where the trays have them",
    "open": "resume the trays in Slurm",
    "validate": "an all-reduce across each NVLink partition, through Slurm",
}
BURN_IN_LEVELS = ("off", "quick", "medium", "long")


@dataclass(frozen=True)
class Options:
    """The choices of one run (kept in its journal, so a resume runs with the same ones)."""

    from_phase: str | None = None
    until_phase: str | None = None
    trust_new_keys: bool = False
    accept: tuple[str, ...] = ()          # health findings accepted: CHECK, HOST:CHECK, shell patterns
    reprovision: bool = False             # provision every host, markers or not
    burn_in: str = "medium"
    imex_wait: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.from_phase, "until": self.until_phase, "trust_new_keys": self.trust_new_keys,
                "accept": list(self.accept), "reprovision": self.reprovision, "burn_in": self.burn_in,
                "imex_wait": self.imex_wait}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Options":
        return cls(from_phase=data.get("from"), until_phase=data.get("until"),
                   trust_new_keys=bool(data.get("trust_new_keys")), accept=tuple(data.get("accept") or ()),
                   reprovision=bool(data.get("reprovision")), burn_in=data.get("burn_in") or "medium",
                   imex_wait=float(data.get("imex_wait") or 60.0))

    def selected(self) -> list[str]:
        start = PHASES.index(self.from_phase) if self.from_phase else 0
        end = PHASES.index(self.until_phase) if self.until_phase else len(PHASES) - 1
        return list(PHASES[start:end + 1])


class Reporter:
    """Where live progress goes; the CLI renders it, tests and --json leave it silent."""

    def phase_started(self, index: int, total: int, name: str) -> None:
        pass

    def line(self, text: str) -> None:
        pass

    def hosts_started(self, what: str, hosts: list[str]) -> None:
        pass

    def host_event(self, event: "HostEvent") -> None:
        pass

    def hosts_ended(self) -> None:
        pass

    def phase_ended(self, name: str, status: str, summary: str, seconds: float) -> None:
        pass


@dataclass
class Outcome:
    status: str                          # done | skipped
    summary: str
    changed: bool = False
    details: list[str] = field(default_factory=list)
    artifacts: dict[str, Any] = field(default_factory=dict)


class PhaseFailed(MctlError):
    """A phase found something it cannot get past: the run stops here and says what and where."""

    exit_code = EXIT_PARTIAL

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None,
                 details: list[str] | None = None, artifacts: dict[str, Any] | None = None):
        super().__init__(message, hint, exit_code=exit_code)
        self.details = details or []
        self.artifacts = artifacts or {}


class RackHold:
    """The rack lock, held for the run but let go while `deploy slurm` takes every rack's lock itself."""

    def __init__(self, state_dir: Path, rack: str, purpose: str):
        self.state_dir = state_dir
        self.rack = rack
        self.purpose = purpose
        self._stack: contextlib.ExitStack | None = None

    def acquire(self) -> None:
        from mctl.state.lock import rack_lock

        stack = contextlib.ExitStack()
        stack.enter_context(rack_lock(self.state_dir, self.rack, purpose=self.purpose))
        self._stack = stack

    def release(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """Let go of the rack lock for the block (the bring-up lock stays held)."""
        held = self._stack is not None
        self.release()
        try:
            yield
        finally:
            if held:
                self.acquire()


@dataclass
class Context:
    site: "Site"
    rack: "Rack"
    state_dir: Path
    options: Options
    report: Reporter
    run_id: str | None = None            # None for --dry-run
    journal: "Journal | None" = None
    hold: RackHold | None = None
    cache: dict[str, Any] = field(default_factory=dict)    # facts one phase found for the next (same process)

    @property
    def dry_run(self) -> bool:
        return self.run_id is None

    @property
    def trays(self) -> list["Host"]:
        return list(self.rack.compute)

    @property
    def managed(self) -> list["Host"]:
        """What bring-up provisions: the rack's compute trays and its head node."""
        return ([self.rack.head] if self.rack.head else []) + list(self.rack.compute)

    def note(self, phase: str, **artifacts: Any) -> None:
        if self.journal is not None:
            self.journal.note(phase, artifacts)

    def lent_lock(self):
        return self.hold.lent() if self.hold is not None else contextlib.nullcontext()
