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


# The boot grace (docs/health.md "Just after a boot"). What a tray starts after a boot (slurmd after munge
# and the network, the IMEX daemon, the driver and its GPU tools) is not there at once: a tray seen in its
# first seconds is half booted, not failed. Hardware signals (an NVLink down, a fabric failure, a GPU
# missing, XIDs of this boot) and a GPU tool that hangs (a wedge, not a start) are judged at once. While the tray is younger than the
# site's `health.boot_grace`, a critical finding of one of these checks warns instead, marked `boot_grace`;
# the policy neither drains for it nor counts the tray healthy (mctl.health.policy), so a tray that is still
# failing once the grace ends is drained then, and one that comes up whole is judged at once.
GRACE_CHECKS = frozenset({"slurm.slurmd", "imex.daemon", "gpu.facts"})
NOT_A_START = frozenset({"nvidia-smi hung"})      # gpu.facts' short forms that a boot does not explain
GRACE = "boot_grace"


def apply_grace(facts, settings, findings: list[Finding]) -> list[Finding]:
    """*findings* with the start-up checks' critical ones lowered to warnings while the tray is in its grace."""
    from dataclasses import replace

    from mctl.model.findings import Severity

    grace = float(getattr(settings, "boot_grace_s", 0.0) or 0.0)
    if grace <= 0 or facts.clock is None or facts.clock.uptime >= grace:
        return findings
    up = facts.clock.uptime
    out = []
    for f in findings:
        if f.severity is Severity.CRITICAL and f.check in GRACE_CHECKS and f.details.get("short") not in NOT_A_START:
            f = replace(f, severity=Severity.WARN,
                        message=f"{f.message} (up {up:.0f}s, in the boot grace of {grace:.0f}s: judged once it ends)",
                        details={**f.details, GRACE: {"uptime": round(up, 1), "grace": grace}})
        out.append(f)
    return out


def in_grace(findings) -> bool:
    """Whether a sweep's findings hold a start-up failure the boot grace lowered (the tray is not judged yet)."""
    return any(GRACE in f.details for f in findings)
