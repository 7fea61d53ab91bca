"""How the Kubernetes client words the API server's refusals (pure: Status bodies as 1.20 sends them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mctl.sched.k8s.client import ApiError, KubeClient
from mctl.sched.k8s.kubeconfig import Connection

STATUS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s-status"      # captured from kube-apiserver 1.20.2


def status(name: str) -> dict:
    return json.loads((STATUS / f"{name}.json").read_text())


def client() -> KubeClient:
    return KubeClient(Connection(server="http://127.0.0.1:1", context="test"))


def test_422_names_the_field_and_the_reason():
    with pytest.raises(ApiError) as err:
        client()._check(422, status("namespace-invalid-422"), "create Namespace GPU_Work")
    assert err.value.status == 422
    assert err.value.message.startswith("create Namespace GPU_Work failed (422 Invalid): metadata.name: Invalid value")
    assert "rejected the object as invalid" in err.value.hint


def test_409_and_415_get_their_hint():
    with pytest.raises(ApiError) as err:
        client()._check(409, status("node-stale-resourceversion-409"), "patch Node n409")
    assert err.value.message.startswith("patch Node n409 failed (409 Conflict): Operation cannot be fulfilled")
    assert "resourceVersion" in err.value.hint
    with pytest.raises(ApiError) as err:
        client()._check(415, status("computedomain-strategic-patch-415"), "patch ComputeDomain x")
    assert "(415 UnsupportedMediaType)" in err.value.message and "patch type" in err.value.hint


def test_long_messages_are_cut():
    with pytest.raises(ApiError) as err:
        client()._check(500, {"message": "x" * 900}, "GET /x")
    assert len(err.value.message) < 700 and err.value.message.endswith("...")


def test_non_json_body():
    with pytest.raises(ApiError, match=r"failed \(500\): boom"):
        client()._check(500, "boom", "GET /x")
