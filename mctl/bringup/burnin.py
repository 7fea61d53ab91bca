"""Burn-in commands and how their output is judged (pure).

Bring-up runs what the trays carry: DCGM diagnostics (`dcgmi diag -r LEVEL`)
and NCCL's `all_reduce_perf` across the tray's GPUs. A tray without either is
not burned in, and bring-up says so: nothing is emulated here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LEVELS = {"quick": 1, "medium": 2, "long": 3}
_FAIL = re.compile(r"\bFail(ed|ure)?\b", re.I)
_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    text: str


def dcgm_command(level: str) -> str:
    return f"dcgmi diag -r {LEVELS[level]} 2>&1"


def nccl_command(path: str, gpus: int, level: str) -> str:
    top = {"quick": "256M", "medium": "1G", "long": "8G"}[level]
    return f"{path} -b 8 -e {top} -f 2 -g {gpus} 2>&1"


def judge_dcgm(rc: int | None, output: str) -> Verdict:
    """dcgmi exits non-zero or prints Fail for a failed test."""
    failed = [ln.strip() for ln in output.splitlines() if _FAIL.search(ln)]
    if rc not in (0, None) or failed:
        return Verdict(False, failed[0] if failed else f"dcgmi diag exited {rc}")
    return Verdict(True, "DCGM diagnostics passed")


def judge_nccl(rc: int | None, output: str) -> Verdict:
    oob = _OOB.search(output)
    bw = _BUSBW.search(output)
    if rc not in (0, None):
        last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
        return Verdict(False, f"all_reduce_perf exited {rc}" + (f": {last}" if last else ""))
    if oob and int(oob.group(1)) > 0:
        return Verdict(False, f"all_reduce_perf: {oob.group(1)} out-of-bounds (wrong) values")
    if bw is None:
        return Verdict(False, "all_reduce_perf printed no average bus bandwidth")
    return Verdict(True, f"all_reduce_perf: average bus bandwidth {bw.group(1)} GB/s")
