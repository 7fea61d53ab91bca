"""The work running on trays, as the site's scheduler reports it: Slurm jobs and Kubernetes pods.

Slurm: one `squeue` on the controller (mctl.sched.slurm.control), bounded by a
deadline like the health watch's reads. Kubernetes: one list call of the pods
bound to the trays, not finished (scheduler.k8s's kubeconfig; a field selector
names one node, or, since field selectors cannot say "one of these nodes", every
bound pod in pages, kept when its node is one of the trays). Only work that holds the
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
    from mctl.sched.slurm.control import run_on_controller
    from mctl.sched.slurm.render import controller_of

    controller = controller_of(site)
    result = run_on_controller(site, squeue_command(site), timeout=timeout, deadline=timeout + 10.0)
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


UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
POD_PAGE = 500


def pod_selector(trays: Sequence[str]) -> str:
    """The field selector of the one list call: the tray's pods, or every bound pod (filtered after)."""
    node = f"spec.nodeName={trays[0]}" if len(trays) == 1 else "spec.nodeName!="
    return f"{node},{UNFINISHED}"


def k8s_pod_objects(client, trays: Sequence[str]) -> list[dict]:
    """The pods (API objects) bound to *trays* and not finished: one list call (in pages of POD_PAGE)."""
    if not trays:
        return []
    wanted = set(trays)
    return [p for p in client.list("Pod", field_selector=pod_selector(list(trays)), limit=POD_PAGE)
            if (p.get("spec") or {}).get("nodeName") in wanted]


def k8s_pods(site: "Site", trays: Sequence[str]) -> list[RunningWork]:
    """The GPU-holding pods bound to *trays* (one list call)."""
    from mctl.sched.k8s.client import client_for

    out: list[RunningWork] = []
    for pod in k8s_pod_objects(client_for(site), trays):
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


def wait_for_jobs(site: "Site", trays: Sequence[str], wait: float, *, sleep=None, clock=None,
                  on_wait=None) -> list[RunningWork]:
    """Ask squeue until no busy job runs on *trays* or *wait* seconds passed; the jobs still there."""
    import time

    from mctl.model.change import work_on

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
