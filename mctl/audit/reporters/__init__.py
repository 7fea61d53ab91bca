"""Report formats of an audit run, each a pure function of the AuditReport to text.

table (people), json (scripts, dashboards), junit (CI: one testsuite per rule
family, one testcase per host and check), prometheus (node_exporter's textfile
collector). The CLI writes the text to stdout or, atomically, to --output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport

FORMATS = ("table", "json", "junit", "prometheus")


def render(report: "AuditReport", fmt: str, *, verbose: bool = False) -> str:
    if fmt == "table":
        from mctl.audit.reporters.table import render_table
        return render_table(report, verbose=verbose)
    if fmt == "json":
        from mctl.audit.reporters.jsonfmt import render_json
        return render_json(report)
    if fmt == "junit":
        from mctl.audit.reporters.junit import render_junit
        return render_junit(report)
    if fmt == "prometheus":
        from mctl.audit.reporters.prometheus import render_prometheus
        return render_prometheus(report)
    raise ValueError(f"unknown format {fmt!r}")
