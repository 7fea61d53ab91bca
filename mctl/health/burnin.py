"""Burn-in: which tools the trays carry, the commands, how their output is judged, one run over SSH.

    probe_tools(site, hosts) -> ({host: {tool: path}}, {host: why not asked})
    run_burn_in(site, hosts, tools, gpus, level) -> {host: [Verdict]}
    dcgm_command / nccl_command / judge_dcgm / judge_nccl / parse_tools      pure

Bring-up runs what the trays carry: DCGM diagnostics (`dcgmi diag -r LEVEL`)
and NCCL's `all_reduce_perf` across the tray's GPUs. A tray without either is
not burned in, and bring-up says so: nothing is emulated here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

LEVELS = {"quick": 1, "medium": 2, "long": 3}
TOOLS = ("dcgmi", "all_reduce_perf")
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


def parse_tools(text: str) -> dict[str, str]:
    """Lines `tool=path` -> {tool: path}, only for the tools bring-up knows."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        tool, sep, path = line.strip().partition("=")
        if sep and tool in TOOLS and path.startswith("/"):
            out[tool] = path
    return out


TOOLS_COMMAND = "for t in " + " ".join(TOOLS) + "; do p=$(command -v \"$t\") && echo \"$t=$p\"; done; true"


def probe_tools(site: "Site", hosts: Sequence["Host"]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Which burn-in tools each host has on its PATH, and the hosts that could not be asked."""
    from mctl.transport import SSHConfig, run_sync, targets_for

    results = run_sync(SSHConfig.from_site(site), targets_for(site, list(hosts)), TOOLS_COMMAND)
    found = {r.host: parse_tools(r.stdout) for r in results if r.ok}
    failed = {r.host: r.summary() for r in results if not r.ok}
    return found, failed


def run_burn_in(site: "Site", hosts: Sequence["Host"], tools: Mapping[str, Mapping[str, str]], gpus: int,
                level: str) -> dict[str, list[Verdict]]:
    """Each tool on the hosts that have it (*tools*: host -> {tool: path}), DCGM first; one verdict per run."""
    from mctl.transport import SSHConfig, run_sync, targets_for

    results: dict[str, list[Verdict]] = {h.name: [] for h in hosts}
    config = SSHConfig.from_site(site)
    for tool in TOOLS:
        users = [h for h in hosts if tool in tools[h.name]]
        if not users:
            continue

        def command(t, tool=tool) -> str:
            return dcgm_command(level) if tool == "dcgmi" else nccl_command(tools[t.name][tool], gpus, level)

        for r in run_sync(config, targets_for(site, users), command, timeout=4 * 3600):
            if not r.status.reached:
                results[r.host].append(Verdict(False, f"{tool}: {r.summary()}"))
                continue
            judge = judge_dcgm if tool == "dcgmi" else judge_nccl
            results[r.host].append(judge(r.exit_code, r.stdout + r.stderr))
    return results
