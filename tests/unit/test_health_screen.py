"""The watch's outputs: the live screen at several terminal sizes, plain lines, events, Prometheus metrics."""

from __future__ import annotations

import time
import urllib.request

from rich.console import Console

from mctl.health.metrics import MetricsServer, render, write_textfile
from mctl.cli.health_screen import WatchScreen, sweep_line
from mctl.health.watch import Event, WatchView, events_of
from tests.helpers import WATCH_HOSTS, watch_result

HOSTS = WATCH_HOSTS


def view() -> WatchView:
    v = WatchView(site="lab", racks={"lab-r1": HOSTS}, interval=2, remediate=True, dry_run=False)
    r = watch_result()
    v.events.extend(events_of(r, {h: "healthy" for h in HOSTS}, dry_run=False))
    v.statuses = {vd.host: r.tray_status(vd.host) for vd in r.verdicts}
    v.last = r
    v.next_at = time.time() + 2
    return v


def draw(v: WatchView, width: int, height: int) -> str:
    con = Console(width=width, height=height, record=True, color_system=None, force_terminal=True)
    con.print(WatchScreen(v))
    return con.export_text()


def test_screen_shows_each_tray_state_and_the_events():
    text = draw(view(), 120, 40)
    for word in ("tray01", "tray02", "tray03", "tray04", "healthy", "drained", "unreach 2", "warn",
                 "rack lab-r1", "remediation ON", "breaker: closed", "DRAIN", "mctl: xid 79 gpu0 (fell off bus)"):
        assert word in text, word


def test_screen_survives_small_and_wide_terminals():
    for width, height in ((60, 20), (80, 24), (200, 60)):
        text = draw(view(), width, height)
        lines = text.splitlines()
        assert max(len(l) for l in lines) <= width
        assert "drained" in text and "tray02" in text


def test_screen_shows_a_tripped_breaker():
    v = view()
    v.last = watch_result(tripped=True)
    assert "TRIPPED" in draw(v, 160, 40)


def test_events_and_plain_lines():
    r = watch_result()
    events = events_of(r, {h: "healthy" for h in HOSTS}, dry_run=False)
    kinds = [(e.kind, e.host) for e in events]
    assert ("status", HOSTS[1]) in kinds and ("drain", HOSTS[1]) in kinds and ("status", HOSTS[0]) not in kinds
    line = Event(0, "drain", HOSTS[1], "mctl: x").line()
    assert line.endswith(" DRAIN   lab-r1-tray02 mctl: x")
    v = view()
    assert "SWEEP   #3: 4 trays: 1 drained, 1 healthy, 1 unreachable, 1 warn; 0.42s" in sweep_line(v)


def test_dry_run_events_say_would():
    r = watch_result()
    from mctl.model.drain import Decision

    r.dry_run = True
    r.decisions = [Decision(HOSTS[1], "drain", "1 of 4", reason="mctl: x")]
    (e,) = [e for e in events_of(r, {}, dry_run=True) if e.kind == "drain"]
    assert e.text.startswith("would drain (dry run): mctl: x")


def test_metrics_text_and_server(tmp_path, sockets):
    r = watch_result()
    text = render(r, site="lab", counters={"drain:ok": 1}, interval=2)
    assert 'mctl_health_tray_status{site="lab",rack="lab-r1",tray="lab-r1-tray02",status="drained"} 1' in text
    assert 'mctl_health_tray_status{site="lab",rack="lab-r1",tray="lab-r1-tray02",status="healthy"} 0' in text
    assert 'mctl_health_actions_total{site="lab",action="drain",result="ok"} 1' in text
    assert 'mctl_health_breaker_tripped{site="lab"} 0' in text and "# TYPE mctl_health_sweeps_total counter" in text
    path = tmp_path / "mctl_health.prom"
    write_textfile(path, text)
    assert path.read_text() == text
    server = MetricsServer(0).start()
    try:
        server.update(text)
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
        assert body == text
    finally:
        server.close()
