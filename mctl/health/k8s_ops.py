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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from mctl.health.policy import NodeView, is_mctl_reason

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


def guard(action: str, view: NodeView) -> tuple[str | None, bool]:
    """(why the action must not happen now, whether it is because the cordon is not mctl's)."""
    if view.down:
        return f"refused: the node is {view.state}", False
    if action == "drain" and view.drained:
        return f"refused: the node is already cordoned ({view.reason})", False
    if action == "resume":
        if not view.drained:
            return "refused: the node is not cordoned", True
        if not view.mctl_drain:
            return f"refused: the cordon is no longer mctl's ({view.reason})", True
    return None, False
