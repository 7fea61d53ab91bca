"""Drains and resumes in Kubernetes' words: cordon, a taint, and annotations saying who, why and when.

Pure: a Node object in, a NodeView or a JSON merge patch out. A drain sets
`spec.unschedulable` (what `kubectl cordon` does), adds the configured taint
(default `mctl.io/unhealthy=true:NoSchedule`) and annotates the node:

  mctl.io/cordon-by         who (user@host, pid, command)
  mctl.io/cordon-reason     the short reason, starting `mctl:` (the equivalent of Slurm's)
  mctl.io/cordon-message    every critical finding, in full
  mctl.io/cordon-timestamp  when (RFC 3339, UTC)

A node cordoned without mctl's reason annotation belongs to someone else (an
operator, NVSentinel, a drain in progress) and is never touched; a resume lifts
only mctl's own cordon, taint and annotations. Patches carry the node's
resourceVersion, so a change made between read and write makes the API refuse
the patch (409) instead of overwriting it.

A rack held by rack escalation (mctl.health.escalation) gets, on each of its nodes, mctl's own taint
`mctl.io/rack-escalated=<rack>:NoSchedule` and the annotation `mctl.io/rack-escalated-reason` (the cause);
no cordon, so the node's own cordon, whoever set it, is never changed, and the lift removes exactly that
taint and annotation (`rack_taint_patch`, `rack_untaint_patch`).

`K8sAdapter` acts through the API server with mctl.sched.k8s's client (kubeconfig
from scheduler.k8s): each action a fresh read, the guard, then a merge patch
carrying the resourceVersion just read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

from mctl.errors import MctlError
from mctl.model.drain import (DRAIN, ActResult, Decision, NodeView, SchedulerUnreachable, drain_refusal,
                              is_mctl_reason, resume_refusal)

if TYPE_CHECKING:
    from mctl.model.site import Site

BY = "mctl.io/cordon-by"
REASON = "mctl.io/cordon-reason"
MESSAGE = "mctl.io/cordon-message"
AT = "mctl.io/cordon-timestamp"
ANNOTATIONS = (BY, REASON, MESSAGE, AT)
MESSAGE_MAX = 2000
_TAINT = re.compile(r"^(?P<key>[A-Za-z0-9./_-]+)(?:=(?P<value>[A-Za-z0-9._-]*))?:(?P<effect>NoSchedule|PreferNoSchedule|"
                    r"NoExecute)$")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: str

    def to_k8s(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


def parse_taint(text: str) -> Taint:
    m = _TAINT.match(text.strip())
    if not m:
        raise ValueError(f"not a taint: {text!r} (key[=value]:NoSchedule|PreferNoSchedule|NoExecute)")
    return Taint(m["key"], m["value"], m["effect"])


def _ready(node: dict[str, Any]) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return None


def node_view(name: str, node: dict[str, Any] | None) -> NodeView:
    """The Kubernetes Node as the policy sees any scheduler's node."""
    if node is None:
        return NodeView(name, known=False)
    meta = node.get("metadata") or {}
    ann = meta.get("annotations") or {}
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    ready = _ready(node)
    # A node without a Ready condition has not reported yet; it is not down by mctl's reckoning.
    down = ready is not None and ready != "True"
    reason = None
    if cordoned:
        reason = ann.get(REASON) if is_mctl_reason(ann.get(REASON)) else "cordoned without mctl's annotation"
    state = ("NotReady" if down else "Ready") + (",SchedulingDisabled" if cordoned else "")
    return NodeView(name, True, cordoned, down, reason, state)


def cordon_patch(node: dict[str, Any], reason: str, full: str | None, who: str, taint: Taint,
                 now: float) -> dict[str, Any]:
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != taint.key] + [taint.to_k8s()]
    stamp = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    annotations = {BY: who, REASON: reason, MESSAGE: (full or reason)[:MESSAGE_MAX], AT: stamp}
    meta: dict[str, Any] = {"annotations": annotations}
    rv = (node.get("metadata") or {}).get("resourceVersion")
    if rv:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"unschedulable": True, "taints": taints}}


def uncordon_patch(node: dict[str, Any], taint: Taint) -> dict[str, Any]:
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != taint.key]
    meta: dict[str, Any] = {"annotations": {k: None for k in ANNOTATIONS}}
    rv = (node.get("metadata") or {}).get("resourceVersion")
    if rv:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"unschedulable": None, "taints": taints or None}}


RACK_TAINT_KEY = "mctl.io/rack-escalated"
RACK_REASON = "mctl.io/rack-escalated-reason"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def rack_taint(rack: str) -> Taint:
    """mctl's taint on a held rack's nodes; the value is the rack (a label value: 63 characters at most)."""
    value = rack if _LABEL_VALUE.match(rack) else ""
    return Taint(RACK_TAINT_KEY, value or None, "NoSchedule")


def rack_taint_patch(node: dict[str, Any], rack: str, reason: str) -> dict[str, Any]:
    """Add mctl's rack taint and its reason annotation; every other taint stays as it is."""
    taint = rack_taint(rack)
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != taint.key] + [taint.to_k8s()]
    meta: dict[str, Any] = {"annotations": {RACK_REASON: reason[:MESSAGE_MAX]}}
    rv = (node.get("metadata") or {}).get("resourceVersion")
    if rv:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"taints": taints}}


def rack_untaint_patch(node: dict[str, Any]) -> dict[str, Any]:
    """Remove mctl's rack taint and its annotation, nothing else."""
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != RACK_TAINT_KEY]
    meta: dict[str, Any] = {"annotations": {RACK_REASON: None}}
    rv = (node.get("metadata") or {}).get("resourceVersion")
    if rv:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"taints": taints or None}}


def rack_held(node: dict[str, Any] | None) -> bool:
    """The node carries mctl's rack taint."""
    return any(t.get("key") == RACK_TAINT_KEY for t in ((node or {}).get("spec") or {}).get("taints") or [])


# The guards of mctl.model.drain, in Kubernetes' words.
_REFUSED = {"unknown": "refused: no such Node", "down": "refused: the node is {v.state}",
            "drained": "refused: the node is already cordoned ({v.reason})",
            "not-drained": "refused: the node is not cordoned",
            "not-ours": "refused: the cordon is no longer mctl's ({v.reason})"}


def guard(action: str, view: NodeView) -> tuple[str | None, bool]:
    """(why the action must not happen now, whether it is because the cordon is not mctl's)."""
    refusal = drain_refusal(view) if action == DRAIN else resume_refusal(view)
    if refusal is None:
        return None, False
    return _REFUSED[refusal.kind].format(v=view), refusal.not_ours


CONFLICT_TRIES = 3        # reads and patches of one Node before a 409 is given up


# The degraded-fabric label (mctl.health.responders.fabric): mctl's own, set and removed only by mctl.
FABRIC_LABEL = "mctl.io/nvlink-degraded"


def fabric_label_patch(node: dict[str, Any], mark: bool) -> dict[str, Any] | None:
    """The merge patch that sets (*mark*) or removes mctl's degraded-fabric label, None when it is so already;
    it carries the node's resourceVersion (a write in between makes the API refuse it) and no other label."""
    meta = node.get("metadata") or {}
    if (FABRIC_LABEL in (meta.get("labels") or {})) == mark:
        return None
    out: dict[str, Any] = {"labels": {FABRIC_LABEL: "true" if mark else None}}
    if meta.get("resourceVersion"):
        out["resourceVersion"] = meta["resourceVersion"]
    return {"metadata": out}


class K8sAdapter:
    kind = "k8s"

    def __init__(self, client, names: Sequence[str], taint: str, who: str, on_drained=None):
        self.client = client
        self.names = list(names)
        self.taint = parse_taint(taint)
        self.who = who
        # called with (client, node) after each drain that went through; returns the result line's keys
        # (health.k8s_evict: mctl.sched.k8s.evict.after_drain evicts the node's GPU pods)
        self.on_drained = on_drained

    @property
    def where(self) -> str:
        return f"Kubernetes API {self.client.conn.server}"

    def _get(self, name: str):
        return self.client.get("Node", name)

    def _read(self) -> tuple[dict[str, NodeView], dict[str, dict]]:
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
            if d.action == DRAIN and self.on_drained is not None:
                return ActResult(d, True, fields=self.on_drained(self.client, d.host))
            return ActResult(d, True)
        raise AssertionError("unreachable")

    def _patch_rack(self, name: str, make) -> str | None:
        """Read *name*, patch it with make(node) (None: nothing to do), again on a 409; None or why not."""
        from mctl.sched.k8s.client import ApiError, ClusterUnreachable

        for attempt in range(1, CONFLICT_TRIES + 1):
            try:
                obj = self._get(name)
                if obj is None:
                    return "no such Node"
                patch = make(obj)
                if patch is None:
                    return None
                self.client.merge_patch("Node", name, None, patch)
                return None
            except ClusterUnreachable as exc:
                raise SchedulerUnreachable(exc.message) from None
            except ApiError as exc:
                if exc.status == 409 and attempt < CONFLICT_TRIES:
                    continue
                return exc.message
            except MctlError as exc:
                return exc.message
        return f"the node changed between read and write {CONFLICT_TRIES} times (409 Conflict)"

    def hold_rack(self, rack: str, trays: Sequence[str], reason: str) -> tuple[list[str], dict[str, str], str | None]:
        """Rack escalation's hold: mctl's rack taint on each of *trays*' nodes (as holds.hold_rack answers:
        held, {tray: why not}, None or why the API server did not answer)."""
        held, left = [], {}
        try:
            for t in trays:
                why = self._patch_rack(t, lambda obj: rack_taint_patch(obj, rack, reason))
                if why is None:
                    held.append(t)
                else:
                    left[t] = why
        except SchedulerUnreachable as exc:
            return held, left, str(exc)
        return held, left, None

    def lift_rack(self, trays: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """Remove mctl's rack taint from *trays* that carry it: (lifted, {tray: why not})."""
        lifted, left = [], {}
        for t in trays:
            why = self._patch_rack(t, lambda obj: rack_untaint_patch(obj) if rack_held(obj) else None)
            if why is None:
                lifted.append(t)
            else:
                left[t] = why
        return lifted, left

    def rack_holds(self, trays: Sequence[str]) -> list[str]:
        """The trays whose node carries mctl's rack taint."""
        try:
            return [t for t in trays if rack_held(self._get(t))]
        except MctlError as exc:
            raise SchedulerUnreachable(exc.message) from None

    async def fabric_marks(self, names: Sequence[str], *, deadline: float | None = None) -> dict[str, bool]:
        """Which nodes carry mctl's degraded-fabric label (a node not read is left out)."""
        import asyncio

        def read() -> dict[str, bool]:
            out = {}
            for name in names:
                try:
                    obj = self._get(name)
                except MctlError:
                    continue
                if obj is not None:
                    out[name] = FABRIC_LABEL in ((obj.get("metadata") or {}).get("labels") or {})
            return out
        try:
            async with asyncio.timeout(deadline):
                return await asyncio.to_thread(read)
        except TimeoutError:
            return {}

    def _mark_one(self, name: str, mark: bool) -> tuple[str, str]:
        from mctl.sched.k8s.client import ApiError

        for _ in range(CONFLICT_TRIES):
            try:
                obj = self._get(name)
                if obj is None:
                    return "refused", "no such Node"
                patch = fabric_label_patch(obj, mark)
                if patch is None:
                    return "done", "already so"
                self.client.merge_patch("Node", name, None, patch)
                return "done", ""
            except ApiError as exc:
                if exc.status == 409:
                    continue
                return "failed", exc.message
            except MctlError as exc:
                return "failed", exc.message
        return "refused", f"the node changed between read and write {CONFLICT_TRIES} times (409 Conflict)"

    async def set_fabric_marks(self, marks: Sequence[tuple[str, bool]], *, deadline: float | None = None
                               ) -> dict[str, tuple[str, str]]:
        """Set or remove mctl's degraded-fabric label on each node: name -> (done|refused|failed, text)."""
        import asyncio

        return {name: await asyncio.to_thread(self._mark_one, name, mark) for name, mark in marks}

    async def apply(self, decisions: Sequence[Decision], *, deadline: float | None = None) -> list[ActResult]:
        import asyncio

        # Not cut at *deadline*: a patch in flight cannot be recalled, and its result must be
        # recorded. Each request is bounded by the client's timeout (KubeClient.timeout).
        return [await asyncio.to_thread(self._apply_one, d) for d in decisions]


def k8s_adapter(site: "Site", names: Sequence[str], who: str) -> K8sAdapter:
    """Through the kubeconfig of scheduler.k8s (else $KUBECONFIG, ~/.kube/config), as `mctl deploy k8s`."""
    from mctl.sched.k8s import KubeClient
    from mctl.sched.k8s import kubeconfig as kc

    settings = site.scheduler.k8s
    path = (site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path()
    return K8sAdapter(KubeClient(kc.load(path, settings.context)), names, site.health.k8s_taint, who)
