"""Basic host resources: local file systems not full, memory available."""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

DISK = "host.disk"
MEMORY = "host.memory"


def check(facts, expect, settings) -> list[Finding]:
    host = facts.host
    out: list[Finding] = []
    seen: set[str] = set()
    for d in facts.disks:
        if d.mount in seen:
            continue
        seen.add(d.mount)
        pct = d.used_pct
        where = d.path if d.path == d.mount or not d.path else f"{d.path} ({d.mount})"
        if pct >= settings.disk_critical_pct:
            out.append(fail(host, DISK, f"{where} is {pct:.0f}% full",
                            "free space (logs, core dumps, /tmp) before jobs fail to start",
                            short=f"disk {d.mount} {pct:.0f}% full"))
        elif pct >= settings.disk_warn_pct:
            out.append(finding(Severity.WARN, host, DISK, f"{where} is {pct:.0f}% full", "free some space"))
    if facts.disks and not any(f.check == DISK for f in out):
        out.append(ok(host, DISK, "file systems below " + f"{settings.disk_warn_pct:g}% full"))
    mem = facts.memory
    if mem is not None:
        if mem.available_pct < settings.memory_warn_available_pct:
            out.append(fail(host, MEMORY, f"only {mem.available_pct:.1f}% of memory available "
                            f"({mem.available_kib // 1024} of {mem.total_kib // 1024} MiB)",
                            "look for leaked processes outside jobs (ps aux --sort=-rss)"))
        else:
            out.append(ok(host, MEMORY, f"{mem.available_pct:.0f}% of memory available"))
    return out
