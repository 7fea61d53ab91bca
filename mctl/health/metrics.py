"""Prometheus metrics of the health watch: a textfile for node_exporter, or /metrics over HTTP.

The exposition text is rendered once per sweep (pure) and then either written
atomically where node_exporter's textfile collector reads it, or served by a
small HTTP server bound to the loopback address unless health.metrics_listen /
--metrics-listen names another address (an IP literal, so what it binds is exact).
Values are written in full precision (repr of the float): a Unix timestamp printed
with six significant digits would be wrong by minutes.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from mctl.state.files import atomic_write

if TYPE_CHECKING:
    from mctl.health.sweep import SweepResult

STATUSES = ("healthy", "warn", "critical", "unreachable", "drained", "held", "unknown")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


DEFAULT_LISTEN = "127.0.0.1"


def prom_value(value: float | int | bool) -> str:
    """A sample value as Prometheus text: integers as integers, floats in full (shortest exact) form."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def listen_address(text: str) -> str:
    """The address /metrics binds, checked: an IPv4 or IPv6 literal (ValueError says why not)."""
    raw = str(text).strip()
    inner = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        return str(ipaddress.ip_address(inner))
    except ValueError:
        raise ValueError(f"not an IP address: {text!r} (use e.g. 127.0.0.1, 0.0.0.0, ::1 or a "
                         f"local interface's address)") from None


def _labels(**labels: str | None) -> str:
    parts = [f'{k}="{_escape(str(v))}"' for k, v in labels.items() if v is not None]
    return "{" + ",".join(parts) + "}" if parts else ""


def render(result: "SweepResult", *, site: str, counters: dict[str, int] | None = None,
           interval: float | None = None, shard: str | None = None, role: str | None = None) -> str:
    """The exposition text for one sweep (plus running counters of actions since the watch started). A watch
    of one shard (*shard*) or of a failover pair (*role*) says so in `mctl_health_watch_info`; the trays'
    series carry their rack, so the site is the sum of its shards' watches."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(**labels)} {prom_value(value)}")

    metric("mctl_health_last_sweep_timestamp_seconds", "gauge", "When the last sweep started (Unix time).",
           [({"site": site}, result.started)])
    metric("mctl_health_sweep_duration_seconds", "gauge", "How long the last sweep took.",
           [({"site": site}, round(result.elapsed, 3))])
    metric("mctl_health_sweeps_total", "counter", "Sweeps since the watch started.",
           [({"site": site}, result.number)])
    if shard or role:
        metric("mctl_health_watch_info", "gauge", "This watch's shard (health.shards; site: the whole site) and "
               "its role in a failover pair (leader, standby; alone without health.failover).",
               [({"site": site, "shard": shard or "site", "role": role or "alone"}, 1)])
    if interval:
        metric("mctl_health_interval_seconds", "gauge", "Configured sweep interval.", [({"site": site}, interval)])
    tray_samples = []
    for v in result.verdicts:
        status = result.tray_status(v.host)
        for s in STATUSES:
            tray_samples.append(({"site": site, "rack": v.rack, "tray": v.host, "status": s}, 1 if s == status else 0))
    metric("mctl_health_tray_status", "gauge", "1 for the tray's current status, 0 for the others.", tray_samples)
    per = {}
    for f in result.findings:
        if f.host and f.severity.value != "ok":
            key = (f.host, f.severity.value)
            per[key] = per.get(key, 0) + 1
    metric("mctl_health_findings", "gauge", "Findings of the last sweep per tray and severity (ok not counted).",
           [({"site": site, "tray": h, "severity": s}, n) for (h, s), n in sorted(per.items())])
    metric("mctl_health_breaker_tripped", "gauge", "1 while the circuit breaker stops automatic drains.",
           [({"site": site}, 1 if result.breaker.tripped else 0)])
    metric("mctl_health_scheduler_up", "gauge", "1 when the scheduler answered in the last sweep.",
           [({"site": site}, 0 if result.scheduler_error else 1)] if result.scheduler else [])
    metric("mctl_health_drained_by_mctl", "gauge", "Trays mctl holds drained.",
           [({"site": site}, sum(1 for r in result.records.values() if r.drained))])
    leaking = [r for r in result.records.values() if getattr(r, "leak", None)]
    metric("mctl_health_leak_trays", "gauge", "Trays in a leak episode (critical: open; powered_off: mctl powered "
           "it off for the leak).",
           [({"site": site, "state": "critical"}, sum(1 for r in leaking if not r.leak.sent)),
            ({"site": site, "state": "powered_off"}, sum(1 for r in leaking if r.leak.sent))])
    if counters is not None:
        metric("mctl_health_actions_total", "counter", "Actions taken since the watch started, by kind and result.",
               [({"site": site, "action": a.split(":")[0], "result": a.split(":")[1]}, n)
                for a, n in sorted(counters.items())])
    if result.event_counts:                            # the event sinks of health.events (docs/events.md)
        metric("mctl_health_events_total", "counter", "Events per sink since mctl started, by outcome "
               "(delivered, dropped: a full queue, dead_lettered, retried: attempts tried again).",
               [({"site": site, "sink": sink, "outcome": k}, n)
                for sink, counts in sorted(result.event_counts.items()) for k, n in sorted(counts.items())])
    from mctl.health.ladder import metric_samples      # the recovery ladder's series, once it has acted

    for name, kind, help_text, samples in metric_samples(result.records, site):
        metric(name, kind, help_text, samples)
    from mctl.health.isolate import metric_samples as isolation_samples     # once the watch isolated a tray

    for name, kind, help_text, samples in isolation_samples(result.records, site):
        metric(name, kind, help_text, samples)
    return "\n".join(lines) + "\n"


def write_textfile(path: str | Path, text: str) -> None:
    """node_exporter reads *.prom files; the atomic rename means it never sees half a file."""
    atomic_write(path, text, mode=0o644)


class MetricsServer:
    """GET /metrics on HOST:PORT (loopback by default), serving the text of the latest sweep."""

    def __init__(self, port: int, host: str = DEFAULT_LISTEN):
        host = listen_address(host)
        self.host = host
        self._text = "# no sweep yet\n"
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = server_self._text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                return

        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        server_class = type("MetricsHTTPServer", (ThreadingHTTPServer,), {"address_family": family})
        self.httpd = server_class((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mctl-metrics", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def update(self, text: str) -> None:
        self._text = text

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
