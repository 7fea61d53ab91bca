"""Dating XID lines, health settings from the inventory, the state files and the action log."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from mctl.errors import EnvironmentProblem
from mctl.facts.kernel_log import parse_xid_line
from mctl.health import store
from mctl.health.breaker import BreakerState
from mctl.model.tray import Clock, TrayFacts
from mctl.facts.kernel_log import observe_xid
from mctl.health.record import TrayRecord
from mctl.inventory.convert import health_settings
from mctl.inventory.schema import HealthSpec
from mctl.model.findings import Severity
from mctl.model.settings import FABRIC_FLAG_DEFAULTS, HealthSettings, parse_duration
from mctl.model.xid import DEFAULT_DRAIN_XIDS

CLOCK = Clock(epoch=1_764_441_600.0, local=datetime(2025, 11, 29, 18, 40, 0), uptime=3_600.0)
LINE = "{stamp} t01 kernel: [{uptime:12.6f}] NVRM: Xid (PCI:0000:29:00): 79, pid='<unknown>', name=<unknown>, x."


def event(stamp="Nov 29 18:30:00", uptime=3_000.0):
    return parse_xid_line(LINE.format(stamp=stamp, uptime=uptime))


def test_xid_age_comes_from_the_uptime_within_this_boot():
    obs = observe_xid(event(uptime=3_000.0), CLOCK)
    assert (obs.age_s, obs.this_boot) == (600.0, True)


def test_xid_from_an_earlier_boot():
    # uptime counter bigger than now: certainly another boot
    assert observe_xid(event(uptime=90_000.0), CLOCK).this_boot is False
    # uptime plausible, but the wall clock says it was written two days ago, before this boot
    obs = observe_xid(event(stamp="Nov 27 18:30:00", uptime=100.0), CLOCK)
    assert obs.this_boot is False and obs.age_s == pytest.approx(2 * 86400 + 600)


def test_syslog_stamps_without_a_year_and_other_forms():
    jan = Clock(epoch=0.0, local=datetime(2026, 1, 1, 0, 5, 0), uptime=10 * 86400)
    obs = observe_xid(parse_xid_line("Dec 31 23:55:00 t01 kernel: NVRM: Xid (PCI:0000:29:00): 48, pid=1, name=x, y"),
                      jan)
    assert obs.age_s == 600 and obs.this_boot is True
    dmesg = parse_xid_line("[ 3000.000000] NVRM: Xid (PCI:0000:29:00): 48, pid=1, name=x, y")
    assert observe_xid(dmesg, CLOCK).age_s == 600
    assert observe_xid(dmesg, None).age_s is None


def test_iso_stamp_age_uses_the_epoch():
    clock = Clock(epoch=datetime.fromisoformat("2025-11-29T18:40:00+00:00").timestamp(),
                  local=datetime(2025, 11, 29, 18, 40), uptime=86400)
    iso = parse_xid_line("2025-11-29T18:20:00+00:00 t01 kernel: NVRM: Xid (PCI:0000:29:00): 48, pid=1, name=x, y")
    assert observe_xid(iso, clock).age_s == 1200


def test_xids_before_an_acknowledgement_are_dropped():
    facts = TrayFacts("t01", clock=CLOCK, xids=(observe_xid(event(uptime=3_000.0), CLOCK),
                                                       observe_xid(event(uptime=3_500.0), CLOCK)))
    ack = CLOCK.epoch - 300              # between the two events (600 s and 100 s ago)
    assert [x.age_s for x in facts.without_xids_before(ack).xids] == [100.0]
    assert facts.without_xids_before(None) is facts


# --- settings -----------------------------------------------------------------------------------------

def test_inventory_defaults_match_nvidias_fatal_column():
    settings = health_settings(HealthSpec())
    assert settings.drain_xids == DEFAULT_DRAIN_XIDS
    assert settings.flag_severity("route_unhealthy") is Severity.WARN
    assert settings.xid_window_s == 3600 and settings.breaker_window_s == 3600
    assert settings.temp_warn_c == 85


def test_settings_from_the_inventory_and_json_round_trip():
    spec = HealthSpec(interval=5, drain_xids=[79, 63], fabric_flags={"route_unhealthy": "critical"},
                      xid_window="10m", breaker={"max_drained_share": 0.5, "window": "2h", "scope": "site"},
                      imex="required", disk_paths=["/"])
    s = health_settings(spec)
    assert (s.interval, s.drain_xids, s.xid_window_s, s.breaker_window_s, s.breaker_scope, s.imex) == \
        (5.0, frozenset({79, 63}), 600.0, 7200.0, "site", "required")
    assert s.flag_severity("route_unhealthy") is Severity.CRITICAL
    assert s.flag_severity("degraded_bandwidth") is FABRIC_FLAG_DEFAULTS["degraded_bandwidth"]
    again = HealthSettings.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s
    with pytest.raises(ValueError, match="unknown health setting"):
        HealthSettings.from_dict({"intervall": 3})


def test_parse_duration():
    assert [parse_duration(x) for x in ("90s", "5m", "1h", "2d", 7)] == [90, 300, 3600, 172800, 7]
    with pytest.raises(ValueError):
        parse_duration("1 hour")


# --- state and action log -------------------------------------------------------------------------------

def test_state_round_trip(tmp_path):
    state = store.HealthState("lab", {"t1": TrayRecord("t1", "r1", drained=True, reason="mctl: x")},
                              BreakerState(True, 1.0, "why", ((1.0, "t1", "r1"),)))
    store.save_state(tmp_path, state)
    back = store.load_state(tmp_path)
    assert back.records == state.records and back.breaker == state.breaker and back.site == "lab"
    assert store.load_state(tmp_path / "elsewhere").records == {}


def test_damaged_or_foreign_state_is_an_operator_error(tmp_path):
    path = store.state_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(EnvironmentProblem, match="cannot read"):
        store.load_state(tmp_path)
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(EnvironmentProblem, match="schema 99"):
        store.load_state(tmp_path)


def test_action_log_only_appends(tmp_path):
    store.append_actions(tmp_path, [store.action_entry("drain", "t1", "mctl: x", who="me", full="long", at=0.0)])
    size = store.actions_path(tmp_path).stat().st_size
    store.append_actions(tmp_path, [store.action_entry("resume", "t1", "mctl: x", who="me", manual=True),
                                    store.action_entry("skip", "t2", None, who="me", dry_run=True)])
    text = store.actions_path(tmp_path).read_text()
    first = text.encode()[:size].decode()
    assert json.loads(first) == {"time": "1970-01-01T00:00:00.000+00:00", "tray": "t1", "action": "drain",
                                 "reason": "mctl: x", "full_reason": "long", "result": "ok", "who": "me"}
    entries = store.read_actions(tmp_path)
    assert [e.action for e in entries] == ["drain", "resume", "skip"]
    assert entries[1].manual is True and entries[2].dry_run is True
    with open(store.actions_path(tmp_path), "a") as fh:        # a crash mid-line leaves a torn line
        fh.write('{"time": "19')
    assert len(store.read_actions(tmp_path)) == 3
    assert oct(store.actions_path(tmp_path).stat().st_mode & 0o777) == "0o640"


def test_actor_names_user_host_and_command():
    who = store.actor()
    assert f"pid {os.getpid()}" in who and "@" in who and "(mctl" in who


def test_watch_lock_is_exclusive(tmp_path):
    from mctl.state.lock import LockBusy

    with store.watch_lock(tmp_path, "test"):
        with pytest.raises(LockBusy, match="health remediation"):
            with store.watch_lock(tmp_path, "second"):
                pass
    assert Path(tmp_path / "locks" / "health-watch.lock").exists()
