"""The tray checks: one module per rule, each a pure function of a tray's facts (mctl.model.tray.TrayFacts).

Every check id, with its one severity and the purposes that evaluate it, is defined
once in mctl.checks.catalogue; the health sweep, `mctl node check` and the audit run
CATALOGUE below (run_tray), the rack inventory runs mctl.checks.inventory, which
evaluates the shared rules (gpu.facts, gpu.count, fabric.state, fabric.health) with
these same modules.

Every check has the signature `check(facts, expect, settings) -> list[Finding]`
and returns an OK finding when all is well (so a report shows what was
checked), nothing when it does not apply. Standard library only: `mctl node
check` runs them on the tray.

CATALOGUE order is also the precedence of drain reasons: when a tray has
several critical findings, the first check's short text names the drain.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mctl.checks import (boot, clocks, dcgm, driver, ecc, fabric_health, fabric_identity, fabric_state, gpu_count, imex,
                         nvlink, nvlink_errors, reachability, resources, slurmd, thermal, xid)
from mctl.checks import leak
from mctl.model.drain import REASON_MAX, REASON_PREFIX
from mctl.model.findings import Finding, Severity, sort_findings

CATALOGUE = (
    ("leak", leak),                 # first: a leak names the drain whatever else is wrong (docs/health.md)
    ("reachability", reachability),
    ("xid", xid),
    ("gpu-count", gpu_count),
    ("ecc", ecc),
    ("nvlink", nvlink),
    ("nvlink-errors", nvlink_errors),
    ("fabric-state", fabric_state),
    ("fabric-identity", fabric_identity),
    ("fabric-health", fabric_health),
    ("imex", imex),
    ("thermal", thermal),
    ("clocks", clocks),
    ("dcgm", dcgm),                 # after the GPU's own signals: an ECC or XID names the drain first
    ("slurmd", slurmd),
    ("driver", driver),
    ("resources", resources),
    ("boot", boot),
)
CHECK_NAMES = tuple(name for name, _ in CATALOGUE)
PARTIAL = "probe.partial"


def run_tray(facts, expect, settings, *, skip: Sequence[str] = ()) -> list[Finding]:
    """Every check of the catalogue on one tray; an unreached tray gets only the reachability finding
    (and what its BMC said, read out of band)."""
    if not facts.reached:
        return reachability.check(facts, expect, settings) + leak.check(facts, expect, settings)
    out: list[Finding] = []
    for name, module in CATALOGUE:
        if name in skip:
            continue
        out.extend(module.check(facts, expect, settings))
    out.extend(partial(facts))
    return boot.apply_grace(facts, settings, out)


def run_switch_tray(host: str, rack: str | None, bmc) -> list[Finding]:
    """A switch tray's checks: what its BMC says (mctl.checks.leak; no host of it is probed), each finding
    with its rack and role in its details."""
    return leak.judge(host, bmc, rack=rack, role="switch")


def partial(facts) -> list[Finding]:
    """probe.partial: one warning per probe section that was missing or unreadable."""
    return [Finding(Severity.WARN, facts.host, PARTIAL, f"probe: {problem}",
                    "rerun; if it persists, run the probe by hand with mctl exec") for problem in facts.problems]


def run_rack(rack: str, trays: Sequence, plan: Mapping[str, str]) -> list[Finding]:
    """Checks that need the whole rack (clique against the partition plan)."""
    return fabric_identity.rack_check(rack, trays, plan)


def _owners() -> dict[str, int]:
    """Check id ('gpu.xid') -> position of its module in the catalogue (the module's upper-case str constants)."""
    out: dict[str, int] = {}
    for position, (_, module) in enumerate(CATALOGUE):
        for attr in dir(module):
            value = getattr(module, attr)
            if attr.isupper() and isinstance(value, str) and "." in value:
                out[value] = position
    return out


_OWNERS = _owners()


def precedence(f: Finding) -> tuple[int, str]:
    return (_OWNERS.get(f.check, len(CATALOGUE)), f.check)


def drain_reason(findings: Sequence[Finding]) -> tuple[str, str]:
    """(Slurm reason starting 'mctl:', at most REASON_MAX chars; full text for the action log)."""
    crit = sorted((f for f in findings if f.severity is Severity.CRITICAL), key=precedence)
    if not crit:
        raise ValueError("no critical finding to drain for")
    short = crit[0].details.get("short") or crit[0].check
    more = f" +{len(crit) - 1}" if len(crit) > 1 else ""
    return compose_reason(short, more), "; ".join(f"{f.check}: {f.message}" for f in crit)


def compose_reason(short: str, suffix: str = "") -> str:
    room = REASON_MAX - len(REASON_PREFIX) - 1 - len(suffix)
    text = short if len(short) <= room else short[: max(room - 1, 1)].rstrip() + "~"
    return f"{REASON_PREFIX} {text}{suffix}"


def summarize(findings: Sequence[Finding]) -> dict[str, int]:
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        counts[f.severity.value] += 1
    return counts


__all__ = ["CATALOGUE", "CHECK_NAMES", "run_tray", "run_switch_tray", "run_rack", "drain_reason", "compose_reason", "precedence",
           "summarize", "sort_findings"]
