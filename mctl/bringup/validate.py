"""Rack-scale NVLink validation: an all-reduce across every tray of each NVLink partition, through Slurm.

    plan(site, rack, ...) -> ValidationPlan                         pure: the partitions (Slurm's blocks), the jobs
    round_script(jobs, ...) / parse_round(text, jobs)                  pure: one controller script a round, its answer
    judge(job, answer, min_busbw) -> JobResult                         pure: health.burnin.judge_nccl, or Slurm's reason
    Finder(partitions)                                                 pure: which jobs each round runs, who drags
    run_validation(site, rack, ...) -> Validation                      the rounds on the controller, recorded

Every partition of the rack (each a Slurm block, mctl.sched.slurm.topology.blocks_for: the NVLink
partitions of the inventory, the trays no partition names, or the whole rack) runs nccl-tests'
`all_reduce_perf` as one Slurm job: `srun --nodes=N --ntasks-per-node=1 --nodelist=<the block>` on the
controller, one task per tray with every GPU of the tray, so the ring spans the whole NVLink partition
and its bus bandwidth is set by its slowest tray. It is judged as burn-in judges it (judge_nccl: the
NVLink 5 floor MIN_BUSBW_GBS, out-of-bounds values, the tool's own failure words).

Where every tray of a partition has DCGM >= 4.3 (its dpkg version, as mctl.facts.packages reads it),
the partition runs DCGM's multi-node diagnostic instead (mctl.bringup.mndiag: `dcgmi mndiag --run
mnubergemm` from the block's first tray, in a salloc of the whole block), judged from dcgmi's own per-host
results: the failing trays are named from them and no search runs. `method` 'all-reduce' or 'mndiag'
forces one (choose_methods); each partition says which ran and why.

A partition whose ring runs below the floor is searched for the tray that drags it (docs/decisions.md):
round 2 runs its trays in disjoint pairs, all at once (9 pairs of 18 trays in one round; a partition of 2
or 3 trays runs each tray alone instead); round 3 runs each tray of a failed pair (and the odd one out)
with a tray of a passed pair; a suspect that fails beside a good tray drags. One dragging tray is
therefore named in 3 rounds on any partition; k of them in 3 + ceil((2k + 1) / good trays) - 1. Without a
passed pair the suspects run alone. A partition whose tool failed (hung, crashed, garbage, truncated,
a GPU lost) fails with the tool's words and is not searched: a search is for a bandwidth figure.

Every srun runs under timeout(1) (`--immediate` bounds its wait for nodes; `--time` is Slurm's own
limit); after every round the script cancels the round's jobs by name (`scancel --name`, each name this
run's own) and waits until squeue shows none of them, so nothing is left allocated. A job Slurm cannot
place is named with Slurm's words and the state and reason of the trays it asked for.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from mctl.health.burnin import KILL_GRACE_S, MIN_BUSBW_GBS, NCCL_MAX_BYTES, Verdict, judge_nccl, parse_nccl, words
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

TOOL = "all_reduce_perf"
ITERS = 20
DEADLINE_S = 300.0             # one job's run (burnin.NCCL_DEADLINE_S["quick"]): seconds on NVLink, minutes at worst
PLACE_S = 30                   # srun --immediate: how long a job waits for its nodes before Slurm's refusal
CLEAR_S = 60                   # how long a round waits for squeue to show none of its jobs after the scancel
MARK = "@@mctl-validate"
_UNPLACED = re.compile(r"Unable to allocate resources|Immediate execution impossible|Job submit/allocate failed|"
                       r"Requested node configuration is not available|Invalid node name", re.I)
_SRUN_SAID = re.compile(r"^(?:srun|salloc): (?:error: )?(?!job \d+ (?:has been allocated|queued))"
                        r"(?!(?:Granted|Relinquishing|Pending) job allocation|Waiting for resource configuration"
                        r"|Nodes .* are ready for job)(.*)$")
_SLURM_CHATTER = re.compile(r"^(?:srun: job \d+ (?:has been allocated|queued)|salloc: (?:Granted|Relinquishing|Pending) "
                            r"job allocation|salloc: (?:job \d+ queued|Waiting for resource configuration|Nodes .* "
                            r"are ready for job))")


@dataclass(frozen=True)
class Job:
    """One Slurm job of a round: `all_reduce_perf` across *trays*, one task per tray."""

    partition: str
    kind: str                     # partition | pair | check | solo | mndiag (DCGM's, across the partition)
    trays: tuple[str, ...]

    @property
    def label(self) -> str:
        if self.kind == "mndiag":
            return f"{self.partition} mndiag"
        return self.partition if self.kind == "partition" else f"{self.partition} {self.kind} {fold(self.trays)}"

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "kind": self.kind, "trays": list(self.trays)}


@dataclass(frozen=True)
class JobResult:
    job: Job
    ok: bool
    text: str
    placed: bool = True
    busbw: float | None = None    # GB/s at the largest message, when the tool printed a table
    bandwidth: bool = False       # the verdict is a bandwidth figure (below the floor), not a tool failure
    rc: int | None = None
    failing: dict[str, str] = field(default_factory=dict)     # mndiag: tray -> why its own results fail it

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.job.to_dict(), ok=self.ok, placed=self.placed, busbw=self.busbw, text=self.text, rc=self.rc)
        if self.job.kind == "mndiag":
            out["failing"] = dict(self.failing)
        return out


@dataclass(frozen=True)
class PartitionPlan:
    name: str                     # the partition's name (or the Slurm block's, for a rack without partitions)
    block: str
    trays: tuple[str, ...]
    method: str = "all-reduce"    # all-reduce | mndiag (choose_methods)
    why: str = ""                 # why that method

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "block": self.block, "trays": list(self.trays), "nodes": fold(self.trays),
                "method": self.method, "method_why": self.why}


@dataclass(frozen=True)
class ValidationPlan:
    rack: str
    partitions: tuple[PartitionPlan, ...]
    gpus: int
    deadline: float
    min_busbw: float
    place: int = PLACE_S

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "gpus_per_tray": self.gpus, "deadline_s": self.deadline, "place_wait_s": self.place,
                "min_busbw_gbs": round(self.min_busbw, 1), "partitions": [p.to_dict() for p in self.partitions]}


def plan(site: "Site", rack: "Rack", *, partitions: Sequence[str] = (), deadline: float = DEADLINE_S,
         min_busbw: float = MIN_BUSBW_GBS, place: int = PLACE_S) -> ValidationPlan:
    """The rack's NVLink partitions as Slurm's blocks (*partitions*: only these, by name)."""
    from mctl.errors import UsageError
    from mctl.sched.slurm.topology import blocks_for

    blocks = [b for b in blocks_for(site) if b.rack == rack.name]
    parts = [PartitionPlan(b.partition or b.name, b.name, tuple(b.nodes)) for b in blocks]
    if partitions:
        known = {p.name for p in parts}
        unknown = [n for n in partitions if n not in known]
        if unknown:
            raise UsageError(f"rack {rack.name} has no partition {', '.join(unknown)}",
                             hint=f"its partitions: {', '.join(sorted(known)) or 'none'}")
        parts = [p for p in parts if p.name in partitions]
    if not parts:
        raise UsageError(f"rack {rack.name} has no compute trays to validate")
    return ValidationPlan(rack.name, tuple(parts), rack.gpus_per_tray, deadline, min_busbw, place)


def choose_methods(site: "Site", vplan: ValidationPlan, method: str = "auto") -> ValidationPlan:
    """Each partition's method (mctl.bringup.mndiag.partition_method): its trays' DCGM versions asked once."""
    from mctl.bringup import mndiag

    if method not in mndiag.METHODS:
        from mctl.errors import UsageError

        raise UsageError(f"unknown method {method!r}", hint=f"one of {', '.join(mndiag.METHODS)}")
    versions: dict[str, str | None] = {}
    unreachable: dict[str, str] = {}
    if method == "auto":
        names = sorted({t for p in vplan.partitions for t in p.trays})
        hosts = [h for h in site.hosts() if h.name in names]
        versions, unreachable = mndiag.dcgm_versions(site, hosts)
    parts = []
    for p in vplan.partitions:
        how, why = mndiag.partition_method(versions, p.trays, method, unreachable)
        parts.append(replace(p, method=how, why=why))
    return replace(vplan, partitions=tuple(parts))


# ------------------------------------------------------------------ the commands (pure)

def srun_command(job: Job, name: str, gpus: int, deadline: float, *, place: int = PLACE_S) -> str:
    """The job's srun, under timeout(1): one task per tray, every GPU of the tray, the trays named."""
    n = len(job.trays)
    minutes = max(1, math.ceil((deadline + place) / 60))
    return (f"timeout -k {KILL_GRACE_S:g} {deadline + place:g} srun --immediate={place} --job-name={name} "
            f"--nodes={n} --ntasks={n} --ntasks-per-node=1 --nodelist={fold(job.trays)} --exclusive "
            f"--time={minutes} --kill-on-bad-exit=1 {TOOL} -b 8 -e {NCCL_MAX_BYTES} -f 2 -g {gpus} -n {ITERS}")


def job_name(run: str, index: int) -> str:
    return f"mctl-validate-{run}-{index}"


def job_command(job: Job, name: str, gpus: int, deadline: float, *, place: int = PLACE_S) -> str:
    if job.kind == "mndiag":
        from mctl.bringup import mndiag

        return mndiag.command(job.trays, name, deadline, place)
    return srun_command(job, name, gpus, deadline, place=place)


def round_script(jobs: Sequence[Job], run: str, gpus: int, deadline: float, *, place: int = PLACE_S,
                 clear: int = CLEAR_S) -> str:
    """One script on the controller: every job of the round at once, each answer base64 behind a marker,
    then the round's jobs cancelled by name and squeue asked until none is left; the trays' state last."""
    names = [job_name(run, i) for i in range(len(jobs))]
    lines = ["d=$(mktemp -d /tmp/mctl-validate.XXXXXX) || exit 1"]
    for i, job in enumerate(jobs):
        lines.append(f"( {job_command(job, names[i], gpus, deadline, place=place)} >$d/{i}.out 2>$d/{i}.err; "
                     f"echo $? >$d/{i}.rc ) &")
    lines.append("wait")
    for i in range(len(jobs)):
        lines.append(f"printf '{MARK} job=%s rc=%s out=%s err=%s\\n' {i} \"$(cat $d/{i}.rc 2>/dev/null)\" "
                     f"\"$(base64 -w0 <$d/{i}.out)\" \"$(base64 -w0 <$d/{i}.err)\"")
    lines.append(f"for n in {' '.join(names)}; do scancel --quiet --name=\"$n\" 2>/dev/null; done")
    all_names = ",".join(names)
    lines.append(f"i=0; while [ -n \"$(squeue -h -n {all_names} -o %i 2>/dev/null)\" ] && [ $i -lt {clear * 2} ]; "
                 "do sleep 0.5; i=$((i+1)); done")
    lines.append(f"squeue -h -n {all_names} -o '{MARK}-left %i %j %T' 2>/dev/null")
    trays = sorted({t for j in jobs for t in j.trays})
    lines.append(f"sinfo -h -N -n {fold(trays)} -o '{MARK}-node %N|%T|%E' 2>/dev/null")
    lines.append("rm -rf \"$d\"")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Answer:
    rc: int | None
    stdout: str
    stderr: str


@dataclass
class RoundAnswer:
    answers: dict[int, Answer] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)                 # jobs squeue still showed
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)   # tray -> (state, reason)


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def parse_round(text: str) -> RoundAnswer:
    out = RoundAnswer()
    for line in (text or "").splitlines():
        if line.startswith(MARK + " job="):
            fields = dict(f.split("=", 1) for f in line[len(MARK) + 1:].split(" ") if "=" in f)
            try:
                index = int(fields.get("job", ""))
            except ValueError:
                continue
            rc_text = fields.get("rc", "")
            out.answers[index] = Answer(int(rc_text) if rc_text.isdigit() else None, _b64(fields.get("out", "")),
                                        _b64(fields.get("err", "")))
        elif line.startswith(MARK + "-left "):
            out.left.append(line[len(MARK) + 6:].strip())
        elif line.startswith(MARK + "-node "):
            node, _, rest = line[len(MARK) + 6:].partition("|")
            state, _, reason = rest.partition("|")
            out.nodes[node.strip()] = (state.strip(), reason.strip())
    return out


def slurm_said(stderr: str) -> str:
    """srun's own lines (its refusal, the nodes it waited for), joined."""
    said = [m.group(1).strip() for ln in (stderr or "").splitlines() if (m := _SRUN_SAID.match(ln.strip()))]
    return "; ".join(dict.fromkeys(s for s in said if s)) or words(stderr)


def judge(job: Job, answer: Answer | None, nodes: dict[str, tuple[str, str]], *,
          min_busbw: float = MIN_BUSBW_GBS, gpus: int = 4) -> JobResult:
    """A job's verdict: Slurm's refusal (with the asked trays' state), else judge_nccl's."""
    if answer is None:
        return JobResult(job, False, "no answer from the controller for this job", placed=False)
    stdout, stderr = answer.stdout, answer.stderr
    if not stdout.strip() and _UNPLACED.search(stderr or ""):
        states = [f"{t} {nodes[t][0]}" + (f" ({nodes[t][1]})" if nodes[t][1] and nodes[t][1] != "none" else "")
                  for t in job.trays if t in nodes and not nodes[t][0].rstrip("*").startswith(("idle", "mixed"))]
        text = f"Slurm did not place the job: {slurm_said(stderr)}" + (f"; {', '.join(states)}" if states else "")
        return JobResult(job, False, text, placed=False, rc=answer.rc)
    if job.kind == "mndiag":
        from mctl.bringup import mndiag

        mv = mndiag.judge(job.trays, gpus, answer.rc, stdout, _tool_stderr(stderr))
        return JobResult(job, mv.ok, mv.text, rc=answer.rc, failing=mv.failing)
    verdict: Verdict = judge_nccl(answer.rc, stdout, _tool_stderr(stderr), min_busbw=min_busbw)
    run = parse_nccl(stdout)
    busbw = None
    if run.rows:
        _size, oop, ip, _wrong = max(run.rows, key=lambda r: r[0])
        busbw = max(oop, ip)
    bandwidth = not verdict.ok and "below the" in verdict.text
    return JobResult(job, verdict.ok, verdict.text, busbw=busbw, bandwidth=bandwidth, rc=answer.rc)


def _tool_stderr(stderr: str) -> str:
    """What the tasks said on stderr, and srun's own error lines (a task's exit, a signal)."""
    return "\n".join(ln for ln in (stderr or "").splitlines()
                     if not _SLURM_CHATTER.match(ln.strip()))


# ------------------------------------------------------------------ the finder (pure)

@dataclass
class PartitionVerdict:
    plan: PartitionPlan
    status: str = "pending"                  # passed | failed | unplaced
    text: str = ""
    busbw: float | None = None
    dragging: dict[str, JobResult] = field(default_factory=dict)
    cleared: list[str] = field(default_factory=list)
    searched: bool = False
    note: str = ""
    failing: dict[str, str] = field(default_factory=dict)     # mndiag: the trays its results fail, and why

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.plan.name, "block": self.plan.block, "trays": list(self.plan.trays),
                "method": self.plan.method, "method_why": self.plan.why,
                "status": self.status, "text": self.text, "busbw": self.busbw, "searched": self.searched,
                "failing": [{"tray": t, "text": why} for t, why in self.failing.items()],
                "dragging": [{"tray": t, "busbw": r.busbw, "with": [x for x in r.job.trays if x != t],
                              "text": r.text} for t, r in self.dragging.items()],
                "note": self.note}


class _Search:
    """One failed partition's search: pairs, then suspects beside good trays (or alone)."""

    def __init__(self, trays: Sequence[str]):
        self.trays = list(trays)
        self.suspects: list[str] = []
        self.good: list[str] = []
        self.stage = "split"

    def jobs(self, partition: str) -> list[Job]:
        if self.stage == "split":
            if len(self.trays) < 4:
                return [Job(partition, "solo", (t,)) for t in self.trays]
            pairs = [tuple(self.trays[i:i + 2]) for i in range(0, len(self.trays) - 1, 2)]
            return [Job(partition, "pair", p) for p in pairs]
        if self.stage == "check":
            if not self.good:
                return [Job(partition, "solo", (t,)) for t in self.suspects]
            return [Job(partition, "check", (s, g)) for s, g in zip(self.suspects, self.good)]
        return []


class Finder:
    """Round 1 every partition; then each failed one's search (docs/decisions.md, the module's docstring)."""

    def __init__(self, partitions: Sequence[PartitionPlan]):
        self.verdicts = {p.name: PartitionVerdict(p) for p in partitions}
        self.searches: dict[str, _Search] = {}
        self.rounds: list[list[JobResult]] = []
        self._first = True

    def next_round(self) -> list[Job]:
        if self._first:
            return [Job(v.plan.name, "mndiag" if v.plan.method == "mndiag" else "partition", v.plan.trays)
                    for v in self.verdicts.values()]
        out: list[Job] = []
        for name, search in self.searches.items():
            out += search.jobs(name)
        return out

    def record(self, results: Sequence[JobResult]) -> None:
        self.rounds.append(list(results))
        if self._first:
            self._first = False
            for r in results:
                v = self.verdicts[r.job.partition]
                v.text, v.busbw = r.text, r.busbw
                if r.ok:
                    v.status = "passed"
                elif not r.placed:
                    v.status = "unplaced"
                elif r.job.kind == "mndiag":
                    v.status = "failed"
                    v.failing = dict(r.failing)
                    if not r.failing:
                        v.note = "mndiag named no tray (its words above); not searched"
                else:
                    v.status = "failed"
                    if r.bandwidth:
                        v.searched = True
                        if len(v.plan.trays) == 1:
                            v.dragging[v.plan.trays[0]] = r
                        else:
                            self.searches[v.plan.name] = _Search(v.plan.trays)
                    else:
                        v.note = "not searched: the tool failed (the search is for a bandwidth figure)"
            return
        by_part: dict[str, list[JobResult]] = {}
        for r in results:
            by_part.setdefault(r.job.partition, []).append(r)
        for name, rs in by_part.items():
            search, v = self.searches[name], self.verdicts[name]
            unplaced = [r for r in rs if not r.placed]
            if unplaced:
                v.note = f"search stopped: {unplaced[0].text}"
                del self.searches[name]
                continue
            if search.stage == "split":
                if rs and rs[0].job.kind == "solo":
                    self._settle(v, rs)
                    search.stage = "done"
                else:
                    in_pairs = {t for r in rs for t in r.job.trays}
                    search.suspects = [t for r in rs if not r.ok for t in r.job.trays]
                    search.suspects += [t for t in search.trays if t not in in_pairs]     # the odd one out
                    search.good = [t for r in rs if r.ok for t in r.job.trays]
                    search.stage = "check"
            else:
                self._settle(v, rs)
                tested = {r.job.trays[0] for r in rs}
                search.suspects = [s for s in search.suspects if s not in tested]
                if not search.suspects:
                    search.stage = "done"
            if search.stage == "done":
                del self.searches[name]
                if not v.dragging:
                    v.note = "no single tray drags: every tray passed alone or beside a good tray"

    @staticmethod
    def _settle(v: PartitionVerdict, rs: Sequence[JobResult]) -> None:
        for r in rs:
            suspect = r.job.trays[0]
            if r.ok:
                v.cleared.append(suspect)
            else:
                v.dragging[suspect] = r

    @property
    def done(self) -> bool:
        return not self._first and not self.searches


def round_bound(trays: int, dragging: int = 1) -> int:
    """The rounds the finder needs on one partition of *trays* with *dragging* trays below the floor."""
    if trays <= 1:
        return 1
    if trays < 4:
        return 2
    suspects = 2 * dragging + (trays % 2)
    good = trays - 2 * dragging - (trays % 2)
    if good <= 0:
        return 3
    return 2 + math.ceil(suspects / good)


# ------------------------------------------------------------------ the run

@dataclass
class Validation:
    plan: ValidationPlan
    run: str
    started: float
    elapsed: float = 0.0
    verdicts: list[PartitionVerdict] = field(default_factory=list)
    rounds: list[list[JobResult]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    history_id: int | None = None

    @property
    def ok(self) -> bool:
        return all(v.status == "passed" for v in self.verdicts) and not self.left

    @property
    def status(self) -> str:
        if self.ok:
            return "passed"
        if self.left or any(v.status == "failed" for v in self.verdicts):
            return "failed"
        return "unplaced"

    def dragging(self) -> list[str]:
        return [t for v in self.verdicts for t in v.dragging]

    def failing(self) -> list[str]:
        """The trays mndiag's own results fail."""
        return [t for v in self.verdicts for t in v.failing]

    def named(self) -> list[str]:
        """Every tray the run names: dragging an all-reduce, or failed by mndiag."""
        return list(dict.fromkeys(self.dragging() + self.failing()))

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.plan.rack, "run": self.run, "status": self.status, "ok": self.ok,
                "elapsed": round(self.elapsed, 2), "min_busbw_gbs": round(self.plan.min_busbw, 1),
                "partitions": [v.to_dict() for v in self.verdicts], "dragging": self.dragging(),
                "failing": self.failing(), "rounds": [[r.to_dict() for r in rs] for rs in self.rounds], "left_allocated": self.left,
                "history_id": self.history_id}

    def lines(self) -> list[str]:
        out = []
        for v in self.verdicts:
            out.append(f"{v.plan.name} ({fold(v.plan.trays)}) [{v.plan.method}]: {v.status}: {v.text}")
            for t, why in v.failing.items():
                out.append(f"  {t} fails {v.plan.name}'s mndiag: {why}")
            for t, r in v.dragging.items():
                others = [x for x in r.job.trays if x != t]
                beside = f" beside {fold(others)}" if others else " alone"
                out.append(f"  {t} drags {v.plan.name}: {r.busbw if r.busbw is not None else '?'} GB/s{beside} "
                           f"({r.text})")
            if v.note:
                out.append(f"  {v.note}")
        if self.left:
            out.append(f"still allocated after the cancel: {', '.join(self.left)}")
        return out


def run_round(site: "Site", jobs: Sequence[Job], run: str, gpus: int, deadline: float,
              min_busbw: float, *, place: int = PLACE_S) -> tuple[list[JobResult], list[str]]:
    """One round on the controller (one SSH command); the results, and any job squeue still showed."""
    from mctl.errors import EnvironmentProblem
    from mctl.sched.slurm.control import run_on_controller

    script = round_script(jobs, run, gpus, deadline, place=place)
    limit = deadline + place + KILL_GRACE_S + CLEAR_S + 30
    res = run_on_controller(site, "sh -c " + _quote(script), timeout=limit, deadline=limit + 10)
    if not res.status.reached:
        raise EnvironmentProblem(f"the Slurm controller did not answer the validation round: {res.summary()}",
                                 hint="the round's sruns run under timeout(1); check squeue for mctl-validate-* jobs")
    answer = parse_round(res.stdout)
    results = [judge(j, answer.answers.get(i), answer.nodes, min_busbw=min_busbw, gpus=gpus)
               for i, j in enumerate(jobs)]
    return results, answer.left


def run_validation(site: "Site", vplan: ValidationPlan, *, state_dir=None, record: bool = True,
                   on_round=None, max_rounds: int = 8) -> Validation:
    """Every partition at once, then the searches, round by round; recorded in the audit history."""
    started = time.time()
    run = time.strftime("%Y%m%d%H%M%S", time.gmtime(started)) + f"{int(started * 1000) % 1000:03d}"
    finder = Finder(vplan.partitions)
    out = Validation(vplan, run, started)
    t0 = time.monotonic()
    for n in range(max_rounds):
        jobs = finder.next_round()
        if not jobs:
            break
        results, left = run_round(site, jobs, f"{run}-{n + 1}", vplan.gpus, vplan.deadline, vplan.min_busbw,
                                  place=vplan.place)
        out.left += left
        finder.record(results)
        if on_round is not None:
            on_round(n + 1, results)
        if finder.done:
            break
    out.rounds = finder.rounds
    out.verdicts = list(finder.verdicts.values())
    out.elapsed = time.monotonic() - t0
    if record and state_dir is not None:
        from mctl.audit.history import History

        history = History.open(state_dir)
        try:
            out.history_id = history.record_validation(site.name, out.to_dict(), started=started,
                                                       elapsed=out.elapsed)
        finally:
            history.close()
    return out


def dry_lines(vplan: ValidationPlan, run: str = "RUN") -> list[str]:
    out = [f"rack {vplan.rack}: {len(vplan.partitions)} NVLink partition(s), floor {vplan.min_busbw:.0f} GB/s "
           f"bus bandwidth, each job under {vplan.deadline:g}s (+{vplan.place}s to be placed)"]
    for i, p in enumerate(vplan.partitions):
        job = Job(p.name, "mndiag" if p.method == "mndiag" else "partition", p.trays)
        how = f" [{p.method}: {p.why}]" if p.why else ""
        out.append(f"{p.name} (block {p.block}, {len(p.trays)} trays {fold(p.trays)}){how}: "
                   f"{job_command(job, job_name(run + '-1', i), vplan.gpus, vplan.deadline, place=vplan.place)}")
    out.append("a partition below the floor is searched: its trays in pairs, then each suspect beside a good tray "
               f"(a dragging tray in {max(round_bound(len(p.trays)) for p in vplan.partitions)} rounds)")
    return out


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
