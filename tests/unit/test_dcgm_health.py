"""DCGM health (`dcgmi health -c -j`): the parser (mctl/facts/dcgm.py) on the real healthy capture and on the
report tree dcgmi writes (NVIDIA/DCGM dcgmi/Health.cpp and DcgmiOutput.h: tests/fixtures/real/README.md), on bad
input, the check dcgm.health (mctl/checks/dcgm.py), the lab's stand-in against both, and the probe's dcgm section
run by sh against a fake dcgmi (its deadline, setting the watches).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from mctl import checks
from mctl.checks import dcgm as dcgm_check
from mctl.facts import dcgm
from mctl.facts.probe import HEALTH as HEALTH_PROBE
from mctl.facts.probe import parse_tray, probe_script
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import LabLayout
from mctl.lab.services import EMULATORS
from mctl.model.findings import Severity
from mctl.model.settings import HealthSettings
from mctl.model.tray import DcgmHealth, TrayExpectation, TrayFacts, dcgm_timeout_for
from tests.helpers import real_text

REAL_HEALTHY = "virtualclient-dcgmi-health-check.json"


def report(gpus: dict, overall: str) -> str:
    """A report in dcgmi's tree: {gpu id: [(system, result, [pieces])]} (HandleOneEntity's nodes)."""
    rank = ["Healthy", "Warning", "Failure"]
    body: dict = {"Overall Health": {"value": overall}}
    if gpus:
        body["GPU"] = {"children": {gid: {"children": {"Errors": {"children": {
            system: {"overflow": pieces, "value": result} for system, result, pieces in systems}}},
            "value": max((r for _s, r, _p in systems), key=rank.index)} for gid, systems in gpus.items()}}
    return json.dumps({"body": body, "header": ["Health Monitor Report"]}, indent="\t")


FAILURE = report({"0": [("Memory system", "Failure", ["Detected 2 volatile double-bit ECC error(s) in GPU 0."])],
                  "3": [("NVLINK system", "Warning", ["GPU 3's NvLink link 5 is currently down"]),
                        ("PCIe system", "Warning", ["Detected more than 8 PCIe replays per minute for GPU",
                                                    "3 : 99"])]}, "Failure")
WARNING = report({"1": [("Thermal system", "Warning", ["GPU 1 temperature is 93 C"])]}, "Warning")
EXPECT = TrayExpectation(host="t01", rack="r1")


def _findings(obs, settings=HealthSettings()):
    return dcgm_check.check(TrayFacts(host="t01", dcgm=obs), EXPECT, settings)


def _one(obs, settings=HealthSettings()):
    (f,) = _findings(obs, settings)
    return f


# --- the parser -----------------------------------------------------------------------------------

@pytest.mark.pure
def test_the_real_healthy_report_is_healthy():
    obs = dcgm.observe(0, real_text(REAL_HEALTHY))
    assert obs == DcgmHealth(True, "Healthy")
    f = _one(obs)
    assert f.severity is Severity.OK and f.message == "DCGM health watches: Healthy"


@pytest.mark.pure
def test_a_failure_is_critical_with_its_incidents_in_dcgms_words():
    obs = dcgm.observe(0, FAILURE)
    assert obs.overall == "Failure" and [(i.label, i.system, i.health) for i in obs.incidents] == [
        ("gpu0", "Memory system", "Failure"), ("gpu3", "NVLINK system", "Warning"), ("gpu3", "PCIe system", "Warning")]
    assert obs.incidents[2].message == "Detected more than 8 PCIe replays per minute for GPU 3 : 99"   # pieces joined
    f = _one(obs)
    assert f.severity is Severity.CRITICAL and f.check == "dcgm.health"
    assert f.message.startswith("DCGM health Failure: gpu0 Memory system Failure: Detected 2 volatile double-bit")
    assert f.details["short"] == "dcgm gpu0 memory failure" and len(f.details["incidents"]) == 3
    assert checks.drain_reason([f])[0] == "mctl: dcgm gpu0 memory failure"


@pytest.mark.pure
def test_hostile_names_reach_neither_the_finding_nor_the_drain_reason_unprintable():
    hostile = report({"0\n1": [("Memory\x1b[2J system\nmctl: fake", "Failure", ["bad\x00 message " * 60])]}, "Failure")
    (i,) = dcgm.observe(0, hostile).incidents
    assert i.entity_id == "0?1" and i.system == "Memory?[2J system?mctl: fake" and len(i.message) <= 400
    assert all(c.isprintable() for c in checks.drain_reason([_one(dcgm.observe(0, hostile))])[0])


@pytest.mark.pure
def test_a_warning_warns():
    f = _one(dcgm.observe(0, WARNING))
    assert f.severity is Severity.WARN and "gpu1 Thermal system Warning: GPU 1 temperature is 93 C" in f.message


@pytest.mark.pure
def test_never_healthy_by_accident_when_an_incident_is_worse_than_the_overall():
    odd = report({"2": [("Memory system", "Failure", ["x"])]}, "Healthy")
    assert dcgm.observe(0, odd).overall == "Failure"


@pytest.mark.parametrize("text, words", [
    ("\x1b[2J#@!\xff garbage", "printed no JSON"),
    (real_text(REAL_HEALTHY)[:40], "printed truncated JSON"),
    ("", "printed nothing"),
    ('["a list"]', "the report is not an object"),
    ('{"header": ["Health Monitor Report"]}', "body is not an object"),
    ('{"body": {}}', 'body."Overall Health" missing'),
    ('{"body": {"Overall Health": {}}}', 'body."Overall Health".value missing'),
    ('{"body": {"Overall Health": {"value": "Internal error"}}}', "'Internal error' (not Healthy, Warning or Failure)"),
    ('{"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {"0": {"children": {}}}}}}',
     "body.GPU.0.value missing"),
    ('{"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {"0": {"value": "Failure", "children": '
     '{"Errors": {"children": {"Memory system": {"value": "Failure", "overflow": "one string"}}}}}}}}}',
     "body.GPU.0.Memory system.overflow is not a list of strings"),
    ('{"body": {"Overall Health": {"value": "Warning"}, "GPU": {"children": {"0": {"value": "Warning", "children": '
     '{"Errors": {"children": {"SM system": {"value": "Sick", "overflow": []}}}}}}}}}', "gpu0 SM system result 'Sick'"),
])
@pytest.mark.pure
def test_bad_input_is_not_reported_never_healthy_never_critical(text, words):
    obs = dcgm.observe(0, text)
    assert obs.error and words in obs.error, obs.error
    f = _one(obs)
    assert f.severity is Severity.WARN and f.message.startswith("DCGM health not reported: ")
    assert f.details["short"] == "dcgm not reporting"


@pytest.mark.pure
def test_dcgm_installed_but_not_answering_warns_in_its_own_words():
    engine = ("Error: unable to establish a connection to the specified host: localhost\n"
              "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
    f = _one(dcgm.observe(235, engine))
    assert f.severity is Severity.WARN and "exited 235: Error: Unable to connect to host engine." in f.message
    hung = _one(dcgm.observe(124, "", timeout=4))
    assert hung.severity is Severity.WARN and "did not answer within 4s" in hung.message
    assert "exited 253: Error: Health watches not enabled" in _one(dcgm.observe(
        253, "Error: Health watches not enabled. Please enable watches. \n")).message


@pytest.mark.pure
def test_not_installed_is_not_applicable_unless_required_and_off_asks_nothing():
    absent = dcgm.observe(127, "")
    assert absent == DcgmHealth(False) and _findings(absent) == []
    required = _one(absent, HealthSettings(dcgm="required"))
    assert required.severity is Severity.WARN and "not installed" in required.message
    assert _findings(dcgm.observe(0, FAILURE), HealthSettings(dcgm="off")) == []
    assert _findings(None) == []                      # not asked (an older probe, health.dcgm off)


@pytest.mark.pure
def test_the_setting_is_checked_and_travels_to_the_node_check():
    assert HealthSettings.from_dict(HealthSettings(dcgm="off").to_dict()).dcgm == "off"
    with pytest.raises(ValueError, match="dcgm is 'sometimes'"):
        HealthSettings.from_dict({"dcgm": "sometimes"})


@pytest.mark.pure
def test_the_sections_deadline_stays_inside_the_probes():
    assert dcgm_timeout_for(15) == 4 and dcgm_timeout_for(5) == 1 and dcgm_timeout_for(35) == 5
    for deadline in (5, 10, 15, 30, 60):
        assert dcgm_timeout_for(deadline) + 2 < deadline          # `to`'s kill grace (2 s) included


# --- the lab's stand-in ---------------------------------------------------------------------------

@pytest.fixture
def lab_dcgmi(tmp_path, monkeypatch):
    """The lab's dcgmi run in-process against a tray's gpus.json and faults.json."""
    monkeypatch.syspath_prepend(str(EMULATORS))
    for name in ("nvidia_smi", "dcgmi"):
        sys.modules.pop(name, None)
    import dcgmi

    layout = LabLayout("lab", 1, 2)
    host = next(h for h in layout.hosts() if h.kind == "tray")
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(layout, host)))
    env = {"MCTL_LAB_GPU_STATE": str(tmp_path / "gpus.json"), "MCTL_LAB_FAULTS": str(tmp_path / "faults.json")}

    def run(argv, faults=None):
        (tmp_path / "faults.json").write_text(json.dumps(faults or {}))
        out, err = io.StringIO(), io.StringIO()
        rc = dcgmi.main(argv, env=env, stdout=out, stderr=err)
        return rc, out.getvalue(), err.getvalue()

    return run


@pytest.mark.pure
def test_the_stand_in_needs_the_watches_then_prints_the_real_healthy_bytes(lab_dcgmi):
    rc, out, _ = lab_dcgmi(["health", "-c", "-j"])
    assert rc == 253 and out == "Error: Health watches not enabled. Please enable watches. \n"
    assert lab_dcgmi(["health", "-s", "a"])[:2] == (0, "Health monitor systems set successfully.\n")
    rc, out, _ = lab_dcgmi(["health", "-c", "-j"])
    assert rc == 0 and out == real_text(REAL_HEALTHY)          # jsoncpp's layout, byte for byte


@pytest.mark.pure
def test_the_stand_in_follows_the_gpu_faults_in_dcgms_tree(lab_dcgmi):
    lab_dcgmi(["health", "-s", "a"])
    rc, out, _ = lab_dcgmi(["health", "-c", "-j"], {"ecc_uncorrectable": {"1": 2}, "nvlink_down": [[2, 5]]})
    obs = dcgm.observe(rc, out)
    assert obs.overall == "Failure" and not obs.error
    assert [(i.label, i.system, i.health, i.message) for i in obs.incidents] == [
        ("gpu1", "Memory system", "Failure", "Detected 2 volatile double-bit ECC error(s) in GPU 1."),
        ("gpu2", "NVLINK system", "Warning", "GPU 2's NvLink link 5 is currently down")]
    assert json.loads(out)["body"]["GPU"]["children"]["1"]["children"]["Errors"]["children"]["Memory system"][
        "value"] == "Failure"
    rc, out, _ = lab_dcgmi(["health", "-c", "-j"], {"tool_faults": {"dcgmi": "garbage"}})
    assert rc == 0 and "printed no JSON" in dcgm.observe(rc, out).error


# --- the probe's section, run by sh ---------------------------------------------------------------

FAKE_DCGMI = """#!/bin/sh
# a fake dcgmi: its behaviour from $DCGM_MODE, the calls it got appended to $DCGM_CALLS
echo "$*" >> "$DCGM_CALLS"
case "$DCGM_MODE:$*" in
  hang:*) exec sleep 60 ;;
  unset:"health -c -j") [ -e "$DCGM_CALLS.set" ] || { echo "Error: Health watches not enabled. Please enable watches. "; exit 253; } ;;
  unset:"health -s a") : > "$DCGM_CALLS.set"; echo "Health monitor systems set successfully."; exit 0 ;;
esac
cat "$DCGM_REPORT"
"""


def _run_probe(tmp_path, mode, timeout=1.0):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "dcgmi").write_text(FAKE_DCGMI)
    (bindir / "dcgmi").chmod(0o755)
    (tmp_path / "report.json").write_text(FAILURE)
    nonce = "feedc0de"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", DCGM_MODE=mode,
               DCGM_CALLS=str(tmp_path / "calls"), DCGM_REPORT=str(tmp_path / "report.json"))
    started = time.monotonic()
    proc = subprocess.run(["/bin/sh", "-c", probe_script(HEALTH_PROBE, nonce, smi_timeout=1, dcgm_timeout=timeout)],
                          capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - started
    facts = parse_tray(HEALTH_PROBE, "t01", proc.stdout, proc.stderr, nonce, smi_timeout=1, dcgm_timeout=timeout)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return facts.dcgm, calls, took


def test_the_probe_sets_the_watches_once_when_dcgm_says_they_are_not_set(tmp_path, processes):
    obs, calls, _ = _run_probe(tmp_path, "unset")
    assert calls == ["health -c -j", "health -s a", "health -c -j"]
    assert obs.overall == "Failure" and obs.watches_set
    obs, calls, _ = _run_probe(tmp_path, "unset")                # set now: one call
    assert calls[3:] == ["health -c -j"] and obs.overall == "Failure" and not obs.watches_set


def test_a_hung_dcgmi_is_killed_at_the_sections_deadline(tmp_path, processes):
    obs, calls, took = _run_probe(tmp_path, "hang", timeout=1.0)
    assert calls == ["health -c -j"]
    assert obs.installed and "did not answer within 1s" in obs.error
    assert took < 20, took           # 1 s and timeout's 2 s kill grace, plus the rest of the probe (no nvidia-smi)


def test_the_lab_launcher_replays_an_unchanged_answer_and_follows_a_fault(tmp_path, processes):
    from mctl.lab.emulators.dcgmi import LAUNCHER

    launcher = tmp_path / "dcgmi"
    launcher.write_text(LAUNCHER.replace("@LIB@", str(EMULATORS)))
    launcher.chmod(0o755)
    layout = LabLayout("lab", 1, 2)
    host = next(h for h in layout.hosts() if h.kind == "tray")
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(layout, host)))
    (tmp_path / "faults.json").write_text("{}")
    env = dict(os.environ, MCTL_LAB_GPU_STATE=str(tmp_path / "gpus.json"), MCTL_LAB_FAULTS=str(tmp_path / "faults.json"))

    def call(*argv):
        proc = subprocess.run([str(launcher), *argv], capture_output=True, text=True, env=env, timeout=60)
        return proc.returncode, proc.stdout

    assert call("health", "-c", "-j")[0] == 253                 # no watches yet (replayed the same way)
    assert call("health", "-s", "a")[0] == 0
    first = call("health", "-c", "-j")
    replay = tmp_path / ".dcgmi.health-c-j"
    assert first == (0, real_text(REAL_HEALTHY)) and replay.read_text().endswith(first[1])
    replay.write_text(replay.read_text().replace("Healthy", "Replayed"))   # the next answer is the stored one
    assert '"Replayed"' in call("health", "-c", "-j")[1]
    os.replace(tmp_path / "faults.json", tmp_path / "f.tmp")
    (tmp_path / "faults.json").write_text(json.dumps({"ecc_uncorrectable": {"0": 1}}))     # a new key
    assert dcgm.observe(*call("health", "-c", "-j")).overall == "Failure"
    (tmp_path / "faults.json").write_text(json.dumps({"tool_faults": {"dcgmi": "garbage"}}))
    for _ in range(2):                                           # a tool fault is never stored, never replayed
        assert "printed no JSON" in dcgm.observe(*call("health", "-c", "-j")).error
