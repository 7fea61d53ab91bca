"""The boot grace: a tray seen in its first seconds after a boot is half booted, not failed (mctl.checks.boot)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from mctl import checks
from mctl.checks.boot import GRACE, GRACE_CHECKS, in_grace
from mctl.health import policy
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.inventory.convert import health_settings
from mctl.inventory.schema import HealthSpec
from mctl.model.drain import DRAIN, RESUME, NodeView
from mctl.model.findings import Severity, worst
from mctl.model.settings import HealthSettings
from mctl.model.tray import Clock, ImexObservation, ServiceState

from mctl.facts.kernel_log import observe_xid, parse_xid_line
from tests.helpers import by_check, expect, tray, xid_line  # the real captures of test_health_checks

S = HealthSettings()
STOPPED = ServiceState("slurmd.service", True, "inactive", "dead", source="process-table")


def clock(up: float) -> Clock:
    return Clock(epoch=1_764_441_600.0, local=datetime(2025, 11, 29, 18, 40, 0), uptime=up)


def run(facts, settings=S):
    return checks.run_tray(facts, expect(facts.host), settings)


def test_a_start_up_failure_warns_within_the_grace_and_is_critical_after_it():
    (young,) = by_check(run(tray(slurmd=STOPPED, clock=clock(20.0))), "slurm.slurmd")
    assert young.severity is Severity.WARN and young.details[GRACE] == {"uptime": 20.0, "grace": 120.0}
    assert "boot grace" in young.message and "slurmd not running" == young.details["short"]
    (old,) = by_check(run(tray(slurmd=STOPPED, clock=clock(121.0))), "slurm.slurmd")
    assert old.severity is Severity.CRITICAL and GRACE not in old.details
    # every start-up check is covered the same way: the IMEX daemon not READY, and GPU tools that do not answer
    found = run(tray(imex=ImexObservation(True, "WAITING_FOR_PEERS", "DOWN"), gpus=None,
                     gpu_error="nvidia-smi: command not found", clock=clock(5.0)))
    lowered = {f.check for f in found if GRACE in f.details}
    assert lowered and lowered <= GRACE_CHECKS and {"imex.daemon", "gpu.facts"} <= lowered
    assert worst(found) is Severity.WARN
    # a GPU tool that hangs is a wedge, not a start; an NVLink down is hardware: judged at once
    hung = run(tray(gpus=None, gpu_error="nvidia-smi hung (no answer within 10s)", clock=clock(5.0)))
    assert by_check(hung, "gpu.facts")[0].severity is Severity.CRITICAL and not in_grace(hung)
    assert "nvlink.links" not in GRACE_CHECKS and "gpu.count" not in GRACE_CHECKS


def test_the_grace_never_hides_hardware_faults_and_can_be_turned_off():
    # an XID of this boot is a fault of this boot, whatever the uptime
    line = parse_xid_line(xid_line(79, uptime=20.0, stamp="Nov 29 18:39:50"))
    young = clock(30.0)
    found = run(tray(xids=(observe_xid(line, young),), clock=young, xid_source="/var/log/kern.log"))
    xid = by_check(found, "gpu.xid")
    assert xid and xid[0].severity is Severity.CRITICAL and not in_grace(xid)
    # the site can turn it off: 0s
    off = replace(S, boot_grace_s=0.0)
    (f,) = by_check(run(tray(slurmd=STOPPED, clock=clock(1.0)), off), "slurm.slurmd")
    assert f.severity is Severity.CRITICAL
    # no clock read: no grace (the probe did not say how long the tray has been up)
    (f,) = by_check(run(tray(slurmd=STOPPED, clock=None)), "slurm.slurmd")
    assert f.severity is Severity.CRITICAL


def _verdict(findings, host="t01"):
    return TrayVerdict(host, "rack-a", "ok", worst(findings), tuple(findings))


def test_the_policy_neither_drains_nor_counts_healthy_a_tray_in_its_grace():
    node = NodeView("t01", state="IDLE")
    rec = TrayRecord("t01", healthy_streak=2)
    young = run(tray(slurmd=STOPPED, clock=clock(10.0)))
    step = policy.decide_tray(rec, _verdict(young), node, S, answered=True, now=1000.0)
    assert step.want is None and step.record.healthy_streak == 0 and step.record.bad_streak == 0
    # the grace ends with slurmd still down: drained at the first sweep after it
    old = run(tray(slurmd=STOPPED, clock=clock(125.0)))
    step = policy.decide_tray(step.record, _verdict(old), node, S, answered=True, now=1115.0)
    assert step.want is not None and "slurmd" in step.want[0]


def test_a_drained_tray_is_not_resumed_while_it_is_still_booting():
    reason = "mctl: slurmd not running"
    node = NodeView("t01", drained=True, reason=reason, state="IDLE+DRAIN")
    rec = TrayRecord("t01", drained=True, reason=reason, full_reason=reason, drained_at=1.0)
    settings = replace(S, resume_after_healthy_sweeps=1)
    young = run(tray(slurmd=STOPPED, clock=clock(10.0)))
    outcome = policy.decide({"t01": rec}, [_verdict(young)], {"t01": node}, settings, policy.BreakerState(),
                            {"rack-a": 18}, now=1000.0)
    assert not [d for d in outcome.decisions if d.action in (DRAIN, RESUME)]
    # up whole (every start-up check passes) within the grace: judged at once, as any sweep
    whole = run(tray(clock=clock(15.0)))
    assert not in_grace(whole)
    outcome = policy.decide(outcome.records, [_verdict(whole)], {"t01": node}, settings, policy.BreakerState(),
                            {"rack-a": 18}, now=1005.0)
    assert [d.action for d in outcome.decisions] == [RESUME]


@pytest.mark.parametrize("text, seconds", [("2m", 120.0), ("0s", 0.0), ("90s", 90.0)])
def test_the_setting(text, seconds):
    assert health_settings(HealthSpec(boot_grace=text)).boot_grace_s == seconds
