"""The event sinks against real sockets (mctl/health/events.py): syslog over a unix socket and UDP, the
webhook against a local HTTP server that answers 500, answers slowly or drops the connection. The
`sockets` fixture puts every test here in the emulators tier."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mctl.health import events
from mctl.health.store import action_entry
from mctl.model.settings import EventSink
from tests.helpers import wait_for


def event(n: int, action: str = "drain") -> dict:
    return events.action_event(action_entry(action, f"t{n:02d}", "mctl: xid 79", who="me", rack="r1"), site="s")


def dead_lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class Receiver:
    """A webhook receiver: `plan` is what each request gets, in turn (ok, 500, slow, drop, 400), then ok."""

    def __init__(self, plan=(), slow_s: float = 3.0):
        self.plan = list(plan)
        self.slow_s = slow_s
        self.got: list[dict] = []
        self.headers: list[dict] = []
        self.times: list[float] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.times.append(time.monotonic())
                what = outer.plan.pop(0) if outer.plan else "ok"
                if what == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if what == "slow":
                    outer.release.wait(outer.slow_s)
                if what in ("500", "400"):
                    self.send_response(int(what))
                    self.end_headers()
                    return
                if what.startswith("302 "):
                    self.send_response(302)
                    self.send_header("Location", what[4:])
                    self.end_headers()
                    return
                outer.got.append(json.loads(body))
                outer.headers.append(dict(self.headers))
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(sockets):
    made = []

    def make(plan=(), slow_s=3.0):
        r = Receiver(plan, slow_s)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def webhook(url, tmp_path, **kw):
    spec = EventSink("webhook", url=url, **{"timeout_s": 1.0, "retries": 3, "backoff_s": 0.2, **kw})
    return events.Bus.for_settings("s", [spec], tmp_path), tmp_path / "health" / "events-dead-webhook-0.jsonl"


def test_the_webhook_posts_each_event_with_the_headers_file_and_never_logs_the_secret(tmp_path, receiver):
    r = receiver()
    (tmp_path / "h").write_text("Authorization: Bearer s3cret\n")
    bus, dead = webhook(r.url, tmp_path, headers_file=str(tmp_path / "h"))
    bus.emit([event(1), event(2)])
    counts = bus.close(10.0)
    assert [e["tray"] for e in r.got] == ["t01", "t02"] and all(events.schema_problems(e) == [] for e in r.got)
    assert r.headers[0]["Authorization"] == "Bearer s3cret" and r.headers[0]["Content-Type"] == "application/json"
    assert r.headers[0]["X-Mctl-Event-Id"] == r.got[0]["id"]
    assert counts["webhook[0]"] == {"delivered": 2, "dropped": 0, "dead_lettered": 0, "retried": 0}
    assert not dead.exists()


def test_the_webhook_retries_a_500_a_dropped_connection_and_a_slow_answer_with_doubling_backoff(tmp_path, receiver):
    r = receiver(["500", "drop", "slow"], slow_s=3.0)
    bus, dead = webhook(r.url, tmp_path, retries=3, backoff_s=0.3, timeout_s=1.0)
    bus.emit([event(1)])
    wait_for("the event delivered after three failures", lambda: r.got, timeout=30)
    counts = bus.close(10.0)
    assert counts["webhook[0]"]["delivered"] == 1 and counts["webhook[0]"]["retried"] == 3
    gaps = [b - a for a, b in zip(r.times, r.times[1:])]
    # the waits between attempts: 0.3 s, 0.6 s (the dropped connection answers at once), then the slow
    # answer's 1 s timeout plus 1.2 s: each at least the backoff, doubled each time
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6 and gaps[2] >= 1.0 + 1.2
    assert not dead.exists()


def test_an_event_never_delivered_lands_in_the_dead_letter_file_with_the_error(tmp_path, receiver):
    r = receiver(["500"] * 3 + ["400"])
    bus, dead = webhook(r.url, tmp_path, retries=2, backoff_s=0.1)
    bus.emit([event(1)])
    wait_for("the event dead-lettered", lambda: dead_lines(dead), timeout=20)
    bus.emit([event(2)])                         # a 400 is final: no retry
    wait_for("the second dead-lettered", lambda: len(dead_lines(dead)) == 2, timeout=20)
    counts = bus.close(5.0)
    first, second = dead_lines(dead)
    assert (first["sink"], first["error"], first["attempts"], first["event"]["tray"]) == \
        ("webhook[0]", "HTTP 500", 3, "t01")
    assert (second["error"], second["attempts"]) == ("HTTP 400", 1)
    assert counts["webhook[0]"]["dead_lettered"] == 2 and r.got == []


def test_a_redirect_is_final_and_never_followed_so_the_secret_goes_nowhere_else(tmp_path, receiver):
    elsewhere = receiver()
    r = receiver([f"302 {elsewhere.url}"])
    (tmp_path / "h").write_text("Authorization: Bearer s3cret\n")
    bus, dead = webhook(r.url, tmp_path, headers_file=str(tmp_path / "h"))
    bus.emit([event(1)])
    bus.close(10.0)
    (line,) = dead_lines(dead)
    assert (line["error"], line["attempts"]) == ("HTTP 302", 1) and elsewhere.times == []
    assert "s3cret" not in dead.read_text()


def test_a_refused_connection_is_retried_then_dead_lettered(tmp_path, sockets):
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bus, dead = webhook(f"http://127.0.0.1:{port}/x", tmp_path, retries=1, backoff_s=0.1)
    bus.emit([event(1)])
    bus.close(10.0)
    (line,) = dead_lines(dead)
    assert line["attempts"] == 2 and "refused" in line["error"].lower()


def test_a_full_queue_drops_the_newest_without_blocking_and_the_dropped_reach_the_dead_letter_file(tmp_path,
                                                                                                  receiver):
    r = receiver(["slow"], slow_s=30.0)          # the first request hangs: the queue fills behind it
    bus, dead = webhook(r.url, tmp_path, queue=3, timeout_s=20.0, retries=0)
    bus.emit([event(0)])
    wait_for("the worker holds the first event", lambda: r.times, timeout=10)
    t0 = time.monotonic()
    bus.emit([event(n) for n in range(1, 11)])    # 3 queued, 7 dropped
    assert time.monotonic() - t0 < 0.5            # never blocks the caller
    assert bus.counts()["webhook[0]"]["dropped"] == 7
    r.release.set()                               # the receiver answers; the queue drains
    wait_for("the queued events delivered", lambda: len(r.got) == 4, timeout=20)
    counts = bus.close(10.0)
    assert [e["tray"] for e in r.got] == ["t00", "t01", "t02", "t03"]   # the oldest kept, in order
    dropped = dead_lines(dead)
    assert sorted(d["event"]["tray"] for d in dropped) == [f"t{n:02d}" for n in range(4, 11)]
    assert all("queue of 3 events was full" in d["error"] for d in dropped)
    assert counts["webhook[0]"]["dead_lettered"] == 7


def test_shutdown_flushes_within_its_deadline_and_dead_letters_what_is_left(tmp_path, receiver):
    r = receiver(["slow"] * 10, slow_s=30.0)
    bus, dead = webhook(r.url, tmp_path, timeout_s=20.0, retries=5, backoff_s=5.0)
    bus.emit([event(1), event(2), event(3)])
    wait_for("the first request sent", lambda: r.times, timeout=10)
    t0 = time.monotonic()
    bus.close(1.5)
    assert time.monotonic() - t0 < 3.0
    left = dead_lines(dead)
    assert sorted(d["event"]["tray"] for d in left) == ["t01", "t02", "t03"]
    assert any("it may have arrived" in d["error"] for d in left)
    bus.emit([event(4)])                          # a closed bus takes nothing, and says nothing
    assert len(dead_lines(dead)) == 3


def test_syslog_over_a_unix_socket_is_one_rfc5424_datagram_per_event(tmp_path, sockets):
    path = str(tmp_path / "log.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(10)
    try:
        bus = events.Bus.for_settings("s", [EventSink("syslog", address=f"unix:{path}", facility="local0")],
                                      tmp_path)
        e = event(1, "gpu-reset")
        bus.emit([e])
        data = server.recv(65536).decode()
        counts = bus.close(5.0)
    finally:
        server.close()
    head, _, body = data.partition(" - ")
    pri, when, host, app, pid, msgid = head.split(" ")
    assert (pri, when, app, msgid) == (f"<{16 * 8 + 5}>1", e["time"], "mctl", "action")
    assert json.loads(body) == e and counts["syslog[0]"]["delivered"] == 1


def test_syslog_over_udp_and_a_missing_socket_dead_letters(tmp_path, sockets):
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(10)
    port = server.getsockname()[1]
    try:
        bus = events.Bus.for_settings("s", [
            EventSink("syslog", name="udp", address=f"udp:127.0.0.1:{port}", kinds=("finding",)),
            EventSink("syslog", name="gone", address=f"unix:{tmp_path}/nobody.sock")], tmp_path)
        finding = events.finding_events({"t1": {"status": "critical", "findings": {"gpu.xid": {
            "check": "gpu.xid", "severity": "critical", "message": "XID 79"}}}}, {}, site="s", who="me", sweep=1,
            at=time.time(), racks={})[0]
        bus.emit([event(1), finding])            # the udp sink takes findings only
        data = server.recv(65536).decode()
        counts = bus.close(5.0)
    finally:
        server.close()
    assert data.startswith(f"<{3 * 8 + 2}>1 ") and json.loads(data.partition(" - ")[2])["kind"] == "finding"
    assert counts["udp"]["delivered"] == 1
    assert counts["gone"] == {"delivered": 0, "dropped": 0, "dead_lettered": 2, "retried": 2}
    assert len(dead_lines(tmp_path / "health" / "events-dead-gone.jsonl")) == 2


def test_the_file_sink_appends_one_line_per_event(tmp_path):
    out = tmp_path / "events.jsonl"
    bus = events.Bus.for_settings("s", [EventSink("file", path=str(out), actions=("drain",))], tmp_path)
    bus.emit([event(1), event(2, "resume"), event(3)])
    assert bus.close(5.0)["file[0]"]["delivered"] == 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [e["tray"] for e in lines] == ["t01", "t03"] and all(events.schema_problems(e) == [] for e in lines)


def test_the_repair_hook_and_an_exec_sink_of_repair_run_as_the_ladders_repair_hook_acts(tmp_path, processes):
    import asyncio
    import sys
    from dataclasses import replace

    from mctl.health.record import TrayRecord
    from mctl.health.responders.ladder import LadderResponder
    from mctl.health.site_view import settings_of
    from mctl.health.store import HealthState
    from mctl.inventory import load_site
    from mctl.model.settings import LadderSettings
    from tests.helpers import EXAMPLE_SITE

    site = load_site(EXAMPLE_SITE)
    host = site.compute_trays()[0]
    said = tmp_path / "said.jsonl"
    write = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"
    base = settings_of(site)
    old = LadderSettings(repair_hook=(sys.executable, "-c", write, str(said), "old", "{tray}"),
                         repair_hook_timeout_s=20.0)
    settings = replace(base, ladder=old,
                       events=(EventSink("exec", name="pager", command=(sys.executable, "-c", write, str(said), "new",
                                                                        "{rack}", "{failures}"),
                                         timeout_s=20.0, actions=("repair",)),
                               EventSink("file", path=str(tmp_path / "ev.jsonl"))))
    responder = LadderResponder(site, settings)
    state = HealthState(site.name, {host.name: TrayRecord(host.name, host.rack)})
    acts = responder._hook_acts(None, state, host.name)
    assert [a.decision.action for a in acts] == ["repair-hook", "repair-hook"]
    assert [a.fields for a in acts] == [{"sink": "pager"}, {}]        # the old hook's line is as it was
    dones = [asyncio.run(a.run(lambda: None)) for a in acts]
    assert [d.result for d in dones] == ["ok", "ok"]
    assert sorted(json.loads(x)[0] for x in said.read_text().splitlines()) == ["new", "old"]
    lines = {json.loads(x)[0]: json.loads(x)[1:] for x in said.read_text().splitlines()}
    assert lines == {"old": [host.name], "new": [host.rack, "0"]}
    none = LadderResponder(site, base)._hook_acts(None, state, host.name)
    assert [asyncio.run(a.run(lambda: None)).result for a in none] == ["noted"]
