"""The report as JUnit XML for CI: one testsuite per rule family, one testcase per host and check.

A testcase fails (<failure>) when its worst finding is at or above --fail-on;
a lesser finding is kept in its <system-out> so the test passes but the text is
there. What could not be checked is an <error> (the run is incomplete), a
family that does not apply to a rack is <skipped>. Testcase names are stable
(`<host>: <check>`), so CI tracks each one from run to run.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from mctl.audit.model import FAMILIES, severity_at_least
from mctl.model.findings import Severity

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport, Entry


def _family_order(name: str) -> tuple[int, str]:
    return (FAMILIES.index(name) if name in FAMILIES else len(FAMILIES), name)


def render_junit(report: "AuditReport") -> str:
    stamp = datetime.fromtimestamp(report.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    cases: dict[str, dict[tuple[str, str], list["Entry"]]] = {}
    for e in report.entries:
        cases.setdefault(e.family, {}).setdefault((e.host or report.site, e.check), []).append(e)
    gaps: dict[str, list] = {}
    for g in report.gaps:
        gaps.setdefault(g.family, []).append(g)
    skips: dict[str, list] = {}
    for s in report.skipped:
        skips.setdefault(s.family, []).append(s)
    families = sorted(set(cases) | set(gaps) | set(skips), key=_family_order)
    root = ET.Element("testsuites", name="mctl audit")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for fam in families:
        suite = ET.SubElement(root, "testsuite", name=f"mctl-audit.{fam}", timestamp=stamp, hostname=report.site,
                              time="0")
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for (host, check), entries in sorted(cases.get(fam, {}).items()):
            rack = next((e.rack for e in entries if e.rack), None) or "site"
            case = ET.SubElement(suite, "testcase", classname=f"mctl.audit.{fam}.{rack}", name=f"{host}: {check}",
                                 time="0")
            counts["tests"] += 1
            bad = sorted((e for e in entries if e.severity is not Severity.OK), key=lambda e: -e.severity.rank)
            failing = [e for e in bad if severity_at_least(e.severity, report.fail_on)]
            if failing:
                counts["failures"] += 1
                text = "\n".join(f"{e.severity.value}: {e.finding.message}"
                                 + (f"\naction: {e.finding.action}" if e.finding.action else "") for e in failing)
                failure = ET.SubElement(case, "failure", type=failing[0].severity.value,
                                        message=failing[0].finding.message)
                failure.text = text
            lesser = [e for e in bad if e not in failing]
            if lesser:
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join(f"{e.severity.value}: {e.finding.message}" for e in lesser)
        for g in gaps.get(fam, []):
            case = ET.SubElement(suite, "testcase", classname=f"mctl.audit.{fam}", name=f"{g.scope}: checked",
                                 time="0")
            counts["tests"] += 1
            counts["errors"] += 1
            err = ET.SubElement(case, "error", type="incomplete", message=g.reason)
            err.text = f"{fam} could not be checked on {g.scope}: {g.reason}"
        for s in skips.get(fam, []):
            case = ET.SubElement(suite, "testcase", classname=f"mctl.audit.{fam}", name=f"{s.scope}: applies",
                                 time="0")
            counts["tests"] += 1
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=s.reason)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{report.elapsed:.3f}")
    root.set("timestamp", stamp)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
