"""Issue 30's signals on the shared lab, end to end: the lab fault, the trays' nvidia-smi, the probe over SSH,
the engine's memory between two `mctl health check`s (health/signals.json) and the checks' findings.

Needs only the lab (no Slurm deploy): the checks run whatever the scheduler read says.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import HEALTH, fault, wait_for, write_health_site


@pytest.fixture(autouse=True)
def _faults_cleared(lab):
    """The shared lab as the next test expects it: these tests' GPU faults cleared, whatever they asserted."""
    yield
    lab.clear_faults()


def _check(lab, site, state, tray):
    proc = lab.mctl("-i", str(site), "--state-dir", str(state), "--json", "health", "check", tray, timeout=120)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return [f for f in json.loads(proc.stdout)["findings"] if f["host"] == tray]


def _one(findings, check):
    (f,) = [f for f in findings if f["check"] == check and f["severity"] != "ok"] or \
        [f for f in findings if f["check"] == check]
    return f


def test_a_degrading_link_warns_then_fails_at_the_critical_rate(lab, tmp_path):
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "nvlink_error_window": "10m"})
    state = tmp_path / "state"
    tray = lab.trays[0]
    first = _one(_check(lab, site, state, tray), "nvlink.errors")
    assert first["severity"] == "ok" and first["details"].get("baseline") is True      # the first reading
    assert (state / "health" / "signals.json").exists()
    healthy = _one(_check(lab, site, state, tray), "nvlink.errors")
    assert healthy["severity"] == "ok" and "no NVLink error counted" in healthy["message"]
    fault(lab, tray, nvlink_errors="1:7:5")
    slow = wait_for("the Rx errors counted", lambda: (lambda f: f if f["severity"] != "ok" else None)(
        _one(_check(lab, site, state, tray), "nvlink.errors")), 60, every=0.5)
    assert slow["severity"] == "warn" and "gpu1 link7 Rx Errors +" in slow["message"]
    fault(lab, tray, nvlink_errors="1:7:5000")
    fast = wait_for("the critical rate", lambda: (lambda f: f if f["severity"] == "critical" else None)(
        _one(_check(lab, site, state, tray), "nvlink.errors")), 60, every=0.5)
    assert fast["details"]["links"] == ["gpu1:7"] and fast["details"]["short"] == "nvlink gpu1 link7 errors"


def test_hw_slowdown_is_critical_after_n_sweeps_and_thermal_warns(lab, tmp_path):
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "clock_event_sweeps": 2})
    state = tmp_path / "state"
    tray = lab.trays[1]
    assert _one(_check(lab, site, state, tray), "gpu.clocks")["severity"] == "ok"
    fault(lab, tray, clock_event="2:hw-slowdown")
    once = _one(_check(lab, site, state, tray), "gpu.clocks")
    assert once["severity"] == "warn" and "gpu2 HW slowdown (1 sweep)" in once["message"]
    twice = _one(_check(lab, site, state, tray), "gpu.clocks")
    assert twice["severity"] == "critical" and twice["details"]["short"] == "gpu2 hw slowdown"
    lab.clear_faults(tray)
    fault(lab, tray, clock_event="0:sw-thermal")
    capped = _one(_check(lab, site, state, tray), "gpu.clocks")
    assert capped["severity"] == "warn" and "gpu0 SW thermal slowdown" in capped["message"]
