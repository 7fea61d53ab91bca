"""A partition change's hold on Kubernetes: cordon the affected nodes, evict their GPU pods, uncordon after.

The Kubernetes twin of mctl.sched.slurm.holds for `mctl partition ... --drain`:

    hold(site, trays, reason) -> (held, {tray: why not})     cordon (spec.unschedulable, mctl's annotations and
                                                              the taint mctl.io/partition-change:NoSchedule)
    release(site, trays) -> {tray: why not}                  lift only that cordon (the reason is still mctl's)
    evict_pods(client, trays, wait) -> EvictResult           every GPU pod through the Eviction API, then
                                                              until they are gone
    delete_pods(client, trays, wait) -> EvictResult          --force: deleted, no budget asked

An eviction is the API server's own check of every PodDisruptionBudget covering the pod: a budget that
allows no disruption now answers 429 with the budget named in the Status' causes. That and the answers
that only say "not now" (429 of priority and fairness, 5xx, a timeout: client.TRANSIENT) are asked again
until the deadline; then the change stops and says which budget (or which error) held it. Pods owned by
a DaemonSet are left (their controller puts them back on a cordoned node; kubectl drain
--ignore-daemonsets does the same) and named. A node cordoned by someone else is left as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.errors import EnvironmentProblem, MctlError, PartialFailure
from mctl.model.change import RunningWork
from mctl.sched.k8s.client import TRANSIENT, ApiError, ClusterUnreachable, client_for  # noqa: F401
from mctl.sched.k8s.cordon import REASON, Taint, cordon_patch, node_view, uncordon_patch

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.sched.k8s.client import KubeClient

TAINT = Taint("mctl.io/partition-change", None, "NoSchedule")
REASON_PREFIX = "mctl: partition change"
CONFLICT_TRIES = 3
BUDGET_CAUSE = "DisruptionBudget"


def change_reason(rack: str) -> str:
    """The cordon reason of a partition change of *rack* (the words of the Slurm hold)."""
    return f"{REASON_PREFIX} of {rack}: held until the change is done"


def uncordon_command(trays: Sequence[str]) -> str:
    return "kubectl uncordon " + " ".join(trays) + " && kubectl taint nodes " + " ".join(trays) + \
        f" {TAINT.key}:{TAINT.effect}-"


# ------------------------------------------------------------------ asked again until the deadline

def transient(exc: MctlError) -> bool:
    return isinstance(exc, ClusterUnreachable) or (isinstance(exc, ApiError) and exc.status in TRANSIENT)


def within(deadline: float, what: str, call: Callable[[], Any], *, clock=time.monotonic, sleep=time.sleep,
           final: Callable[[MctlError], bool] = lambda exc: False) -> Any:
    """*call*, asked again while the API answers 'not now' (429, 5xx, timeouts; not those *final* says are an
    answer) and *deadline* (a clock() value) is ahead; EnvironmentProblem naming the last answer once it is not."""
    pause = 0.2
    while True:
        try:
            return call()
        except MctlError as exc:
            if not transient(exc) or final(exc):
                raise
            if clock() + pause > deadline:
                raise EnvironmentProblem(f"{what}: the Kubernetes API kept failing until the deadline: {exc.message}",
                                         hint="check the API server (its load, its etcd), then run the change "
                                              "again") from None
        sleep(pause)
        pause = min(pause * 2, 2.0)


# ------------------------------------------------------------------ the pods on the trays

def is_daemonset_pod(pod: dict) -> bool:
    return any(o.get("kind") == "DaemonSet" and o.get("controller")
               for o in (pod.get("metadata") or {}).get("ownerReferences") or [])


def pod_key(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


@dataclass
class EvictResult:
    evicted: list[RunningWork] = field(default_factory=list)     # evicted (or deleted) and gone
    left: list[RunningWork] = field(default_factory=list)        # DaemonSet pods, not evicted
    terminating: list[RunningWork] = field(default_factory=list)  # deleted, not yet gone (--force only)
    asked: int = 0                                                # eviction or delete requests sent


def _gpu_pods(client: "KubeClient", trays: Sequence[str], deadline: float, clock, sleep
              ) -> list[tuple[RunningWork, dict]]:
    from mctl.sched.work import k8s_pod_objects, pod_work

    pods = within(deadline, "listing the pods on the trays", lambda: k8s_pod_objects(client, trays),
                  clock=clock, sleep=sleep)
    out = []
    for pod in pods:
        w = pod_work(pod)
        if w is not None:
            out.append((w, pod))
    return out


def _wait_gone(client: "KubeClient", trays: Sequence[str], gone: dict[str, RunningWork], deadline: float,
               clock, sleep, on_wait) -> list[RunningWork]:
    """Until none of *gone* (uid -> pod) is bound to the trays any more, or the deadline; those still there."""
    from mctl.sched.work import k8s_pod_objects

    while True:
        try:
            there = {(p.get("metadata") or {}).get("uid") for p in k8s_pod_objects(client, trays)}
        except MctlError as exc:
            if not transient(exc):
                raise
            there = set(gone)           # not known: as if still there
        left = [w for uid, w in gone.items() if uid in there]
        if not left or clock() >= deadline:
            return left
        if on_wait is not None:
            on_wait(left, deadline - clock())
        sleep(min(1.0, max(0.05, deadline - clock())))


def _budget(exc: ApiError) -> str | None:
    """The budget's words when a PodDisruptionBudget refused the eviction (429 with a DisruptionBudget cause)."""
    if exc.status != 429:
        return None
    for c in exc.causes:
        if c.get("reason") == BUDGET_CAUSE or "disruption budget" in str(c.get("message", "")).lower():
            return str(c.get("message") or c.get("reason"))
    if "disruption budget" in exc.message.lower():
        return exc.message
    return None


def evict_pods(client: "KubeClient", trays: Sequence[str], wait: float, *, clock=time.monotonic, sleep=time.sleep,
               on_wait=None) -> EvictResult:
    """Evict every GPU pod on *trays* (DaemonSets' left), asking again while a budget or the API says 'not now',
    then wait until they are gone, all within *wait* seconds. PartialFailure at the deadline, naming the
    budgets that refused and the pods they keep; the pods evicted so far stay evicted."""
    deadline = clock() + wait
    result = EvictResult()
    policy = within(deadline, "asking the API server for the Eviction API's version", client.policy_version,
                    clock=clock, sleep=sleep)
    pending: dict[str, tuple[RunningWork, dict]] = {}
    for w, pod in _gpu_pods(client, trays, deadline, clock, sleep):
        if is_daemonset_pod(pod):
            result.left.append(w)
        else:
            pending[pod["metadata"]["uid"]] = (w, pod)
    evicted: dict[str, RunningWork] = {}
    blocked: dict[str, str] = {}            # pod -> the budget's words
    failing: dict[str, str] = {}            # pod -> the API's last 'not now'
    pause = 0.2
    while pending:
        for uid, (w, pod) in list(pending.items()):
            meta = pod["metadata"]
            result.asked += 1
            try:
                client.evict(meta["name"], meta.get("namespace", "default"), policy)
            except ApiError as exc:
                why = _budget(exc)
                if why is not None:
                    blocked[w.id] = why
                    failing.pop(w.id, None)
                    continue
                if exc.status not in TRANSIENT:
                    raise
                failing[w.id] = exc.message
                continue
            except ClusterUnreachable as exc:
                failing[w.id] = exc.message
                continue
            evicted[uid] = w
            del pending[uid]
            blocked.pop(w.id, None)
            failing.pop(w.id, None)
        if not pending:
            break
        if clock() + pause > deadline:
            from mctl.model.site import fold

            said = [f"{p} is kept by a PodDisruptionBudget: {why}" for p, why in blocked.items()] + \
                   [f"{p}: {why}" for p, why in failing.items() if p not in blocked]
            raise PartialFailure(
                f"the GPU pods on {fold(trays)} could not all be evicted within {wait:g}s: " + "; ".join(said) +
                (f" ({len(evicted)} evicted already)" if evicted else ""),
                hint="a budget that allows no disruption holds its pods until more of them are healthy elsewhere: "
                     "scale the workload or relax the PodDisruptionBudget, then run the change again (with a longer "
                     "--wait); --force deletes the pods without asking their budgets"
                if blocked else "check the API server, then run the change again")
        if on_wait is not None:
            on_wait([w for w, _ in pending.values()], deadline - clock())
        sleep(pause)
        pause = min(pause * 2, 2.0)
    left = _wait_gone(client, trays, evicted, deadline, clock, sleep, on_wait)
    if left:
        raise PartialFailure(f"evicted pods still on the trays after {wait:g}s: "
                             + "; ".join(w.describe() for w in left),
                             hint="their containers have not stopped (terminationGracePeriodSeconds, a kubelet "
                                  "that does not answer); run the change again once they are gone")
    result.evicted = list(evicted.values())
    return result


def delete_pods(client: "KubeClient", trays: Sequence[str], wait: float, *, clock=time.monotonic,
                sleep=time.sleep) -> EvictResult:
    """--force: delete every GPU pod on *trays* (DaemonSets' left) with its own grace period, no budget asked;
    wait up to *wait* seconds for them to be gone. Those still terminating are returned, not raised."""
    deadline = clock() + wait
    result = EvictResult()
    gone: dict[str, RunningWork] = {}
    for w, pod in _gpu_pods(client, trays, deadline, clock, sleep):
        if is_daemonset_pod(pod):
            result.left.append(w)
            continue
        meta = pod["metadata"]
        result.asked += 1
        within(deadline, f"deleting pod {w.id}",
               lambda m=meta: client.delete("Pod", m["name"], m.get("namespace", "default")), clock=clock, sleep=sleep)
        gone[meta["uid"]] = w
    result.terminating = _wait_gone(client, trays, gone, deadline, clock, sleep, None)
    result.evicted = [w for w in gone.values() if w not in result.terminating]
    return result


# ------------------------------------------------------------------ the health drain's evictions (one pass)

@dataclass
class NodeEvictions:
    """What one pass of evictions did on a drained node."""

    evicted: list[str] = field(default_factory=list)           # namespace/name
    kept: dict[str, str] = field(default_factory=dict)         # pod -> why not (its budget, the API's error)
    left: list[str] = field(default_factory=list)              # DaemonSet pods, never evicted

    def to_dict(self) -> dict[str, Any]:
        return {"evicted": self.evicted, "kept": self.kept, "daemonset_pods_left": self.left}

    def message(self, node: str) -> str:
        parts = [f"evicted {len(self.evicted)} GPU pod{'s' if len(self.evicted) != 1 else ''}"
                 + (f" ({', '.join(self.evicted)})" if self.evicted else "")]
        parts += [f"{p} not evicted: {why}" for p, why in self.kept.items()]
        if self.left:
            parts.append(f"DaemonSet pods left: {', '.join(self.left)}")
        return f"mctl drained {node}: " + "; ".join(parts)


def evict_node(client: "KubeClient", node: str, deadline: float, *, clock=time.monotonic,
               sleep=time.sleep) -> NodeEvictions:
    """Evict the GPU pods on a node the health drain just cordoned, each once (the API's 'not now' asked again
    until *deadline*; a budget's refusal is said, not waited out: the watch never blocks on a budget)."""
    out = NodeEvictions()
    policy = within(deadline, "asking the API server for the Eviction API's version", client.policy_version,
                    clock=clock, sleep=sleep)
    for w, pod in _gpu_pods(client, [node], deadline, clock, sleep):
        if is_daemonset_pod(pod):
            out.left.append(w.id)
            continue
        meta = pod["metadata"]
        try:
            within(deadline, f"evicting pod {w.id}",
                   lambda m=meta: client.evict(m["name"], m.get("namespace", "default"), policy),
                   clock=clock, sleep=sleep, final=lambda exc: isinstance(exc, ApiError) and _budget(exc) is not None)
            out.evicted.append(w.id)
        except ApiError as exc:
            why = _budget(exc)
            out.kept[w.id] = f"kept by a PodDisruptionBudget: {why}" if why else exc.message
        except MctlError as exc:
            out.kept[w.id] = exc.message
    return out


def node_event(client: "KubeClient", node: dict, reason: str, message: str, namespace: str = "default",
               now: float | None = None) -> None:
    """One core/v1 Event on *node* (what `kubectl describe node` shows), from the component mctl."""
    from datetime import datetime, timezone

    stamp = datetime.fromtimestamp(now or time.time(), timezone.utc).isoformat(timespec="seconds") \
        .replace("+00:00", "Z")
    meta = node.get("metadata") or {}
    client.create({"apiVersion": "v1", "kind": "Event",
                   "metadata": {"generateName": f"{meta.get('name')}.mctl-", "namespace": namespace},
                   "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": meta.get("name"),
                                      "uid": meta.get("uid")},
                   "reason": reason, "message": message[:1024], "type": "Warning",
                   "source": {"component": "mctl"}, "reportingComponent": "mctl",
                   "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})


EVICT_DEADLINE = 20.0       # s for one drained node's evictions and its event (the watch's drain executor waits)
EVENT_REASON = "MctlEvictedGPUPods"


def after_drain(client: "KubeClient", node: str) -> dict[str, Any]:
    """The health drain's hook on a Kubernetes site with `health.k8s_evict: true`: the node's GPU pods evicted
    once, and one Event on the node saying what was evicted and what not; the result line's keys (never raises:
    the drain itself is done)."""
    deadline = time.monotonic() + EVICT_DEADLINE
    try:
        done = evict_node(client, node, deadline)
    except MctlError as exc:
        return {"evictions": {"error": exc.message}}
    out: dict[str, Any] = {"evictions": done.to_dict()}
    try:
        obj = client.get("Node", node) or {"metadata": {"name": node}}
        node_event(client, obj, EVENT_REASON, done.message(node))
    except MctlError as exc:
        out["event_error"] = exc.message
    return out


# ------------------------------------------------------------------ cordon and uncordon

def _patch_node(client: "KubeClient", name: str, make: Callable[[dict], dict | str | None], deadline: float
                ) -> str | None:
    """Read the Node, let *make* judge it (a patch; a string: why not; None: nothing to do), patch with its
    resourceVersion, again on 409. None when done; else why not."""
    for attempt in range(1, CONFLICT_TRIES + 1):
        obj = within(deadline, f"reading Node {name}", lambda: client.get("Node", name))
        if obj is None:
            return "no such Node"
        patch = make(obj)
        if patch is None:
            return None
        if isinstance(patch, str):
            return patch
        try:
            within(deadline, f"patching Node {name}", lambda: client.merge_patch("Node", name, None, patch))
            return None
        except ApiError as exc:
            if exc.status == 409 and attempt < CONFLICT_TRIES:
                continue
            return exc.message
    return f"the node changed between read and write {CONFLICT_TRIES} times (409 Conflict)"


def hold_nodes(client: "KubeClient", trays: Sequence[str], reason: str, who: str, *, deadline: float
               ) -> tuple[list[str], dict[str, str]]:
    """Cordon *trays* for the change: (those cordoned for it, including before; {tray: why not} for the others:
    no Node, or cordoned by someone else, who mctl never overrides)."""
    held, refused = [], {}

    def make(obj: dict):
        view = node_view(obj["metadata"]["name"], obj)
        ours = ((obj.get("metadata") or {}).get("annotations") or {}).get(REASON) == reason
        if view.drained:
            return None if ours else f"cordoned already ({view.reason}); left as it is"
        return cordon_patch(obj, reason, reason, who, TAINT, time.time())

    for t in trays:
        why = _patch_node(client, t, make, deadline)
        if why is None:
            held.append(t)
        else:
            refused[t] = why
    return held, refused


def release_nodes(client: "KubeClient", trays: Sequence[str], reason: str, *, deadline: float) -> dict[str, str]:
    """Uncordon *trays* where the cordon is still the change's; {tray: why not} for the others."""
    failed = {}

    def make(obj: dict):
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if not (obj.get("spec") or {}).get("unschedulable"):
            return None                 # not cordoned (any more): nothing to lift
        if ann.get(REASON) != reason:
            return f"the cordon is no longer the change's ({ann.get(REASON) or 'no mctl annotation'}); left as it is"
        return uncordon_patch(obj, TAINT)

    for t in trays:
        why = _patch_node(client, t, make, deadline)
        if why is not None:
            failed[t] = why
    return failed


HOLD_WAIT = 60.0        # s for the cordons (or uncordons) of one change, the API's 'not now' asked again within


def hold(site: "Site", trays: Sequence[str], reason: str, who: str = "mctl") -> tuple[list[str], dict[str, str]]:
    return hold_nodes(client_for(site), trays, reason, who, deadline=time.monotonic() + HOLD_WAIT)


def release(site: "Site", trays: Sequence[str], reason: str) -> dict[str, str]:
    return release_nodes(client_for(site), trays, reason, deadline=time.monotonic() + HOLD_WAIT)
