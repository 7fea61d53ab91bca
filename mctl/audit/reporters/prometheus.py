"""The report in Prometheus text exposition format, for node_exporter's textfile collector.

Alert on `mctl_audit_findings{severity="critical"} > 0`, on
`mctl_audit_incomplete == 1`, and on `time() - mctl_audit_last_run_timestamp_seconds`
growing past the cron interval (the audit stopped running). Per-rack totals
are written for both severities even when zero, so a graph never has holes;
per-check series exist only while the check has findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from mctl.audit.model import FAMILIES
from mctl.model.findings import Severity

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}" if labels else ""


def render_prometheus(report: "AuditReport") -> str:
    site = report.site
    lines: list[str] = []

    def metric(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            number = str(int(value)) if float(value).is_integer() else f"{value:.3f}"
            lines.append(f"{name}{_labels(labels)} {number}")

    per_check: dict[tuple[str, str, str, str], int] = {}
    per_rack: dict[tuple[str, str], int] = {(r, s): 0 for r in report.racks for s in ("warn", "critical")}
    for e in report.findings:
        rack = e.rack or ""
        per_check[(rack, e.family, e.check, e.severity.value)] = \
            per_check.get((rack, e.family, e.check, e.severity.value), 0) + 1
        if e.severity is not Severity.OK:
            per_rack[(rack, e.severity.value)] = per_rack.get((rack, e.severity.value), 0) + 1
    metric("mctl_audit_findings", "Findings of the last audit run by rack, rule family, check and severity.",
           [({"site": site, "rack": r, "family": f, "check": c, "severity": s}, n)
            for (r, f, c, s), n in sorted(per_check.items())])
    metric("mctl_audit_rack_findings", "Findings of the last audit run per rack and severity (zeros included).",
           [({"site": site, "rack": r, "severity": s}, n) for (r, s), n in sorted(per_rack.items())])
    families = [f for f in FAMILIES if f in report.coverage]
    metric("mctl_audit_checked", "Hosts or racks each rule family evaluated in the last run.",
           [({"site": site, "family": f}, len(report.coverage[f])) for f in families])
    gaps: dict[str, int] = {}
    for g in report.gaps:
        gaps[g.family] = gaps.get(g.family, 0) + 1
    metric("mctl_audit_not_checked", "What the last run could not check, per family (unreachable trays are 'reach').",
           [({"site": site, "family": f}, n) for f, n in sorted(gaps.items())])
    metric("mctl_audit_incomplete", "1 when the last run could not check everything (exit code 3).",
           [({"site": site}, 0 if report.complete else 1)])
    metric("mctl_audit_exit_code", "Exit code of the last run (0 clean, 1 findings, 3 incomplete).",
           [({"site": site, "fail_on": report.fail_on}, report.exit_code)])
    metric("mctl_audit_duration_seconds", "How long the last run took.", [({"site": site}, round(report.elapsed, 3))])
    metric("mctl_audit_last_run_timestamp_seconds", "When the last run started (Unix time).",
           [({"site": site}, round(report.started, 3))])
    return "\n".join(lines) + "\n"
