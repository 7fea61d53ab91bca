"""What every check shares: the finding constructors with a short drain-reason fragment.

`details["short"]` is the few words that go after `mctl: ` in a Slurm drain
reason (sinfo -R shows little); the full message goes to the action log.
"""

from __future__ import annotations

from typing import Any

from mctl.checks.catalogue import spec
from mctl.model.findings import Finding, Severity


def finding(severity: Severity, host: str, check: str, message: str, action: str | None = None,
            short: str | None = None, **details: Any) -> Finding:
    if short:
        details["short"] = short
    return Finding(severity, host, check, message, action, details)


def fail(host: str, check: str, message: str, action: str | None = None, short: str | None = None,
         **details: Any) -> Finding:
    """A failure of *check*, at the one severity mctl.checks.catalogue gives it."""
    return finding(spec(check).severity, host, check, message, action, short, **details)


def ok(host: str, check: str, message: str, **details: Any) -> Finding:
    return Finding(Severity.OK, host, check, message, None, details)


def gpu_list(indexes) -> str:
    ix = sorted(set(indexes))
    return f"gpu{ix[0]}" if len(ix) == 1 else "gpu" + ",".join(str(i) for i in ix)
