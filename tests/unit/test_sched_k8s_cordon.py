"""Kubernetes remediation in pure terms: Node objects to views, cordon/uncordon merge patches, guards."""

from __future__ import annotations

import pytest

from mctl.sched.k8s.cordon import (AT, BY, MESSAGE, REASON, cordon_patch, guard, node_view, parse_taint,
                                   uncordon_patch)

TAINT = parse_taint("mctl.io/unhealthy=true:NoSchedule")


def node(name="t1", *, cordoned=False, ready="True", annotations=None, taints=None, rv="42"):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": rv, "annotations": annotations or {}},
            "spec": {"unschedulable": cordoned, "taints": taints or []},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": ready}]}}


def test_views():
    assert node_view("t1", None).known is False
    v = node_view("t1", node())
    assert (v.drained, v.down, v.reason, v.state) == (False, False, None, "Ready")
    v = node_view("t1", node(cordoned=True))
    assert v.drained and not v.mctl_drain and v.reason == "cordoned without mctl's annotation"
    v = node_view("t1", node(cordoned=True, ready="Unknown", annotations={REASON: "mctl: xid 79 gpu0 (fell off bus)"}))
    assert v.mctl_drain and v.down and v.state == "NotReady,SchedulingDisabled"
    no_status = node()
    del no_status["status"]
    assert node_view("t1", no_status).down is False


def test_cordon_patch_keeps_other_taints_and_carries_the_resource_version():
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    patch = cordon_patch(node(taints=[other, {"key": TAINT.key, "effect": "NoExecute"}]), "mctl: x", "long text",
                         "root@vm pid 1", TAINT, 0.0)
    assert patch["spec"] == {"unschedulable": True, "taints": [other, {"key": "mctl.io/unhealthy", "effect":
                                                                       "NoSchedule", "value": "true"}]}
    assert patch["metadata"] == {"resourceVersion": "42", "annotations": {
        BY: "root@vm pid 1", REASON: "mctl: x", MESSAGE: "long text", AT: "1970-01-01T00:00:00Z"}}
    assert len(cordon_patch(node(), "mctl: x", "y" * 5000, "me", TAINT, 0.0)["metadata"]["annotations"][MESSAGE]) \
        == 2000


def test_uncordon_patch_lifts_only_mctls_own():
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    patch = uncordon_patch(node(cordoned=True, taints=[other, TAINT.to_k8s()]), TAINT)
    assert patch["spec"] == {"unschedulable": None, "taints": [other]}
    assert patch["metadata"]["annotations"] == {BY: None, REASON: None, MESSAGE: None, AT: None}
    assert uncordon_patch(node(cordoned=True, taints=[TAINT.to_k8s()]), TAINT)["spec"]["taints"] is None


def test_guards():
    mine = node_view("t1", node(cordoned=True, annotations={REASON: "mctl: x"}))
    theirs = node_view("t1", node(cordoned=True))
    free = node_view("t1", node())
    down = node_view("t1", node(ready="False"))
    assert guard("drain", free) == (None, False)
    assert guard("drain", theirs)[0].startswith("refused: the node is already cordoned")
    assert guard("drain", down)[0] == "refused: the node is NotReady"
    assert guard("resume", mine) == (None, False)
    assert guard("resume", theirs) == ("refused: the cordon is no longer mctl's (cordoned without mctl's "
                                       "annotation)", True)
    assert guard("resume", free)[1] is True


def test_taints():
    assert parse_taint("a.b/c:NoExecute").to_k8s() == {"key": "a.b/c", "effect": "NoExecute"}
    with pytest.raises(ValueError):
        parse_taint("nope")
