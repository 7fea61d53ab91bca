"""DCGM's multi-node diagnostic (`dcgmi mndiag`, DCGM >= 4.3) as rack validate's test of an NVLink partition.

    supports(version) / partition_method(versions, trays, method)   pure: mndiag or the all-reduce, and why
    host_list(trays) / command(trays, name, deadline, place)       pure: the salloc + srun that runs it
    parse(text) -> MnDiagRun / judge(trays, gpus, rc, out, err)      pure: dcgmi's JSON, the verdict per tray
    dcgm_versions(site, trays)                                      the trays' DCGM package versions (dpkg)

The model is DCGM's (docs.nvidia.com, "Multi-Node Diagnostics", "dcgmi mndiag"): dcgmi asks the *head
node's* host engine to run mnubergemm on every host of `--hostList`; that host engine connects to the
other hosts' engines and launches the workload through MPI. So the command runs on one node of the
partition, not once per tray: `salloc` takes the whole Slurm block (`--exclusive`, as DCGM asks the GPUs be
drained of other work), and one step on the block's first tray runs `dcgmi mndiag --hostList
'tray1;tray2;...' --run mnubergemm --json`; the allocation ends with the step (salloc), and the round's
cancel by job name clears anything left, as for the all-reduce.

The JSON is dcgmi's, from the source's contract (NVIDIA/DCGM dcgmi/MnDiag.cpp at commit
1477d8785e899ab3450fdff2b486102e9bed096b, HelperJsonBuildOutput; the key names are
nvvs/include/NvvsJsonStrings.h's; dcgmi/tests/TestMnDiag.cpp), not a capture:
  "DCGM Diagnostic": "DCGM Multi-Node Diagnostic", "metadata": {num_hosts, num_entities},
  "hosts": [{host_id, hostname, dcgm_version, driver_version, num_entities, entities: [...]}],
  "test_categories": [{"category": "Multi-Node Tests", "tests": [{name, status, test_summary: {status},
      results: [{host_id, entity_group, entity_group_id, entity_id, status, warnings: [{warning, error_id,
      error_category, error_severity}], info}], mpi_error?}]}],
  "global_errors": [...]?, and on a run that did not complete "runtime_error" (no "hosts").
Statuses are "Pass", "Fail", "Warn", "Skip", "Not Run". dcgmi exits 0 when the run completed, whatever its
result (RunStartMnDiag returns the display's status), so the verdict is read from the JSON, never the exit
status alone; only "Pass" passes.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mctl.health.burnin import KILL_GRACE_S
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

TOOL = "dcgmi mndiag"
MIN_VERSION = (4, 3)              # the multi-node diagnostic module's first release (DCGM 4.3.0)
MAX_HOSTS = 72                    # dcgmi mndiag: at most 72 host specifications a request
DIAG = "mnubergemm"
# DCGM 4's packages (CUDA repository); DCGM 3's was `datacenter-gpu-manager` (no mndiag either way)
PACKAGES = ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager")
METHODS = ("auto", "mndiag", "all-reduce")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def supports(version: str | None) -> bool:
    """An upstream DCGM version ('4.3.1') that has mndiag."""
    m = _VERSION.match(version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= MIN_VERSION


def partition_method(versions: Mapping[str, str | None], trays: Sequence[str], method: str = "auto",
                     unreachable: Mapping[str, str] | None = None) -> tuple[str, str]:
    """('mndiag' | 'all-reduce', why) for one partition: mndiag when every tray has DCGM >= 4.3 (auto), or
    when asked (*method* 'mndiag': a tray without it then fails the run, as mndiag would)."""
    unreachable = unreachable or {}
    if method == "all-reduce":
        return "all-reduce", "--method all-reduce"
    lacking = [t for t in trays if not supports(versions.get(t))]
    if len(trays) > MAX_HOSTS:
        return "all-reduce", f"{len(trays)} trays: mndiag takes at most {MAX_HOSTS} hosts"
    if method == "mndiag":
        return "mndiag", "--method mndiag"
    if not lacking:
        found = sorted({str(versions[t]) for t in trays})
        return "mndiag", f"every tray has DCGM {', '.join(found)} (mndiag from 4.3)"
    said = []
    for t in lacking:
        if t in unreachable:
            said.append(f"{t} not asked ({unreachable[t]})")
        else:
            said.append(f"{t} DCGM {versions.get(t) or 'not installed'}")
    return "all-reduce", "DCGM < 4.3 or unknown: " + ", ".join(said[:4]) + (" ..." if len(said) > 4 else "")


def host_list(trays: Sequence[str]) -> str:
    """`--hostList`'s value: the trays' names, ';'-separated (the default port, every GPU of each host)."""
    bad = [t for t in trays if not _HOST.match(t)]
    if bad:
        raise ValueError(f"not host names: {', '.join(map(repr, bad))}")
    if not trays or len(trays) > MAX_HOSTS:
        raise ValueError(f"mndiag takes 1 to {MAX_HOSTS} hosts, not {len(trays)}")
    return ";".join(trays)


def command(trays: Sequence[str], name: str, deadline: float, place: int) -> str:
    """salloc of the whole block, one step on its first tray running dcgmi mndiag, under timeout(1)."""
    n = len(trays)
    minutes = max(1, math.ceil((deadline + place) / 60))
    return (f"timeout -k {KILL_GRACE_S:g} {deadline + place:g} salloc --immediate={place} --job-name={name} "
            f"--nodes={n} --nodelist={fold(trays)} --exclusive --time={minutes} "
            f"srun --nodes=1 --ntasks=1 --nodelist={trays[0]} --kill-on-bad-exit=1 "
            f"dcgmi mndiag --hostList {shlex.quote(host_list(trays))} --run {DIAG} --json")


# ------------------------------------------------------------------ dcgmi's JSON (pure)

@dataclass
class GpuResult:
    host_id: int
    gpu: int
    status: str
    errors: list[str] = field(default_factory=list)


@dataclass
class MnDiagRun:
    doc: dict[str, Any] | None = None
    problem: str = ""                               # why the text is not dcgmi mndiag's JSON
    runtime_error: str = ""
    status: str = ""                                # the test's status (the first test)
    hosts: dict[int, str] = field(default_factory=dict)          # host_id -> hostname
    versions: dict[int, str] = field(default_factory=dict)       # host_id -> dcgm_version
    results: list[GpuResult] = field(default_factory=list)
    global_errors: list[str] = field(default_factory=list)


def parse(text: str) -> MnDiagRun:
    """dcgmi mndiag --json's document; *problem* says why not, when it is not one."""
    text = text or ""
    start = text.find("{")
    if not text.strip():
        return MnDiagRun(problem="printed nothing")
    if start < 0:
        return MnDiagRun(problem="printed no JSON")
    try:
        doc, _end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as exc:
        return MnDiagRun(problem=f"its JSON does not parse ({exc.msg} at character {exc.pos})")
    if not isinstance(doc, dict) or doc.get("DCGM Diagnostic") != "DCGM Multi-Node Diagnostic":
        return MnDiagRun(problem="its JSON is not a multi-node diagnostic's (no \"DCGM Diagnostic\": "
                                 "\"DCGM Multi-Node Diagnostic\")")
    run = MnDiagRun(doc=doc, runtime_error=str(doc.get("runtime_error") or "").strip())
    try:
        for h in doc.get("hosts") or []:
            run.hosts[int(h["host_id"])] = str(h["hostname"])
            run.versions[int(h["host_id"])] = str(h.get("dcgm_version") or "")
        tests = [t for c in doc.get("test_categories") or [] for t in c.get("tests") or []]
        if tests:
            run.status = str(tests[0].get("status") or "")
            for r in tests[0].get("results") or []:
                if str(r.get("entity_group") or "GPU") != "GPU":
                    continue
                errors = [str(w.get("warning") or "") for w in r.get("warnings") or [] if isinstance(w, dict)]
                run.results.append(GpuResult(int(r["host_id"]), int(r["entity_id"]), str(r["status"]), errors))
            mpi = tests[0].get("mpi_error")
            if isinstance(mpi, dict) and mpi.get("warning"):
                run.global_errors.append(str(mpi["warning"]))
        for e in doc.get("global_errors") or []:
            if isinstance(e, dict) and e.get("warning") and str(e["warning"]) not in run.global_errors:
                run.global_errors.append(str(e["warning"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return MnDiagRun(problem=f"its JSON lacks a field its contract has ({exc!r})")
    return run


@dataclass(frozen=True)
class MnDiagVerdict:
    ok: bool
    text: str
    failing: dict[str, str]                     # tray -> why mndiag failed it (its own per-host results)


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def _words(text: str, limit: int = 300) -> str:
    flat = " ".join((text or "").split())
    return flat[:limit] + ("..." if len(flat) > limit else "")


def judge(trays: Sequence[str], gpus: int, rc: int | None, stdout: str, stderr: str = "") -> MnDiagVerdict:
    """The partition's verdict from dcgmi mndiag's answer: Pass only when the test passed and every tray of
    *trays* is in its hosts with *gpus* GPU results, each Pass; the failing trays named from its results."""
    if rc in (124, 137) and not (stdout or "").strip():
        return MnDiagVerdict(False, f"{TOOL} did not finish in time (killed)" + (
            f": {_words(stderr)}" if (stderr or "").strip() else ""), {})
    run = parse(stdout)
    if run.doc is None:
        killed = " (killed at the deadline)" if rc in (124, 137) else ""
        said = f"; stderr: {_words(stderr)}" if (stderr or "").strip() else ""
        return MnDiagVerdict(False, f"{TOOL} failed{killed}: {run.problem} (exit {rc}); output: "
                                    f"{_words(stdout, 160) or '(none)'}{said}", {})
    if run.runtime_error:
        return MnDiagVerdict(False, f"{TOOL} did not complete: {_words(run.runtime_error)}", {})
    by_name = {_short(n): i for i, n in run.hosts.items()}
    failing: dict[str, str] = {}
    for tray in trays:
        hid = by_name.get(_short(tray))
        if hid is None:
            failing[tray] = "not among mndiag's hosts"
            continue
        mine = [r for r in run.results if r.host_id == hid]
        bad = [r for r in mine if r.status != "Pass"]
        why = [f"GPU {r.gpu} {r.status}" + (f": {'; '.join(r.errors)}" if r.errors else "") for r in bad]
        if len(mine) < gpus:
            seen = sorted(r.gpu for r in mine)
            why.append(f"{len(mine)} of {gpus} GPUs in mndiag's results (GPUs {', '.join(map(str, seen)) or 'none'})")
        if why:
            failing[tray] = "; ".join(why)
    if run.status == "Pass" and not failing:
        return MnDiagVerdict(True, f"{DIAG} Pass on {len(trays)} host(s), {len(run.results)} GPU(s)", {})
    text = f"{DIAG} {run.status or 'no test result'}"
    if failing:
        text += f" on {fold(list(failing))}"
    if run.global_errors:
        text += ": " + _words("; ".join(run.global_errors))
    elif not failing:
        text += ": no host or GPU named by mndiag"
    return MnDiagVerdict(False, text, failing)


# ------------------------------------------------------------------ the trays' DCGM (one dpkg-query each)

def versions_command() -> str:
    from mctl.facts import packages

    names = packages.command(PACKAGES).split(" ", 1)[1]         # checked and quoted there
    return f"timeout 10 dpkg-query -W -f={shlex.quote(packages.FORMAT)} {names} 2>/dev/null; exit 0"


def parse_versions(text: str) -> str | None:
    """The highest installed DCGM upstream version in dpkg-query's answer, or None."""
    from mctl.facts import packages

    found, _why = packages.parse(text, PACKAGES)
    ups = [packages.upstream(v) for v in found.values() if v]
    ups = [u for u in ups if _VERSION.match(u)]
    return max(ups, key=lambda u: tuple(int(x) for x in _VERSION.match(u).groups())) if ups else None


def dcgm_versions(site: "Site", hosts: Sequence["Host"]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Each tray's DCGM version (dpkg, as mctl.facts.packages reads it), and the trays that could not be asked."""
    from mctl.transport import SSHConfig, run_sync, targets_for

    results = run_sync(SSHConfig.from_site(site), targets_for(site, list(hosts)), versions_command(), timeout=30)
    found = {r.host: parse_versions(r.stdout) for r in results if r.ok}
    failed = {r.host: r.summary() for r in results if r.host not in found}
    return found, failed
