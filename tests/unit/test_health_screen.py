"""The watch's outputs: the live screen at several terminal sizes, plain lines, events, Prometheus metrics."""

from __future__ import annotations

import time
import urllib.request

from rich.console import Console

from mctl.health.metrics import MetricsServer, render, write_textfile
from mctl.health.record import TrayVerdict
from mctl.model.drain import NodeView
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


# ------------------------------------------------------------------ the trays that are not healthy, and the start

def _line(text: str, *parts: str) -> str:
    """The one screen line holding every part, in that order."""
    found = [l for l in text.splitlines() if all(p in l for p in parts)
             and [l.index(p) for p in parts] == sorted(l.index(p) for p in parts)]
    assert len(found) == 1, (parts, text)
    return found[0]


def test_each_tray_not_healthy_shows_its_first_finding_and_what_mctl_did():
    text = draw(view(), 140, 40)
    assert "not healthy: 3 trays - first finding, what mctl did" in text
    _line(text, "tray02", "drained", "gpu.xid: xid 79 gpu0 (fell off bus)", "drained: mctl: xid 79 gpu0 (fell off bus)")
    _line(text, "tray03", "unreachable", "tray.reachable: unreachable", "none yet: unreachable 2 sweep(s)")
    _line(text, "tray04", "warn", "none: only critical trays are drained")
    assert not [l for l in text.splitlines() if "tray01" in l and "healthy" not in l and "╭" not in l]


def test_held_back_by_the_breaker_queued_and_skipped_say_why():
    from mctl.model.drain import Decision
    from mctl.model.findings import Finding, Severity

    ecc = Finding(Severity.CRITICAL, HOSTS[0], "gpu.ecc", "2 uncorrectable ECC errors on gpu1", None,
                  {"short": "ecc uncorrectable gpu1"})
    r = watch_result(tripped=True)
    r.verdicts[0] = TrayVerdict(HOSTS[0], "lab-r1", "ok", Severity.CRITICAL, (ecc,))
    r.verdicts[3] = TrayVerdict(HOSTS[3], "lab-r1", "ok", Severity.CRITICAL, (ecc,))
    r.decisions = [Decision(HOSTS[0], "skip", "draining lab-r1-tray01 would make 2 of 4 trays of rack lab-r1 "
                            "drained by mctl within 1h (50% > 25%)", reason="mctl: ecc uncorrectable gpu1",
                            full="gpu.ecc: 2 uncorrectable ECC errors on gpu1"),
                   Decision(HOSTS[2], "queue", "scheduler unreachable: drain queued", reason="mctl: unreachable 2"),
                   Decision(HOSTS[3], "skip", "node is DOWN; mctl never touches down nodes")]
    v = view()
    v.last = r
    v.statuses = {vd.host: r.tray_status(vd.host) for vd in r.verdicts}
    text = draw(v, 200, 40)
    _line(text, "tray01", "critical", "gpu.ecc: ecc uncorrectable gpu1",
          "held back by the breaker: draining lab-r1-tray01 would make 2 of 4 trays")
    _line(text, "tray03", "unreachable", "queued: scheduler unreachable: drain queued")
    _line(text, "tray04", "critical", "skipped: node is DOWN; mctl never touches down nodes")


def test_report_only_and_dry_run_say_so():
    from mctl.cli.health_screen import what_mctl_did
    from mctl.model.drain import Decision

    r = watch_result()
    r.remediate, r.logged, r.records = False, [], {}
    r.nodes = {h: NodeView(h, state="IDLE") for h in HOSTS}
    assert what_mctl_did(r, HOSTS[1], "critical") == "none: report only (remediation off)"
    r.remediate, r.dry_run = True, True
    r.decisions = [Decision(HOSTS[1], "drain", "1 of 4", reason="mctl: xid 79 gpu0 (fell off bus)")]
    assert what_mctl_did(r, HOSTS[1], "critical") == "would drain (dry run): mctl: xid 79 gpu0 (fell off bus)"


def test_the_event_pane_starts_with_the_problems_of_the_first_sweep():
    """A watch started on sick trays: the first sweep changes no status (nothing came before it), and the pane
    still lists what it found."""
    from mctl.cli.health_screen import start_events

    v = view()
    v.events.clear()
    screen = WatchScreen(v)
    screen.update(swept=True)
    assert [e.text for e in start_events(v.last)] == [
        "at start: drained: gpu.xid: xid 79 gpu0 (fell off bus)", "at start: unreachable: tray.reachable: unreachable",
        "at start: warn"]
    con = Console(width=140, height=40, record=True, color_system=None, force_terminal=True)
    con.print(screen)
    text = con.export_text()
    _line(text, "STATUS", "lab-r1-tray02", "at start: drained: gpu.xid: xid 79 gpu0 (fell off bus)")
    _line(text, "STATUS", "lab-r1-tray03", "at start: unreachable")
    later = watch_result(number=4)
    v.last = later
    v.add(Event(later.started + 1, "resume", HOSTS[1], "healthy for 2 sweeps"))
    screen.update(swept=True)                        # a later sweep: the start stays the first one's
    con = Console(width=140, height=40, record=True, color_system=None, force_terminal=True)
    con.print(screen)
    lines = con.export_text().splitlines()
    resume = next(i for i, l in enumerate(lines) if "RESUME" in l)
    start = next(i for i, l in enumerate(lines) if "at start: drained" in l)
    assert resume < start                            # newest first
