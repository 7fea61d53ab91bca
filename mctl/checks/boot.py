"""A reboot between two sweeps: the tray's boot id changed (/proc/sys/kernel/random/boot_id).

The boot id is the kernel's own, new at every boot, so a tray that lost power,
panicked or was rebooted by someone is seen even when it came back between two
sweeps and answers as if nothing happened. It is a warning, not a drain: what
made it reboot shows in its other checks (and XIDs from before the boot no longer
count, see gpu.xid). The previous boot id comes from the engine (the watch
remembers it, `health check` reads the last one recorded in the state folder).
"""

from __future__ import annotations

from mctl.checks._base import fail, ok
from mctl.model.findings import Finding

CHECK = "tray.boot"


def check(facts, expect, settings) -> list[Finding]:
    if not facts.boot_id or not facts.previous_boot_id:
        return []           # nothing to compare with (first sweep, or a probe without the boot id)
    up = f", up {facts.clock.uptime:.0f}s" if facts.clock is not None else ""
    if facts.rebooted:
        return [fail(facts.host, CHECK,
                     f"tray rebooted since the last sweep (boot id {facts.previous_boot_id[:8]} -> "
                     f"{facts.boot_id[:8]}{up})",
                     "if no one rebooted it: look for a kernel panic, a watchdog or a power event in its logs "
                     "and the BMC event log; XIDs logged before this boot no longer count",
                     short="rebooted", boot_id=facts.boot_id, previous_boot_id=facts.previous_boot_id)]
    return [ok(facts.host, CHECK, f"same boot as the last sweep ({facts.boot_id[:8]}{up})", boot_id=facts.boot_id)]
