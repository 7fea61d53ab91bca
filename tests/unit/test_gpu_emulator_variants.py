"""The lab's nvidia-smi emits the real variants: compared with the real captures in tests/fixtures/real/lab-forms.

The emulator is run as the trays run it (a subprocess on state files, or through the shell launcher that
replays unchanged answers); shapes are compared with the real samples (same line format, same element
names), not with the emulator's own earlier output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mctl.facts.kernel_log import parse_xid_line
from mctl.lab import faults as faultlib
from mctl.lab.emulators import nvidia_smi as emu
from mctl.model.findings import Severity
from tests.helpers import SMI_EMULATOR, EmulatedTray, contract_state

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real" / "lab-forms"
GB200_BUS = "00000018:01:00.0"           # the PCI address of the real GB200 samples (0018:01:00)
NVLINK5_SHAPE = re.compile(r"^NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): (14[4-9]|150), "
                           r"([A-Z0-9_]+)\s+(Fatal|Nonfatal)\s+XC\d i\d Link -?\d+ \(0x[0-9a-f]{8}( 0x[0-9a-f]{8})*\)$")
SYSLOG_PREFIX = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: \[\s*\d+\.\d{6}\] ")


def real(name: str) -> str:
    return (REAL / name).read_text()


def message(line: str) -> str:
    """A kern.log line without its rsyslog and uptime prefix."""
    m = SYSLOG_PREFIX.match(line)
    assert m, line
    return line[m.end():]


# --- nvlink --status: all links down ---------------------------------------------------------------

def test_all_links_down_prints_the_real_nvml_text_under_the_gpu_line(tmp_path, processes):
    t = EmulatedTray(tmp_path, contract_state(), {"nvlink_all_down": [1]})
    out = t.out("nvlink", "--status").splitlines()
    sample = real("nvlink-status-all-inactive-b200.txt").splitlines()
    i = out.index(next(line for line in out if line.startswith("GPU 1: ")))
    assert re.fullmatch(r"GPU \d+: NVIDIA [A-Z0-9]+ \(UUID: GPU-[^)]+\)", sample[0])
    assert re.fullmatch(r"GPU 1: NVIDIA GB200 \(UUID: GPU-[^)]+\)", out[i])
    assert out[i + 1] == sample[1] == emu.NVLINK_ALL_INACTIVE_TEXT          # same text, column 0, no links
    assert out[i + 2].startswith("GPU 2: ")
    assert sum(line.startswith("\t Link ") for line in out) == 3 * emu.NVLINKS_PER_GPU
    # the other forms agree: the GPU is still enumerated, its fabric bandwidth degraded
    tree = ET.fromstring(t.out("-q", "-x"))
    bw = [g.findtext("fabric/health/bandwidth") for g in tree.findall("gpu")]
    assert bw == ["Full", "Degraded", "Full", "Full"]
    assert len(t.out("-L").splitlines()) == 4


def test_nvlink_down_gpu_all_is_a_fault_request():
    doc = faultlib.apply(None, faultlib.FaultRequest(nvlink_down="2:all"), now=1.0)
    assert doc["nvlink_all_down"] == [2] and doc["nvlink_down"] == []
    assert "nvlink gpu2:all links down" in faultlib.active(doc)
    with pytest.raises(Exception, match="GPU index 4 out of range"):
        faultlib.validate(faultlib.FaultRequest(nvlink_down="4:all"))


# --- kernel log: NVLink5, 154, fallen off the bus ------------------------------------------------

@pytest.mark.parametrize("sample, code, nonfatal, link", [
    ("xid145-rlw-rxpipe-nonfatal.txt", 145, True, 13),
    ("xid149-netir-link-evt-fatal.txt", 149, False, 9),
    ("xid149-netir-ber-event-nonfatal.txt", 149, True, 3),
])
def test_nvlink5_lines_are_the_real_lines(sample, code, nonfatal, link):
    line = emu.event_line("lab-r1-tray03", GB200_BUS, code, 1764441497.5, uptime=171167.620236,
                          nonfatal=nonfatal, link=link)
    assert message(line) == real(sample).rstrip("\n")
    event = parse_xid_line(line)
    assert (event.code, event.pci, event.pid) == (code, "0018:01:00", None)


@pytest.mark.parametrize("code", range(144, 151))
@pytest.mark.parametrize("nonfatal", [False, True])
def test_every_nvlink5_code_has_the_real_shape(code, nonfatal):
    text = message(emu.event_line("h", GB200_BUS, code, 1.0, uptime=1.0, nonfatal=nonfatal, link=5))
    m = NVLINK5_SHAPE.match(text)
    assert m, text
    assert m.group(3) == ("Nonfatal" if nonfatal else "Fatal")
    for name in ("xid145-rlw-rxpipe-nonfatal.txt", "xid149-netir-link-evt-fatal.txt"):
        assert NVLINK5_SHAPE.match(real(name).rstrip("\n"))      # the pattern is the real lines' shape


def test_xid_154_carries_the_recovery_action_the_real_way():
    sample = real("journal-xid149-then-154-gb200.txt").splitlines()[1]
    line = emu.event_line("coastline-turtle-cn02", GB200_BUS, 154, 1.0, uptime=1.0)
    assert message(line) == sample[sample.index("NVRM: "):]
    assert "to 0x1 (GPU Reset Required)" in emu.event_line("h", GB200_BUS, 154, 1.0, uptime=1.0, recovery="reset")
    assert "to 0x2 (Node Reboot Required)" in emu.event_line("h", GB200_BUS, 154, 1.0, uptime=1.0, recovery="reboot")


def test_nvlink5_severity_and_154_show_in_nvidia_smi(tmp_path, processes):
    t = EmulatedTray(tmp_path, contract_state(), {"xid": [{"gpu": 0, "code": 145, "nonfatal": True, "time": 1.0},
                                                 {"gpu": 1, "code": 149, "nonfatal": False, "time": 1.0},
                                                 {"gpu": 2, "code": 154, "recovery": "drain-reset", "time": 1.0}]})
    tree = ET.fromstring(t.out("-q", "-x"))
    assert [g.findtext("gpu_recovery_action") for g in tree.findall("gpu")] == \
        ["None", "Reset", "Drain and Reset", "None"]


def test_fell_off_bus_lines_follow_the_real_message():
    lines = emu.fell_off_bus_lines("lab-r1-tray03", "00000000:B3:00.0", "26b5", when=1.0, uptime=1843.308145)
    texts = [message(line) for line in lines]
    dmesg = [re.sub(r"^\[\s*\d+\.\d+\] |^\s+", "", line) for line in real("dmesg-fallen-off-bus-no-xid.txt").splitlines()]
    assert texts[:3] == dmesg[:3]                                  # the three-line printk, word for word
    assert texts[4] == dmesg[3]                                    # "The NVIDIA probe routine failed ..."
    probe = [re.sub(r"^\[\s*\d+\.\d+\] |^\s+", "", line) for line in real("dmesg-fallen-off-bus-h100-probe.txt").splitlines()]
    assert re.sub(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", "PCI", texts[3]) == \
        re.sub(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", "PCI", probe[3])
    assert all("Xid" not in line for line in lines)
    assert all(parse_xid_line(line) is None for line in lines)
    # the three lines of one printk carry one time stamp, as the kernel's syslog interface prints them
    assert len({line[:line.index("] ") + 1] for line in lines[:3]}) == 1


def test_fell_off_bus_gpu_is_lost_in_nvidia_smi(tmp_path, processes):
    t = EmulatedTray(tmp_path, contract_state(), {"fell_off_bus": [2]})
    proc = t.run("-q", "-x")
    assert proc.stderr.strip() == "Unable to determine the device handle for GPU2: 0018:01:00.0: Unknown Error"
    tree = ET.fromstring(proc.stdout)
    assert tree.findtext("attached_gpus") == "4" and len(tree.findall("gpu")) == 3
    assert "GPU 2:" not in t.out("nvlink", "--status")


# --- driver branches --------------------------------------------------------------------------------

def _children(elem):
    return [c.tag for c in elem]


def test_r535_power_readings_follow_the_real_r535_shape(tmp_path, processes):
    sample = ET.fromstring("<gpu>" + real("q-x-r53x-power-readings-excerpt.xml") + "</module_power_readings></gpu>")
    t = EmulatedTray(tmp_path, contract_state(), {"driver_branch": "535"})
    tree = ET.fromstring(t.out("-q", "-x"))
    assert tree.findtext("driver_version").startswith("535.")
    gpu = tree.find("gpu")
    for tag in ("gpu_power_readings", "gpu_memory_power_readings", "module_power_readings"):
        assert _children(gpu.find(tag)) == _children(sample.find(tag)), tag
    assert gpu.findtext("gpu_power_readings/power_draw").endswith(" W")
    assert "Power Draw" in t.out("-q")


def test_r580_ecc_section_follows_the_real_r580_shape(tmp_path, processes):
    t = EmulatedTray(tmp_path, contract_state(), {"driver_branch": "580"})
    sample = real("q-r580-ecc-excerpt.txt").splitlines()
    text = t.out("-q").splitlines()

    def ecc_labels(lines):
        start = next(i for i, line in enumerate(lines) if line.strip() == "ECC Errors")
        end = next(i for i, line in enumerate(lines) if line.strip() == "Retired Pages")
        return [(len(line) - len(line.lstrip()), line.split(":")[0].strip()) for line in lines[start:end]]

    assert ecc_labels(text) == ecc_labels(sample)                    # same labels, same nesting, same order
    gpu = ET.fromstring(t.out("-q", "-x")).find("gpu")
    assert _children(gpu.find("ecc_errors"))[-3:] == ["channel_repair_pending", "tpc_repair_pending",
                                                      "unrepairable_memory"]
    assert gpu.find("ecc_errors/aggregate/sram_threshold_exceeded") is not None
    assert ET.fromstring(t.out("-q", "-x")).findtext("driver_version").startswith("580.")


def test_branch_comes_from_gpus_json_and_the_fault_overrides_it(tmp_path, processes):
    t = EmulatedTray(tmp_path, contract_state(driver_branch="580"))
    assert ET.fromstring(t.out("-q", "-x")).find("gpu/ecc_errors/tpc_repair_pending") is not None
    t = EmulatedTray(tmp_path, contract_state(driver_branch="580"), {"driver_branch": "570"})
    tree = ET.fromstring(t.out("-q", "-x"))
    assert tree.find("gpu/ecc_errors/tpc_repair_pending") is None
    assert tree.find("gpu/gpu_power_readings/average_power_draw") is not None      # the real R570 capture's
    with pytest.raises(Exception, match="not an emulated branch"):
        faultlib.validate(faultlib.FaultRequest(driver_branch="999"))


# --- flapping links, storms ------------------------------------------------------------------------

def test_flapping_link_follows_the_clock(tmp_path, processes):
    # The rule at given instants (down the first half of each period), then the emulator itself with a period
    # long enough that no load on the machine moves the answer across a half period.
    from mctl.lab.emulators.nvidia_smi import flapping_down

    flap = {"nvlink_flap": [{"gpu": 0, "link": 5, "since": 100.0, "period": 6.0}]}
    assert [flapping_down(flap, 0, now) for now in (101.0, 104.0, 107.0, 110.5)] == [[5], [], [5], []]
    assert flapping_down(flap, 1, 101.0) == []
    now = time.time()
    for since, down in ((now - 1.0, True), (now - 301.0, False), (now - 601.0, True)):
        t = EmulatedTray(tmp_path, contract_state(), {"nvlink_flap": [{"gpu": 0, "link": 5, "since": since, "period": 600.0}]})
        out = t.out("nvlink", "--status")
        assert ("\t Link 5: <inactive>" in out) is down, since - now


def test_time_dependent_answers_are_not_stored_for_replay(tmp_path):
    replay = tmp_path / ".nvidia-smi.nvlink-status"
    env = {emu.STATE_ENV: str(tmp_path / "gpus.json"), emu.FAULTS_ENV: str(tmp_path / "faults.json"),
           emu.REPLAY_FILE_ENV: str(replay), emu.REPLAY_KEY_ENV: "k"}
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    (tmp_path / "faults.json").write_text(json.dumps({"nvlink_flap": [{"gpu": 0, "link": 5, "since": 1.0}]}))
    assert emu.main(["nvlink", "--status"], env=env, stdout=open(os.devnull, "w")) == 0
    assert not replay.exists()
    (tmp_path / "faults.json").write_text("{}")
    assert emu.main(["nvlink", "--status"], env=env, stdout=open(os.devnull, "w")) == 0
    assert replay.exists()


def test_storm_appends_bounded_lines_per_call(tmp_path):
    kern = tmp_path / "kern.log"
    env = {emu.FAULTS_ENV: str(tmp_path / "faults.json"), emu.KERN_LOG_ENV: str(kern)}
    now = 1_764_441_497.0
    storm = {"xid_storm": [{"gpu": 2, "code": 145, "nonfatal": True, "since": now - 10}]}
    emu.storm_append(contract_state(), storm, env, now)
    lines = kern.read_text().splitlines()
    assert len(lines) == 10 * emu.STORM_RATE
    assert all(parse_xid_line(line).code == 145 and "RLW_RXPIPE Nonfatal" in line for line in lines)
    assert all(parse_xid_line(line).pci == "0018:01:00" for line in lines)
    emu.storm_append(contract_state(), storm, env, now)                      # nothing new in no time
    assert len(kern.read_text().splitlines()) == len(lines)
    emu.storm_append(contract_state(), storm, env, now + 10_000)             # hours later: bounded
    assert len(kern.read_text().splitlines()) == len(lines) + emu.STORM_MAX_APPEND


def test_xid_storm_fault_requests():
    doc = faultlib.apply(None, faultlib.FaultRequest(xid_storm=145, gpu=1, nonfatal=True), now=5.0)
    assert doc["xid_storm"] == [{"gpu": 1, "code": 145, "since": 5.0, "nonfatal": True}]
    assert faultlib.active(doc) == ["xid storm 145 nonfatal gpu1"]
    for req, words in ((faultlib.FaultRequest(xid_storm=145), "need --gpu"),
                       (faultlib.FaultRequest(xid=79, gpu=0, nonfatal=True), "--nonfatal goes with"),
                       (faultlib.FaultRequest(xid=79, gpu=0, recovery_action="reset"), "goes with --xid 154"),
                       (faultlib.FaultRequest(xid=154, gpu=0, recovery_action="pray"), "unknown action"),
                       (faultlib.FaultRequest(nvlink_flap="0:99"), "link 99 out of range"),
                       (faultlib.FaultRequest(smi_hang=True, clear=True), "cannot be combined")):
        with pytest.raises(Exception) as exc:
            faultlib.validate(req)
        assert words in str(exc.value.message) + str(getattr(exc.value, "hint", "")), req
    assert faultlib.apply(doc, faultlib.FaultRequest(clear=True), now=6.0) == faultlib.empty()


# --- nvidia-smi hang, through the launcher too -------------------------------------------------------

def _launcher(tmp_path: Path) -> Path:
    script = tmp_path / "nvidia-smi"
    script.write_text(emu.LAUNCHER.replace("@LIB@", str(SMI_EMULATOR.parent)))
    script.chmod(0o755)
    return script


def _run_launcher(script, tmp_path, *args, timeout):
    env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LC_ALL": "C",
           emu.STATE_ENV: str(tmp_path / "gpus.json"), emu.FAULTS_ENV: str(tmp_path / "faults.json")}
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _write_faults(tmp_path: Path, doc: dict) -> None:
    new = tmp_path / "faults.json.new"
    new.write_text(json.dumps(doc))
    new.replace(tmp_path / "faults.json")                                    # atomic, as `mctl lab fault`


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="the launcher runs /usr/bin/python3")
def test_smi_hang_blocks_even_an_answer_the_launcher_would_replay(tmp_path, processes):
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    _write_faults(tmp_path, {})
    script = _launcher(tmp_path)
    first = _run_launcher(script, tmp_path, "nvlink", "--status", timeout=30)
    assert first.returncode == 0 and (tmp_path / ".nvidia-smi.nvlink-status").exists()   # stored for replay
    assert _run_launcher(script, tmp_path, "nvlink", "--status", timeout=30).stdout == first.stdout
    _write_faults(tmp_path, {"smi_hang": True})
    for args in (("nvlink", "--status"), ("-q", "-x"), ("-L",)):
        with pytest.raises(subprocess.TimeoutExpired):
            _run_launcher(script, tmp_path, *args, timeout=2)
    # a call that is stuck returns once the wedge is cleared
    timer = threading.Timer(1.0, _write_faults, (tmp_path, {}))
    timer.start()
    try:
        back = _run_launcher(script, tmp_path, "nvlink", "--status", timeout=30)
    finally:
        timer.join()
    assert back.returncode == 0 and back.stdout == first.stdout


# --- the probe reads a bounded tail of kern.log ---------------------------------------------------------

def _xid_function(log: Path, max_bytes: int) -> str:
    from mctl.facts import shell

    body = shell.FUNCTIONS["xid"].replace("/var/log/kern.log", str(log))
    return body.replace("@XID_BYTES@", str(max_bytes)).replace("@XID_TAIL@", str(shell.XID_TAIL)) + "\nxid\n"


def test_the_xid_probe_reads_only_the_tail_of_a_stormed_kern_log(tmp_path, processes):
    from mctl.facts import shell

    log = tmp_path / "kern.log"
    state = contract_state()
    old = emu.event_line("lab-r1-tray03", GB200_BUS, 79, 1.0, uptime=1.0)
    storm = emu.storm_lines(state, {"gpu": 2, "code": 145, "nonfatal": True}, 20_000, 100.0, 1100.0)
    log.write_text(old + "\n" + "\n".join(storm) + "\n")
    assert log.stat().st_size > 1_000_000
    t0 = time.monotonic()
    proc = subprocess.run(["/bin/sh", "-c", _xid_function(log, 256 << 10)], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30
    lines = proc.stdout.splitlines()
    assert lines[0] == f"source={log}" and len(lines) == 1 + shell.XID_TAIL
    assert all(parse_xid_line(line) is not None and parse_xid_line(line).code == 145 for line in lines[1:])
    assert lines[-1] == storm[-1]
    # a log shorter than the bound is read whole, first line included
    log.write_text(old + "\n" + storm[0] + "\n")
    proc = subprocess.run(["/bin/sh", "-c", _xid_function(log, 256 << 10)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[1:] == [old, storm[0]]
    # the first line of the tail, cut in the middle, is dropped: no XID without its time stamp
    proc = subprocess.run(["/bin/sh", "-c", _xid_function(log, len(storm[0]) + 20)], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.splitlines()[1:] == [storm[0]]
    assert shell.XID_BYTES == 4 << 20


def test_a_storm_has_the_lasting_effect_of_its_code(tmp_path, processes):
    now = time.time()
    faults = {"xid_storm": [{"gpu": 0, "code": 149, "nonfatal": False, "since": now},
                            {"gpu": 1, "code": 145, "nonfatal": True, "since": now}]}
    env_log = tmp_path / "kern.log"
    t = EmulatedTray(tmp_path, contract_state(), faults)
    proc = subprocess.run([__import__("sys").executable, "-I", str(SMI_EMULATOR), "-q", "-x"], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", emu.STATE_ENV: str(t.state_path),
                                           emu.FAULTS_ENV: str(t.faults_path), emu.KERN_LOG_ENV: str(env_log)})
    tree = ET.fromstring(proc.stdout)
    assert [g.findtext("gpu_recovery_action") for g in tree.findall("gpu")] == ["Reset", "None", "None", "None"]


# --- the health probe meets the variants (the real probe script, run by /bin/sh here) -------------------

def _probe(tmp_path, faults, smi_timeout=20.0):
    import sys

    from mctl.facts.probe import HEALTH, parse_tray, probe_script

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} -I {SMI_EMULATOR} \"$@\"\n")
    smi.chmod(0o755)
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    _write_faults(tmp_path, faults)
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", **{emu.STATE_ENV: str(tmp_path / "gpus.json"),
                                                               emu.FAULTS_ENV: str(tmp_path / "faults.json"),
                                                               emu.KERN_LOG_ENV: str(tmp_path / "kern.log")})
    nonce = "0123456789abcdef"
    body = probe_script(HEALTH, nonce, smi_timeout=smi_timeout, disk_paths=("/",))
    proc = subprocess.run(["/bin/sh", "-c", body], capture_output=True, text=True, env=env, timeout=120)
    return parse_tray(HEALTH, "lab-r1-tray03", proc.stdout, proc.stderr, nonce, disk_paths=("/",), smi_timeout=smi_timeout)


def _judge(facts):
    from mctl import checks
    from mctl.model.tray import TrayExpectation
    from mctl.model.settings import HealthSettings

    expect = TrayExpectation("lab-r1-tray03", "r1", driver_version="570.148.08",
                             nvlink_domain=contract_state()["cluster_uuid"])
    return checks.run_tray(facts, expect, HealthSettings(imex="ignore"))


def test_probe_on_a_hung_nvidia_smi_ends_within_its_timeout_and_is_not_healthy(tmp_path, processes):
    t0 = time.monotonic()
    facts = _probe(tmp_path, {"smi_hang": True}, smi_timeout=2.0)
    assert time.monotonic() - t0 < 30
    assert facts.gpus is None and "hung" in (facts.gpu_error or "")
    assert any(f.severity is Severity.CRITICAL for f in _judge(facts))


def test_probe_on_all_links_down_is_not_healthy(tmp_path, processes):
    found = _judge(_probe(tmp_path, {"nvlink_all_down": [0]}))
    nvlink = [f for f in found if f.check == "nvlink.links"]
    assert nvlink and all(f.severity is not Severity.OK for f in nvlink)
