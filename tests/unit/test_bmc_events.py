"""Redfish EventService (issue 29.3): an event read safely (mctl.bmc.eventservice.parse_event), the watch's receiver
(mctl.health.bmc_events) over a real loopback socket refusing what is not an event of a subscription it made, the
reader's cadence for a subscribed BMC and a pushed read, and the lab BMC's subscriptions (mctl.lab.bmc_events)."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from mctl.bmc import eventservice as es
from mctl.health import oob
from mctl.health.bmc_events import PATH, EventReceiver
from mctl.lab import bmc_events as lab_ev
from mctl.model.settings import BmcEventSettings
from mctl.model.site import Host

DETECTOR = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/Chassis_0_LeakDetector_0_ColdPlate"


def event(context: str, **record) -> bytes:
    rec = {"EventType": "Alert", "MessageId": "ResourceEvent.1.3.LeakDetected", "Severity": "Critical",
           "Message": "leak", "OriginOfCondition": {"@odata.id": DETECTOR}, **record}
    return json.dumps({"@odata.type": "#Event.v1_7_0.Event", "Context": context, "Events": [rec]}).encode()


def test_the_lab_bmcs_event_is_read_as_a_leak_record_of_its_context():
    body = json.dumps(lab_ev.leak_event("tok", "critical", DETECTOR, 7)).encode()
    context, records = es.parse_event(body)
    assert context == "tok" and len(records) == 1
    r = records[0]
    assert r.leak and r.origin == DETECTOR and r.severity == "Critical" and r.event_type == "Alert"
    cleared = es.parse_event(json.dumps(lab_ev.leak_event("tok", None, DETECTOR, 8)).encode())[1][0]
    assert cleared.leak and cleared.message_id.endswith("LeakDetectorOK")
    other = es.parse_event(event("t", MessageId="ResourceEvent.1.3.ResourceChanged",
                                 OriginOfCondition={"@odata.id": "/redfish/v1/Systems/System_0"}))[1][0]
    assert not other.leak


@pytest.mark.parametrize("body, why", [
    (b"\xff\xfe", "not JSON"), (b"[1]", "not a JSON object"), (b'{"Events": []}', "Context"),
    (json.dumps({"Context": 5, "Events": [{}]}).encode(), "Context"),
    (json.dumps({"Context": "t", "Events": []}).encode(), "no Events"),
    (json.dumps({"Context": "t", "Events": [{"MessageId": "x"}] * 65}).encode(), "more than 64"),
    (json.dumps({"Context": "t", "Events": ["x"]}).encode(), "not an object"),
    (json.dumps({"Context": "t", "Events": [{"MessageId": None}]}).encode(), "MessageId"),
    (json.dumps({"Context": "t", "Events": [{"MessageId": "x" * 2000}]}).encode(), "longer than"),
    (event("t", OriginOfCondition={"@odata.id": "https://evil.example/redfish/v1/x"}), "not a path on this BMC"),
    (event("t", OriginOfCondition={"@odata.id": "/etc/passwd"}), "outside /redfish/v1"),
    (b"[" * 100000, "larger than"),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000, "not JSON"),
])
def test_a_hostile_event_is_refused_with_its_reason(body, why):
    with pytest.raises(ValueError, match=why):
        es.parse_event(body)


def test_subscriptions_link_says_when_a_bmc_offers_no_event_service():
    assert es.subscriptions_link(lab_ev.service_doc(True)) == lab_ev.SUBSCRIPTIONS
    assert es.subscriptions_link(lab_ev.service_doc(False)) is None
    assert es.subscriptions_link({"Subscriptions": {"@odata.id": "//evil/redfish/v1"}}) is None
    assert es.subscriptions_link(None) is None


@pytest.fixture
def receiver(sockets):
    r = EventReceiver(BmcEventSettings(listen="127.0.0.1", queue=2)).start()
    yield r
    r.close()


def post(r: EventReceiver, body: bytes, *, path: str = PATH, method: str = "POST", headers=None) -> int:
    host, port = r.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def test_the_receiver_takes_an_event_of_a_token_it_gave_and_refuses_the_rest(receiver):
    token = receiver.token_for("t1")
    assert receiver.url.startswith("http://127.0.0.1:") and receiver.url.endswith(PATH)
    assert post(receiver, event(token)) == 204
    got = receiver.queue.get(timeout=1)
    assert got.host == "t1" and got.record.leak
    assert post(receiver, event("a guessed token")) == 401
    assert post(receiver, b"{not json") == 400
    assert post(receiver, event(token), path="/other") == 404
    assert post(receiver, b"", method="GET") == 405
    assert post(receiver, b"x" * (es.MAX_BODY + 1)) == 413
    # not a leak: taken (204), not queued
    assert post(receiver, event(token, MessageId="Base.1.0.ResourceChanged",
                                OriginOfCondition={"@odata.id": "/redfish/v1/Systems/System_0"})) == 204
    assert receiver.queue.empty()
    # a full queue drops the newest, and says so
    for _ in range(3):
        assert post(receiver, event(token)) == 204
    c = receiver.counts()
    assert c["accepted"] == 3 and c["dropped"] == 1 and c["ignored"] == 1
    assert c["rejected"] == {"context": 1, "malformed": 1, "path": 1, "method": 1, "too large": 1}
    receiver.forget(token)
    assert post(receiver, event(token)) == 401


def test_a_sender_that_trickles_or_lies_about_its_length_is_cut_within_the_deadline(receiver, monkeypatch):
    from mctl.health import bmc_events

    monkeypatch.setattr(bmc_events, "READ_DEADLINE_S", 0.5)
    host, port = receiver.httpd.server_address[:2]
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n".encode() + b"{")
    t0 = time.monotonic()
    answer = s.recv(100)
    s.close()
    assert b" 400 " in answer and time.monotonic() - t0 < 8
    assert receiver.counts()["rejected"].get("slow", 0) + receiver.counts()["rejected"].get("short", 0) == 1


def test_connections_past_the_cap_are_closed_and_the_receiver_goes_on(sockets, monkeypatch):
    from mctl.health import bmc_events

    monkeypatch.setattr(bmc_events, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(bmc_events, "READ_DEADLINE_S", 1.0)
    r = EventReceiver(BmcEventSettings(listen="127.0.0.1")).start()
    try:
        host, port = r.httpd.server_address[:2]
        held = []
        for _ in range(2):                                 # each sends a partial request line and waits
            c = socket.create_connection((host, port), timeout=10)
            c.sendall(b"POST ")
            held.append(c)
        time.sleep(0.3)
        extra = socket.create_connection((host, port), timeout=10)
        assert extra.recv(10) == b""                       # closed
        extra.close()
        assert r.counts()["rejected"].get("connections", 0) >= 1, r.counts()
        for c in held:
            c.close()
        token = r.token_for("t1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and r.counts()["accepted"] == 0:   # the held ones end with their senders
            try:
                post(r, event(token))
            except OSError:
                time.sleep(0.1)
        assert r.counts()["accepted"] == 1, r.counts()
    finally:
        r.close()


def test_http_off_loopback_is_refused(sockets):
    with pytest.raises(ValueError, match="only on loopback"):
        EventReceiver(BmcEventSettings(listen="0.0.0.0")).start()


def test_a_subscribed_bmc_is_polled_at_the_longer_cadence_and_read_at_once_when_it_pushes():
    t1 = Host("t1", "10.0.0.1", "compute", "r1", bmc="10.9.0.1")
    r = oob.BmcReader([t1], interval=1.0, power_interval=60.0, stale_after=3.0, deadline=10.0, concurrency=4,
                      subscribed_interval=60.0)
    from mctl.checks.leak import BmcHealth, LeakDetector
    dry = BmcHealth(detectors=(LeakDetector("d", "OK"),), power_health="OK", supplies=(), elapsed=0.1)
    token, _until, power = r.begin("t1", 0.0)
    r.slots["t1"].sub = es.Subscription("/redfish/v1/EventService/Subscriptions/1", "tok")
    assert r.end("t1", token, dry, 0.1, power=power)
    assert r.due(1.5) == [] and r.due(59.0) == []             # not every second: its events come
    assert r.view("t1", 30.0).stale_after == 180.0           # stale after 3 of its own intervals
    assert r.pushed("t1", 5.0) and r.due(5.0) == ["t1"]       # an event: read now
    token, _until, power = r.begin("t1", 5.0)
    assert not r.pushed("t1", 5.1)                            # during a read (it may have begun before the leak)
    assert r.end("t1", token, dry, 5.3, power=power) and r.due(5.3) == ["t1"]      # ... once more when it ends
    token, _until, power = r.begin("t1", 5.3)
    assert r.end("t1", token, dry, 5.4, power=power) and r.due(6.0) == []
    r.slots["t1"].sub = None                                  # no subscription: the leak interval again
    r.slots["t1"].next_at = 0.1 + 1.0
    assert r.due(1.2) == ["t1"]


def test_subscribed_interval_is_never_below_the_leak_interval():
    assert oob.subscribed_interval(BmcEventSettings(listen="127.0.0.1"), 5.0, 60.0) == 60.0
    assert oob.subscribed_interval(BmcEventSettings(listen="127.0.0.1", leak_interval=300), 5.0, 60.0) == 300.0
    assert oob.subscribed_interval(BmcEventSettings(listen="127.0.0.1", leak_interval=1), 5.0, 60.0) == 5.0


def test_the_lab_bmc_keeps_subscriptions_as_redfish_says():
    subs = lab_ev.Subscriptions()
    status, doc, location = subs.create({"Destination": "http://127.0.0.1:1/x", "Protocol": "Redfish",
                                         "Context": "c"})
    assert status == 201 and location == f"{lab_ev.SUBSCRIPTIONS}/1" and doc["Context"] == "c"
    assert subs.collection()["Members"] == [{"@odata.id": location}]
    assert subs.create({"Destination": "ftp://x/"})[0] == 400
    assert subs.create({"Destination": "http://x/", "Protocol": "SNMPv2c"})[0] == 400
    assert subs.create([1])[0] == 400
    assert subs.delete("1") and not subs.delete("1") and subs.get("1") is None
    for _ in range(lab_ev.MAX_SUBSCRIPTIONS):
        assert subs.create({"Destination": "http://x/"})[0] == 201
    assert subs.create({"Destination": "http://x/"})[0] == 400      # the BMC's limit
