"""The report as JSON (schema 1, `kind: mctl-audit`); findings are the problems, OK results are counted."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mctl.audit.model import AuditReport


def render_json(report: "AuditReport") -> str:
    return json.dumps(report.to_dict(), indent=2, default=str) + "\n"
