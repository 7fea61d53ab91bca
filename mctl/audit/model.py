"""What one audit run found, what it could check, and the exit code that follows.

Every finding of the audit is a `mctl.model.findings.Finding` tagged with the
rule family that produced it and a *subject* (the block, file or partition it
is about), so that one run can be compared with the next by a fingerprint that
stays the same while the problem stays the same: (check, host, subject), never
the message, whose numbers move (ages, counts).

Rules also return OK findings for everything they compared, so reports can show
what was checked (JUnit testcases that pass) and history can tell a resolved
finding from one that was merely not looked at this time (an unreachable tray).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from mctl.errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, UsageError
from mctl.model.findings import Finding, Severity

# Rule families, in report order. "health" is the health check catalogue.
FAMILIES = ("versions", "firmware", "imex", "slurm", "nmx", "layers", "drains", "hostkeys", "health")
FAIL_ON = ("warn", "critical")
REPORT_SCHEMA = 1

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, option: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' or plain seconds -> seconds; anything else is a usage error."""
    m = _DURATION.match(str(text).strip().lower())
    if not m:
        raise UsageError(f"{option} {text!r} is not a duration", hint="use e.g. 90s, 30m, 12h, 7d or 2w")
    return float(m[1]) * _UNIT[m[2]]


def normalise_subject(subject: str | None) -> str:
    """Case and spacing do not make a different problem."""
    return " ".join((subject or "").split()).lower()


def fingerprint(check: str, host: str | None, subject: str | None) -> str:
    raw = "\0".join((check, host or "", normalise_subject(subject)))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """One finding of the audit, with where it came from."""

    family: str
    finding: Finding
    subject: str = ""
    rack: str | None = None

    @property
    def severity(self) -> Severity:
        return self.finding.severity

    @property
    def check(self) -> str:
        return self.finding.check

    @property
    def host(self) -> str | None:
        return self.finding.host

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.finding.check, self.finding.host, self.subject)

    def to_dict(self) -> dict[str, Any]:
        f = self.finding
        out: dict[str, Any] = {"family": self.family, "check": f.check, "severity": f.severity.value,
                               "rack": self.rack, "host": f.host, "subject": self.subject,
                               "fingerprint": self.fingerprint, "message": f.message, "action": f.action}
        if f.details:
            out["details"] = f.details
        return out


@dataclass(frozen=True)
class Gap:
    """Something the audit could not check: the family, where (a host, a rack, a controller) and why."""

    family: str
    scope: str
    reason: str
    hosts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "scope": self.scope, "reason": self.reason, "hosts": list(self.hosts)}


@dataclass(frozen=True)
class Skip:
    """A family that does not apply here (no NMX-M endpoint, no image, another scheduler): not a gap."""

    family: str
    scope: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "scope": self.scope, "reason": self.reason}


def severity_at_least(severity: Severity, fail_on: str) -> bool:
    return severity is not Severity.OK and severity.rank >= Severity(fail_on).rank


@dataclass
class AuditReport:
    site: str
    racks: list[str]
    started: float                                  # Unix time
    elapsed: float
    entries: list[Entry]                            # OK entries included
    coverage: dict[str, list[str]]                  # family -> hosts/racks it evaluated
    gaps: list[Gap] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    fail_on: str = "critical"
    settings: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] | None = None           # set once the run is recorded

    @property
    def complete(self) -> bool:
        return not self.gaps

    @property
    def findings(self) -> list[Entry]:
        """The problems (OK entries left out), most severe first, stable order."""
        bad = [e for e in self.entries if e.severity is not Severity.OK]
        return sorted(bad, key=lambda e: (-e.severity.rank, FAMILIES.index(e.family) if e.family in FAMILIES
                                          else len(FAMILIES), e.check, e.host or "", e.subject, e.finding.message))

    def failing(self) -> list[Entry]:
        return [e for e in self.findings if severity_at_least(e.severity, self.fail_on)]

    @property
    def exit_code(self) -> int:
        """3 when something could not be checked, else 1 on a finding at or above --fail-on, else 0."""
        if self.gaps:
            return EXIT_PARTIAL
        return EXIT_FINDINGS if self.failing() else EXIT_OK

    def counts(self) -> dict[str, int]:
        found = self.findings
        return {"critical": sum(e.severity is Severity.CRITICAL for e in found),
                "warn": sum(e.severity is Severity.WARN for e in found),
                "checked": len(self.entries)}

    def to_dict(self) -> dict[str, Any]:
        from datetime import datetime, timezone

        return {
            "schema": REPORT_SCHEMA, "kind": "mctl-audit", "site": self.site, "racks": self.racks,
            "started": datetime.fromtimestamp(self.started, timezone.utc).isoformat(timespec="seconds"),
            "elapsed": round(self.elapsed, 3), "fail_on": self.fail_on, "exit_code": self.exit_code,
            "complete": self.complete, "summary": self.counts(),
            "coverage": {fam: {"count": len(hosts), "hosts": _fold(hosts)} for fam, hosts in self.coverage.items()},
            "incomplete": [g.to_dict() for g in self.gaps],
            "skipped": [s.to_dict() for s in self.skipped],
            "settings": self.settings,
            "findings": [e.to_dict() for e in self.findings],
            "history": self.history,
        }


def _fold(names: Sequence[str]) -> str:
    from mctl.model.site import fold

    return fold(names) if names else ""


def _catalogued(f: Finding) -> None:
    """Every audit finding carries a check id of the catalogue (mctl.checks.catalogue) tagged for the
    audit, at a severity its entry allows: an id defined nowhere else is a bug, never a quiet new check."""
    from mctl.checks.catalogue import CHECKS
    from mctl.model.tray import AUDIT

    entry = CHECKS.get(f.check)
    if entry is None or AUDIT not in entry.purposes or not entry.allows(f.severity):
        raise RuntimeError(f"audit finding {f.check!r} at {f.severity.value} is not in the check catalogue "
                           "for the audit (mctl/checks/catalogue.py)")


def tag(family: str, findings: Iterable[Finding], *, rack_of: dict[str, str], subject_key: str = "subject",
        default_rack: str | None = None) -> list[Entry]:
    """Findings of one family as entries; the subject is taken from details[subject_key] (and kept out of them)."""
    out = []
    for f in findings:
        _catalogued(f)
        details = dict(f.details)
        subject = str(details.pop(subject_key, "") or "")
        finding = Finding(f.severity, f.host, f.check, f.message, f.action, details)
        out.append(Entry(family, finding, subject, rack_of.get(f.host or "", default_rack)))
    return out
