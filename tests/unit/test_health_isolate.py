"""The watch isolating a tray drained for a hardware fault from its NVLink partition (mctl.health.isolate):
which faults count, the circuit breaker, the states a killed or refused isolation leaves, the settings."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from mctl.checks.catalogue import CHECKS
from mctl.health import isolate
from mctl.health.breaker import BreakerState
from mctl.health.record import IsolationState, TrayRecord, TrayVerdict
from mctl.inventory import load_site
from mctl.model.findings import Finding, Severity
from mctl.model.settings import HealthSettings
from mctl.model.site import Partition
from tests.helpers import captured_lab_site

NOW = 1_800_000_000.0
ON = HealthSettings(isolate=True)
T1, T2, T3, T4 = (f"lab-r1-tray0{n}" for n in range(1, 5))


@pytest.fixture()
def site(tmp_path):
    return load_site(captured_lab_site(tmp_path / "site"))


def verdict(host: str, *checks: str, severity: Severity = Severity.CRITICAL) -> TrayVerdict:
    found = tuple(Finding(severity, host, c, f"{c} failed") for c in checks)
    return TrayVerdict(host, "lab-r1", "ok", severity if found else Severity.OK, found)


def drained(host: str, **kw) -> TrayRecord:
    return TrayRecord(host, "lab-r1", "critical", drained=True, reason="mctl: gpu", drained_at=NOW - 5, **kw)


def decide(site, records, verdicts, settings=ON, breaker=BreakerState(), racks=None):
    recs = {r.host: r for r in records}
    return isolate.decide(recs, verdicts, settings, breaker, {"lab-r1": 4}, racks or site.racks, now=NOW)


def test_the_hardware_checks_are_catalogue_checks_and_none_is_a_service_or_reach():
    assert isolate.HARDWARE_CHECKS <= set(CHECKS)
    assert all(CHECKS[c].severity is Severity.CRITICAL for c in isolate.HARDWARE_CHECKS)
    for not_hardware in ("tray.reachable", "imex.daemon", "slurm.slurmd", "host.disk", "fabric.clique",
                         "fabric.state", "gpu.facts", "gpu.driver"):
        assert not_hardware not in isolate.HARDWARE_CHECKS


@pytest.mark.parametrize("check", sorted(isolate.HARDWARE_CHECKS))
def test_a_drained_tray_with_a_hardware_fault_is_isolated_once(site, check):
    out = decide(site, [drained(T2)], [verdict(T2, check)])
    assert [(i.host, i.rack, i.to) for i in out.isolations] == [(T2, "lab-r1", "quarantine")]
    assert out.isolations[0].why == f"{check}: {check} failed"
    assert out.breaker.drains == ((NOW, T2, "lab-r1"),)                     # counted by the breaker
    isolate.mark_sending(out.records, out.isolations[0])                    # the jobs rule let it start
    assert out.records[T2].isolation.state == isolate.SENDING
    again = isolate.decide(out.records, [verdict(T2, check)], ON, out.breaker, {"lab-r1": 4}, site.racks, now=NOW)
    assert again.isolations == []                                            # being sent: never twice


@pytest.mark.parametrize("case", ["off", "not drained", "service", "warn", "unreached"])
def test_no_isolation_without_the_setting_a_drain_of_mctls_or_a_critical_hardware_fault(site, case):
    rec, v, settings = drained(T2), verdict(T2, "gpu.count"), ON
    if case == "off":
        settings = HealthSettings()
    elif case == "not drained":
        rec = replace(rec, drained=False)
    elif case == "service":
        v = verdict(T2, "slurm.slurmd", "imex.daemon", "tray.reachable")
    elif case == "warn":
        v = verdict(T2, "gpu.ecc", severity=Severity.WARN)
    else:
        v = TrayVerdict(T2, "lab-r1", "unreachable", Severity.CRITICAL,
                        (Finding(Severity.CRITICAL, T2, "tray.reachable", "unreachable"),))
    out = decide(site, [rec], [v], settings=settings)
    assert out.isolations == [] and out.breaker.drains == ()


def test_a_tray_alone_in_its_partition_or_in_none_is_not_isolated(site):
    r = site.racks["lab-r1"]
    racks = {"lab-r1": replace(r, partitions=(Partition("p0", "lab-r1", (T1, T3)),
                                              Partition("quarantine-lab-r1-tray02", "lab-r1", (T2,))))}
    assert isolate.isolated_already(racks["lab-r1"], T2) == "alone in partition quarantine-lab-r1-tray02 (isolated)"
    assert isolate.isolated_already(racks["lab-r1"], T4) == "in no partition (NMX-M's default partition)"
    assert isolate.isolated_already(r, T2) is None
    out = decide(site, [drained(T2), drained(T4)], [verdict(T2, "gpu.xid"), verdict(T4, "gpu.xid")], racks=racks)
    assert out.isolations == []


def test_a_tripped_breaker_stops_isolations_and_says_so_once(site):
    tripped = BreakerState(True, NOW - 60, "3 of 4 trays drained")
    out = decide(site, [drained(T2)], [verdict(T2, "nvlink.links")], breaker=tripped)
    assert out.isolations == []
    assert [(e.action, e.host) for e in out.events] == [("isolate-wait", T2)]
    assert "circuit breaker tripped" in out.events[0].why
    assert out.records[T2].isolation.state == isolate.WAITING
    again = isolate.decide(out.records, [verdict(T2, "nvlink.links")], ON, tripped, {"lab-r1": 4}, site.racks,
                           now=NOW + 30)
    assert again.isolations == [] and again.events == []                    # noted once per change


def test_an_isolation_that_would_trip_the_breaker_trips_it(site):
    # two other trays of the rack drained by mctl within the window: a third is over 50 %
    state = BreakerState(drains=((NOW - 10, T1, "lab-r1"), (NOW - 10, T3, "lab-r1")))
    out = decide(site, [drained(T2)], [verdict(T2, "gpu.count")], settings=replace(ON, breaker_max_share=0.5),
                 breaker=state)
    assert out.isolations == [] and out.breaker.tripped
    assert [e.action for e in out.events] == ["isolate-wait", "breaker-trip"]


def test_outcomes_folded_back(site):
    out = decide(site, [drained(T2)], [verdict(T2, "gpu.count")])
    iso = out.isolations[0]
    recs = dict(out.records)
    assert isolate.settle(recs, iso, "waiting", "jobs 42 on lab-r1-tray01") == \
        "isolate waits: jobs 42 on lab-r1-tray01"
    assert recs[T2].isolation.to_dict() == {"state": isolate.WAITING, "note": "isolate waits: jobs 42 on lab-r1-tray01"}
    again = isolate.decide(recs, [verdict(T2, "gpu.count")], ON, BreakerState(), {"lab-r1": 4}, site.racks, now=NOW)
    assert [i.host for i in again.isolations] == [T2]                       # a wait is tried again
    recs = dict(again.records)
    assert isolate.settle(recs, again.isolations[0], "waiting", "jobs 42 on lab-r1-tray01") is None   # same note
    isolate.settle(recs, again.isolations[0], "failed", "change r1 rolled-back: NMX-M refused")
    assert recs[T2].isolation.state == isolate.FAILED
    assert decide(site, [recs[T2]], [verdict(T2, "gpu.count")]).isolations == []   # a failure is not retried
    resumed = replace(recs[T2], drained=False)
    out = isolate.decide({T2: resumed}, [verdict(T2)], ON, BreakerState(), {"lab-r1": 4}, site.racks, now=NOW)
    assert out.records[T2].isolation is None                                # resumed: a new fault starts afresh


def test_done_stays_done_until_the_tray_is_in_a_partition_again(site):
    r = site.racks["lab-r1"]
    isolated = {"lab-r1": replace(r, partitions=(Partition("p0", "lab-r1", (T1,)), r.partitions[1],
                                                 Partition("quarantine-lab-r1-tray02", "lab-r1", (T2,))))}
    done = drained(T2, isolation=IsolationState.from_dict({"state": isolate.DONE, "at": NOW - 100}))
    out = decide(site, [done], [verdict(T2, "gpu.count")], racks=isolated)
    assert out.isolations == [] and out.records[T2].isolation.state == isolate.DONE
    # a person ran 'mctl partition restore': the tray is in p0 again, and a new fault isolates it again
    out = decide(site, [done], [verdict(T2, "gpu.count")])
    assert [i.host for i in out.isolations] == [T2]


def test_a_killed_watch_mid_change_finishes_from_the_inventory_or_points_at_resume(site):
    r = site.racks["lab-r1"]
    sending = drained(T2, isolation=IsolationState.from_dict({"state": isolate.SENDING, "at": NOW - 100}))
    isolated = {"lab-r1": replace(r, partitions=(Partition("p0", "lab-r1", (T1,)), r.partitions[1],
                                                 Partition("quarantine-lab-r1-tray02", "lab-r1", (T2,))))}
    out = decide(site, [sending], [verdict(T2, "gpu.count")], racks=isolated)
    assert out.records[T2].isolation.state == isolate.DONE and out.isolations == []
    out = decide(site, [sending], [verdict(T2, "gpu.count")])
    assert out.isolations == []
    assert [e.why for e in out.events] == [
        "the isolation of lab-r1-tray02 was interrupted; finish it with 'mctl partition apply lab-r1 --resume'"]


def test_metrics_only_once_the_watch_acted(site):
    assert isolate.metric_samples({T1: TrayRecord(T1, "lab-r1")}, "lab") == []
    (name, kind, _help, rows), = isolate.metric_samples(
        {T2: drained(T2, isolation=IsolationState.from_dict({"state": isolate.DONE})), T3: drained(T3, isolation=IsolationState.from_dict({"state": "waiting"}))}, "lab")
    assert (name, kind) == ("mctl_health_isolated", "gauge")
    assert [(r[0]["tray"], r[0]["state"], r[1]) for r in rows] == [(T2, "done", 1), (T3, "waiting", 0)]


# ------------------------------------------------------------------ the setting, checked at load

def _with(tmp_path, isolate_doc, *, drop_nmx=False):
    folder = captured_lab_site(tmp_path / "s", nmx=not drop_nmx)
    doc = yaml.safe_load((folder / "mctl.yml").read_text())
    doc["health"] = {"isolate": isolate_doc}
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def test_the_setting_is_off_by_default_and_read_per_site(tmp_path):
    assert load_site(captured_lab_site(tmp_path / "d")).health.isolate is False
    s = load_site(_with(tmp_path, {"enabled": True, "to": "default"})).health
    assert (s.isolate, s.isolate_to) == (True, "default")
    assert HealthSettings.from_dict(s.to_dict()) == s                       # travels with the rest


@pytest.mark.parametrize("doc, said", [
    ({"enabled": "maybe"}, "health.isolate.enabled"),
    ({"enabled": True, "to": "elsewhere"}, "health.isolate.to"),
    ({"enable": True}, "health.isolate.enable"),
])
def test_a_bad_value_is_refused_at_load_naming_the_key(tmp_path, doc, said):
    from mctl.inventory.loader import validate_inventory

    _site, problems = validate_inventory(_with(tmp_path, doc))
    assert problems and said in " ".join(p.field for p in problems)


def test_enabled_without_nmx_is_a_load_problem_naming_the_rack(tmp_path):
    from mctl.inventory.loader import validate_inventory

    _site, problems = validate_inventory(_with(tmp_path, {"enabled": True}, drop_nmx=True))
    (p,) = problems
    assert p.field == "health.isolate.enabled" and "rack lab-r1 has no nmx: endpoint" in p.message
    assert "nmx" in p.hint
    _site, problems = validate_inventory(_with(tmp_path / "off", {"enabled": False}, drop_nmx=True))
    assert problems == []


def test_bad_value_exits_2_with_a_hint(tmp_path, processes):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mctl", "-i", str(_with(tmp_path, {"enabled": True}, drop_nmx=True)),
                           "inventory", "validate"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    said = proc.stdout + proc.stderr
    assert "health.isolate.enabled" in said and "hint:" in said and "Traceback" not in said


def test_the_engine_follows_the_partitions_an_isolation_or_a_restore_by_hand_writes(tmp_path):
    """After its own isolation, and after a person's restore written to the inventory while it runs, the
    watch judges the cliques against the partitions the inventory has now."""
    import os

    from mctl.health.engine import Engine, _stamp_of
    from mctl.health.site_view import Scope, expectations, partition_plan

    folder = _with(tmp_path, {"enabled": True})
    site = load_site(folder)
    engine = object.__new__(Engine)          # no SSH pool: only the plan-following part is exercised
    engine.site, engine.scope = site, Scope(tuple(site.racks["lab-r1"].compute))
    engine.plans = {n: partition_plan(r) for n, r in site.racks.items()}
    engine.expect = expectations(site, list(engine.scope.hosts))
    engine.isolator, engine._inventory_stamp = object(), _stamp_of(site.file)
    r = site.racks["lab-r1"]
    after = (Partition("p0", "lab-r1", (T1,)), r.partitions[1], Partition("quarantine-lab-r1-tray02", "lab-r1", (T2,)))
    engine.partitions_changed("lab-r1", after)
    assert engine.site.racks["lab-r1"].partitions == after
    assert engine.plans["lab-r1"][T2] == "quarantine-lab-r1-tray02"
    engine._follow_partitions()                                              # the file did not change: kept
    assert engine.plans["lab-r1"][T2] == "quarantine-lab-r1-tray02"
    # a person restores the tray: the inventory has p0 = tray[01-02] again (a later mtime)
    os.utime(site.file, ns=(engine._inventory_stamp + 10**9, engine._inventory_stamp + 10**9))
    engine._follow_partitions()
    assert engine.plans["lab-r1"][T2] == "p0" and engine.site.racks["lab-r1"].partitions == r.partitions
    # an inventory that no longer loads keeps the plan the watch has
    site.file.write_text("racks: [")
    engine._follow_partitions()
    assert engine.plans["lab-r1"][T2] == "p0"


def test_the_rack_lock_is_taken_or_already_ours_someone_elses_is_a_wait(tmp_path, held_lock):
    from mctl.change.service import rack_lock_at as _rack_lock
    from mctl.state.lock import LockBusy, file_lock

    path = tmp_path / "rack-lab-r1.lock"
    with _rack_lock(path, "lab-r1"):
        with pytest.raises(LockBusy):                       # held while the change runs
            with file_lock(path):
                pass
    with file_lock(path, purpose="mctl health check --remediate"):
        with _rack_lock(path, "lab-r1"):                    # this process holds it: go on
            pass
    with held_lock(path, "other"):
        with pytest.raises(LockBusy):
            with _rack_lock(path, "lab-r1"):
                pass


def test_dry_run_shows_the_isolation_it_would_start_and_writes_nothing(site, tmp_path):
    from types import SimpleNamespace

    from mctl.health import store
    from mctl.health.responders.isolation import IsolationResponder

    result = SimpleNamespace(verdicts=[verdict(T2, "nvlink.links"), verdict(T3, "slurm.slurmd")])
    ctx = SimpleNamespace(settings=ON, sizes={"lab-r1": 4}, site=site, state_dir=tmp_path / "state", result=result)
    state = store.HealthState(site.name, {T2: drained(T2), T3: drained(T3)}, BreakerState())
    (d,) = IsolationResponder(site).dry_run(ctx, state)
    assert (d.host, d.action, d.rack) == (T2, "isolate", "lab-r1")
    assert d.why == "nvlink.links: nvlink.links failed (to quarantine)"
    assert not (tmp_path / "state").exists()
    from mctl.health.watch import events_of

    shown = events_of(SimpleNamespace(started=NOW, verdicts=[], decisions=[d], tray_status=lambda h: "critical"),
                      {}, dry_run=True)
    assert [(e.kind, e.host, e.text) for e in shown] == [
        ("isolate", T2, "would isolate (dry run): nvlink.links: nvlink.links failed (to quarantine)")]


@pytest.mark.parametrize("outcome", ["ok", "waiting", "failed-before", "failed"])
def test_the_runner_logs_an_intent_only_for_a_change_that_starts(site, tmp_path, monkeypatch, outcome):
    import asyncio
    from types import SimpleNamespace

    from mctl.health import store
    from mctl.health.actuator import Actuator
    from mctl.health.responders import isolation

    after = (Partition("p0", "lab-r1", (T1,)), site.racks["lab-r1"].partitions[1],
             Partition("quarantine-lab-r1-tray02", "lab-r1", (T2,)))

    def fake(site_, iso, state_dir, on_go=None):
        if outcome == "waiting":
            return "waiting", "the change touches trays with running work: job 7 (root) on lab-r1-tray01", ()
        if outcome == "failed-before":
            return "waiting", "NMX-M did not answer", ()
        on_go()
        saved = store.load_state(state_dir).records[T2].isolation
        assert saved.state == isolate.SENDING                    # saved before the change starts
        return ("ok", "change 1: ...", after) if outcome == "ok" else ("failed", "change 1 rolled-back: x", ())

    monkeypatch.setattr(isolation, "run_isolation", fake)
    changed = []
    result = SimpleNamespace(verdicts=[verdict(T2, "gpu.count")], nodes={})
    ctx = SimpleNamespace(settings=ON, sizes={"lab-r1": 4}, site=site, state_dir=tmp_path / "state", who="t",
                          partitions_changed=lambda rack, parts: changed.append((rack, parts)), result=result,
                          actuator=Actuator(tmp_path / "state", "t"))
    state = store.HealthState(site.name, {T2: drained(T2)}, BreakerState())
    logged = asyncio.run(isolation.IsolationResponder(site).respond(ctx, state))
    actions = [(e.action, e.result) for e in store.read_actions(tmp_path / "state")]
    st = state.records[T2].isolation
    if outcome == "ok":
        assert actions == [("intent", "pending"), ("isolate", "ok")] and st.state == isolate.DONE
        assert changed == [("lab-r1", after)] and state.breaker.drains == ((state.breaker.drains[0][0], T2, "lab-r1"),)
    elif outcome == "failed":
        assert actions == [("intent", "pending"), ("isolate", "failed: change 1 rolled-back: x")]
        assert st.state == isolate.FAILED and changed == []
    else:
        assert actions == [("isolate-wait", "noted")] and st.state == isolate.WAITING
        assert state.breaker.drains == ()                           # a wait is not counted
        again = asyncio.run(isolation.IsolationResponder(site).respond(ctx, state))
        assert again == [] and len(store.read_actions(tmp_path / "state")) == 1    # said once
    assert [e.action for e in logged] == [a for a, _ in actions if a != "intent"]      # as the ladder returns them
