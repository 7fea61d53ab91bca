"""The watch's BMC reads beside the sweep (issues 27.5, 29.3): the reader's cadence and staleness with time
injected (mctl.health.oob.BmcReader), then the reader itself (BmcWatch) against the real GB200 capture served
over TLS by the static mockup server: one kept connection and one TLS handshake per BMC across reads, the CA
file read once, a hung BMC that never holds a view and goes stale, a trickling one cut from outside, and a
kept connection the BMC closed sent again once (a GET only)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redfish_mockup import MockupServer, throwaway_ca, wait_until  # noqa: E402

from mctl.bmc.client import BMCCredentials, BMCError, RedfishClient  # noqa: E402
from mctl.bmc.inventory import Settings  # noqa: E402
from mctl.checks import leak  # noqa: E402
from mctl.checks.leak import BmcHealth, LeakDetector  # noqa: E402
from mctl.health import oob  # noqa: E402
from mctl.model.findings import Severity  # noqa: E402
from mctl.model.site import Host  # noqa: E402

GB200 = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "redfish" / "nvidia_gb200"
CRED = BMCCredentials("root", "0penBmc")
T1 = Host("t1", "10.0.0.1", "compute", "r1", bmc="10.9.0.1")
SW = Host("sw1", "10.0.1.1", "switch", "r1", bmc="10.9.1.1")
DRY = BmcHealth(detectors=(LeakDetector("Chassis_0_LeakDetector_0_ColdPlate", "OK"),), power_health="OK",
                supplies=(), elapsed=0.2)


def reader(**kw) -> oob.BmcReader:
    args = dict(interval=2.0, power_interval=60.0, stale_after=6.0, deadline=10.0, concurrency=4)
    args.update(kw)
    return oob.BmcReader([T1, SW], **args)


def read_now(r: oob.BmcReader, name: str, now: float, health: BmcHealth, took: float = 0.2) -> bool:
    """One whole read of *name* beginning at *now*; returns whether the power subsystem was read with it."""
    token, _until, power = r.begin(name, now)
    if not power and health.power_asked:
        health = BmcHealth(detectors=health.detectors, power_asked=False, elapsed=health.elapsed)
    assert r.end(name, token, health, now + took, power=power)
    return power


# ------------------------------------------------------------------ cadence and staleness, time injected

def test_each_bmc_is_read_every_interval_and_power_less_often():
    r = reader()
    assert sorted(r.due(0.0)) == ["sw1", "t1"]
    powers = []
    for t in range(0, 130, 2):
        if "t1" in r.due(float(t)):
            powers.append((t, read_now(r, "t1", float(t), DRY)))
    assert [t for t, _p in powers] == list(range(0, 130, 2))             # every 2 s
    assert [t for t, p in powers if p] == [0, 60, 120]                   # its power every 60 s
    v = r.view("t1", 128.5)
    assert v.answered and v.power_asked and v.power_health == "OK" and v.age == 0.3 and not v.stale
    assert r.view("sw1", 128.5).error_kind == "pending"                 # never begun in this test


def test_a_switch_trays_view_has_no_power():
    r = reader()
    token, _until, power = r.begin("sw1", 0.0)
    assert power is False
    r.end("sw1", token, BmcHealth(detectors=DRY.detectors, power_asked=False), 0.1, power=False)
    v = r.view("sw1", 0.5)
    assert not v.power_asked and {f.check for f in leak.judge("sw1", v)} == {leak.BMC, leak.LEAK}


def test_a_read_in_flight_past_stale_after_is_stale_then_cut_at_its_deadline_naming_the_error():
    r = reader()
    read_now(r, "t1", 0.0, DRY)                                          # answered at 0.2
    token, until, _power = r.begin("t1", 2.0)                          # hangs
    assert until == 12.0
    assert not r.view("t1", 6.0).stale                                  # 5.8 s old: within 6 s
    v = r.view("t1", 7.0)
    assert v.stale and v.answered and v.in_flight == 5.0 and v.age == 6.8
    found = {f.check: f for f in leak.judge("t1", v)}
    assert found[leak.STALE].severity is Severity.WARN and "6.8s ago" not in found[leak.STALE].message
    assert "7s ago" in found[leak.STALE].message and "a read has waited 5s" in found[leak.STALE].message
    assert found[leak.LEAK].severity is Severity.WARN and "not read" in found[leak.LEAK].message   # never OK
    assert found[leak.BMC].severity is Severity.OK
    assert r.overdue(12.4) == [] and r.overdue(12.6) == ["t1"]
    late_token, late = r.late("t1", 12.6)
    assert r.end("t1", late_token, late, 12.6, power=False)
    assert not r.end("t1", token, DRY, 13.0, power=False)              # the cut worker's late answer: dropped
    v = r.view("t1", 13.0)
    assert not v.answered and v.error_kind == "timeout" and v.stale and v.age == 12.8
    stale = next(f for f in leak.judge("t1", v) if f.check == leak.STALE)
    assert "last error: no complete answer within 10s" in stale.message and stale.details["age"] == 12.8
    assert stale.message.startswith("the BMC's last answer 13s ago")
    # a failed read waits an interval from its end, not from its beginning (a silent BMC is not asked back
    # to back); the next good reading clears it
    assert r.due(14.0) == ["sw1"] and "t1" in r.due(14.6)
    read_now(r, "t1", 14.6, DRY)
    v = r.view("t1", 15.0)
    assert v.answered and not v.stale and not [f for f in leak.judge("t1", v) if f.check == leak.STALE]


def test_a_bmc_that_never_answered_is_pending_then_stale():
    r = reader()
    r.begin("t1", 0.0)
    v = r.view("t1", 1.0)
    assert v.error_kind == "pending" and not v.stale
    found = {f.check: f for f in leak.judge("t1", v)}
    assert "not read yet" in found[leak.BMC].message and found[leak.LEAK].severity is Severity.WARN
    assert r.view("t1", 6.5).stale
    assert "has not answered since it was first asked 6s ago" in next(
        f for f in leak.judge("t1", r.view("t1", 6.5)) if f.check == leak.STALE).message


def test_a_reading_is_counted_once_by_the_leak_episode():
    """A sweep that judges the reading the sweep before judged says so (details read False): a leak episode
    counts readings in a row, not sweeps (mctl.health.leaks)."""
    r = reader(interval=5.0)
    read_now(r, "t1", 0.0, DRY)
    first = r.view("t1", 1.0)
    second = r.view("t1", 2.0)
    assert not first.repeat and second.repeat
    reads = [next(f for f in leak.judge("t1", v) if f.check == leak.LEAK).details["read"] for v in (first, second)]
    assert reads == [True, False]
    read_now(r, "t1", 5.0, DRY)
    assert not r.view("t1", 6.0).repeat


def test_reads_run_at_most_concurrency_at_once_one_per_bmc():
    hosts = [Host(f"t{i}", f"10.0.0.{i}", "compute", "r1", bmc=f"10.9.0.{i}") for i in range(5)]
    r = oob.BmcReader(hosts, interval=1.0, power_interval=60.0, stale_after=3.0, deadline=5.0, concurrency=2)
    first = r.due(0.0)
    assert len(first) == 2
    for n in first:
        r.begin(n, 0.0)
    assert r.due(0.5) == [] and r.due(3.0) == []                       # slots full; one read per BMC
    assert r.next_event(0.5) == pytest.approx(1.0)                      # at most 1 s, or a deadline
    assert r.next_event(5.2) == pytest.approx(0.3)


# ------------------------------------------------------------------ the reader over HTTPS

@pytest.fixture(scope="module")
def pki(tmp_path_factory, processes, sockets):
    ca, cert, key = throwaway_ca(tmp_path_factory.mktemp("pki"), ["127.0.0.1"])
    return ca, (cert, key)


def _watch(srv: MockupServer, ca: Path, **kw) -> oob.BmcWatch:
    host = Host("tray01", srv.host, "compute", "r1", bmc=srv.host)
    settings = Settings(CRED, verify_tls=str(ca), port=srv.port, timeout_s=kw.pop("timeout_s", 5.0),
                        deadline_s=30, concurrency=4)
    args = dict(interval=0.2, power_interval=1.0, stale_after=1.0, deadline=5.0)
    args.update(kw)
    return oob.BmcWatch([host], settings, **args)


def _until(what: str, check, within: float):
    value = wait_until(check, within)
    assert value, f"not within {within}s: {what}"
    return value


def test_the_watch_reads_each_bmc_over_one_kept_connection_with_one_tls_handshake(pki):
    ca, tls = pki
    with MockupServer(GB200, tls=tls, expand=True) as srv:
        watch = _watch(srv, ca).start()
        try:
            _until("ten reads", lambda: watch.reads >= 10 and watch.views()["tray01"].answered, 30)
            client = watch.reader.slots["tray01"].client
            view = watch.views()["tray01"]
        finally:
            watch.close()
        gets = [p for m, p, _a in srv.requests if m == "GET"]
    assert [d.state for d in view.detectors] == ["OK", "OK", "Critical", "OK"] and view.power_health == "OK"
    assert srv.connections == 1 and client.connections == 1 and client.tls_handshakes == 1, (srv.connections,)
    assert client.tls_resumed == 0                                     # the watch never resumes (docs/bmc.md)
    assert gets.count("/redfish/v1/Chassis?$expand=.($levels=1)") == 1  # found once, then read where found
    leak_reads = gets.count(f"{leak.LEAK_DETECTORS}?$expand=.($levels=1)")
    assert leak_reads >= 9 and gets.count(leak.POWER_SUBSYSTEM) < leak_reads   # power less often


def test_a_hung_bmc_never_holds_a_view_and_goes_stale_until_it_answers_again(pki):
    ca, tls = pki
    with MockupServer(GB200, tls=tls, expand=True) as srv:
        watch = _watch(srv, ca, timeout_s=1.0, deadline=1.5).start()
        try:
            _until("a first reading", lambda: watch.views()["tray01"].answered, 30)
            srv.fault, srv.hold_s = "slow", 60.0                        # every answer held from now on
            took = []

            def stale():
                t0 = time.monotonic()
                v = watch.views()["tray01"]
                took.append(time.monotonic() - t0)
                return v if v.stale and not v.answered else None

            v = _until("the view stale with the timeout named", stale, 30)
            assert v.error_kind == "timeout" and max(took) < 0.1, max(took)
            srv.release.set()                                           # the BMC answers again
            srv.fault = "none"
            _until("fresh again", lambda: (lambda v: v.answered and not v.stale)(watch.views()["tray01"]), 30)
        finally:
            watch.close()


def test_a_trickling_bmc_is_cut_at_its_deadline_from_outside(pki):
    """Every byte comes before any socket timeout: only the reader's cut (the connection shut from outside)
    ends the worker, and the next read gets a new connection."""
    ca, tls = pki
    with MockupServer(GB200, tls=tls, expand=True, fault="trickle", fault_path=leak.LEAK_DETECTORS) as srv:
        watch = _watch(srv, ca, timeout_s=5.0, deadline=1.0).start()
        try:
            v = _until("the read cut", lambda: (lambda v: v if v.error_kind == "timeout" else None)(
                watch.views()["tray01"]), 30)
            assert "the read was cut" in v.error
            _until("its worker gone", lambda: not any(t.name == "oob-tray01" and t.is_alive() and
                                                      watch.reader.slots["tray01"].started is None
                                                      for t in threading.enumerate()), 10)
            _until("a second connection for the next read", lambda: srv.connections >= 2, 30)
        finally:
            srv.release.set()
            watch.close()


def test_the_ca_file_is_read_once_for_every_bmc(pki, monkeypatch):
    import ssl

    import mctl.bmc.client as client_mod

    ca, tls = pki
    loads = []
    real = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations",
                        lambda self, *a, **k: loads.append(a or k) or real(self, *a, **k))
    monkeypatch.setattr(client_mod, "_CONTEXTS", {})
    with MockupServer(GB200, tls=tls) as one, MockupServer(GB200, tls=tls) as two:   # two BMCs (two origins)
        contexts = set()
        for srv in (one, two, one, two):                                # two clients of each (two commands)
            c = RedfishClient(f"https://{srv.host}:{srv.port}", CRED, verify_tls=str(ca), timeout_s=5,
                              resume_tls=False)
            adapter = c._client._session.get_adapter("https://x")
            for _ in range(3):                                          # each with new connections
                adapter.poolmanager.clear()
                assert c.get("/redfish/v1")["RedfishVersion"]
            contexts.add(id(adapter.poolmanager.connection_pool_kw["ssl_context"]))
            c.close()
    # one context for the CA file, shared by every BMC's client: the file read once; a connection each time
    assert len(loads) == 1 and len(contexts) == 1 and one.connections == two.connections == 6
    assert list(client_mod._CONTEXTS) == [(str(ca), None, False)]


def test_a_kept_connection_the_bmc_closed_is_sent_again_once_a_post_never(pki):
    ca, tls = pki
    with MockupServer(GB200, tls=tls, fault="drop-kept") as srv:
        c = RedfishClient(f"https://{srv.host}:{srv.port}", CRED, verify_tls=str(ca), timeout_s=5, resume_tls=False)
        for _ in range(3):
            assert c.get("/redfish/v1/Chassis/Chassis_0")["Id"] == "Chassis_0"
        assert c.connections == 3 and len(srv.requests) == 5           # 1, then 2 and 2 (each re-sent once)
        with pytest.raises(BMCError) as exc:
            c.post_action("/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", {"ResetType": "On"})
        assert exc.value.kind == "unreachable" and srv.posts == []      # the POST was dropped: not sent again
        c.close()


# ------------------------------------------------------------------ the settings

def test_the_watchs_bmc_settings_from_the_inventory(tmp_path):
    from mctl.inventory import load_site
    from mctl.inventory.convert import health_settings
    from mctl.inventory.schema import HealthSpec
    from mctl.model.settings import HealthSettings

    default = health_settings(HealthSpec())
    assert (default.leak_interval, default.bmc_interval, default.bmc_stale_after) == (None, None, 3)
    # leaks every sweep by default; the BMC health (power) at the leak interval but at least 60 s
    assert oob.leak_interval(default.leak_interval, 60.0) == 60.0 and oob.leak_interval(None, 2.0) == 2.0
    assert oob.bmc_interval(default.bmc_interval, 2.0) == 60.0
    assert oob.bmc_interval(default.bmc_interval, 90.0) == 90.0
    set_ = health_settings(HealthSpec(leak_interval=5, bmc_interval=30, bmc_stale_after=4))
    assert (set_.leak_interval, set_.bmc_interval, set_.bmc_stale_after) == (5.0, 30.0, 4)
    assert oob.leak_interval(set_.leak_interval, 60.0) == 5.0 and oob.bmc_interval(set_.bmc_interval, 5.0) == 30
    assert HealthSettings.from_dict(set_.to_dict()) == set_
    racks = "racks:\n  r1:\n    shape: {compute_trays: 1, switch_trays: 0}\n    compute: {nodes: r1-t1, addresses: 10.0.0.1}\n"
    for bad, says in (("leak_interval: 0", "greater than 0"), ("bmc_interval: 0", "greater than 0"),
                      ("bmc_stale_after: 0", "greater than or equal"), ("leak_interval: soon", "number"),
                      ("bmc_interval: 10, leak_interval: 20", "shorter than leak_interval 20s"),
                      ("bmc_power_interval: 30", "renamed")):
        (tmp_path / "mctl.yml").write_text(f"site: s\nhealth: {{{bad}}}\n{racks}")
        with pytest.raises(Exception, match=bad.split(":")[0]) as exc:
            load_site(tmp_path / "mctl.yml")
        text = str(exc.value) + " ".join(f"{p.file}:{p.line} {p.message} {p.hint}" for p in exc.value.problems)
        assert "mctl.yml:2" in text and says in text, text
