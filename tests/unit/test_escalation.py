"""Rack escalation (mctl.health.escalation, its responder, its Slurm script): the rule over a 4-tray rack with
2 switch trays, time injected — a share of trays failing within the window, a switch tray, confirmation,
hysteresis after a lift, unreachable trays only by policy — the one guarded script of the hold, the state's
round trip, and the responder's one act per rack (the Slurm round trip is a stand-in; the lab test runs it)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from mctl.health import escalation, store
from mctl.health.actuator import Actuator
from mctl.health.escalation import RackHold, RackWatch, observe
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.health.responders import escalation as resp_mod
from mctl.health.responders.escalation import EscalationResponder
from mctl.model.findings import Finding, Severity
from mctl.model.settings import EscalationSettings, HealthSettings
from mctl.sched.slurm import holds

T0 = 1_800_000_000.0
TRAYS = [f"r1-t{i}" for i in range(1, 5)]
SWITCHES = ["r1-sw1", "r1-sw2"]
ON = HealthSettings(escalation=EscalationSettings(enabled=True))


def _crit(host: str, check: str = "gpu.xid") -> Finding:
    return Finding(Severity.CRITICAL, host, check, "XID 79 on GPU 0")


def _v(host: str, *, crit: bool = False, reach: str = "ok") -> TrayVerdict:
    if crit:
        return TrayVerdict(host, "r1", reach, Severity.CRITICAL, (_crit(host),))
    return TrayVerdict(host, "r1", reach, Severity.OK if reach == "ok" else Severity.CRITICAL)


def _sweep(watch, failing=(), *, now=T0, settings=ON, records=None, unreachable=(), switch=None, held=False):
    verdicts = {t: _v(t, crit=t in failing, reach="unreachable" if t in unreachable else "ok") for t in TRAYS}
    return observe(watch, TRAYS, SWITCHES, verdicts, records or {}, switch or {}, settings, now=now, held=held)


def test_more_than_the_share_failing_within_the_window_escalates_the_rack():
    watch, trig = _sweep(None, ["r1-t1", "r1-t2"])
    assert trig is None and sorted(watch.failing) == ["r1-t1", "r1-t2"]     # 2 of 4 is not more than 50 %
    watch, trig = _sweep(watch, ["r1-t1", "r1-t2", "r1-t3"], now=T0 + 60)
    assert trig is not None and trig.kind == escalation.SHARE
    assert trig.trays == ("r1-t1", "r1-t2", "r1-t3")
    assert trig.reason == "mctl: rack escalated: 3 of 4 trays failed"
    assert "3 of 4 compute trays failed within 10m (r1-t[1-3])" in trig.cause and "rack_share 50%" in trig.cause
    assert watch.failing["r1-t1"] == T0 and watch.failing["r1-t3"] == T0 + 60      # when each failure began


def test_failures_older_than_the_window_do_not_count_and_a_healthy_tray_leaves():
    watch, _ = _sweep(None, ["r1-t1", "r1-t2"])
    watch, trig = _sweep(watch, ["r1-t1", "r1-t2", "r1-t3"], now=T0 + 601)     # t1, t2 began 601 s ago
    assert trig is None
    watch, trig = _sweep(watch, ["r1-t3"], now=T0 + 602)
    assert sorted(watch.failing) == ["r1-t3"]


def test_confirmation_follows_confirm_sweeps_and_a_drained_tray_counts():
    s = replace(ON, confirm_sweeps=2)
    recs = {t: TrayRecord(t, "r1", bad_streak=0) for t in TRAYS}
    _, trig = _sweep(None, TRAYS, settings=s, records=recs)
    assert trig is None                                       # first critical sweep: not confirmed
    recs = {t: TrayRecord(t, "r1", bad_streak=1) for t in TRAYS[:2]}
    recs["r1-t3"] = TrayRecord("r1-t3", "r1", drained=True, reason="mctl: gpu.xid", drained_at=T0 - 5)
    watch, trig = _sweep(None, TRAYS[:2], settings=s, records=recs)
    assert trig is not None and trig.trays == ("r1-t1", "r1-t2", "r1-t3")
    assert watch.failing["r1-t3"] == T0 - 5


def test_unreachable_trays_never_escalate_unless_the_policy_says():
    _, trig = _sweep(None, unreachable=TRAYS)
    assert trig is None
    s = replace(ON, unreachable_sweeps_before_drain=1,
                escalation=EscalationSettings(enabled=True, count_unreachable=True))
    _, trig = _sweep(None, unreachable=TRAYS, settings=s)
    assert trig is not None and len(trig.trays) == 4


def test_a_switch_tray_critical_for_confirm_sweeps_escalates_the_rack():
    sw = {"r1-sw2": [_crit("r1-sw2", "nmx.switch")]}
    s = replace(ON, confirm_sweeps=2)
    watch, trig = _sweep(None, switch=sw, settings=s)
    assert trig is None and watch.switch["r1-sw2"] == (T0, 1)
    watch, trig = _sweep(watch, switch=sw, settings=s, now=T0 + 60)
    assert trig is not None and trig.kind == escalation.SWITCH and trig.trays == ("r1-sw2",)
    assert trig.reason == "mctl: rack escalated: switch tray r1-sw2 failed" and "nmx.switch" in trig.cause
    warn = {"r1-sw2": [replace(_crit("r1-sw2"), severity=Severity.WARN)]}
    watch, trig = _sweep(watch, switch=warn, settings=s, now=T0 + 120)
    assert trig is None and watch.switch == {}                # a warning resets the streak
    off = replace(ON, escalation=EscalationSettings(enabled=True, on_switch_tray=False))
    _, trig = _sweep(None, switch=sw, settings=off)
    assert trig is None


def test_a_held_rack_never_triggers_twice_and_a_lift_needs_new_failures():
    watch, trig = _sweep(None, TRAYS[:3])
    assert trig is not None
    watch, trig = _sweep(watch, TRAYS, held=True, now=T0 + 10)
    assert trig is None and len(watch.failing) == 4           # still remembered while held
    lifted = replace(watch, lifted_at=T0 + 20)               # what the lift keeps (mctl.health.service)
    watch, trig = _sweep(lifted, TRAYS, now=T0 + 30)
    assert trig is None                                       # the failures the lift saw do not escalate again
    watch, trig = _sweep(watch, ["r1-t2", "r1-t3", "r1-t4"], now=T0 + 40)
    assert trig is None and "r1-t1" not in watch.failing      # t1 recovered ...
    watch, trig = _sweep(watch, TRAYS, now=T0 + 50)
    assert trig is None                                       # ... and failing again is one new failure: 1 of 4
    watch, trig = _sweep(RackWatch({"r1-t1": T0 + 30}, lifted_at=T0 + 20), TRAYS[:3], now=T0 + 40)
    assert trig is not None and trig.trays == ("r1-t1", "r1-t2", "r1-t3")     # new failures do


def test_off_by_default_and_min_trays():
    _, trig = _sweep(None, TRAYS, settings=HealthSettings())
    assert trig is None
    s = replace(ON, escalation=EscalationSettings(enabled=True, min_trays=4))
    _, trig = _sweep(None, TRAYS[:3], settings=s)
    assert trig is None


def test_early_drains_wait_only_where_the_rack_may_escalate():
    assert not escalation.held_back_early(None, "r1-t1", 1, ON)             # a rack's first failure: at once
    assert escalation.held_back_early(None, "r1-t1", 2, ON)                 # two in one batch of answers
    assert escalation.held_back_early(RackWatch({"r1-t2": T0}), "r1-t1", 1, ON)
    assert not escalation.held_back_early(RackWatch({"r1-t2": T0}), "r1-t1", 1, HealthSettings())


def test_the_hold_script_drains_free_trays_and_retags_only_the_watchs_own_drains():
    reason = "mctl: rack escalated: 3 of 4 trays failed"
    text = holds.escalate_script("r1", ["r1-t1", "r1-t2"], reason, {"r1-t2": "mctl: gpu.xid 79"})
    steps = text.split("@@mctl-action")
    first, second = steps[0], steps[1]
    assert "*DRAIN*|*DOWN*|*FAIL*" in first                    # a free tray only (anyone's drain is left alone)
    assert "scontrol update NodeName=r1-t1 State=DRAIN Reason='mctl: rack escalated: 3 of 4 trays failed'" in first
    assert "' Reason=mctl: gpu.xid 79'" in second and "*DRAIN*) ;;" in second   # still the watch's, still drained
    assert "scontrol update NodeName=r1-t2 State=DRAIN" in second
    assert "mctl_budget_r1-t1" in text and "counted beyond it" in text           # counted, never held back
    assert "mctl_budget_tripped Licenses" not in text                            # and never trips the budget


def test_the_release_lifts_only_the_escalations_reason():
    text = holds.release_script(holds.ESCALATION, ["r1-t1"])
    assert "' Reason=mctl: rack escalated'" in text
    assert "State=RESUME Reason='lifted by mctl rack escalation'" in text
    assert "delete reservation=mctl_budget_r1-t1" in text


def test_the_state_round_trips_and_a_damaged_hold_is_named(tmp_path):
    state = store.HealthState("s", escalations={"r1": RackHold("r1", "share", "3 of 4", "mctl: rack escalated: x",
                                                               ("r1-t1",), T0, "ok", ("r1-t1",), {"r1-t4": "down"})},
                              rack_watch={"r1": RackWatch({"r1-t1": T0}, {"r1-sw1": (T0, 2)}, T0 - 1)})
    store.save_state(tmp_path, state)
    back = store.load_state(tmp_path)
    assert back.escalations == state.escalations and back.rack_watch == state.rack_watch
    data = state.to_dict()
    data["escalations"]["r1"]["since"] = "yesterday"
    import json
    store.state_path(tmp_path).write_text(json.dumps(data))
    from mctl.state.files import DamagedState
    with pytest.raises(DamagedState, match="escalations.r1"):
        store.load_state(tmp_path)


# ------------------------------------------------------------------ the responder

def _ctx(tmp_path, verdicts, *, scheduler="slurm", findings=()):
    host = lambda n, role: SimpleNamespace(name=n, role=role, rack="r1")    # noqa: E731
    rack = SimpleNamespace(name="r1", compute=tuple(host(t, "compute") for t in TRAYS),
                           switches=tuple(host(s, "switch") for s in SWITCHES))
    site = SimpleNamespace(name="s", racks={"r1": rack}, scheduler=SimpleNamespace(type=scheduler))
    result = SimpleNamespace(verdicts=verdicts, findings=list(findings), scheduler=scheduler)
    return SimpleNamespace(settings=ON, scope=SimpleNamespace(racks=["r1"]), now=T0, site=site, who="t",
                           result=result, decisions=[], actuator=Actuator(tmp_path, "t", {}),
                           scheduler=SimpleNamespace(kind=scheduler))


def test_the_responder_takes_one_hold_with_one_result_line_and_retags_own_drains(tmp_path, monkeypatch):
    calls = []

    def hold_rack(site, rack, trays, reason, own):
        calls.append((rack, list(trays), reason, dict(own)))
        return [t for t in trays if t != "r1-t4"], {"r1-t4": "left alone: the node is DOWN"}, None

    monkeypatch.setattr(holds, "hold_rack", hold_rack)
    state = store.HealthState("s", {"r1-t1": TrayRecord("r1-t1", "r1", drained=True, reason="mctl: gpu.xid 79",
                                                        drained_at=T0 - 1)})
    verdicts = [_v(t, crit=t != "r1-t4") for t in TRAYS]
    r = EscalationResponder()
    lines = asyncio.run(r.respond(_ctx(tmp_path, verdicts), state))
    assert len(calls) == 1 and calls[0][1] == TRAYS and calls[0][3] == {"r1-t1": "mctl: gpu.xid 79"}
    assert [ln.action for ln in lines] == [escalation.ACTION]            # one line (one event) for the rack
    line = lines[0].to_dict()
    assert line["rack"] == "r1" and line["failed"] == ["r1-t1", "r1-t2", "r1-t3"] and line["trays"] == TRAYS
    assert line["held"] == ["r1-t1", "r1-t2", "r1-t3"] and line["cause"] == "share"
    assert line["result"].startswith("partial: 3 of 4 held")
    assert line["left"] == {"r1-t4": "left alone: the node is DOWN"}
    hold = state.escalations["r1"]
    assert hold.result == "ok" and hold.held == ("r1-t1", "r1-t2", "r1-t3")
    assert state.records["r1-t1"].reason == hold.reason                  # the watch's drain carries the rack's reason
    log = [e.action for e in store.read_actions(tmp_path)]
    assert log == ["intent", escalation.ACTION]
    from mctl.health import events
    (event,) = events.action_events(lines, site="s")            # the one event, to the documented schema
    assert events.schema_problems(event) == [] and event["action"] == escalation.ACTION and event["rack"] == "r1"
    lines = asyncio.run(r.respond(_ctx(tmp_path, verdicts), state))      # held: nothing more
    assert lines == [] and len(calls) == 1


def test_a_hold_the_controller_did_not_take_is_sent_again(tmp_path, monkeypatch):
    answers = [([], {}, "the Slurm controller ctl did not answer"), (TRAYS, {}, None)]
    monkeypatch.setattr(holds, "hold_rack", lambda *a: answers.pop(0))
    state = store.HealthState("s")
    verdicts = [_v(t, crit=True) for t in TRAYS]
    r = EscalationResponder()
    lines = asyncio.run(r.respond(_ctx(tmp_path, verdicts), state))
    assert lines[0].result.startswith("failed: the Slurm controller") and state.escalations["r1"].result != "ok"
    lines = asyncio.run(r.respond(_ctx(tmp_path, verdicts), store.load_state(tmp_path)))
    assert [ln.result for ln in lines] == ["ok"]


def test_a_scheduler_without_rack_holds_says_so_once_and_holds_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(holds, "hold_rack", lambda *a: pytest.fail("no Slurm hold here"))
    state = store.HealthState("s")
    verdicts = [_v(t, crit=True) for t in TRAYS]
    r = EscalationResponder()
    lines = asyncio.run(r.respond(_ctx(tmp_path, verdicts, scheduler="other"), state))
    assert len(lines) == 1 and resp_mod.NO_HOLD in (lines[0].why or "")
    assert asyncio.run(r.respond(_ctx(tmp_path, verdicts, scheduler="other"), state)) == []
    assert state.escalations == {}


# ------------------------------------------------------------------ Kubernetes: mctl's rack taint

class _Nodes:
    """A stand-in for the API server's Nodes: get, and a JSON merge patch of annotations and taints."""

    def __init__(self, names, *, conflicts=0):
        self.nodes = {n: {"metadata": {"name": n, "resourceVersion": "1", "annotations": {"other/x": "y"}},
                          "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}} for n in names}
        self.conflicts = conflicts
        self.patches = []

    def get(self, kind, name):
        return self.nodes.get(name)

    def merge_patch(self, kind, name, namespace, patch):
        from mctl.sched.k8s.client import ApiError

        if self.conflicts:
            self.conflicts -= 1
            raise ApiError(409, "conflict")
        self.patches.append((name, patch))
        node = self.nodes[name]
        for k, v in patch["metadata"]["annotations"].items():
            if v is None:
                node["metadata"]["annotations"].pop(k, None)
            else:
                node["metadata"]["annotations"][k] = v
        node["spec"]["taints"] = patch["spec"]["taints"] or []
        assert "unschedulable" not in patch["spec"]            # the rack hold never cordons


def test_kubernetes_rack_hold_is_mctls_own_taint_and_the_lift_removes_only_it():
    from mctl.sched.k8s.cordon import RACK_REASON, RACK_TAINT_KEY, K8sAdapter

    api = _Nodes(TRAYS, conflicts=1)
    adapter = K8sAdapter(api, TRAYS, "mctl.io/unhealthy=true:NoSchedule", "t")
    held, left, error = adapter.hold_rack("r1", TRAYS[:2], "mctl: rack escalated: 3 of 4 trays failed: why")
    assert (held, left, error) == (TRAYS[:2], {}, None)                  # a 409 is read and patched again
    node = api.nodes["r1-t1"]
    assert {"key": RACK_TAINT_KEY, "value": "r1", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in node["spec"]["taints"]     # others' stay
    assert node["metadata"]["annotations"][RACK_REASON].startswith("mctl: rack escalated")
    assert api.patches[0][1]["metadata"]["resourceVersion"] == "1"
    assert adapter.rack_holds(TRAYS) == TRAYS[:2]
    lifted, left = adapter.lift_rack(TRAYS)
    assert lifted == TRAYS and left == {}
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"] == {"other/x": "y"}
    assert len(api.patches) == 4                                          # trays without the taint: untouched


def test_the_responder_holds_a_kubernetes_rack_through_the_adapter(tmp_path):
    from mctl.sched.k8s.cordon import RACK_TAINT_KEY, K8sAdapter

    api = _Nodes(TRAYS)
    ctx = _ctx(tmp_path, [_v(t, crit=t != "r1-t4") for t in TRAYS], scheduler="k8s")
    ctx.scheduler = K8sAdapter(api, TRAYS, "mctl.io/unhealthy=true:NoSchedule", "t")
    state = store.HealthState("s")
    lines = asyncio.run(EscalationResponder().respond(ctx, state))
    assert [(ln.action, ln.result) for ln in lines] == [(escalation.ACTION, "ok")]
    assert all(any(t["key"] == RACK_TAINT_KEY for t in api.nodes[n]["spec"]["taints"]) for n in TRAYS)
    assert state.escalations["r1"].held == tuple(TRAYS)


def test_the_watch_and_the_check_name_the_same_action():
    from mctl.health.watch import ESCALATION_ACTION

    assert ESCALATION_ACTION == escalation.ACTION


# ------------------------------------------------------------------ the inventory's boundary

def test_health_escalation_from_the_inventory_and_its_refusals_at_file_line(tmp_path):
    from pathlib import Path

    from mctl.inventory import validate_inventory

    repo = Path(__file__).resolve().parents[2]
    base = (repo / "inventories" / "example-gb200" / "mctl.yml").read_text().replace(
        "images_dir: ../../images", f"images_dir: {repo / 'images'}")

    def check(block: str):
        indented = "".join(f"    {b}\n" for b in block.splitlines())
        text = base.replace("health:\n", "health:\n  escalation:\n" + indented, 1)
        folder = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "mctl.yml").write_text(text)
        return text, validate_inventory(folder)

    _, (site, problems) = check("enabled: true\nrack_share: 0.75\nwindow: 30m\nmin_trays: 3\non_switch_tray: false")
    assert problems == []
    e = site.health.escalation
    assert (e.enabled, e.rack_share, e.window_s, e.min_trays, e.on_switch_tray, e.count_unreachable) == \
        (True, 0.75, 1800.0, 3, False, False)
    assert HealthSettings.from_dict(site.health.to_dict()).escalation == e       # travels as JSON and back
    for block, field, words in (("rack_share: 1", "health.escalation.rack_share", "0.99"),
                                ("window: 10 min", "health.escalation.window", "pattern"),
                                ("min_trays: 0", "health.escalation.min_trays", "greater than or equal"),
                                ("rack_shar: 0.5", "health.escalation.rack_shar", "")):
        text, (_, problems) = check(block)
        (p,) = [p for p in problems if p.field == field]
        assert p.line == next(i for i, ln in enumerate(text.split("\n"), 1) if block.split(":")[0] + ":" in ln)
        assert words in p.message
    with pytest.raises(ValueError, match="unknown health.escalation setting 'share'"):
        HealthSettings.from_dict({"escalation": {"share": 0.5}})


def test_a_held_racks_trays_get_no_rung_of_the_ladder_and_no_isolation(monkeypatch):
    from mctl.health import isolate, ladder
    from mctl.health.responders.isolation import IsolationResponder
    from mctl.health.responders.ladder import LadderResponder

    seen = {}
    monkeypatch.setattr(ladder, "decide", lambda records, obs, *a, **k: seen.setdefault("rungs for", obs))
    monkeypatch.setattr(isolate, "decide", lambda records, verdicts, *a, **k: seen.setdefault(
        "isolations for", [v.host for v in verdicts]))
    state = store.HealthState("s", {"r1-t1": TrayRecord("r1-t1", "r1", drained=True, reason="mctl: x"),
                                    "r2-t1": TrayRecord("r2-t1", "r2", drained=True, reason="mctl: x")},
                              escalations={"r1": RackHold("r1", "share", "c", "mctl: rack escalated: x", (), T0)})
    r = LadderResponder.__new__(LadderResponder)
    r._observations = lambda result, records: sorted(records)
    r._burn_status = lambda records: {}
    r.settings = ON
    ctx = SimpleNamespace(result=SimpleNamespace(verdicts=[replace(_v("r1-t1", crit=True)),
                                                           replace(_v("r2-t1", crit=True), rack="r2")]),
                          settings=ON, sizes={}, site=SimpleNamespace(racks={}))
    r._decide(ctx, state, T0)
    IsolationResponder._decide(None, ctx, state, T0)
    assert seen == {"rungs for": ["r2-t1"], "isolations for": ["r2-t1"]}
