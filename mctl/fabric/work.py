"""The work running on trays, as the site's scheduler reports it: Slurm jobs and Kubernetes pods.

Slurm: one `squeue` on the controller over SSH (Site.scheduler.controller), bounded
by a deadline like the health watch's reads. Kubernetes: the pods bound to each
tray through the API (scheduler.k8s's kubeconfig). Only work that holds the
trays' GPUs counts: Slurm jobs running, completing or suspended (R, CG, S); pods
not finished that request `nvidia.com/gpu` or carry a DRA resource claim (GPUs
and ComputeDomain channels are both claims). The parsers are pure.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, Sequence

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from mctl.errors import EnvironmentProblem
from mctl.model.change import BUSY_JOB_STATES, RunningWork

if TYPE_CHECKING:
    from mctl.model.site import Site

_SEP = "\x1f"           # squeue prints it as it is; no job ID, user, state or node set holds it
# %i job ID (array and het jobs as squeue writes them), %u user, %t compact state, %N nodes, %j name (last:
# a name may hold anything)
SQUEUE = "squeue --noheader --states=" + ",".join(BUSY_JOB_STATES) + " --format=" + \
    shlex.quote(_SEP.join(("%i", "%u", "%t", "%N", "%j")))
GPU_RESOURCE = "nvidia.com/gpu"


NOT_DEPLOYED = "@@mctl-no-slurm-conf"


def squeue_command(site: "Site") -> str:
    """squeue on the controller; a controller without slurm.conf (Slurm not deployed yet) says so instead
    (a slurmctld that does not answer is an error: its slurmd may still run jobs)."""
    from mctl.sched.slurm.render import settings_of

    conf = shlex.quote(settings_of(site).conf_dir.rstrip("/") + "/slurm.conf")
    return f"if [ ! -e {conf} ] && [ -z \"${{SLURM_CONF:-}}\" ]; then echo {NOT_DEPLOYED}; exit 0; fi; {SQUEUE}"


def parse_squeue(text: str) -> list[RunningWork]:
    """`squeue --format='%i<US>%u<US>%t<US>%N<US>%j'` -> the jobs in the busy states."""
    out = []
    for line in text.splitlines():
        parts = line.split(_SEP, 4)
        if len(parts) != 5:
            continue
        job, user, state, nodes = (p.strip() for p in parts[:4])
        name = parts[4]
        if state not in BUSY_JOB_STATES or not job:
            continue
        try:
            expanded = tuple(NodeSet(nodes)) if nodes and nodes != "(null)" else ()
        except NodeSetParseError:
            expanded = (nodes,)
        out.append(RunningWork("slurm", job, user or None, name, state, expanded))
    return out


def slurm_jobs(site: "Site", *, timeout: float = 30.0) -> list[RunningWork]:
    """Every busy job on the cluster, from squeue on the controller; EnvironmentProblem when it cannot be read."""
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import SSHConfig, run_sync, targets_for

    controller = controller_of(site)
    (result,) = run_sync(SSHConfig.from_site(site), targets_for(site, [controller]), squeue_command(site),
                         timeout=timeout, deadline=timeout + 10.0)
    if result.status.reached and result.ok and result.stdout.startswith(NOT_DEPLOYED):
        return []           # no slurm.conf on the controller: Slurm is not deployed, so it runs no job
    if not result.status.reached or not result.ok:
        said = ((result.stdout + result.stderr).strip().splitlines() or [result.summary()])[-1]
        raise EnvironmentProblem(f"cannot read the Slurm queue on {controller.name}: {said}",
                                 hint="the change refuses to go ahead without knowing the jobs on its trays; "
                                      "fix slurmctld, or give --force")
    return parse_squeue(result.stdout)


def _quantity(value: Any) -> float:
    try:
        return float(str(value))
    except ValueError:
        return 1.0          # a quantity we cannot read is still a request


def pod_work(pod: dict) -> RunningWork | None:
    """A pod that holds GPUs on its node (GPU requests or a DRA resource claim), else None."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    phase = status.get("phase") or "Unknown"
    node = spec.get("nodeName")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    gpus = 0.0
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            if GPU_RESOURCE in (res.get(part) or {}):
                gpus = max(gpus, _quantity(res[part][GPU_RESOURCE]))
    claims = [c.get("name") or "?" for c in spec.get("resourceClaims") or []]
    if not gpus and not claims:
        return None
    why = ", ".join(([f"{int(gpus) if gpus == int(gpus) else gpus} {GPU_RESOURCE}"] if gpus else []) +
                    ([f"resource claim {', '.join(claims)}"] if claims else []))
    return RunningWork("k8s", f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}", None,
                       str(meta.get("name", "?")), phase, (node,), why)


def k8s_pods(site: "Site", trays: Sequence[str]) -> list[RunningWork]:
    """The GPU-holding pods bound to *trays* (one list call per tray)."""
    from mctl.sched.k8s import KubeClient
    from mctl.sched.k8s import kubeconfig as kc

    settings = site.scheduler.k8s
    path = (site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path()
    client = KubeClient(kc.load(path, settings.context))
    out: list[RunningWork] = []
    for t in trays:
        for pod in client.list("Pod", field_selector=f"spec.nodeName={t}"):
            w = pod_work(pod)
            if w is not None:
                out.append(w)
    return out


def discover(site: "Site", trays: Sequence[str]) -> tuple[list[RunningWork], str | None]:
    """The work on the site's scheduler relevant to *trays*, and why it could not be read (None: it was)."""
    from mctl.errors import MctlError

    if site.scheduler is None or not trays:
        return [], None
    try:
        if site.scheduler.type == "slurm":
            return slurm_jobs(site), None
        if site.scheduler.type == "k8s":
            return k8s_pods(site, trays), None
    except MctlError as exc:
        return [], exc.message
    return [], None


# ------------------------------------------------------------------ holding trays in Slurm (--drain)

HOLD_PREFIX = "mctl: partition change"


def hold_reason(rack: str) -> str:
    return f"{HOLD_PREFIX} of {rack}: held until the change is done"


def _controller_run(site: "Site", command: str, *, timeout: float = 30.0):
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import SSHConfig, run_sync, targets_for

    controller = controller_of(site)
    (result,) = run_sync(SSHConfig.from_site(site), targets_for(site, [controller]), command,
                         timeout=timeout, deadline=timeout + 10.0)
    if not result.status.reached:
        raise EnvironmentProblem(f"the Slurm controller {controller.name} did not answer: {result.summary()}")
    return result


def hold_trays(site: "Site", trays: Sequence[str], rack: str) -> tuple[list[str], dict[str, str]]:
    """Drain *trays* with an `mctl: partition change` reason through the health engine's guarded script.

    Returns (trays held by this change, including those an earlier run of it holds still;
    {tray: why not} for the others: drained or down for someone else, whom mctl never overrides).
    """
    from mctl.model.drain import DRAIN, Decision
    from mctl.sched.slurm.drain import apply_script, parse_apply, read_nodes, show_node_command

    shown = _controller_run(site, show_node_command())
    _, states = read_nodes(shown.stdout)
    already = [t for t in trays if t in states and states[t].drained and states[t].owned_by(HOLD_PREFIX)]
    todo = [Decision(t, DRAIN, "partition change", reason=hold_reason(rack)) for t in trays if t not in already]
    held, refused = list(already), {}
    if todo:
        result = _controller_run(site, apply_script(todo))
        for r in parse_apply(result.stdout, todo):
            if r.ok:
                held.append(r.decision.host)
            else:
                refused[r.decision.host] = r.error or "refused"
    order = {t: i for i, t in enumerate(trays)}
    return sorted(held, key=order.__getitem__), refused


def release_trays(site: "Site", trays: Sequence[str]) -> dict[str, str]:
    """Resume the trays this change holds (only while the reason is still mctl's); {tray: why not}."""
    from mctl.model.drain import RESUME, Decision
    from mctl.sched.slurm.drain import apply_script, parse_apply

    if not trays:
        return {}
    todo = [Decision(t, RESUME, "partition change done") for t in trays]
    result = _controller_run(site, apply_script(todo))
    return {r.decision.host: r.error or "refused" for r in parse_apply(result.stdout, todo) if not r.ok}


def release_command(trays: Sequence[str]) -> str:
    from mctl.model.site import fold

    return f"scontrol update NodeName={fold(trays)} State=RESUME Reason='released by the operator'"


def wait_for_jobs(site: "Site", trays: Sequence[str], wait: float, *, sleep=None, clock=None,
                  on_wait=None) -> list[RunningWork]:
    """Ask squeue until no busy job runs on *trays* or *wait* seconds passed; the jobs still there."""
    import time

    from mctl.fabric.change import work_on

    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    deadline = clock() + wait
    while True:
        left = work_on(slurm_jobs(site), trays)
        remaining = deadline - clock()
        if not left or remaining <= 0:
            return list(left)
        if on_wait is not None:
            on_wait(left, remaining)
        sleep(min(2.0, max(0.1, remaining)))
