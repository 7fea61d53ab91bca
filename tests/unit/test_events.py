"""Events out (mctl/health/events.py, docs/events.md): building, the schema, the inventory's sinks (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mctl.health import events
from mctl.health.store import action_entry
from mctl.inventory import validate_inventory
from mctl.model.settings import EventSink, HealthSettings, LadderSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "inventories" / "example-gb200" / "mctl.yml").read_text().replace(
    "images_dir: ../../images", f"images_dir: {REPO / 'images'}")


def seen(status="ok", **checks):
    return {"status": status, "findings": {c: {"check": c, "severity": s, "message": f"{c} is {s}"}
                                           for c, s in checks.items()}}


def changes(now, before):
    return events.finding_events(now, before, site="s", who="me", sweep=4, at=1_700_000_000.0,
                                 racks={h: "r1" for h in now})


# ------------------------------------------------------------------ building

def test_a_new_critical_finding_is_one_schema_valid_event_naming_what_was_added():
    (e,) = changes({"t1": seen("critical", **{"gpu.xid": "critical"})}, {"t1": seen()})
    assert events.schema_problems(e) == []
    assert (e["kind"], e["tray"], e["rack"], e["status"], e["status_before"], e["sweep"]) == \
        ("finding", "t1", "r1", "critical", "ok", 4)
    assert e["added"] == [{"check": "gpu.xid", "severity": "critical", "message": "gpu.xid is critical",
                           "severity_before": None}]
    assert e["cleared"] == [] and e["findings"][0]["check"] == "gpu.xid"
    assert e["time"] == "2023-11-14T22:13:20.000+00:00" and len(e["id"]) == 32


def test_unchanged_findings_are_no_event_and_a_severity_change_or_a_clear_is_one():
    same = {"t1": seen("warn", **{"gpu.temp": "warn"})}
    assert changes(same, same) == []
    (worse,) = changes({"t1": seen("critical", **{"gpu.temp": "critical"})}, same)
    assert worse["added"][0]["severity_before"] == "warn" and worse["cleared"] == []
    (clear,) = changes({"t1": seen()}, same)
    assert clear["added"] == [] and clear["cleared"] == [{"check": "gpu.temp", "severity": "warn"}]
    assert clear["findings"] == [] and events.schema_problems(clear) == []


def test_a_tray_seen_for_the_first_time_is_an_event_only_when_it_is_not_healthy():
    assert changes({"t1": seen()}, {}) == []
    (e,) = changes({"t1": seen("warn", **{"disk.usage": "warn"})}, {})
    assert e["status_before"] is None and e["added"][0]["check"] == "disk.usage"


def test_an_action_line_is_an_event_with_the_documented_keys_and_the_rest_in_details():
    line = action_entry("drain", "t1", "mctl: xid 79 gpu0", who="me", full="mctl: xid 79 gpu0 @x", at=1.5,
                        result="ok", why="critical", rack="r1", intent_id="t1@1.500:ab", scheduler="slurm",
                        findings=[{"check": "gpu.xid"}])
    e = events.action_event(line, site="s")
    assert events.schema_problems(e) == []
    assert (e["action"], e["result"], e["ok"], e["reason"], e["why"], e["intent_id"], e["rack"], e["dry_run"]) == \
        ("drain", "ok", True, "mctl: xid 79 gpu0", "critical", "t1@1.500:ab", "r1", False)
    assert e["details"] == {"full_reason": "mctl: xid 79 gpu0 @x", "scheduler": "slurm",
                            "findings": [{"check": "gpu.xid"}]}
    failed = events.action_event(action_entry("gpu-reset", "t1", None, who="me", result="failed: exit 3"), site="s")
    assert failed["ok"] is False and events.severity_of(failed) == 3


def test_intent_lines_are_not_events_their_results_are():
    intent = action_entry("intent", "t1", "r", who="me", result="pending", intent="drain", intent_id="i")
    result = action_entry("drain", "t1", "r", who="me", intent_id="i")
    assert [e["action"] for e in events.action_events([intent, result], site="s")] == ["drain"]


def test_an_event_is_one_line_of_ascii_json():
    e = events.action_event(action_entry("drain", "t1", "mctl: é\nnext", who="me"), site="s")
    text = events.line_of(e)
    assert "\n" not in text and text.isascii() and json.loads(text) == e


@pytest.mark.parametrize("edit, words", [
    (lambda e: e.pop("id"), "missing id"),
    (lambda e: e.update(schema_version=2), "schema_version"),
    (lambda e: e.update(kind="alert"), "kind"),
    (lambda e: e.update(ok="yes"), "booleans"),
    (lambda e: e.update(time="yesterday"), "ISO 8601"),
    (lambda e: e.update(details=[]), "details"),
])
def test_the_schema_check_names_what_is_wrong(edit, words):
    e = events.action_event(action_entry("resume", "t1", "r", who="me"), site="s")
    edit(e)
    assert any(words in p for p in events.schema_problems(e))


def test_filters_take_kinds_and_actions():
    assert EventSink("file").takes("finding", None) and EventSink("file").takes("action", "drain")
    only = EventSink("webhook", kinds=("action",), actions=("drain", "repair"))
    assert only.takes("action", "repair") and not only.takes("action", "resume")
    assert not only.takes("finding", None)


def test_the_syslog_message_is_rfc5424_with_the_event_as_its_message():
    sink = events.SyslogSink(EventSink("syslog", address="unix:/dev/log", facility="local3"), "syslog[0]",
                             Path("/nonexistent/dead"))
    e = events.action_event(action_entry("drain", "t1", "r", who="me", at=0.0, result="failed: x"), site="s")
    head, _, body = sink.message(e).decode().partition(" - ")
    pri, when, host, app, pid, msgid = head.split(" ")
    assert head.startswith(f"<{19 * 8 + 3}>1 1970-01-01T00:00:00.000+00:00 ")
    assert (app, msgid) == ("mctl", "action") and pid.isdigit() and json.loads(body) == e


def test_the_headers_file_is_read_and_a_bad_line_is_named_without_its_value(tmp_path):
    path = tmp_path / "headers"
    path.write_text("# the receiver's token\nAuthorization: Bearer s3cret-token\n\nX-Site: lab\n")
    assert events.read_headers(str(path)) == {"Authorization": "Bearer s3cret-token", "X-Site": "lab"}
    path.write_text("Authorization Bearer s3cret-token\n")
    from mctl.errors import UsageError
    with pytest.raises(UsageError) as err:
        events.read_headers(str(path))
    assert f"{path}:1" in err.value.message and "s3cret" not in err.value.message + (err.value.hint or "")


def test_the_finding_memory_survives_a_restart_and_a_damaged_one_is_a_fresh_start(tmp_path):
    events.save_seen(tmp_path, {"t1": seen("warn", **{"gpu.temp": "warn"})})
    assert events.load_seen(tmp_path)["t1"]["findings"]["gpu.temp"]["severity"] == "warn"
    (tmp_path / "health" / events.MEMORY_FILE).write_text("{torn")
    assert events.load_seen(tmp_path) == {}


# ------------------------------------------------------------------ the repair hook is an exec sink

def test_the_old_repair_hook_is_an_exec_sink_of_repair_events():
    ladder = LadderSettings(repair_hook=("/usr/bin/ticket", "{tray}"), repair_hook_timeout_s=12.0)
    (sink,) = HealthSettings(ladder=ladder).repair_sinks()
    assert (sink.type, sink.command, sink.timeout_s, sink.actions) == \
        ("exec", ("/usr/bin/ticket", "{tray}"), 12.0, ("repair",))
    extra = EventSink("exec", name="pager", command=("/usr/bin/page", "{rack}"), actions=("repair",))
    both = HealthSettings(ladder=ladder, events=(extra, EventSink("file", path="/tmp/x"))).repair_sinks()
    assert [s.name for s in both] == ["pager", "repair_hook"]
    assert HealthSettings().repair_sinks() == ()


def test_the_sinks_travel_in_the_settings_json_and_back():
    s = HealthSettings(events=(EventSink("webhook", url="http://127.0.0.1:9/x", retries=2, kinds=("action",)),))
    assert HealthSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ValueError, match="unknown event sink setting"):
        EventSink.from_dict({"type": "file", "pth": "x"})


# ------------------------------------------------------------------ the inventory

def site_text(sinks: str) -> str:
    return EXAMPLE.replace("health:\n", "health:\n  events:\n" + "".join(f"    {b}\n" for b in sinks.splitlines()), 1)


def check(tmp_path: Path, text: str):
    folder = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "mctl.yml").write_text(text)
    return validate_inventory(folder)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), start=1) if needle in line)


def test_every_sink_type_reaches_the_settings(tmp_path):
    text = site_text("- {type: file, path: /var/log/mctl/events.jsonl}\n"
                     "- {type: syslog, address: 'udp:127.0.0.1:514', facility: local4, kinds: [action]}\n"
                     "- {type: webhook, name: tickets, url: 'https://hooks.example.com/mctl', timeout: 3s,\n"
                     "   retries: 5, backoff: 2s, queue: 50, headers_file: hook.headers, dead_letter: dead.jsonl}\n"
                     "- {type: exec, command: [/usr/bin/ticket, '{tray}'], actions: [repair], timeout: 30s}")
    site, problems = check(tmp_path, text)
    assert problems == [] and site is not None
    file, syslog, hook, exe = site.health.events
    assert file.path == "/var/log/mctl/events.jsonl" and (syslog.address, syslog.facility) == ("udp:127.0.0.1:514",
                                                                                               "local4")
    assert (hook.name, hook.url, hook.timeout_s, hook.retries, hook.backoff_s, hook.queue, hook.headers_file) == \
        ("tickets", "https://hooks.example.com/mctl", 3.0, 5, 2.0, 50, "hook.headers")
    assert (exe.command, exe.timeout_s) == (("/usr/bin/ticket", "{tray}"), 30.0)
    assert [s.name for s in site.health.repair_sinks()] == ["exec[3]"]


@pytest.mark.parametrize("sinks, field, words", [
    ("- {type: webhook, url: 'ftp://example.com/x'}", "health.events[0].url", "not an http:// or https:// URL"),
    ("- {type: webhook, url: 'https://user:pw@example.com/x'}", "health.events[0].url", "credentials"),
    ("- {type: webhook, url: 'https://exa mple.com/x'}", "health.events[0].url", "whitespace"),
    ("- {type: webhook}", "health.events[0].url", "needs url"),
    ("- {type: webhook, url: 'https://example.com', path: /tmp/x}", "health.events[0].path", "has no 'path'"),
    ("- {type: file, url: 'https://example.com'}", "health.events[0].url", "has no 'url'"),
    ("- {type: syslog, address: 'tcp:127.0.0.1:514'}", "health.events[0].address", "neither unix"),
    ("- {type: syslog, address: 'udp:127.0.0.1:0'}", "health.events[0].address", "port 1-65535"),
    ("- {type: syslog, address: 'unix:dev/log'}", "health.events[0].address", "absolute path"),
    ("- {type: syslog, address: 'unix:/dev/log', facility: local9}", "health.events[0].facility", "local7"),
    ("- {type: exec, command: [/bin/true], actions: [drain]}", "health.events[0].actions", "repair"),
    ("- {type: exec, command: [/bin/true]}", "health.events[0].actions", "repair"),
    ("- {type: pager, path: /tmp/x}", "health.events[0].type", "'webhook' or 'exec'"),
    ("- {type: file, path: /tmp/x, kinds: [alert]}", "health.events[0].kinds[0]", "'finding' or 'action'"),
    ("- {type: webhook, url: 'https://example.com', retries: -1}", "health.events[0].retries", "greater than"),
    ("- {type: webhook, url: 'https://example.com', timeout: 5}", "health.events[0].timeout", "valid string"),
    ("- {type: file, path: /tmp/x, queue: 0}", "health.events[0].queue", "greater than"),
    ("- {type: file, path: /tmp/x, colour: red}", "health.events[0].colour", "unknown key"),
    ("- {type: file, path: /tmp/a, name: x}\n- {type: file, path: /tmp/b, name: x}", "health.events[1].name",
     "two event sinks"),
])
def test_a_bad_sink_is_refused_at_its_line(tmp_path, sinks, field, words):
    text = site_text(sinks)
    site, problems = check(tmp_path, text)
    assert site is None
    (p,) = [p for p in problems if p.field == field]
    last = sinks.splitlines()[-1].strip()
    assert p.line == line_of(text, last) and words in p.message, p


# ------------------------------------------------------------------ the engine is the one source

class _Slurm:
    """A scheduler stand-in: every tray idle; a drain is applied at once."""

    kind = "slurm"
    where = "slurmctld on a stand-in"

    def __init__(self, hosts):
        from mctl.model.drain import NodeView

        self.nodes = {h: NodeView(h, state="IDLE") for h in hosts}

    async def read(self, *, deadline=None):
        return dict(self.nodes), {}

    async def apply(self, decisions, *, deadline=None):
        from mctl.model.drain import ActResult, NodeView

        for d in decisions:
            self.nodes[d.host] = NodeView(d.host, drained=True, reason=d.reason, state="IDLE+DRAIN")
        return [ActResult(d, ok=True) for d in decisions]


def _file_bus(engine, path):
    engine.bus = events.Bus.for_settings(engine.site.name, [EventSink("file", path=str(path))], engine.state_dir)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_the_engine_tells_each_finding_change_once_across_sweeps_and_restarts(tmp_path):
    import asyncio

    from tests.helpers import example_engine

    out = tmp_path / "events.jsonl"
    engine, _ = example_engine(tmp_path / "state")
    engine.scheduler = None
    _file_bus(engine, out)
    result = asyncio.run(engine.sweep())        # every tray unreachable (the stand-in pool)
    engine.close()
    first = _lines(out)
    assert sorted(e["tray"] for e in first) == sorted(v.host for v in result.verdicts)
    assert all(e["kind"] == "finding" and e["status"] == "unreachable" and not events.schema_problems(e)
               for e in first)
    assert set(result.event_counts) == {"file[0]"}                  # the sweep's snapshot of the counts
    assert engine.bus.counts() == {"file[0]": {"delivered": len(first), "dropped": 0, "dead_lettered": 0,
                                               "retried": 0}}
    again, _ = example_engine(tmp_path / "state")   # a later `health check`: the same findings, no event
    again.scheduler = None
    _file_bus(again, out)
    asyncio.run(again.sweep())
    again.close()
    assert len(_lines(out)) == len(first)


def test_a_dry_run_sends_no_event(tmp_path):
    from dataclasses import replace

    from mctl.health.engine import Engine
    from tests.helpers import example_engine

    engine, pool = example_engine(tmp_path / "state")
    settings = replace(engine.settings, events=(EventSink("file", path=str(tmp_path / "events.jsonl")),))
    wet = Engine(engine.site, engine.scope, settings, tmp_path / "state", pool)
    dry = Engine(engine.site, engine.scope, settings, tmp_path / "state", pool, dry_run=True)
    assert wet.bus and not dry.bus
    wet.close()


def test_the_actuators_lines_are_events(tmp_path):
    import asyncio
    import time

    from mctl.model.tray import TrayFacts
    from mctl.health.record import TrayVerdict
    from mctl.health.sweep import SweepResult
    from mctl.model.findings import Finding, Severity
    from tests.helpers import example_engine

    out = tmp_path / "events.jsonl"
    engine, _ = example_engine(tmp_path / "state")
    host, rack = engine.scope.hosts[0].name, engine.scope.hosts[0].rack
    engine.remediate, engine.scheduler = True, _Slurm([h.name for h in engine.scope.hosts])
    _file_bus(engine, out)
    xid = Finding(Severity.CRITICAL, host, "gpu.xid", "XID 79 on gpu0: GPU has fallen off the bus", None,
                  {"short": "xid 79 gpu0 (fell off bus)"})
    verdict = TrayVerdict(host, rack, "ok", Severity.CRITICAL, (xid,))
    result = SweepResult(1, time.time(), 0.0, {host: TrayFacts(host)}, [xid], [verdict],
                         dict(engine.scheduler.nodes), "slurm", remediate=True)
    asyncio.run(engine.respond(result))
    engine.close()
    (drain,) = [e for e in _lines(out) if e["kind"] == "action"]
    assert (drain["action"], drain["tray"], drain["rack"], drain["ok"]) == ("drain", host, rack, True)
    assert drain["intent_id"] and not events.schema_problems(drain)
    assert [e.intent_id for e in result.logged if e.action == "drain"] == [drain["intent_id"]]


def test_the_sinks_counts_are_metrics():
    from mctl.health.metrics import render
    from tests.helpers import watch_result

    result = watch_result()
    result.event_counts = {"tickets": {"delivered": 5, "dropped": 1, "dead_lettered": 2, "retried": 3}}
    text = render(result, site="lab")
    assert 'mctl_health_events_total{site="lab",sink="tickets",outcome="dropped"} 1' in text
    assert 'mctl_health_events_total{site="lab",sink="tickets",outcome="delivered"} 5' in text
    assert "mctl_health_events_total" not in render(watch_result(), site="lab")


def test_a_hand_edited_memory_never_breaks_the_sweep(tmp_path):
    import asyncio

    from tests.helpers import example_engine

    (tmp_path / "state" / "health").mkdir(parents=True)
    (tmp_path / "state" / "health" / events.MEMORY_FILE).write_text(json.dumps(
        {"trays": {"rack-a-tray01": {"status": "ok", "findings": {"gpu.xid": "not an object"}}}}))
    engine, _ = example_engine(tmp_path / "state")
    engine.scheduler = None
    _file_bus(engine, tmp_path / "events.jsonl")
    result = asyncio.run(engine.sweep())
    engine.close()
    assert result.verdicts and events.load_seen(tmp_path / "state")["rack-a-tray01"]["status"] == "unreachable"
