"""Kubernetes remediation: the lab's trays checked over SSH, nodes cordoned through a real HTTP
server that emulates the Kubernetes API (kmock), reached through an ordinary kubeconfig.

The site is the lab's inventory with `scheduler.type: k8s`; the emulator holds one Node per
tray. Faults are cleared and the emulator stopped after each test.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

pytest.importorskip("kmock", reason="kmock (test extra) is not installed")

from tests.integration.test_deploy_k8s import KubeAPI, _kubeconfig  # noqa: E402 - after the importorskip

HEALTH = {"interval": 1, "resume_after_healthy_sweeps": 2, "unreachable_sweeps_before_drain": 2,
          "xid_window": "15s", "imex": "ignore"}
NODES = "v1/nodes"
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def kube(lab):
    api = KubeAPI(compute_domains=False, kai=False)
    for tray in lab.trays:
        api.add_node(tray)
        obj = api.emulator.objects[NODES, None, tray]
        raw = dict(obj.raw)
        raw["spec"] = {"taints": [OTHER_TAINT]}
        raw["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
        api.emulator.objects[NODES, None, tray] = raw
    try:
        yield api
    finally:
        lab.clear_faults()
        if api._thread.is_alive():
            api.stop()


@pytest.fixture
def mctl(lab, kube, tmp_path):
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["scheduler"] = {"type": "k8s", "k8s": {"kubeconfig": str(_kubeconfig(tmp_path / "kubeconfig", kube.url))}}
    doc["health"] = HEALTH
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def run(*args: str) -> subprocess.CompletedProcess:
        return lab.mctl("-i", str(tmp_path / "site"), "--state-dir", str(tmp_path / "state"), *args)

    run.state = tmp_path / "state"
    return run


def fault(lab, tray: str, **request) -> None:
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    control.fault(lab.dir, tray, FaultRequest(**request))


def test_cordon_taint_annotate_then_lift_only_mctls_own(lab, kube, mctl):
    tray, theirs = lab.trays[1], lab.trays[2]
    # an operator's cordon, with no mctl annotation, on another faulty tray
    node = kube.get(NODES, None, theirs)
    node["spec"]["unschedulable"] = True
    kube.emulator.objects[NODES, None, theirs] = node
    fault(lab, tray, nvlink_down="2:11")
    fault(lab, theirs, nvlink_down="0:0")
    dry = mctl("--json", "health", "check", "--remediate", "--dry-run")
    assert dry.returncode == 1 and kube.writes() == []
    proc = mctl("--json", "health", "check", "--remediate")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["scheduler"] == "k8s"
    node = kube.get(NODES, None, tray)
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [OTHER_TAINT, {"key": "mctl.io/unhealthy", "value": "true",
                                                    "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann["mctl.io/cordon-reason"] == "mctl: nvlink gpu2 link11 down"
    assert "nvlink.links: NVLinks not up: gpu2 link11" in ann["mctl.io/cordon-message"]
    assert ann["mctl.io/cordon-by"].startswith("root@") and ann["mctl.io/cordon-timestamp"].endswith("Z")
    # the operator's cordon is left exactly as it was
    assert kube.get(NODES, None, theirs)["spec"] == {"taints": [OTHER_TAINT], "unschedulable": True}
    skips = [d for d in data["decisions"] if d["action"] == "skip"]
    assert [d["host"] for d in skips] == [theirs]
    drains = json.loads(mctl("--json", "health", "drains").stdout)["drains"]
    assert [(d["host"], d["reason"]) for d in drains] == [(tray, "mctl: nvlink gpu2 link11 down")]
    # fault cleared: two healthy sweeps lift mctl's cordon, taint and annotations, nothing else
    lab.clear_faults(tray)
    assert mctl("health", "check", "--remediate").returncode == 1          # the other tray is still faulty
    assert kube.get(NODES, None, tray)["spec"]["unschedulable"] is True
    assert mctl("health", "check", "--remediate").returncode == 1
    node = kube.get(NODES, None, tray)
    assert not node["spec"].get("unschedulable") and node["spec"]["taints"] == [OTHER_TAINT]
    assert not any(k.startswith("mctl.io/cordon") for k in node["metadata"].get("annotations") or {})
    assert kube.get(NODES, None, theirs)["spec"]["unschedulable"] is True
    log = [json.loads(l) for l in (mctl.state / "health" / "actions.jsonl").read_text().splitlines()]
    assert [(e["action"], e["tray"]) for e in log if e["action"] in ("drain", "resume")] == [("drain", tray),
                                                                                           ("resume", tray)]
    assert log[0]["scheduler"].startswith("Kubernetes API http://127.0.0.1:")


def test_api_server_away_queues_the_drain(lab, kube, mctl):
    tray = lab.trays[3]
    fault(lab, tray, gpu_missing=1)
    kube.stop()
    proc = mctl("--json", "health", "check", "--remediate")
    data = json.loads(proc.stdout)
    assert data["scheduler_error"] and "cannot reach the Kubernetes API" in data["scheduler_error"]
    assert [(d["action"], d["host"]) for d in data["decisions"]] == [("queue", tray)]
    state = json.loads((mctl.state / "health" / "state.json").read_text())
    assert state["trays"][tray]["pending"]["action"] == "drain"
