"""The tray shows all its GPUs (4 on a GB200 tray) and nvidia-smi/NVML can read them."""

from __future__ import annotations

from mctl.checks._base import fail, ok
from mctl.model.findings import Finding

CHECK = "gpu.count"
FACTS = "gpu.facts"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None:
        error = facts.gpu_error or "no GPU facts"
        short = ("nvidia-smi hung" if "hung" in error else "no gpu driver" if "driver" in error
                 else "gpu facts unreadable")
        return [fail(facts.host, FACTS, error,
                     "drain, then check the driver (lsmod | grep nvidia; nvidia-smi) and the kernel log",
                     short=short)]
    report = facts.gpus
    have = len(report.gpus)
    want = expect.gpus_per_tray
    attached = report.attached_gpus
    if have != want or (attached is not None and attached != have):
        said = f"; nvidia-smi: {facts.gpu_messages[0]}" if facts.gpu_messages else ""
        if have != want:
            text = f"{have} GPUs visible, expected {want}" + (f" (driver counts {attached})"
                                                               if attached not in (None, have) else "")
        else:
            # fewer <gpu> blocks than attached_gpus: a GPU the driver knows but nvidia-smi could not read
            text = f"driver counts {attached} GPUs but nvidia-smi lists {have}"
        return [fail(facts.host, CHECK, text + said,
                     "a GPU fell off the bus or failed: drain, check XIDs (79), reboot; reseat or replace if it "
                     "stays missing", short=f"gpu count {have}/{want}", visible=have, expected=want,
                     attached=attached, indexes=sorted(g.index for g in report.gpus))]
    return [ok(facts.host, CHECK, f"{have}/{want} GPUs")]
