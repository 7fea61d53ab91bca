"""What happened on each host of a fan-out, and the clush -b style grouping of it.

Every host ends in exactly one status so a caller never has to read an
exception to learn whether a tray answered: ok, failed (the command ran and
exited non-zero), unreachable (no SSH session: refused, no route, or no SSH
answer within the connect timeout), timeout (the session opened but the
command did not finish in time: a hung host) or host-key-mismatch (refused
for security).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Hashable, Iterable

from ClusterShell.NodeSet import NodeSet


class HostStatus(str, Enum):
    OK = "ok"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    HOST_KEY_MISMATCH = "host-key-mismatch"

    @property
    def reached(self) -> bool:
        """The command ran to completion (whatever its exit code)."""
        return self in (HostStatus.OK, HostStatus.FAILED)


@dataclass(frozen=True)
class HostKeyProblem:
    """Why a host was refused: the key it presented and the ones on record."""

    presented: str | None                  # "ssh-ed25519 SHA256:..." or None if not seen
    recorded: tuple[str, ...]              # same form; empty when the host was never trusted
    known_hosts: str

    def to_dict(self) -> dict[str, Any]:
        return {"presented": self.presented, "recorded": list(self.recorded), "known_hosts": self.known_hosts}


@dataclass(frozen=True)
class HostResult:
    host: str
    address: str
    status: HostStatus
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None               # operator text for non-ok statuses
    elapsed: float = 0.0                   # seconds, connect (if needed) + command
    phase: str | None = None               # "connect" or "command": where a timeout/failure struck
    host_key: HostKeyProblem | None = None
    attempts: int = 1                      # connect attempts used (retries happen on connect only)

    @property
    def ok(self) -> bool:
        return self.status is HostStatus.OK

    def summary(self) -> str:
        """One line for reports: 'exit 2: No such file', 'unreachable: Connection refused'."""
        if self.status is HostStatus.OK:
            return "ok"
        if self.status is HostStatus.FAILED:
            last = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
            return f"exit {self.exit_code}" + (f": {last[0]}" if last else "")
        return f"{self.status.value}: {self.error}" if self.error else self.status.value

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "address": self.address, "status": self.status.value,
                               "exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                               "error": self.error, "phase": self.phase, "elapsed": round(self.elapsed, 3),
                               "attempts": self.attempts}
        if self.host_key is not None:
            out["host_key"] = self.host_key.to_dict()
        return out


@dataclass(frozen=True)
class OutputGroup:
    """Hosts that printed the same thing, shown once under their folded node set."""

    nodes: str                                   # folded: lab-r1-tray[01-17]
    hosts: tuple[str, ...]
    status: HostStatus
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "count": self.count, "status": self.status.value,
                "exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr, "error": self.error}


def _default_key(r: HostResult) -> Hashable:
    return (r.status, r.exit_code, r.stdout, r.stderr, r.error if not r.status.reached else None)


def group_by_output(results: Iterable[HostResult],
                    key: Callable[[HostResult], Hashable] = _default_key) -> list[OutputGroup]:
    """Group hosts whose results are identical under *key*.

    Groups come out largest first (the usual case on top, the odd ones below),
    ties in node order, so the same run always prints the same way. Errors of
    unreachable hosts differ only by address, so by default they group by status.
    """
    buckets: dict[Hashable, list[HostResult]] = {}
    for r in results:
        buckets.setdefault(key(r), []).append(r)
    groups = []
    for members in buckets.values():
        first = members[0]
        names = [m.host for m in members]
        folded = NodeSet.fromlist(names)
        error = first.error if len({m.error for m in members}) == 1 else None
        groups.append(OutputGroup(str(folded), tuple(folded), first.status, first.exit_code,
                                  first.stdout, first.stderr, error))
    groups.sort(key=lambda g: (-g.count, g.status is not HostStatus.OK, g.nodes))
    return groups
