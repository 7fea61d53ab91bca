"""The scheduler adapters the health engine drains and resumes through.

Slurm: `scontrol` over SSH on the controller host (Site.scheduler.controller),
through the same connection pool as the sweep, so the watch keeps that
connection open too. Reading every node is one command; all actions of a
sweep are one script (slurm_ops.apply_script) with a guard before each.

Kubernetes: the API server through mctl.sched.k8s's client (kubeconfig from
scheduler.k8s): cordon, taint and annotations (k8s_ops), each action a fresh
read, the guard, then a merge patch carrying the resourceVersion just read.

Both expose `kind`, `where`, `read() -> (views, raw states)` and
`apply(decisions) -> [ActResult]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from mctl.errors import MctlError
from mctl.health.policy import Decision, NodeView
from mctl.health.slurm_ops import ActResult, SchedulerUnreachable, apply_script, controller_down, parse_apply, \
    read_nodes, show_node_command

if TYPE_CHECKING:
    from mctl.model.site import Site
    from mctl.sched.slurm.facts import NodeState
    from mctl.transport import SSHPool, SSHTarget


class SlurmAdapter:
    kind = "slurm"

    def __init__(self, pool: "SSHPool", target: "SSHTarget", *, timeout: float = 30.0):
        self.pool = pool
        self.target = target
        self.timeout = timeout

    @property
    def where(self) -> str:
        return f"slurmctld on {self.target.name}"

    async def read(self, *, deadline: float | None = None) -> tuple[dict[str, NodeView], dict[str, "NodeState"]]:
        result = await self.pool.run_one(self.target, show_node_command(), timeout=self.timeout,
                                         deadline=min(self.timeout, deadline) if deadline else None)
        if not result.status.reached:
            raise SchedulerUnreachable(f"{self.target.name} did not answer: {result.summary()}")
        text = result.stdout + result.stderr
        if not result.ok:
            said = (text.strip().splitlines() or [result.summary()])[-1]
            if controller_down(text):
                raise SchedulerUnreachable(f"slurmctld did not answer on {self.target.name}: {said}")
            raise SchedulerUnreachable(f"scontrol on {self.target.name} failed: {said}")
        return read_nodes(result.stdout)

    async def apply(self, decisions: Sequence[Decision], *, deadline: float | None = None) -> list[ActResult]:
        if not decisions:
            return []
        limit = min(self.timeout, deadline) if deadline else self.timeout
        result = await self.pool.run_one(self.target, apply_script(decisions, limit_s=limit), timeout=self.timeout,
                                         deadline=min(self.timeout, deadline) if deadline else None)
        if not result.status.reached:
            return [ActResult(d, False, f"{self.target.name}: {result.summary()}", unreachable=True)
                    for d in decisions]
        return parse_apply(result.stdout, decisions)


def slurm_adapter(site: "Site", pool: "SSHPool") -> SlurmAdapter:
    from mctl.sched.slurm.render import controller_of
    from mctl.transport import targets_for

    controller = controller_of(site)
    (target,) = targets_for(site, [controller])
    return SlurmAdapter(pool, target, timeout=min(30.0, site.ssh.command_timeout))


CONFLICT_TRIES = 3        # reads and patches of one Node before a 409 is given up


class K8sAdapter:
    kind = "k8s"

    def __init__(self, client, names: Sequence[str], taint: str, who: str):
        from mctl.health.k8s_ops import parse_taint

        self.client = client
        self.names = list(names)
        self.taint = parse_taint(taint)
        self.who = who

    @property
    def where(self) -> str:
        return f"Kubernetes API {self.client.conn.server}"

    def _get(self, name: str):
        return self.client.get("Node", name)

    def _read(self) -> tuple[dict[str, NodeView], dict[str, dict]]:
        from mctl.health.k8s_ops import node_view
        from mctl.sched.k8s.client import ClusterUnreachable

        views, raw = {}, {}
        try:
            for name in self.names:
                obj = self._get(name)
                views[name] = node_view(name, obj)
                if obj is not None:
                    raw[name] = obj
        except ClusterUnreachable as exc:
            raise SchedulerUnreachable(exc.message) from None
        except MctlError as exc:
            raise SchedulerUnreachable(f"the Kubernetes API refused to list nodes: {exc.message}") from None
        return views, raw

    async def read(self, *, deadline: float | None = None):
        import asyncio

        # Each request has the client's own socket timeout; the deadline bounds the whole read
        # (one GET per node), so a slow API server cannot hold a sweep past it.
        try:
            async with asyncio.timeout(deadline):
                views, _ = await asyncio.to_thread(self._read)
        except TimeoutError:
            raise SchedulerUnreachable(f"{self.where} did not answer within the {deadline:g}s deadline") from None
        return views, {}

    def _apply_one(self, d: Decision) -> ActResult:
        import time

        from mctl.health.k8s_ops import cordon_patch, guard, node_view, uncordon_patch
        from mctl.health.policy import DRAIN
        from mctl.sched.k8s.client import ApiError, ClusterUnreachable

        # A patch carries the resourceVersion it was computed from: a write in between (another controller's
        # taint, an operator's cordon) makes the server answer 409. Then read again, check again, patch again.
        for attempt in range(1, CONFLICT_TRIES + 1):
            try:
                obj = self._get(d.host)
                if obj is None:
                    return ActResult(d, False, "refused: no such Node", refused=True)
                why, not_ours = guard(d.action, node_view(d.host, obj))
                if why:
                    return ActResult(d, False, why, refused=True, not_ours=not_ours)
                patch = (cordon_patch(obj, d.reason or "mctl:", d.full, self.who, self.taint, d.at or time.time())
                         if d.action == DRAIN else uncordon_patch(obj, self.taint))
                self.client.merge_patch("Node", d.host, None, patch)
            except ClusterUnreachable as exc:
                return ActResult(d, False, exc.message, unreachable=True)
            except ApiError as exc:
                if exc.status == 409 and attempt < CONFLICT_TRIES:
                    continue
                if exc.status == 409:
                    return ActResult(d, False, f"refused: the node changed between read and write {CONFLICT_TRIES} "
                                               "times (409 Conflict)", refused=True)
                return ActResult(d, False, exc.message + (f"; {exc.hint}" if exc.hint else ""))
            except MctlError as exc:
                return ActResult(d, False, exc.message)
            return ActResult(d, True)
        raise AssertionError("unreachable")

    async def apply(self, decisions: Sequence[Decision], *, deadline: float | None = None) -> list[ActResult]:
        import asyncio

        # Not cut at *deadline*: a patch in flight cannot be recalled, and its result must be
        # recorded. Each request is bounded by the client's timeout (KubeClient.timeout).
        return [await asyncio.to_thread(self._apply_one, d) for d in decisions]


def k8s_adapter(site: "Site", names: Sequence[str], who: str | None = None) -> K8sAdapter:
    """Through the kubeconfig of scheduler.k8s (else $KUBECONFIG, ~/.kube/config), as `mctl deploy k8s`."""
    from mctl.health.store import actor
    from mctl.sched.k8s import KubeClient
    from mctl.sched.k8s import kubeconfig as kc

    settings = site.scheduler.k8s
    path = (site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path()
    return K8sAdapter(KubeClient(kc.load(path, settings.context)), names, site.health.k8s_taint, who or actor())


def adapter_for(site: "Site", pool: "SSHPool", names: Sequence[str] = (), who: str | None = None):
    """The site's scheduler adapter, or None when mctl has nothing to drain through."""
    if site.scheduler is None:
        return None
    if site.scheduler.type == "slurm":
        return slurm_adapter(site, pool)
    if site.scheduler.type == "k8s":
        return k8s_adapter(site, names or [h.name for h in site.compute_trays()], who)
    return None
