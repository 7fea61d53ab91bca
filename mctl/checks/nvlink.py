"""NVLinks up: every GB200/GB300 GPU has 18, and any inactive one is critical
(NVIDIA Health Validation: drain, reset the GPU, reboot, then service)."""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import NVLINKS_PER_GPU

CHECK = "nvlink.links"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None:
        return []
    if facts.nvlinks is None:
        if facts.nvlink_error:
            return [finding(Severity.WARN, facts.host, CHECK, facts.nvlink_error,
                            "rerun 'nvidia-smi nvlink --status' on the tray", short="nvlink facts unreadable")]
        return []
    down: list[str] = []
    short_links: list[str] = []
    all_down = [gpu.index for gpu in facts.nvlinks if gpu.all_inactive]
    for gpu in facts.nvlinks:
        if gpu.all_inactive:
            continue
        down += [f"gpu{gpu.index} link{link}" for link in gpu.inactive_links]
        if len(gpu.links) != NVLINKS_PER_GPU:
            short_links.append(f"gpu{gpu.index} shows {len(gpu.links)} links")
    if down or short_links or all_down:
        text = ", ".join([f"gpu{i} all {NVLINKS_PER_GPU} links down (NVML: all links are inactive)"
                          for i in all_down] + down + short_links)
        short = (f"nvlink gpu{all_down[0]} all links down" if len(all_down) == 1
                 else f"nvlink gpu{','.join(map(str, all_down))} all down" if all_down
                 else f"nvlink {down[0]} down" if len(down) == 1 else f"nvlink {len(down)} links down" if down
                 else "nvlink count")
        return [fail(facts.host, CHECK, f"NVLinks not up: {text}",
                     "drain, reset the GPU; if the link stays down, reboot, then service the tray or cable",
                     short=short, inactive=down, all_inactive=[f"gpu{i}" for i in all_down])]
    total = sum(len(g.links) for g in facts.nvlinks)
    return [ok(facts.host, CHECK, f"{total} NVLinks active ({len(facts.nvlinks)} GPUs x {NVLINKS_PER_GPU})")]
