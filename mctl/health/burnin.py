"""Burn-in: which tools the trays carry, the commands, how their output is judged, one run over SSH.

    probe_tools(site, hosts) -> ({host: {tool: path}}, {host: why not asked})
    run_burn_in(site, hosts, tools, gpus, level) -> {host: [Verdict]}
    dcgm_command / health_command / nccl_command / judge_dcgm / judge_health / judge_nccl / parse_tools   pure

Bring-up and the ladder's validation run what the trays carry: DCGM's diagnostic (`dcgmi diag -r LEVEL
-j`, DCGM 4's JSON) and its health check (`dcgmi health -c -j`), and nccl-tests' `all_reduce_perf`
across the tray's GPUs. Each is judged against what NVIDIA publishes (docs/health.md, "Burn-in"):

- DCGM: every test that ran must say Pass (or Warn) for every GPU the tray should have; a Fail, a GPU
  missing from the results, a run where nothing ran, or a non-zero exit fails the tray with DCGM's words.
- NCCL: no out-of-bounds (wrong) values, and the bus bandwidth at the largest message at least
  MIN_BUSBW_GBS: NVLink 5's 900 GB/s per GPU and direction (NVIDIA's GB200 NVL72 figures: 1.8 TB/s
  per GPU, both directions), times the ~80 % NCCL reaches of the line rate (its maintainer, nccl-tests
  issue 212), less a 10 % margin.

A tool that hangs (each runs under `timeout` on the tray, killed at its deadline), crashes (a signal,
a non-zero exit), prints garbage or truncated JSON fails that tray, quoting the tool; never passes.
A tray without either tool is not burned in, and bring-up says so: nothing is emulated here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

LEVELS = {"quick": 1, "medium": 2, "long": 3}
TOOLS = ("dcgmi", "all_reduce_perf")

# NVIDIA's figures the NCCL threshold is made of (docs/health.md, "Burn-in", cites them).
NVLINK5_GBS_PER_DIRECTION = 900.0      # GB200 NVL72: fifth-generation NVLink, 1.8 TB/s per GPU (both directions)
NCCL_EFFICIENCY = 0.8                  # NCCL's effective share of the line rate (~20 % protocol overhead)
BUSBW_MARGIN = 0.9
MIN_BUSBW_GBS = NVLINK5_GBS_PER_DIRECTION * NCCL_EFFICIENCY * BUSBW_MARGIN      # 648 GB/s
NCCL_MAX_BYTES = "8G"                  # the bandwidth is read at the largest message: NVLink's peak needs GiBs
NCCL_ITERS = {"quick": 20, "medium": 50, "long": 200}
# Deadlines of one run on a tray. DCGM's documented run times: level 1 seconds, level 2 about two
# minutes, level 3 about 30 minutes; each gets several times that. all_reduce_perf to 8 GiB: seconds
# per iteration count on NVLink.
DCGM_DEADLINE_S = {"quick": 300.0, "medium": 900.0, "long": 5400.0}
HEALTH_DEADLINE_S = 120.0
NCCL_DEADLINE_S = {"quick": 300.0, "medium": 600.0, "long": 1800.0}
KILL_GRACE_S = 10.0                    # `timeout -k`: SIGKILL this long after the SIGTERM
TIMEOUT_EXIT = 124                     # timeout(1)'s status when the command ran out of time
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", re.M)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.M)
_FAILURE = re.compile(r"Test (?:CUDA |NCCL )?failure|NCCL error|NCCL WARN", re.I)
_PASSING = ("Pass", "Warn")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    text: str
    tool: str = ""


def _timed(command: str, deadline: float) -> str:
    return f"timeout -k {KILL_GRACE_S:g} {deadline:g} {command}"


def dcgm_command(level: str) -> str:
    return f"dcgmi diag -r {LEVELS[level]} -j"


def health_command() -> str:
    """Watch every subsystem, then read the health check (DCGM needs the watches set before -c)."""
    return "dcgmi health -s a >/dev/null && dcgmi health -c -j"


def nccl_command(path: str, gpus: int, level: str) -> str:
    return f"{path} -b 8 -e {NCCL_MAX_BYTES} -f 2 -g {gpus} -n {NCCL_ITERS[level]}"


def words(text: str, limit: int = 200) -> str:
    """The tool's own words, short and printable: its last meaningful line (or first, for a JSON start)."""
    lines = [re.sub(r"[^\x20-\x7e]", "?", ln.replace("\t", " ")).strip() for ln in (text or "").splitlines()]
    lines = [ln for ln in lines if ln and ln not in ("{", "}", "[", "]", "#")]
    if not lines:
        return "(no output)"
    return lines[-1][:limit]


def _exited(tool: str, rc: int | None, stdout: str, stderr: str, error: str | None = None) -> str:
    if rc == TIMEOUT_EXIT:
        return f"{tool} did not finish in time (killed)"
    why = error or (f"exited {rc}" if rc is not None else "exited without a status")
    said = words(stderr) if (stderr or "").strip() else words(stdout)
    return f"{tool} {why}: {said}"


def _json_doc(tool: str, stdout: str) -> tuple[dict | None, str | None]:
    text = (stdout or "").strip()
    if not text:
        return None, f"{tool} printed nothing"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        kind = "truncated JSON" if text.startswith("{") else "no JSON"
        return None, f"{tool} printed {kind} ({exc.msg} at char {exc.pos}): {words(text, 120)}"
    if not isinstance(doc, dict):
        return None, f"{tool} printed JSON that is not an object: {words(text, 120)}"
    return doc, None


def _results(doc: dict) -> tuple[list[tuple[str, str, Any, str]], str | None]:
    """[(test, status, entity id, message)] of a `dcgmi diag -j` document (DCGM 4, or 3's "DCGM GPU
    Diagnostic" with gpu_ids), or why it is not one."""
    root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(root, dict):
        return [], "its JSON has no \"DCGM Diagnostic\" section"
    if root.get("runtime_error"):
        return [], f"runtime error: {words(str(root['runtime_error']))}"
    cats = root.get("test_categories")
    if not isinstance(cats, list):
        return [], "its JSON has no test_categories"
    out = []
    for cat in cats:
        for test in (cat.get("tests") if isinstance(cat, dict) else None) or []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name") or "?")
            for r in test.get("results") or []:
                if not isinstance(r, dict):
                    continue
                entity = r.get("entity_id", r.get("gpu_id", r.get("gpu_ids")))
                out.append((name, str(r.get("status") or "?"), entity, _message(r)))
    return out, None


def _message(result: dict) -> str:
    for key in ("warnings", "errors"):
        for w in result.get(key) or []:
            text = w.get("warning") or w.get("error") or w.get("msg") if isinstance(w, dict) else w
            if text:
                return str(text)
    return ""


def judge_dcgm(rc: int | None, stdout: str, stderr: str = "", *, gpus: int | None = None, level: int | None = None,
               error: str | None = None) -> Verdict:
    tool = f"dcgmi diag -r {level}" if level else "dcgmi diag"
    doc, bad = _json_doc(tool, stdout)
    if doc is None:
        if rc not in (0,) or error:
            return Verdict(False, _exited(tool, rc, stdout, stderr, error), "dcgmi")
        return Verdict(False, bad or "", "dcgmi")
    results, why = _results(doc)
    if why:
        return Verdict(False, f"{tool}: {why}", "dcgmi")
    failed = [(t, e, m) for t, s, e, m in results if s not in _PASSING and s != "Skip"]
    if failed:
        by_test: dict[str, list[str]] = {}
        for test, entity, _m in failed:
            by_test.setdefault(test, []).append(str(entity))
        which = ", ".join(f"{t} (GPU {','.join(g)})" for t, g in by_test.items())
        said = next((m for _t, _e, m in failed if m), "")
        return Verdict(False, f"{tool} failed: {which}" + (f": {words(said)}" if said else ""), "dcgmi")
    ran = [r for r in results if r[1] in _PASSING]
    if not ran:
        return Verdict(False, f"{tool}: no test ran (every result Skip)", "dcgmi")
    if rc != 0 or error:
        return Verdict(False, _exited(tool, rc, stdout, stderr, error), "dcgmi")
    seen = {e for _t, _s, e, _m in results}
    if gpus is not None and all(isinstance(e, int) for e in seen) and len(seen) < gpus:
        return Verdict(False, f"{tool}: results for {len(seen)} of {gpus} GPUs (GPUs {sorted(seen)})", "dcgmi")
    tests = sorted({t for t, _s, _e, _m in ran})
    return Verdict(True, f"{tool} passed: {', '.join(tests)} on {len(seen)} GPU(s)", "dcgmi")


def judge_health(rc: int | None, stdout: str, stderr: str = "", *, error: str | None = None) -> Verdict:
    """`dcgmi health -c -j` read as the sweep reads it (mctl.facts.dcgm): Healthy passes, anything else fails."""
    from mctl.facts.dcgm import observe

    tool = "dcgmi health -c"
    if error or rc == TIMEOUT_EXIT:
        return Verdict(False, _exited(tool, rc, stdout, stderr, error), "dcgmi")
    obs = observe(rc, stdout, stderr)
    if obs.error:
        return Verdict(False, obs.error, "dcgmi")
    if obs.overall != "Healthy":
        incidents = [f"{i.label}: {i.system}: {i.message or i.health}" for i in obs.incidents]
        return Verdict(False, f"{tool}: overall {obs.overall}" + (f" ({'; '.join(incidents[:3])})" if incidents else ""),
                       "dcgmi")
    return Verdict(True, f"{tool}: Healthy", "dcgmi")


@dataclass(frozen=True)
class NcclRun:
    rows: list[tuple[int, float, float, int]]       # (bytes, out-of-place busbw, in-place busbw, #wrong both)
    avg_busbw: float | None
    out_of_bounds: int | None


def parse_nccl(text: str) -> NcclRun:
    rows = []
    for line in (text or "").splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        try:
            size = int(m.group(1))
            oop, ip = float(m.group(5)), float(m.group(9))
            wrong = sum(int(x) if x.isdigit() else 0 for x in (m.group(6), m.group(10)))
        except ValueError:
            continue
        rows.append((size, oop, ip, wrong))
    avg = _BUSBW.search(text or "")
    oob = _OOB.search(text or "")
    return NcclRun(rows, float(avg.group(1)) if avg else None, int(oob.group(1)) if oob else None)


def judge_nccl(rc: int | None, stdout: str, stderr: str = "", *, min_busbw: float = MIN_BUSBW_GBS,
               error: str | None = None) -> Verdict:
    tool = "all_reduce_perf"
    text = (stdout or "") + ("\n" + stderr if stderr else "")
    failure = next((ln.strip() for ln in text.splitlines() if _FAILURE.search(ln)), None)
    if rc != 0 or error:
        why = _exited(tool, rc, stdout, stderr, error)
        return Verdict(False, f"{why}" if not failure or rc == TIMEOUT_EXIT else f"{tool}: {words(failure)}", tool)
    if failure:
        return Verdict(False, f"{tool}: {words(failure)}", tool)
    run = parse_nccl(stdout)
    if not run.rows:
        return Verdict(False, f"{tool} printed no result rows: {words(stdout, 120)}", tool)
    if run.out_of_bounds is None or run.avg_busbw is None:
        return Verdict(False, f"{tool}'s output ends early (no \"Out of bounds\" or \"Avg bus bandwidth\" line): "
                              f"{words(stdout, 120)}", tool)
    wrong = sum(r[3] for r in run.rows)
    if run.out_of_bounds > 0 or wrong:
        return Verdict(False, f"{tool}: {max(run.out_of_bounds, wrong)} out-of-bounds (wrong) values", tool)
    size, oop, ip, _w = max(run.rows, key=lambda r: r[0])
    peak = max(oop, ip)
    if peak < min_busbw:
        return Verdict(False, f"{tool}: bus bandwidth {peak:.1f} GB/s at {_bytes(size)}, below the "
                              f"{min_busbw:.0f} GB/s NVLink 5 floor", tool)
    return Verdict(True, f"{tool}: bus bandwidth {peak:.1f} GB/s at {_bytes(size)} (floor {min_busbw:.0f})", tool)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


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


def steps(level: str) -> list[tuple[str, str, float]]:
    """(tool, step, deadline) in the order a tray runs them: DCGM's diagnostic, its health check, NCCL."""
    return [("dcgmi", "diag", DCGM_DEADLINE_S[level]), ("dcgmi", "health", HEALTH_DEADLINE_S),
            ("all_reduce_perf", "nccl", NCCL_DEADLINE_S[level])]


def run_burn_in(site: "Site", hosts: Sequence["Host"], tools: Mapping[str, Mapping[str, str]], gpus: int,
                level: str, *, min_busbw: float = MIN_BUSBW_GBS, deadline: float | None = None) -> dict[str, list[Verdict]]:
    """Each tool on the hosts that have it (*tools*: host -> {tool: path}); one verdict per step and tray.
    Every step runs under timeout(1) on the tray (nothing is left running past its deadline; *deadline*
    caps each step's, e.g. the ladder's burn_in_deadline); a tray whose step fails still runs the others,
    and the other trays go on."""
    from mctl.transport import SSHConfig, run_sync, targets_for

    results: dict[str, list[Verdict]] = {h.name: [] for h in hosts}
    config = SSHConfig.from_site(site)
    for tool, step, limit in steps(level):
        step_deadline = min(limit, deadline) if deadline is not None else limit
        users = [h for h in hosts if tool in tools[h.name]]
        if not users:
            continue

        def command(t, step=step, deadline=step_deadline) -> str:
            if step == "diag":
                return _timed(dcgm_command(level), deadline)
            if step == "health":
                return _timed("sh -c " + _quote(health_command()), deadline)
            return _timed(nccl_command(tools[t.name]["all_reduce_perf"], gpus, level), deadline)

        for r in run_sync(config, targets_for(site, users), command, timeout=step_deadline + KILL_GRACE_S + 30):
            if not r.status.reached:
                results[r.host].append(Verdict(False, f"{tool} ({step}): {r.summary()}", tool))
                continue
            err = r.error if r.exit_code is None else None
            if step == "diag":
                v = judge_dcgm(r.exit_code, r.stdout, r.stderr, gpus=gpus, level=LEVELS[level], error=err)
            elif step == "health":
                v = judge_health(r.exit_code, r.stdout, r.stderr, error=err)
            else:
                v = judge_nccl(r.exit_code, r.stdout, r.stderr, min_busbw=min_busbw, error=err)
            results[r.host].append(v)
    return results


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
