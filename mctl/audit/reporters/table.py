"""The report as plain text for people: what was checked, what could not be, and the findings.

Findings with the same severity, check and message are one row with their
hosts folded (`lab-r1-tray[01-18]`), so a driver rolled out to a whole rack
is one line, not eighteen. No colour and no terminal codes: the same text
goes to a terminal, a pipe, cron mail or --output.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from mctl.audit.model import FAMILIES

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport


def _fold(names: list[str]) -> str:
    from mctl.model.site import fold

    named = [n for n in names if n]
    try:
        text = fold(named) if named else ""
    except Exception:  # noqa: BLE001 - a name NodeSet cannot fold is listed as it is
        text = ",".join(sorted(named))
    return text or "site"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:-1])) + "  " + r[-1] for r in rows]


def render_table(report: "AuditReport", *, verbose: bool = False) -> str:
    when = datetime.fromtimestamp(report.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    racks = ", ".join(report.racks)
    lines = [f"mctl audit of {report.site} ({'rack' if len(report.racks) == 1 else 'racks'} {racks}) at {when}, "
             f"{report.elapsed:.1f} s"]
    order = [f for f in FAMILIES if f in report.coverage] + sorted(set(report.coverage) - set(FAMILIES))
    checked = ", ".join(f"{fam} {len(report.coverage[fam])}" for fam in order)
    lines.append(f"checked: {checked or 'nothing'} (hosts or racks per rule family)")
    for gap in report.gaps:
        lines.append(f"NOT CHECKED: {gap.family} on {gap.scope}: {gap.reason}")
    for skip in report.skipped:
        lines.append(f"not applicable: {skip.family} on {skip.scope}: {skip.reason}")
    lines.append("")
    groups: dict[tuple, list] = {}
    for e in report.findings:
        key = (e.severity.value, e.family, e.check, e.finding.message, e.finding.action)
        groups.setdefault(key, []).append(e.host or "")
    if groups:
        rows = [["SEVERITY", "FAMILY", "CHECK", "WHERE", "MESSAGE"]]
        actions = []
        for (sev, fam, check, message, action), hosts in groups.items():
            rows.append([sev, fam, check, _fold(hosts), message])
            actions.append(action)
        table = _columns(rows)
        lines.append(table[0])
        for row, action in zip(table[1:], actions):
            lines.append(row)
            if verbose and action:
                lines.append(f"    -> {action}")
        lines.append("")
    else:
        lines.append("no findings")
        lines.append("")
    counts = report.counts()
    history = report.history or {}
    since = ""
    if history:
        since = f"; since the last run: {history.get('new', 0)} new, {history.get('resolved', 0)} resolved"
    lines.append(f"{counts['critical']} critical, {counts['warn']} warn{since}; exit {report.exit_code} "
                 f"(--fail-on {report.fail_on}{', incomplete' if report.gaps else ''})")
    return "\n".join(lines) + "\n"
