"""Kubernetes remediation: the lab's trays checked over SSH, nodes cordoned through the real
kube-apiserver (tests/kube_apiserver.py), reached through an ordinary kubeconfig (CA file,
tokenFile, mctl's RBAC-limited user).

The site is the lab's inventory with `scheduler.type: k8s`; the server holds one GB200-like
Node per tray, each carrying another controller's taint. Faults are cleared after each test.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
import yaml

from tests.kube_apiserver import gb200_node

HEALTH = {"interval": 1, "resume_after_healthy_sweeps": 2, "unreachable_sweeps_before_drain": 2,
          "xid_window": "15s", "imex": "ignore"}
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def kube(lab, kube_apiserver):
    kube_apiserver.reset([gb200_node(tray, None, taints=[OTHER_TAINT]) for tray in lab.trays])
    try:
        yield kube_apiserver
    finally:
        lab.clear_faults()


@pytest.fixture
def mctl(lab, kube, tmp_path):
    doc = yaml.safe_load(lab.inventory.read_text())
    config = kube.kubeconfig(tmp_path / "kube" / "config", ca="file", token="file")
    doc["scheduler"] = {"type": "k8s", "k8s": {"kubeconfig": str(config)}}
    doc["health"] = HEALTH
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def run(*args: str) -> subprocess.CompletedProcess:
        return lab.mctl("-i", str(tmp_path / "site"), "--state-dir", str(tmp_path / "state"), *args)

    run.state = tmp_path / "state"
    run.kubeconfig = config
    return run


def fault(lab, tray: str, **request) -> None:
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    control.fault(lab.dir, tray, FaultRequest(**request))


def test_cordon_taint_annotate_then_lift_only_mctls_own(lab, kube, mctl, tmp_path):
    # no NMX-M here: this test counts mctl's writes of the cordon and taint; the switch side's degraded-fabric
    # label (D107) is another write on every tray of a degraded partition (tests/integration/test_switch_side.py)
    doc = yaml.safe_load((tmp_path / "site" / "mctl.yml").read_text())
    for rack in doc["racks"].values():
        rack.pop("nmx", None)
    (tmp_path / "site" / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    tray, theirs = lab.trays[1], lab.trays[2]
    # an operator's cordon, with no mctl annotation, on another faulty tray
    kube.patch_node(theirs, {"spec": {"unschedulable": True}})
    kube.mark()
    fault(lab, tray, nvlink_down="2:11")
    fault(lab, theirs, nvlink_down="0:0")
    dry = mctl("--json", "health", "check", "--remediate", "--dry-run")
    assert dry.returncode == 1 and kube.writes() == []
    proc = mctl("--json", "health", "check", "--remediate")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["scheduler"] == "k8s"
    node = kube.node(tray)
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [OTHER_TAINT, {"key": "mctl.io/unhealthy", "value": "true",
                                                    "effect": "NoSchedule"}]
    ann = node["metadata"]["annotations"]
    assert ann["mctl.io/cordon-reason"] == "mctl: nvlink gpu2 link11 down"
    assert "nvlink.links: NVLinks not up: gpu2 link11" in ann["mctl.io/cordon-message"]
    assert ann["mctl.io/cordon-by"].startswith("root@") and ann["mctl.io/cordon-timestamp"].endswith("Z")
    # the operator's cordon is left exactly as it was
    assert kube.node(theirs)["spec"] == {"taints": [OTHER_TAINT], "unschedulable": True}
    skips = [d for d in data["decisions"] if d["action"] == "skip"]
    assert [d["host"] for d in skips] == [theirs]
    drains = json.loads(mctl("--json", "health", "drains").stdout)["drains"]
    assert [(d["host"], d["reason"]) for d in drains] == [(tray, "mctl: nvlink gpu2 link11 down")]
    # fault cleared: two healthy sweeps lift mctl's cordon, taint and annotations, nothing else
    lab.clear_faults(tray)
    assert mctl("health", "check", "--remediate").returncode == 1          # the other tray is still faulty
    assert kube.node(tray)["spec"]["unschedulable"] is True
    assert mctl("health", "check", "--remediate").returncode == 1
    node = kube.node(tray)
    assert not node["spec"].get("unschedulable") and node["spec"]["taints"] == [OTHER_TAINT]
    assert not any(k.startswith("mctl.io/cordon") for k in node["metadata"].get("annotations") or {})
    assert kube.node(theirs)["spec"]["unschedulable"] is True
    log = [json.loads(l) for l in (mctl.state / "health" / "actions.jsonl").read_text().splitlines()]
    assert [(e["action"], e["tray"]) for e in log if e["action"] in ("drain", "resume")] == [("drain", tray),
                                                                                           ("resume", tray)]
    assert log[0]["scheduler"] == f"Kubernetes API {kube.url}"
    # one patch per drain and resume, nothing else written
    assert kube.writes() == [f"patch /api/v1/nodes/{tray} 200"] * 2


def test_api_server_away_queues_the_drain(lab, kube, mctl):
    tray = lab.trays[3]
    fault(lab, tray, gpu_missing=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # closed again: nothing answers there
    kube.kubeconfig(mctl.kubeconfig, ca="file", token="file", server=f"https://127.0.0.1:{port}")
    proc = mctl("--json", "health", "check", "--remediate")
    data = json.loads(proc.stdout)
    assert data["scheduler_error"] and "cannot reach the Kubernetes API" in data["scheduler_error"]
    assert [(d["action"], d["host"]) for d in data["decisions"]] == [("queue", tray)]
    state = json.loads((mctl.state / "health" / "state.json").read_text())
    assert state["trays"][tray]["pending"]["action"] == "drain"


def test_audit_names_the_labels_layer_when_a_nodes_clique_label_is_behind(lab, kube, mctl):
    """The audit reads each tray's Node: labels that group the trays as the plan does are in step; one
    relabelled by hand is the `labels` layer behind, named in the partition's one finding; put back, in step."""
    clique = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    kube.reset([gb200_node(tray, f"{clique}.1") for tray in lab.trays])    # the lab plans the rack as one partition

    def layer_findings() -> list[dict]:
        proc = mctl("audit", "--json", "--no-health", "--no-history")
        assert proc.returncode in (0, 1, 3), proc.stderr
        report = json.loads(proc.stdout)
        assert "layers" in report["coverage"], report["coverage"]           # compared (an OK is not listed)
        assert not [g for g in report["incomplete"] if g["family"] == "layers"], report["incomplete"]
        return [f for f in report["findings"] if f["family"] == "layers"]

    assert not [f for f in layer_findings() if "labels" in f["details"]["behind"]]
    tray = lab.trays[1]
    kube.patch_node(tray, {"metadata": {"labels": {"nvidia.com/gpu.clique": f"{clique}.2"}}})
    try:
        (found,) = layer_findings()
        assert found["details"]["behind"] == ["labels"] and found["severity"] == "critical", found
        assert "Kubernetes clique labels behind (" in found["message"]
        assert f"{tray} labelled alike with {tray})" in found["message"]
    finally:
        kube.patch_node(tray, {"metadata": {"labels": {"nvidia.com/gpu.clique": f"{clique}.1"}}})
    assert not [f for f in layer_findings() if "labels" in f["details"]["behind"]]


def test_host_imex_beside_the_dra_driver_is_refused_by_deploy_and_named_by_the_audit(lab, kube, mctl):
    """Issue 31.4: on a Kubernetes site, whose IMEX the DRA driver's ComputeDomains manage, a tray with the host
    nvidia-imex unit enabled (the lab's trays carry the unit; provisioning for Slurm enables and starts it) is
    named by `deploy k8s` with the fix, and nothing is written; the audit has one critical imex.host_service
    finding per such tray; a tray stopped and disabled passes both. Each tray's unit is put back as found."""
    from tests.helpers import wait_for

    unit = "nvidia-imex.service"
    trays = lab.trays

    def state(t: str) -> tuple[bool, bool]:
        said = lab.run(t, f"systemctl is-enabled {unit}; systemctl is-active {unit}", check=False).stdout.split()
        return (bool(said) and said[0] == "enabled", len(said) > 1 and said[1] == "active")

    found_as = {t: state(t) for t in trays}
    for t in trays:
        lab.run(t, f"systemctl enable {unit}")
    try:
        kube.mark()
        refused = mctl("deploy", "k8s")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "run the host IMEX service where the DRA driver's ComputeDomains manage IMEX" in refused.stderr
        assert all(f"{t}: host nvidia-imex service is " in refused.stderr for t in trays[:6]), refused.stderr
        assert "enabled at boot" in refused.stderr and "nothing was applied" in refused.stderr
        assert "systemctl disable --now nvidia-imex.service" in refused.stderr
        assert not kube.writes(), kube.writes()

        def host_service() -> dict[str, dict]:
            proc = mctl("audit", "--json", "--no-health", "--no-history")
            assert proc.returncode in (0, 1, 3), proc.stderr
            return {f["host"]: f for f in json.loads(proc.stdout)["findings"] if f["check"] == "imex.host_service"}

        found = host_service()
        assert sorted(found) == sorted(trays) and all(f["severity"] == "critical" for f in found.values()), found
        tray = trays[0]
        lab.run(tray, f"systemctl stop {unit}; systemctl disable {unit}")
        found = host_service()
        assert sorted(found) == sorted(trays[1:]), found           # an OK finding is not listed in the report
        again = mctl("--json", "deploy", "k8s", "--dry-run")
        assert again.returncode == 2 and f"{tray}:" not in again.stderr and f"{trays[1]}:" in again.stderr
    finally:
        for t, (enabled, active) in found_as.items():
            lab.run(t, f"systemctl {'enable' if enabled else 'disable'} {unit}", check=False)
            if active and not state(t)[1]:
                lab.run(t, f"systemctl start {unit}", check=False)
                wait_for(f"IMEX READY again on {t}",
                         lambda t=t: "READY" in lab.run(t, "nvidia-imex-ctl -q", check=False).stdout, timeout=120)


def test_a_degraded_partition_gets_the_nodes_label_and_loses_it_when_healthy(lab, kube, mctl, tmp_path):
    """Issue 30.5 on Kubernetes, through the real kube-apiserver: NMX-M says the partition is DEGRADED, so every
    node of its trays gets mctl's label `mctl.io/nvlink-degraded=true` (no other label or taint touched, no cordon:
    the trays themselves are healthy); two healthy sweeps later it is gone, and only mctl's label patches were
    written."""
    from ClusterShell.NodeSet import NodeSet

    from mctl.lab import nmx_faults
    from tests.helpers import lab_nmx

    site = tmp_path / "site" / "mctl.yml"
    doc = yaml.safe_load(site.read_text())
    emulator = lab_nmx(lab, doc, tmp_path)
    site.write_text(yaml.safe_dump(doc, sort_keys=False))

    def set_fault(kind, **options):
        if emulator is not None:
            emulator.state.set_faults(nmx_faults.merged(emulator.state.faults, kind, **options), replace=True)
            return
        args = [a for k, v in options.items() for a in (f"--nmx-{k}", str(v))]
        res = lab.mctl("lab", "fault", "nmx", lab.rack, kind, *args, "--dir", str(lab.dir))
        assert res.returncode == 0, res.stderr

    label = "mctl.io/nvlink-degraded"

    def audited() -> dict[str, str]:
        """The audit's nmx.fabric_limit warnings per tray: the label against NMX-M's partition health (issue 30.5;
        an OK is not listed, the family's coverage says it was compared)."""
        proc = mctl("audit", "--json", "--no-health", "--no-history")
        assert proc.returncode in (0, 1, 3), proc.stderr
        report = json.loads(proc.stdout)
        assert not [g for g in report["incomplete"] if g["family"] == "nmx"], report["incomplete"]
        covered = set(NodeSet((report["coverage"].get("nmx") or {}).get("hosts", "")))
        assert set(lab.trays) <= covered, report["coverage"]                                  # each tray compared
        found = [f for f in report["findings"] if f["check"] == "nmx.fabric_limit"]
        assert all(f["details"]["label"] == label for f in found), found     # no Slurm here: the label only
        return {f["host"]: f["message"] for f in found}

    before = {t: dict(kube.node(t)["metadata"].get("labels") or {}) for t in lab.trays}
    assert not any(label in ls for ls in before.values())
    kube.mark()
    try:
        set_fault("partition-degraded", partition="Default Partition")
        unmarked = audited()
        assert sorted(unmarked) == sorted(lab.trays), unmarked
        assert all(m.endswith(f"but the tray does not carry the label {label}") for m in unmarked.values())
        proc = mctl("--json", "health", "check", "--remediate", "--timeout", "30")
        data = json.loads(proc.stdout)
        marks = sorted(a["tray"] for a in data["actions"] if a["action"] == "fabric-mark")
        assert marks == sorted(lab.trays), (data["actions"], proc.stderr)
        for t in lab.trays:
            node = kube.node(t)
            assert node["metadata"]["labels"] == {**before[t], label: "true"}
            assert node["spec"]["taints"] == [OTHER_TAINT] and not node["spec"].get("unschedulable")
        marked = audited()
        assert sorted(marked) == sorted(lab.trays), marked
        assert all(f"is DEGRADED on NMX-M: the tray carries the label {label}" in m for m in marked.values())
        set_fault("clear")
        first = json.loads(mctl("--json", "health", "check", "--remediate", "--timeout", "30").stdout)
        assert not [a for a in first["actions"] if a["action"] == "fabric-clear"]      # one healthy sweep of two
        assert all(label in kube.node(t)["metadata"]["labels"] for t in lab.trays)
        stale = audited()
        assert sorted(stale) == sorted(lab.trays), stale
        assert all("the label mctl.io/nvlink-degraded while NMX-M reports its partition healthy" in m
                   for m in stale.values())
        second = json.loads(mctl("--json", "health", "check", "--remediate", "--timeout", "30").stdout)
        clears = sorted(a["tray"] for a in second["actions"] if a["action"] == "fabric-clear")
        assert clears == sorted(lab.trays), second["actions"]
        assert {t: kube.node(t)["metadata"].get("labels") or {} for t in lab.trays} == before
        assert sorted(kube.writes()) == sorted([f"patch /api/v1/nodes/{t} 200" for t in lab.trays] * 2)
        assert audited() == {}
    finally:
        set_fault("clear")
        if emulator is not None:
            emulator.stop()


def test_most_of_a_rack_failing_takes_one_kubernetes_rack_hold_lifted_by_one_command(lab, kube, mctl, tmp_path):
    """Issue 30.6 on Kubernetes, through the real kube-apiserver: 3 of 4 trays failing at once give one rack hold,
    mctl's taint `mctl.io/rack-escalated=<rack>:NoSchedule` with the cause on every node of the rack (no cordon
    of the others, the other controller's taint kept); `mctl health escalation lift` removes only that."""
    site = tmp_path / "site" / "mctl.yml"
    doc = yaml.safe_load(site.read_text())
    for rack in doc["racks"].values():
        rack.pop("nmx", None)            # the switch side's degraded-fabric label is another test's
    doc["health"] = {**HEALTH, "escalation": {"enabled": True, "rack_share": 0.5, "window": "10m"}}
    site.write_text(yaml.safe_dump(doc, sort_keys=False))
    taint = {"key": "mctl.io/rack-escalated", "value": lab.rack, "effect": "NoSchedule"}
    failing = lab.trays[:3]
    for i, tray in enumerate(failing):
        fault(lab, tray, nvlink_down=f"{i}:1")
    proc = mctl("--json", "health", "check", "--remediate")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    log = [json.loads(x) for x in (mctl.state / "health" / "actions.jsonl").read_text().splitlines()]
    (hold,) = [e for e in log if e["action"] == "rack-escalation"]
    assert hold["result"] == "ok" and hold["failed"] == sorted(failing) and hold["held"] == lab.trays, hold
    drained = [e["tray"] for e in log if e["action"] == "drain"]
    assert len(drained) <= 1              # at most the first tray to answer, on its own, before the hold
    for t in lab.trays:
        node = kube.node(t)
        assert node["spec"]["taints"][0] == OTHER_TAINT and taint in node["spec"]["taints"], node["spec"]
        assert "3 of 4 compute trays failed" in node["metadata"]["annotations"]["mctl.io/rack-escalated-reason"]
        assert bool(node["spec"].get("unschedulable")) == (t in drained)      # the hold is no cordon
    status = json.loads(mctl("--json", "health", "escalation", "status").stdout)
    assert list(status["held"]) == [lab.rack]
    lab.clear_faults()
    dry = mctl("--json", "health", "escalation", "lift", lab.rack, "--dry-run")
    assert dry.returncode == 0 and all(taint in kube.node(t)["spec"]["taints"] for t in lab.trays)
    lift = mctl("--json", "health", "escalation", "lift", lab.rack)
    assert lift.returncode == 0, lift.stdout + lift.stderr
    for t in lab.trays:
        node = kube.node(t)
        assert taint not in node["spec"]["taints"] and OTHER_TAINT in node["spec"]["taints"], node["spec"]
        assert "mctl.io/rack-escalated-reason" not in (node["metadata"].get("annotations") or {})
    assert json.loads(mctl("--json", "health", "escalation", "status").stdout)["held"] == {}
