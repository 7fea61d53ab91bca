"""Every GPU's fabric state is Completed with status Success (the device plugin's rule).

`In Progress` is a fabric being (re)programmed, e.g. during a partition change:
a warning, because it passes by itself; anything else is critical.
"""

from __future__ import annotations

from mctl.checks._base import finding, gpu_list, ok
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import FABRIC_COMPLETED, FABRIC_IN_PROGRESS, FABRIC_SUCCESS

CHECK = "fabric.state"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    bad = [g for g in facts.gpus.gpus if g.fabric.state != FABRIC_COMPLETED or g.fabric.status != FABRIC_SUCCESS]
    if not bad:
        return [ok(facts.host, CHECK, "Completed/Success on every GPU")]
    by_state: dict[str, list[int]] = {}
    for g in bad:
        by_state.setdefault(f"{g.fabric.state or 'unknown'}/{g.fabric.status or 'N/A'}", []).append(g.index)
    text = "; ".join(f"{s} on GPU {','.join(map(str, sorted(ix)))}" for s, ix in sorted(by_state.items()))
    transient = all(g.fabric.state == FABRIC_IN_PROGRESS for g in bad)
    severity = Severity.WARN if transient else Severity.CRITICAL
    first = bad[0]
    short = f"fabric {first.fabric.status or first.fabric.state or 'unknown'} {gpu_list(g.index for g in bad)}"
    return [finding(severity, facts.host, CHECK, f"fabric not ready: {text}",
                    "wait for the fabric manager if a partition change is running; otherwise check NMX-M and the "
                    "NVLink switch trays, then reset the GPUs", short=short.lower(),
                    gpus=[g.index for g in bad])]
