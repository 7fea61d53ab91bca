"""Boot configuration: is each tray running with the kernel parameters its image declares?

Provisioning (playbooks/roles/base) writes the parameters to /etc/default/grub.d/, regenerates
the boot configuration with update-grub, and leaves REBOOT_FLAG on the tray while the running
kernel's command line lacks them. The audit reads /proc/cmdline and the flag: the running kernel
is the truth, the flag only says whether provisioning already did its part (then a reboot is all
that is missing).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mctl.model.findings import Finding, Severity

FAMILY = "boot"
CHECK = "boot.kernel_parameters"
CMDLINE = "/proc/cmdline"
REBOOT_FLAG = "/var/lib/mctl/reboot-required"
FILES = (CMDLINE, REBOOT_FLAG)


def check_tray(host: str, params: Sequence[str], files: Mapping[str, str | None],
               file_errors: Mapping[str, str]) -> list[Finding]:
    """One finding for a tray whose image declares kernel parameters; none when it declares none."""
    if not params:
        return []
    details = {"subject": "kernel command line", "wanted": list(params)}
    cmdline = files.get(CMDLINE)
    if cmdline is None:
        why = file_errors.get(CMDLINE, "absent")
        return [Finding(Severity.WARN, host, CHECK, f"cannot read {CMDLINE} ({why})", "check the tray", details)]
    running = cmdline.split()
    missing = [p for p in params if p not in running]
    if not missing:
        return [Finding(Severity.OK, host, CHECK, "running with the image's kernel parameters", None, details)]
    details = {**details, "missing": missing}
    if files.get(REBOOT_FLAG) is not None:
        return [Finding(Severity.WARN, host, CHECK,
                        f"reboot required: boot configuration has {' '.join(missing)}, the running kernel does not",
                        f"drain and reboot {host}", {**details, "reboot_required": True})]
    return [Finding(Severity.WARN, host, CHECK, f"kernel parameters not applied: {' '.join(missing)}",
                    f"'mctl provision {host} --tags base', then reboot it", {**details, "reboot_required": False})]
