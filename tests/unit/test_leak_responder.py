"""The leak responder (mctl.health.responders.leak) over a 4-tray rack with 2 switch trays, time injected:
power-offs of any leaking tray after the grace (an operator's drain, DOWN, a tripped breaker), the inventory's
exclusions, switch-tray episodes acted on by the rack's policy, and the rack-wide power-off past the share.
The executors are stand-ins that record what they were asked (the BMC side is tested on the lab)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from mctl.health import store
from mctl.health.actuator import Actuator, Done
from mctl.health.breaker import BreakerState
from mctl.health.record import LeakEpisode, TrayRecord
from mctl.health.responders import leak as leak_mod
from mctl.health.responders.leak import RACK_POWER_OFF, LeakResponder
from mctl.model.findings import Finding, Severity
from mctl.model.settings import HealthSettings

T0 = 1_800_000_000.0
TRAYS = [f"r1-t{i}" for i in range(1, 5)]
SWITCHES = ["r1-sw1", "r1-sw2"]
CRIT = Finding(Severity.CRITICAL, None, "leak.detectors", "leak critical 0_ColdPlate", details={"read": True})


def _site():
    host = lambda n, role: SimpleNamespace(name=n, role=role, rack="r1", bmc="127.0.0.1")    # noqa: E731
    rack = SimpleNamespace(name="r1", compute=tuple(host(t, "compute") for t in TRAYS),
                           switches=tuple(host(s, "switch") for s in SWITCHES))
    return SimpleNamespace(name="s", racks={"r1": rack})


def _run(tmp_path, monkeypatch, state, *, now, settings=None, switch_findings=(), powered=None, racks=None):
    powered = [] if powered is None else powered

    async def power_off(acts):
        powered.extend(a.decision.host for a in acts)
        return [Done("ok", raw=SimpleNamespace(result="ok", sent=True, ok=True, power_state="Off"),
                     fields={"power_state": "Off", "sent": True}) for _ in acts]

    site = _site()
    result = SimpleNamespace(findings=[replace(f, host=h) for h, f in switch_findings],
                             switch_bmcs={s: object() for s in SWITCHES})
    ctx = SimpleNamespace(settings=settings or HealthSettings(), scope=SimpleNamespace(hosts=site.racks["r1"].compute),
                          now=now, site=site, who="t", result=result, decisions=[],
                          actuator=Actuator(tmp_path, "t", {"power-off": power_off}))
    monkeypatch.setattr(leak_mod, "_power_off_rack", lambda ctx, hosts: (
        racks.append([h.name for h in hosts]) if racks is not None else None) or ("ok", ""))
    lines = asyncio.run(LeakResponder().respond(ctx, state))
    return lines, powered, ctx


def _leaking(host: str, *, drained: bool = False, since: float = T0) -> TrayRecord:
    return TrayRecord(host, "r1", drained=drained, leak=LeakEpisode(since, replace(CRIT, host=host)))


def test_any_leaking_tray_is_powered_off_after_the_grace_unless_excluded(tmp_path, monkeypatch):
    state = store.HealthState("s", {"r1-t1": _leaking("r1-t1")},           # drained by an operator: not mctl's
                              BreakerState(tripped=True, tripped_at=T0, reason="x"))
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 599)
    assert powered == [] and lines == []
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 600)
    assert powered == ["r1-t1"] and state.records["r1-t1"].leak.sent          # breaker tripped: still sent
    assert [e.action for e in lines] == ["power-off"]
    again, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 700)
    assert powered == [] and again == []                                     # once per episode
    # excluded by name: never powered off, said once
    state = store.HealthState("s", {"r1-t2": _leaking("r1-t2")}, BreakerState())
    s = replace(HealthSettings(), leak_exclude=("r1-t2",))
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 600, settings=s)
    assert powered == [] and "health.leak.exclude" in lines[0].why
    lines, _, _ = _run(tmp_path, monkeypatch, state, now=T0 + 601, settings=s)
    assert lines == []


def test_a_switch_tray_leak_is_acted_on_by_the_racks_policy(tmp_path, monkeypatch):
    state = store.HealthState("s")
    leak_on = [("r1-sw1", CRIT)]
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0, switch_findings=leak_on)
    assert state.switch_leaks["r1-sw1"].since == T0 and powered == []
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 600, switch_findings=leak_on)
    assert powered == ["r1-sw1"] and state.switch_leaks["r1-sw1"].sent       # power-off: the switch tray alone
    # alert: said once, nothing powered off
    state = store.HealthState("s")
    s = replace(HealthSettings(), leak_switch_tray="alert")
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 700, switch_findings=leak_on, settings=s)
    assert powered == [] and "alert" in lines[0].why
    lines, powered, _ = _run(tmp_path, monkeypatch, state, now=T0 + 1400, switch_findings=leak_on, settings=s)
    assert powered == [] and lines == []
    # rack: the whole rack, once, after the grace
    state, racks = store.HealthState("s"), []
    s = replace(HealthSettings(), leak_switch_tray="rack")
    lines, _, _ = _run(tmp_path, monkeypatch, state, now=T0, switch_findings=leak_on, settings=s, racks=racks)
    assert [e.action for e in lines] == ["rack-leak"] and racks == []
    lines, _, ctx = _run(tmp_path, monkeypatch, state, now=T0 + 600, switch_findings=leak_on, settings=s, racks=racks)
    assert racks == [TRAYS + SWITCHES] and [e.action for e in lines] == [RACK_POWER_OFF]
    assert state.rack_leaks["r1"].sent
    _run(tmp_path, monkeypatch, state, now=T0 + 700, switch_findings=leak_on, settings=s, racks=racks)
    assert len(racks) == 1                                                   # once


def test_leaks_past_the_racks_share_power_the_rack_off_in_order(tmp_path, monkeypatch):
    racks: list = []
    # 1 of 6 trays: the tray alone; 2 of 6 (33 % > 25 %): the rack
    state = store.HealthState("s", {"r1-t1": _leaking("r1-t1", drained=True)})
    _run(tmp_path, monkeypatch, state, now=T0 + 1, racks=racks)
    assert racks == [] and "r1" not in state.rack_leaks
    state.records["r1-t2"] = _leaking("r1-t2", since=T0 + 1)
    lines, _, _ = _run(tmp_path, monkeypatch, state, now=T0 + 2, racks=racks)
    assert state.rack_leaks["r1"].since == T0 + 2 and "2 of 6 trays of rack r1 leak" in lines[0].why
    _run(tmp_path, monkeypatch, state, now=T0 + 602, racks=racks)
    assert racks == [TRAYS + SWITCHES]                   # compute then switch trays: mctl.bmc.power's order
    # rack_power_off false: one line, the rack stays on
    state = store.HealthState("s", {"r1-t1": _leaking("r1-t1"), "r1-t2": _leaking("r1-t2")})
    s = replace(HealthSettings(), leak_rack_power_off=False)
    _run(tmp_path, monkeypatch, state, now=T0, racks=racks, settings=s)
    lines, _, _ = _run(tmp_path, monkeypatch, state, now=T0 + 600, racks=racks, settings=s)
    assert len(racks) == 1 and any("the rack stays on" in (e.why or "") for e in lines)
