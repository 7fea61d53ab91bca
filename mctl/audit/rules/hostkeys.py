"""The host key each host presented against the inventory's known_hosts (read-only; nothing is recorded).

The audit's SSH connections check keys strictly, so a host that answered
presented a recorded key, and one that was refused comes back with the
fingerprint it presented and the ones on record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.transport.results import HostKeyProblem

FAMILY = "hostkeys"
CHECK = "ssh.host-key"          # the inventory's id for the same check (one id: docs/decisions.md)


def check_host(host: str, reach: str, problem: "HostKeyProblem | None") -> list[Finding]:
    """One finding when the key was seen (the host answered, or was refused for its key), else none."""
    details = {"subject": "host key"}
    if reach in ("ok", "failed"):
        return [Finding(Severity.OK, host, CHECK, "presented a key recorded in known_hosts", None, details)]
    if reach != "host-key-mismatch":
        return []
    presented = (problem.presented if problem else None) or "an unreadable key"
    recorded = list(problem.recorded) if problem else []
    where = problem.known_hosts if problem else "known_hosts"
    if recorded:
        return [Finding(Severity.CRITICAL, host, CHECK,
                        f"host key changed: presents {presented}, {where} records {', '.join(recorded)}",
                        "verify out of band (reinstalled tray, or someone in between?), then "
                        f"'mctl ssh trust {host} --replace'", {**details, "presented": presented,
                                                              "recorded": recorded})]
    return [Finding(Severity.WARN, host, CHECK, f"host key not in {where} (presents {presented})",
                    f"check the fingerprint, then 'mctl ssh trust {host}'", {**details, "presented": presented})]
