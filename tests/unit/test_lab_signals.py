"""The lab's nvidia-smi for issue 30's signals: `nvlink -e` counters that grow with a fault, clock-event
reasons in -q -x, and the `mctl lab fault gpu` flags that set them (--nvlink-errors, --clock-event).

The emulator's answers go through mctl's own parsers and checks, and its shapes are those of the real
capture (tests/fixtures/real/ml-engineering-nvlink-e-h100.txt): the line form, indent and blank lines.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from mctl.checks import clocks, nvlink_errors
from mctl.errors import UsageError
from mctl.facts.nvidia_smi import parse_nvlink_errors, parse_xml
from mctl.health.signals import SignalMemory
from mctl.lab import faults as faultlib
from mctl.lab.emulators import nvidia_smi as emu
from mctl.model.findings import Severity
from mctl.model.settings import HealthSettings
from mctl.model.tray import Clock, TrayFacts
from tests.helpers import SMI_EMULATOR, contract_state, real_text


def smi(tmp_path, faults: dict, *args: str, now: float) -> str:
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    (tmp_path / "faults.json").write_text(json.dumps(faults))
    out, err = io.StringIO(), io.StringIO()
    env = {emu.STATE_ENV: str(tmp_path / "gpus.json"), emu.FAULTS_ENV: str(tmp_path / "faults.json")}
    assert emu.main(list(args), env=env, stdout=out, stderr=err, now=now) == 0, out.getvalue()
    return out.getvalue()


def test_nvlink_e_has_the_real_line_shape():
    real = real_text("ml-engineering-nvlink-e-h100.txt").splitlines()
    shape = re.compile(r"^ {9}Link \d+: [A-Za-z][A-Za-z0-9 -]*: \S+$")
    assert all(shape.match(line) for line in real[1:] if line)
    assert real[4] == ""                                       # a blank line after each link
    got = emu.render_nvlink_errors(emu.Rack(contract_state(), {}), emu.Rack(contract_state(), {}).gpus).splitlines()
    assert re.fullmatch(r"GPU 0: NVIDIA GB200 \(UUID: GPU-[^)]+\)", got[0])
    assert all(shape.match(line) for line in got if line and not line.startswith("GPU "))
    per_link = len(emu.NVLINK5_COUNTERS) + 16 + 2 + 1
    assert got[per_link] == ""


def test_the_fault_grows_one_counter_at_its_rate(tmp_path):
    doc = faultlib.apply(None, faultlib.FaultRequest(target="gpu", nvlink_errors="2:13:50"), now=1000.0)
    assert doc["nvlink_errors"] == [{"gpu": 2, "link": 13, "rate": 50.0, "since": 1000.0}]
    assert "nvlink gpu2:link13 errors 50/s" in faultlib.active(doc)
    first = parse_nvlink_errors(smi(tmp_path, doc, "nvlink", "-e", now=1010.0))
    later = parse_nvlink_errors(smi(tmp_path, doc, "nvlink", "-e", now=1070.0))
    assert first[2].links[13]["Rx Errors"] == 500 and later[2].links[13]["Rx Errors"] == 3500
    assert {v for g in later for l, c in g.links.items() for n, v in c.items()
            if n != "FEC Errors - 0" and (g.index, l, n) != (2, 13, "Rx Errors")} == {0}
    # judged over the window: 3000 in 60 s = 50/s, a warning (critical from 100/s)
    mem = SignalMemory(window_s=600)
    for when, counters in ((1010.0, first), (1070.0, later)):
        f = mem.see(TrayFacts(host="t", gpus=parse_xml(smi(tmp_path, doc, "-q", "-x", now=when)),
                              nvlink_counters=counters, boot_id="b", clock=Clock(when, None, 1.0)))
    found = nvlink_errors.check(f, None, HealthSettings())
    assert [x.severity for x in found] == [Severity.WARN] and "gpu2 link13 Rx Errors +3000 in 60s" in found[0].message
    fast = faultlib.apply(None, faultlib.FaultRequest(target="gpu", nvlink_errors="2:13:500"), now=1000.0)
    mem = SignalMemory(window_s=600)
    for when in (1010.0, 1070.0):
        f = mem.see(TrayFacts(host="t", gpus=parse_xml(smi(tmp_path, fast, "-q", "-x", now=when)), boot_id="b",
                              nvlink_counters=parse_nvlink_errors(smi(tmp_path, fast, "nvlink", "-e", now=when)),
                              clock=Clock(when, None, 1.0)))
    assert nvlink_errors.check(f, None, HealthSettings())[0].severity is Severity.CRITICAL
    assert emu.time_dependent(doc)                 # never replayed: the counter follows the clock


def test_clock_event_fault_shows_in_q_x(tmp_path):
    doc = faultlib.apply(None, faultlib.FaultRequest(target="gpu", clock_event="1:hw-power-brake"), now=1.0)
    doc = faultlib.apply(doc, faultlib.FaultRequest(target="gpu", clock_event="3:sw-power-cap"), now=2.0)
    assert "gpu1 clock event hw-power-brake" in faultlib.active(doc)
    report = parse_xml(smi(tmp_path, doc, "-q", "-x", now=5.0))
    assert [g.clock_events.active for g in report.gpus] == [(), ("hw_power_brake_slowdown",), (), ("sw_power_cap",)]
    assert {g.clock_events.element for g in report.gpus} == {"clocks_event_reasons"}
    found = clocks.check(TrayFacts(host="t", gpus=report), None, HealthSettings())
    assert [f.severity for f in found] == [Severity.WARN]
    assert faultlib.cleared(doc, "gpu").get("clock_events") is None


@pytest.mark.parametrize("req, words", [
    (faultlib.FaultRequest(target="gpu", nvlink_errors="0:3"), "GPU:LINK:RATE"),
    (faultlib.FaultRequest(target="gpu", nvlink_errors="0:18:5"), "link 18 out of range"),
    (faultlib.FaultRequest(target="gpu", nvlink_errors="4:1:5"), "GPU index 4"),
    (faultlib.FaultRequest(target="gpu", nvlink_errors="0:1:nan"), "not a rate"),
    (faultlib.FaultRequest(target="gpu", nvlink_errors="0:1:-2"), "not a rate"),
    (faultlib.FaultRequest(target="gpu", clock_event="0:slow"), "GPU:REASON"),
    (faultlib.FaultRequest(target="gpu", clock_event="9:hw-slowdown"), "GPU index 9"),
])
def test_bad_fault_flags_are_refused_with_a_hint(req, words):
    with pytest.raises(UsageError, match=words):
        faultlib.validate(req)


def test_the_health_probe_reads_the_lab_counters(tmp_path, processes):
    from mctl.facts.probe import HEALTH, parse_tray, probe_script

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} -I {SMI_EMULATOR} \"$@\"\n")
    (bindir / "nvidia-smi").chmod(0o755)
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    (tmp_path / "faults.json").write_text(json.dumps(
        faultlib.apply(None, faultlib.FaultRequest(target="gpu", nvlink_errors="0:5:3"), now=1.0)))
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", **{emu.STATE_ENV: str(tmp_path / "gpus.json"),
                                                               emu.FAULTS_ENV: str(tmp_path / "faults.json")})
    nonce = "0123456789abcdef"
    proc = subprocess.run(["/bin/sh", "-c", probe_script(HEALTH, nonce, smi_timeout=20.0)], capture_output=True,
                          text=True, env=env, timeout=120)
    facts = parse_tray(HEALTH, "t", proc.stdout, proc.stderr, nonce, smi_timeout=20.0)
    assert facts.nvlink_counters_error is None and len(facts.nvlink_counters) == 4
    assert facts.nvlink_counters[0].links[5]["Rx Errors"] > 0
