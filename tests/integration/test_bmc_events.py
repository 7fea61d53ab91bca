"""Leak events pushed by the BMCs (issue 29.3): on a fleet lab (1 rack, 2 trays; its own lab: the slow tier) the watch
subscribes at each BMC's EventService (health.bmc_events, the receiver on loopback), the leak poll of a subscribed BMC
set to 10 minutes: a leak fault is seen by the watch through the BMC's event within seconds. A BMC that offers no
EventService (`mctl lab fault bmc --no-events`) gets no subscription and its leak is seen by the poll (every sweep).
The watch deletes its subscriptions when it stops."""

from __future__ import annotations

import time

import pytest
import yaml

from mctl.lab import bmc_faults
from tests.helpers import Watch, redfish, wait_for, write_health_site

SUBS = "/redfish/v1/EventService/Subscriptions"
EVENTS = {"interval": 1, "imex": "ignore", "leak_interval": 1, "breaker": {"max_drained_share": 1.0, "window": "1h"},
          "bmc_events": {"listen": "127.0.0.1", "leak_interval": 600}}


@pytest.fixture(scope="module")
def fleet(own_lab, tmp_path_factory):
    with own_lab(tmp_path_factory.mktemp("mctl-events-state"), trays=2, racks=1, fleet=True,
                 label="events fleet lab") as lab:
        yield lab


def members(lab, tray: str) -> list:
    code, doc = redfish(lab, tray, SUBS)
    assert code == 200, (code, doc)
    return doc["Members"]


def critical_line(watch: Watch, tray: str) -> bool:
    return any(" STATUS " in l and tray in l and "-> critical" in l and "leak.detectors" in l for l in watch.read())


def test_a_leak_is_seen_through_the_bmcs_event_and_by_the_poll_where_the_bmc_has_no_event_service(fleet, tmp_path):
    pushed, polled = sorted(n for n in fleet.addresses if "-tray" in n)[:2]
    site = write_health_site(fleet, tmp_path / "site", EVENTS)
    doc = yaml.safe_load((site / "mctl.yml").read_text())
    doc.pop("scheduler", None)          # a fleet lab runs no Slurm: without it a dry tray is healthy
    (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    bmc_faults.apply(fleet.dir, polled, no_events=True)
    code, doc = redfish(fleet, polled, "/redfish/v1/EventService")
    assert code == 200 and doc["ServiceEnabled"] is False
    before = {t: len(members(fleet, t)) for t in (pushed, polled)}
    watch = Watch(fleet, site, tmp_path / "state", "--no-remediate", "--interval", "1")
    try:
        wait_for("the watch's subscription at the BMC that offers events",
                 lambda: len(members(fleet, pushed)) == before[pushed] + 1, 120, every=0.5)
        wait_for("two sweeps", lambda: watch.sweeps() >= 2, 120, every=0.3)
        assert not any(" STATUS " in l and "critical" in l for l in watch.read()), watch.read()
        sub = members(fleet, pushed)[-1]["@odata.id"]
        code, dest = redfish(fleet, pushed, sub)
        assert code == 200 and dest["Protocol"] == "Redfish" and dest["Destination"].startswith("http://127.0.0.1:")
        assert len(dest["Context"]) >= 32                      # the token the receiver checks
        assert len(members(fleet, polled)) == before[polled]   # none where the BMC offers no EventService

        # the event: seen within seconds although this BMC's leak poll is 10 minutes apart
        t0 = time.monotonic()
        bmc_faults.apply(fleet.dir, pushed, leak="critical")
        wait_for(f"{pushed}'s leak seen by the watch", lambda: critical_line(watch, pushed), 20, every=0.2,
                 )
        seen_after = time.monotonic() - t0
        assert seen_after < 20, seen_after

        # no EventService: the poll (every sweep) still sees the leak
        bmc_faults.apply(fleet.dir, polled, leak="critical")
        wait_for(f"{polled}'s leak seen by the poll", lambda: critical_line(watch, polled), 30, every=0.2)
    finally:
        code = watch.stop()
        bmc_faults.apply(fleet.dir, pushed, clear=True)
        bmc_faults.apply(fleet.dir, polled, clear=True)
    assert code == 0, watch.proc.stderr.read()
    assert len(members(fleet, pushed)) == before[pushed]       # the watch deleted its subscription when it stopped
