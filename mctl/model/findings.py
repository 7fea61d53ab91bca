"""Findings: what an inventory, a health check or an audit has to say about a host.

One shape for every producer, so reports, exit codes, drains and audit history
treat them alike. `check` is a stable dotted identifier (``gpu.count``,
``fabric.state``) that scripts can match on; `message` is for people; `action`
says what an operator should do about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable


class Severity(str, Enum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def __lt__(self, other: object) -> bool:  # type: ignore[override]
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank < other.rank


_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True)
class Finding:
    """One observation. `host` names what is at fault: a host, or a rack for rack-wide findings."""

    severity: Severity
    host: str | None
    check: str
    message: str
    action: str | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"severity": self.severity.value, "host": self.host, "check": self.check,
                               "message": self.message, "action": self.action}
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return cls(Severity(data["severity"]), data.get("host"), data["check"], data["message"],
                   data.get("action"), dict(data.get("details") or {}))


def critical(host: str | None, check: str, message: str, action: str | None = None, **details: Any) -> Finding:
    return Finding(Severity.CRITICAL, host, check, message, action, details)


def warn(host: str | None, check: str, message: str, action: str | None = None, **details: Any) -> Finding:
    return Finding(Severity.WARN, host, check, message, action, details)


def worst(findings: Iterable[Finding]) -> Severity:
    """The most severe level among *findings* (OK when there are none)."""
    level = Severity.OK
    for f in findings:
        if f.severity.rank > level.rank:
            level = f.severity
    return level


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by host and check, so reports read the same every run."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.host or "", f.check, f.message))
