"""The tray shows all its GPUs (4 on a GB200 tray) and nvidia-smi/NVML can read them."""

from __future__ import annotations

from mctl.health.checks._base import finding, ok
from mctl.model.findings import Finding, Severity

CHECK = "gpu.count"
FACTS = "gpu.facts"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None:
        error = facts.gpu_error or "no GPU facts"
        short = ("nvidia-smi hung" if "hung" in error else "no gpu driver" if "driver" in error
                 else "gpu facts unreadable")
        return [finding(Severity.CRITICAL, facts.host, FACTS, error,
                        "drain, then check the driver (lsmod | grep nvidia; nvidia-smi) and the kernel log",
                        short=short)]
    report = facts.gpus
    have = len(report.gpus)
    want = expect.gpus_per_tray
    if have != want or (report.attached_gpus is not None and report.attached_gpus != have):
        driver = f", driver counts {report.attached_gpus}" if report.attached_gpus not in (None, have) else ""
        said = f"; {facts.gpu_messages[0]}" if facts.gpu_messages else ""
        return [finding(Severity.CRITICAL, facts.host, CHECK, f"{have} of {want} GPUs readable{driver}{said}",
                        "a GPU fell off the bus or failed: drain, check XIDs (79), reboot; reseat or replace if it "
                        "stays missing", short=f"gpu count {have}/{want}", visible=have, expected=want,
                        attached=report.attached_gpus)]
    return [ok(facts.host, CHECK, f"{have}/{want} GPUs")]
