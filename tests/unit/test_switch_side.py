"""The switch side of a rack's NVLink fabric: NMX-M's switch nodes, switches and ports mapped to trays and
partitions (mctl.fabric.switchside), judged per tray (mctl.checks.switch_fabric), read beside the sweep
(mctl.health.nmx_watch), and the lab's switch-side faults (mctl.lab.nmx_faults)."""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from mctl.checks import switch_fabric
from mctl.checks.catalogue import spec
from mctl.errors import UsageError
from mctl.fabric.partitions import map_fabric
from mctl.fabric.switchside import SwitchSideMalformed, map_switch_side, parse_lists
from mctl.health.nmx_watch import NmxWatch
from mctl.lab import nmx_faults
from mctl.model.fabric import (NmxComputeNode, NmxGpu, NmxPartition, NmxPort, NmxSwitch, NmxSwitchNode,
                               SwitchSideView)
from mctl.model.findings import Severity
from tests.helpers import PLANNER_DOMAIN, make_rack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SPEC = yaml.safe_load((FIXTURES / "real" / "nmx-m" / "opennmxm.yaml").read_text())["components"]["schemas"]


def _state(**faults):
    from mctl.lab.nmx_emulator import Config, NMXState

    cfg = Config.from_dict({"username": "u", "password": "p", "domain_uuid": PLANNER_DOMAIN,
                            "trays": [{"name": f"r1-tray{i + 1:02d}", "tray_index": i, "slot_id": i + 1}
                                      for i in range(4)]})
    state = NMXState(cfg)
    if faults:
        state.set_faults(faults)
    return state


def _view(state, pids=None):
    """The rack's SwitchSideView from the emulator's answers; p0 = trays 1-2, p1 = trays 3-4."""
    rack = make_rack(4)
    nodes = [NmxComputeNode.from_nmx(d) for d in state.compute_nodes_json()]
    gpus = [NmxGpu.from_nmx(d) for d in state.gpus_json()]
    fabric = map_fabric(rack, nodes, gpus)
    by_tray = {t: [g.gpu_id for g in fabric.trays[t]] for t in fabric.trays}
    parts = [NmxPartition("a" * 24, 1, "p0", "ID_BASED", (pids or {}).get("p0", "HEALTHY"),
                          tuple(by_tray["r1-tray01"] + by_tray["r1-tray02"])),
             NmxPartition("b" * 24, 2, "p1", "ID_BASED", (pids or {}).get("p1", "HEALTHY"),
                          tuple(by_tray["r1-tray03"] + by_tray["r1-tray04"]))]
    pid_of = {g: p.partition_id for p in parts for g in p.members}
    gpus = [replace(g, partition_id=pid_of[g.id]) for g in gpus]
    sw_nodes, switches, ports = parse_lists("r1", state.switch_nodes_json(), state.switches_json(), state.ports_json())
    return map_switch_side("r1", fabric, gpus, parts, sw_nodes, switches, ports, read_at=1000.0)


def test_a_healthy_switch_side_has_no_faults_and_every_tray_is_judged_ok():
    view = _view(_state())
    assert view.faults == () and view.switch_nodes == 9 and view.ports == 16 * 18
    assert [(p.name, p.trays) for p in view.partitions] == [("p0", ("r1-tray01", "r1-tray02")),
                                                            ("p1", ("r1-tray03", "r1-tray04"))]
    found = switch_fabric.judge_tray("r1-tray01", view)
    assert {f.check: f.severity for f in found} == {"nmx.switch_tray": Severity.OK, "nmx.switch_port": Severity.OK,
                                                    "nmx.tray_partition": Severity.OK}


def test_an_unhealthy_switch_tray_maps_to_every_tray_cabled_to_it_and_their_partitions():
    view = _view(_state(switch_health={"1": "UNHEALTHY"}))
    (fault,) = view.faults
    assert (fault.switch, fault.kind, fault.state) == ("nvsw02", "switch", "UNHEALTHY")
    assert fault.trays == ("r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04")      # every GPU is cabled to it
    assert fault.partitions == ("p0", "p1")
    f = next(f for f in switch_fabric.judge_tray("r1-tray04", view) if f.check == "nmx.switch_tray")
    assert f.severity is Severity.WARN and "nvsw02 UNHEALTHY" in f.message and "p0, p1" in f.message


def test_a_switch_port_down_maps_to_the_one_gpu_at_its_other_end_its_tray_and_partition():
    # tray03 (TrayIndex 2), GPU 1, plane 0 is cabled to port 2*8 + 1*2 + 1 = 19 of each switch tray's ASIC 0
    view = _view(_state(ports_down=[[1, 19]]))
    (fault,) = view.faults
    assert (fault.switch, fault.kind, fault.port, fault.state) == ("nvsw02", "port", 19, "DISABLED/STATE_DOWN")
    assert fault.trays == ("r1-tray03",) and fault.gpus == ("r1-tray03:1",) and fault.partitions == ("p1",)
    bad = {f.check: f for f in switch_fabric.judge_tray("r1-tray03", view)}
    assert bad["nmx.switch_port"].severity is Severity.WARN and "nvsw02 port 19 (r1-tray03:1)" in \
        bad["nmx.switch_port"].message
    ok = {f.check: f.severity for f in switch_fabric.judge_tray("r1-tray01", view)}
    assert ok["nmx.switch_port"] is Severity.OK


def test_a_degraded_partition_warns_on_its_trays_only():
    view = _view(_state(), pids={"p1": "DEGRADED_BANDWIDTH"})
    on3 = {f.check: f for f in switch_fabric.judge_tray("r1-tray03", view)}
    on1 = {f.check: f for f in switch_fabric.judge_tray("r1-tray01", view)}
    assert on3["nmx.tray_partition"].severity is Severity.WARN and "p1 DEGRADED_BANDWIDTH" in \
        on3["nmx.tray_partition"].message
    assert on1["nmx.tray_partition"].severity is Severity.OK


def test_the_switch_end_of_a_link_maps_too():
    """A real NMX-M may list the switch end of a link (a SWITCH_ACCESS port in its ASIC's PortIDList, the GPU's
    DeviceUID as its peer): it maps to the same GPU."""
    state = _state()
    view0 = _view(state)
    gpu = next(g for g in state.gpus_json() if g["Name"] == "r1-tray02/GPU3")
    ports = [p for p in state.ports_json() if p["ID"] not in gpu["PortIDList"][:1]]
    switch_port = dict(ports[0], ID="c" * 24, Type="SWITCH_ACCESS", PortNum=7, PeerPortDeviceUID=gpu["DeviceUID"],
                       PeerPortNum=1, PhysicalState="POLLING", LogicalState="STATE_DOWN")
    switches = state.switches_json()
    switches[4] = dict(switches[4], PortIDList=["c" * 24])          # nvsw03's ASIC 0
    nodes, sws, parsed = parse_lists("r1", state.switch_nodes_json(), switches, ports + [switch_port])
    rack = make_rack(4)
    fabric = map_fabric(rack, [NmxComputeNode.from_nmx(d) for d in state.compute_nodes_json()],
                        [NmxGpu.from_nmx(d) for d in state.gpus_json()])
    view = map_switch_side("r1", fabric, [NmxGpu.from_nmx(d) for d in state.gpus_json()], [], nodes, sws, parsed)
    (fault,) = view.faults
    assert (fault.switch, fault.port, fault.gpus) == ("nvsw03", 7, ("r1-tray02:3",)) and view0.faults == ()


@pytest.mark.parametrize("model, kind, cls", [("SwitchNode", "switch-nodes", NmxSwitchNode),
                                              ("Switch", "switches", NmxSwitch), ("Port", "ports", NmxPort)])
def test_the_specs_own_examples_parse(model, kind, cls):
    example = SPEC[model]["example"]
    parsed = cls.parse(copy.deepcopy(example), 0)
    assert parsed.id == example["ID"]


@pytest.mark.parametrize("kind, index, edit, field", [
    ("switch-nodes", 1, lambda d: d.pop("ID"), "switch-nodes[1].ID is missing"),
    ("switch-nodes", 0, lambda d: d.update(Health="BROKEN"), "switch-nodes[0].Health is 'BROKEN', not one of"),
    ("switch-nodes", 0, lambda d: d.update(SwitchIDList="x"), "switch-nodes[0].SwitchIDList is not a list of IDs"),
    ("switches", 0, lambda d: d.pop("DeviceUID"), "switches[0].DeviceUID is missing"),
    ("ports", 2, lambda d: d.update(PeerPortDeviceUID="12"), "ports[2].PeerPortDeviceUID is '12', not an unsigned"),
    ("ports", 0, lambda d: d.pop("PhysicalState"), "ports[0].PhysicalState is missing"),
])
def test_a_malformed_switch_object_names_the_rack_the_list_the_item_and_the_field(kind, index, edit, field):
    state = _state()
    lists = {"switch-nodes": state.switch_nodes_json(), "switches": state.switches_json(), "ports": state.ports_json()}
    edit(lists[kind][index])
    with pytest.raises(SwitchSideMalformed) as exc:
        parse_lists("lab-r1", lists["switch-nodes"], lists["switches"], lists["ports"])
    assert exc.value.message.startswith("rack lab-r1: NMX-M's ") and field in exc.value.message
    assert exc.value.hint


def test_a_non_object_item_is_named():
    with pytest.raises(SwitchSideMalformed, match=r"rack r9: NMX-M's ports\[0\].\(item\) is str"):
        parse_lists("r9", [], [], ["nope"])


@pytest.mark.parametrize("health, level", [("HEALTHY", Severity.OK), ("NEW", Severity.OK),
                                           ("DEGRADED", Severity.WARN), ("DEGRADED_BANDWIDTH", Severity.WARN),
                                           ("UNHEALTHY", Severity.CRITICAL), ("UNKNOWN", Severity.WARN),
                                           ("SOMETHING_NEW", Severity.WARN), (None, Severity.WARN)])
def test_partition_health_is_judged_once_for_the_audit_and_the_sweep(health, level):
    assert switch_fabric.partition_level(health) is level


def test_every_switch_side_finding_is_a_catalogue_check_at_its_severity():
    view = _view(_state(switch_health={"0": "MISSING_NVLINK"}, ports_down=[[2, 3]]), pids={"p0": "UNHEALTHY"})
    found = switch_fabric.judge_tray("r1-tray01", view) + switch_fabric.judge_view(view, 60)
    assert {f.severity for f in found if f.check != "nmx.switch_side"} == {Severity.WARN}
    for f in found:
        assert spec(f.check).allows(f.severity), f


def test_the_racks_own_finding_says_unread_stale_or_read():
    view = SwitchSideView("r1", read_at=10.0, switch_nodes=9, ports=10, age_s=1.0)
    assert switch_fabric.judge_view(view, 30)[0].severity is Severity.OK
    stale = switch_fabric.judge_view(replace(view, age_s=31.0), 30)[0]
    assert stale.severity is Severity.WARN and "31 s old" in stale.message and stale.host == "r1"
    unread = switch_fabric.judge_view(replace(view, error="NMX-M at x is unavailable"), 30)[0]
    assert unread.severity is Severity.WARN and "not read: NMX-M at x is unavailable" in unread.message
    assert switch_fabric.judge_tray("r1-tray01", SwitchSideView("r1", error="never read")) == []


def test_a_hung_read_never_holds_the_sweep_and_is_not_started_twice():
    release = threading.Event()
    calls = []

    def read(rack):
        calls.append(rack.name)
        release.wait(10)
        return SwitchSideView(rack.name, read_at=now[0])

    now = [100.0]
    watch = NmxWatch(None, [make_rack(2)], deadline=0.2, stale_after_s=5, read=read, clock=lambda: now[0])
    views = asyncio.run(watch.views(0.05))
    assert views["r1"].error == "no answer from NMX-M within 0.2 s" and views["r1"].read_at is None
    views = asyncio.run(watch.views(0.05))
    assert calls == ["r1"]                                   # still in flight: no second read
    release.set()
    watch._racks["r1"].thread.join(5)
    now[0] = 110.0
    snap = watch.snapshot()["r1"]
    assert snap.error is None and snap.age_s == pytest.approx(10.0)
    assert switch_fabric.judge_view(snap, watch.stale_after_s)[0].check == "nmx.switch_side"
    assert "10 s old" in switch_fabric.judge_view(snap, watch.stale_after_s)[0].message


def test_a_failed_read_keeps_the_last_good_lists_and_says_why():
    from mctl.fabric.nmx import NMXUnavailable

    answers = [SwitchSideView("r1", read_at=5.0, switch_nodes=9), NMXUnavailable("NMX-M at u is unavailable")]

    def read(rack):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    watch = NmxWatch(None, [make_rack(2)], deadline=2, stale_after_s=5, read=read, clock=lambda: 6.0)
    assert asyncio.run(watch.views())["r1"].error is None
    v = asyncio.run(watch.views())["r1"]
    assert v.error == "NMX-M at u is unavailable" and v.switch_nodes == 9 and v.age_s == pytest.approx(1.0)


def test_lab_fabric_faults_add_up_and_survive_a_transport_fault():
    doc = nmx_faults.merged({}, "switch-unhealthy", switch=2)
    doc = nmx_faults.merged(doc, "port-down", switch=1, port=5)
    doc = nmx_faults.merged(doc, "partition-degraded", partition="p0", health="degraded_bandwidth")
    doc = nmx_faults.merged(doc, "timeout")
    assert doc == {"hang": True, "switch_health": {"1": "UNHEALTHY"}, "ports_down": [[0, 5]],
                   "partition_health": {"p0": "DEGRADED_BANDWIDTH"}}
    assert nmx_faults.describe(doc) == ["nmx never answers", "switch tray 2 UNHEALTHY", "switch tray 1 port 5 down",
                                        "partition p0 DEGRADED_BANDWIDTH"]
    assert nmx_faults.merged(doc, "slow") == {"delay_s": nmx_faults.SLOW_S, "switch_health": {"1": "UNHEALTHY"},
                                              "ports_down": [[0, 5]], "partition_health": {"p0": "DEGRADED_BANDWIDTH"}}
    assert nmx_faults.merged(doc, "clear") == {}


@pytest.mark.parametrize("kind, kw, text", [("port-down", {"switch": 1}, "--port"),
                                            ("switch-unhealthy", {}, "--switch"),
                                            ("partition-degraded", {}, "--nmx-partition"),
                                            ("partition-degraded", {"partition": "p0", "health": "bad"}, "bad")])
def test_lab_fabric_faults_refuse_what_they_lack(kind, kw, text):
    with pytest.raises(UsageError, match=text):
        nmx_faults.merged({}, kind, **kw)


def test_the_emulator_takes_the_faults_file_keys():
    state = _state(switch_health={"3": "MISSING_NVLINK"}, partition_health={"p9": "DEGRADED"})
    assert [n["Health"] for n in state.switch_nodes_json()][3] == "MISSING_NVLINK"
    assert {s["Health"] for s in state.switches_json()[6:8]} == {"MISSING_NVLINK"}


# ------------------------------------------------------------ the degraded-fabric mark (issue 30.5)

def _node(name="r1-tray01", available="r1", active=None):
    from mctl.sched.slurm.facts import NodeState

    fields = {"AvailableFeatures": available, "ActiveFeatures": active if active is not None else available}
    return NodeState(name, "IDLE", fields=fields)


def test_the_feature_is_read_from_the_real_scontrol_output_and_others_features_are_kept():
    from mctl.sched.slurm import features
    from mctl.sched.slurm.facts import parse_show_nodes
    from tests.helpers import real_text

    [node] = parse_show_nodes(real_text("slurm-on-aws-scontrol-show-node-idle-cloud.txt"))
    assert features.features_of(node) == (["static", "g7e.8xlarge", "dist-ml", "efa", "gpu"],) * 2
    assert not features.marked(node) and features.update(node, False) is None
    step = features.update(node, True)
    assert (step.available, step.active) == ("static,g7e.8xlarge,dist-ml,efa,gpu,nvl_degraded",) * 2
    assert step.seen == "static,g7e.8xlarge,dist-ml,efa,gpu"
    marked = _node(available="a,nvl_degraded,b")
    assert features.marked(marked)
    off = features.update(marked, False)
    assert (off.available, off.active) == ("a,b", "a,b")
    assert features.features_of(_node(available="(null)")) == ([], [])


def test_the_feature_script_is_a_compare_and_set_and_its_result_is_parsed():
    from mctl.sched.slurm import features

    text = features.script([features.update(_node(), True)], limit_s=10)
    assert "sc update NodeName=r1-tray01 AvailableFeatures=r1,nvl_degraded ActiveFeatures=r1,nvl_degraded" in text
    assert "if [ \"$cur\" = r1 ]" in text and "@@mctl-feature r1-tray01 rc=$rc" in text
    out = "  \n@@mctl-feature r1-tray01 rc=0\n  AvailableFeatures are now x, not r1\n@@mctl-feature r1-tray02 rc=3\n" \
          "  slurm_update error: Invalid node name\n@@mctl-feature r1-tray03 rc=1\n"
    got = features.parse(out, ["r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04"])
    assert [got[h].status for h in sorted(got)] == ["done", "refused", "failed", "unreachable"]
    assert "now x" in got["r1-tray02"].text and "Invalid node name" in got["r1-tray03"].text


def test_a_degraded_partition_an_unhealthy_switch_or_a_fabric_flag_marks_the_partitions_trays():
    from mctl.health.fabric_limit import degraded_partitions, wanted_marks
    from mctl.model.findings import Finding

    view = _view(_state(), pids={"p1": "DEGRADED"})
    assert degraded_partitions(view, []) == {"p1": "NMX-M DEGRADED"}
    want, read = wanted_marks({"r1": view}, [])
    assert sorted(want) == ["r1-tray03", "r1-tray04"] and read == {"r1"}
    view = _view(_state(switch_health={"2": "UNHEALTHY"}))
    assert degraded_partitions(view, []) == {"p0": "switch tray nvsw03 UNHEALTHY", "p1": "switch tray nvsw03 UNHEALTHY"}
    flag = Finding(Severity.WARN, "r1-tray02", "fabric.health", "route_unhealthy")
    assert degraded_partitions(_view(_state()), [flag]) == {"p0": "fabric health flag on r1-tray02"}
    assert degraded_partitions(_view(_state(ports_down=[[1, 19]])), []) == {}     # a port alone: warns, no mark
    assert wanted_marks({"r1": replace(view, error="unavailable")}, []) == ({}, set())


def test_the_mark_is_set_at_once_and_cleared_after_n_healthy_sweeps_and_an_unread_rack_changes_nothing(tmp_path):
    from mctl.health import fabric_limit

    limits = fabric_limit.Limits(clear_sweeps=2)
    trays = {"t1": ("r1", False), "t2": ("r1", False)}
    assert limits.decide(trays, {"t1": "partition p0: NMX-M DEGRADED"}, {"r1"}) == \
        [("t1", True, "partition p0: NMX-M DEGRADED")]
    marked = {"t1": ("r1", True), "t2": ("r1", False)}
    assert limits.decide(marked, {}, set()) == []                       # not read: nothing, not even counted
    assert limits.decide(marked, {}, {"r1"}) == [] and limits.healthy == {"t1": 1}
    fabric_limit.save(tmp_path, limits)
    again = fabric_limit.load(tmp_path, 2)                              # the next `health check` goes on counting
    assert again.healthy == {"t1": 1}
    assert again.decide(marked, {"t1": "back"}, {"r1"}) == [] and again.healthy == {}   # degraded again: restart
    assert again.decide(marked, {}, {"r1"}) == [] and again.decide(marked, {}, {"r1"}) == \
        [("t1", False, "its partitions' fabric healthy for 2 sweeps")]
    (tmp_path / "health" / fabric_limit.STATE_NAME).write_text("{not json")
    assert fabric_limit.load(tmp_path, 2).healthy == {}


def _degraded_p0():
    """A 4-tray rack whose partition p0 (trays 1 and 2) NMX-M calls DEGRADED: the rack and NMX-M's view."""
    from mctl.fabric.reconcile import FabricState

    state = _state()
    rack = make_rack(4)
    nodes = [NmxComputeNode.from_nmx(d) for d in state.compute_nodes_json()]
    gpus = [NmxGpu.from_nmx(d) for d in state.gpus_json()]
    fabric = map_fabric(rack, nodes, gpus)
    ids = [g.gpu_id for t in ("r1-tray01", "r1-tray02") for g in fabric.trays[t]]
    parts = (NmxPartition("a" * 24, 1, "p0", "ID_BASED", "DEGRADED", tuple(ids)),)
    return rack, FabricState(tuple(nodes), tuple(gpus), parts, fabric)


def test_the_audit_reports_the_mark_against_nmx_ms_partition_health():
    from mctl.audit.rules import nmx

    rack, view = _degraded_p0()
    slurm = {"r1-tray01": _node("r1-tray01", "r1,nvl_degraded"), "r1-tray02": _node("r1-tray02"),
             "r1-tray03": _node("r1-tray03", "r1,nvl_degraded"), "r1-tray04": _node("r1-tray04")}
    found = {f.host: f for f in nmx.check_fabric_limit(rack, view, slurm)}
    assert "carries nvl_degraded" in found["r1-tray01"].message and found["r1-tray01"].severity is Severity.WARN
    assert "does not carry" in found["r1-tray02"].message and found["r1-tray02"].action
    assert "while NMX-M reports its partition healthy" in found["r1-tray03"].message
    assert found["r1-tray04"].severity is Severity.OK
    for f in found.values():
        assert spec(f.check).allows(f.severity)


def test_the_audit_reports_the_kubernetes_label_against_nmx_ms_partition_health():
    from mctl.audit.rules import nmx
    from mctl.audit.rules.layers import node_labels
    from mctl.sched.k8s.cordon import FABRIC_LABEL

    rack, view = _degraded_p0()
    mark = {FABRIC_LABEL: "true"}
    k8s = [{"metadata": {"name": "r1-tray01", "labels": mark}}, {"metadata": {"name": "r1-tray02", "labels": {}}},
           {"metadata": {"name": "node-3", "labels": {**mark, "kubernetes.io/hostname": "r1-tray03"}}},
           {"metadata": {"name": "r1-tray04"}}, {"metadata": "junk"}]
    labels = node_labels([h.name for h in rack.compute], k8s)
    found = {f.host: f for f in nmx.check_fabric_label(rack, view, labels)}
    assert f"carries the label {FABRIC_LABEL}, pods with the node affinity" in found["r1-tray01"].message
    assert "does not carry the label" in found["r1-tray02"].message and found["r1-tray02"].action
    assert "while NMX-M reports its partition healthy" in found["r1-tray03"].message     # by its hostname label
    assert found["r1-tray04"].severity is Severity.OK and found["r1-tray04"].details["label"] == FABRIC_LABEL
    for f in found.values():
        assert spec(f.check).allows(f.severity)
    only = nmx.check_fabric_label(rack, view, {"r1-tray01": mark})
    assert [f.host for f in only] == ["r1-tray01"]                     # a tray with no Node is not judged


def test_the_kubernetes_label_is_mctls_own_and_carries_the_resource_version():
    from mctl.sched.k8s.cordon import FABRIC_LABEL, K8sAdapter, fabric_label_patch

    node = {"metadata": {"name": "t1", "resourceVersion": "42", "labels": {"nvidia.com/gpu.clique": "x.1"}}}
    assert fabric_label_patch(node, True) == {"metadata": {"labels": {FABRIC_LABEL: "true"}, "resourceVersion": "42"}}
    assert fabric_label_patch(node, False) is None
    marked = {"metadata": {"labels": {FABRIC_LABEL: "true", "other": "kept"}}}
    assert fabric_label_patch(marked, False) == {"metadata": {"labels": {FABRIC_LABEL: None}}}   # null deletes

    class Client:
        def __init__(self):
            self.patches = []

        def get(self, kind, name):
            return node if name == "t1" else None

        def merge_patch(self, kind, name, ns, patch):
            self.patches.append((name, patch))

    client = Client()
    adapter = K8sAdapter.__new__(K8sAdapter)
    adapter.client = client
    got = asyncio.run(adapter.set_fabric_marks([("t1", True), ("t9", True)]))
    assert got == {"t1": ("done", ""), "t9": ("refused", "no such Node")}
    assert client.patches == [("t1", {"metadata": {"labels": {FABRIC_LABEL: "true"}, "resourceVersion": "42"}})]
    assert asyncio.run(adapter.fabric_marks(["t1", "t9"], deadline=5)) == {"t1": False}


def test_a_slow_or_failing_nmx_m_is_not_waited_for_again():
    from mctl.fabric.nmx import NMXUnavailable

    calls = []

    def read(rack):
        calls.append(1)
        if len(calls) == 1:
            raise NMXUnavailable("NMX-M at u is unavailable")
        return SwitchSideView(rack.name, read_at=1.0)

    watch = NmxWatch(None, [make_rack(2)], deadline=5, stale_after_s=5, read=read, clock=lambda: 2.0)
    assert asyncio.run(watch.views())["r1"].error == "NMX-M at u is unavailable"      # the first one: waited
    slot = watch._racks["r1"]
    assert not watch._worth_waiting(slot)                  # after a failure: read beside, not waited for
    slot.thread.join(5)
    asyncio.run(watch.views(0))
    slot.thread.join(5)
    assert watch._worth_waiting(slot) and watch.snapshot()["r1"].error is None


def test_a_read_once_the_probes_are_in_waits_only_the_grace_when_a_view_exists():
    import time as _time

    release = threading.Event()
    answers = [SwitchSideView("r1", read_at=1.0, switch_nodes=1)]

    def read(rack):
        if not answers:
            release.wait(10)
            return SwitchSideView("r1", read_at=3.0, switch_nodes=2)
        return answers.pop()

    watch = NmxWatch(None, [make_rack(2)], deadline=5, stale_after_s=30, read=read, clock=lambda: 4.0)
    first = asyncio.run(watch.collect(watch.begin(), until=_time.monotonic() + 5))
    assert first["r1"].switch_nodes == 1                       # never read before: waited for
    t0 = _time.monotonic()
    second = asyncio.run(watch.collect(watch.begin(), until=_time.monotonic() + 5, grace=0.1))
    assert _time.monotonic() - t0 < 2 and second["r1"].switch_nodes == 1 and second["r1"].age_s == 3.0
    release.set()
    watch._racks["r1"].thread.join(5)
    assert watch.snapshot()["r1"].switch_nodes == 2            # the next sweep judges it
