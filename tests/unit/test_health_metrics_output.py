"""Prometheus text in full precision, and the address /metrics listens on (checked, loopback by default)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from mctl.health.metrics import MetricsServer, listen_address, prom_value, render
from tests.unit.cli_helpers import run_cli
from tests.helpers import watch_result

EXAMPLE = str(Path(__file__).resolve().parents[2] / "inventories" / "example-gb200")


def _sample(text: str, name: str) -> str:
    (line,) = [l for l in text.splitlines() if l.startswith(name + "{")]
    return line.rsplit(" ", 1)[1]


def test_the_last_sweep_timestamp_is_written_to_the_microsecond():
    r = watch_result()
    r.started = 1796110000.123456
    r.elapsed = 0.4216
    text = render(r, site="lab", interval=2.5)
    # `{:g}` wrote 1.79611e+09 here: a staleness alert on it was wrong by up to five minutes.
    assert _sample(text, "mctl_health_last_sweep_timestamp_seconds") == "1796110000.123456"
    assert float(_sample(text, "mctl_health_last_sweep_timestamp_seconds")) == r.started
    assert _sample(text, "mctl_health_sweep_duration_seconds") == "0.422"
    assert _sample(text, "mctl_health_interval_seconds") == "2.5"
    assert _sample(text, "mctl_health_sweeps_total") == "3"
    assert "e+" not in text


@pytest.mark.parametrize("value, text", [(0, "0"), (7, "7"), (True, "1"), (1796110000.5, "1796110000.5"),
                                         (2.0, "2.0"), (1e-7, "1e-07"), (float("inf"), "+Inf"),
                                         (float("-inf"), "-Inf"), (float("nan"), "NaN")])
def test_prom_value(value, text):
    assert prom_value(value) == text


@pytest.mark.parametrize("given, bound", [("127.0.0.1", "127.0.0.1"), (" 0.0.0.0 ", "0.0.0.0"), ("::1", "::1"),
                                          ("[::1]", "::1"), ("::", "::")])
def test_listen_addresses_that_are_accepted(given, bound):
    assert listen_address(given) == bound


@pytest.mark.parametrize("given", ["localhost", "", "127.0.0.1:9464", "300.1.1.1", "0.0.0.0; rm -rf /", "*"])
def test_listen_addresses_that_are_refused(given):
    with pytest.raises(ValueError, match="not an IP address"):
        listen_address(given)


def test_server_listens_where_it_is_told(sockets):
    other = "127.0.0.2"          # a loopback address that is not the default one
    server = MetricsServer(0, other).start()
    try:
        server.update("x 1\n")
        assert server.httpd.server_address[0] == other
        body = urllib.request.urlopen(f"http://{other}:{server.port}/metrics", timeout=10).read().decode()
        assert body == "x 1\n"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    finally:
        server.close()


def test_server_default_is_loopback_and_ipv6_works_where_the_machine_has_it(sockets):
    server = MetricsServer(0)
    assert server.httpd.server_address[0] == "127.0.0.1"
    server.httpd.server_close()
    if socket.has_ipv6:
        try:
            v6 = MetricsServer(0, "::1")
        except OSError:
            pytest.skip("no IPv6 loopback here")
        assert v6.httpd.server_address[0] == "::1"
        v6.httpd.server_close()


def test_watch_refuses_a_bad_listen_address_with_exit_2(capsys, tmp_path):
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "health", "watch", "--metrics-port", "9464",
                "--metrics-listen", "example.org", "--sweeps", "1")
    assert r.code == 2 and "--metrics-listen" in r.err and "not an IP address" in r.err
    r = run_cli(capsys, "-i", EXAMPLE, "--state-dir", str(tmp_path), "health", "watch", "--metrics-listen",
                "127.0.0.1", "--sweeps", "1")
    assert r.code == 2 and "needs a port" in r.err


def test_a_shard_watch_names_its_shard_and_role_and_a_lone_watch_is_as_before():
    r = watch_result()
    alone = render(r, site="lab", interval=2.5)
    assert "mctl_health_watch_info" not in alone
    text = render(r, site="lab", interval=2.5, shard="pod1", role="leader")
    assert 'mctl_health_watch_info{site="lab",shard="pod1",role="leader"} 1' in text, text
    assert text.replace(text[text.index("# HELP mctl_health_watch_info"):text.index("# HELP mctl_health_interval")],
                        "") == alone
