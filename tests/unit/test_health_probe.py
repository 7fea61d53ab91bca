"""The health probe script run by /bin/sh here, with the lab's nvidia-smi emulator as nvidia-smi.

The emulator is a real program (the one lab trays run) reading a gpus.json/faults.json pair, so
the script's sections, its framing and the parsers meet real output; /proc, df and dmesg are
this machine's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mctl import checks
from mctl.model.tray import TrayExpectation
from mctl.facts import shell
from mctl.facts.probe import (HEALTH, NODE_CHECK, RC_ABSENT, Section, imex_observation, parse_clock, parse_df,
                               parse_meminfo, parse_tray, probe_script)
from mctl.model.settings import HealthSettings
from mctl.lab.emulators import nvidia_smi as emu
from mctl.model.findings import Severity
from mctl.facts import FactsParseError

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "mctl" / "lab" / "emulators" / "nvidia_smi.py"
DOMAIN = "3f5c1a9e-2b7d-5e04-8c61-9d2a4b7e0f13"
BUSES = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")
NONCE = "0123456789abcdef"


def gpus_json() -> dict:
    return {"schema": 1, "hostname": "t01", "driver_version": "570.148.08", "cuda_version": "12.8",
            "product_name": "NVIDIA GB200", "chassis_serial": "1825024170029", "tray_index": 0, "slot_number": 1,
            "host_id": 1, "cluster_uuid": DOMAIN, "clique_id": 32766, "fabric_state": "Completed",
            "fabric_status": "Success",
            "gpus": [{"index": i, "uuid": f"GPU-{i:08x}-7c3e-5a1b-9d2f-4e6a8b0c1d2e", "serial": f"16550240001{i}",
                      "pci_bus_id": bus, "module_id": i + 1, "minor_number": i, "gpu_fabric_guid": f"0x98{i:02x}",
                      "memory_total_mib": 189471, "power_limit_w": 1200.0, "temperature_c": 33 + i}
                     for i, bus in enumerate(BUSES)]}


@pytest.fixture
def tray(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} -I {EMULATOR} \"$@\"\n")
    smi.chmod(0o755)
    state, faults = tmp_path / "gpus.json", tmp_path / "faults.json"
    state.write_text(json.dumps(gpus_json()))

    def probe(fault: dict | None = None, *, paths=("/", "/tmp")):
        faults.write_text(json.dumps(fault or {}))
        env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", **{emu.STATE_ENV: str(state),
                                                                   emu.FAULTS_ENV: str(faults)})
        body = probe_script(HEALTH, NONCE, smi_timeout=20, disk_paths=paths)
        proc = subprocess.run(["/bin/sh", "-c", body], capture_output=True, text=True, env=env, timeout=90)
        return parse_tray(HEALTH, "t01", proc.stdout, proc.stderr, NONCE, disk_paths=paths, smi_timeout=20)

    return probe


def judge(facts):
    expect = TrayExpectation("t01", "r1", driver_version="570.148.08", nvlink_domain=DOMAIN)
    return checks.run_tray(facts, expect, HealthSettings(imex="auto"))


def test_healthy_tray_through_the_real_script(tray, processes):
    facts = tray()
    assert facts.problems == () and facts.gpu_error is None
    assert len(facts.gpus.gpus) == 4 and facts.gpus.driver_version == "570.148.08"
    assert [len(g.links) for g in facts.nvlinks] == [18] * 4
    assert facts.clock is not None and facts.clock.uptime > 0 and abs(facts.clock.epoch - __import__("time").time()) < 60
    assert [d.path for d in facts.disks] == ["/", "/tmp"] and facts.memory.total_kib > 0
    assert facts.imex is not None and facts.imex.configured is (Path("/etc/nvidia-imex/config.cfg").exists())
    assert facts.xid_source in ("/var/log/kern.log", "dmesg")
    found = judge(facts)
    bad = [f for f in found if f.severity is not Severity.OK and f.check not in ("host.disk", "host.memory")]
    assert bad == []


def test_faulted_tray_through_the_real_script(tray, processes):
    facts = tray({"gpu_missing": [], "nvlink_down": [[2, 9]], "ecc_uncorrectable": {"1": 3},
                  "xid": [{"gpu": 0, "code": 79, "time": 0}]})
    assert len(facts.gpus.gpus) == 3 and facts.gpus.attached_gpus == 4
    assert any("Unable to determine the device handle" in m for m in facts.gpu_messages)
    found = {f.check for f in judge(facts) if f.severity is Severity.CRITICAL}
    assert {"gpu.count", "nvlink.links", "gpu.ecc", "gpu.recovery"} <= found


def test_driver_gone(tray, tmp_path, processes):
    (tmp_path / "gpus.json").unlink()
    facts = tray()
    assert facts.gpus is None and "could not communicate with the NVIDIA driver" in facts.gpu_error
    assert [f.check for f in judge(facts) if f.severity is Severity.CRITICAL] == ["gpu.facts"]


def test_ssh_command_wraps_the_script_for_any_login_shell():
    body = probe_script(HEALTH, NONCE, smi_timeout=5)
    cmd = shell.command(body)
    assert cmd.startswith("exec /bin/sh -c '") and "::mctl-" + NONCE in cmd
    assert "sec nvidia-smi smi -q -x" in body and "smi nvlink --status" in body and "sec nvlink nvl" in body
    without = probe_script(NODE_CHECK, NONCE, smi_timeout=5)     # the node check read NVML instead
    assert "sec nvidia-smi" not in without and "sec nvlink" not in without


def test_small_parsers():
    clock = parse_clock("1764441600 2025-11-29T18:40:00\n3600.52\n")
    assert (clock.epoch, clock.local.hour, clock.uptime) == (1764441600.0, 18, 3600.52)
    # nanoseconds: two sweeps within one second still differ; a date without %N counts whole seconds
    assert parse_clock("1764441600.250000000 2025-11-29T18:40:00\n3600.52\n").epoch == 1764441600.25
    assert parse_clock("1764441600.N 2025-11-29T18:40:00\n3600.52\n").epoch == 1764441600.0
    with pytest.raises(FactsParseError):
        parse_clock("1764441600x 2025-11-29T18:40:00\n3600.52\n")
    df = parse_df("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                  "/dev/vda1 264212084 23193000 83197912 22% /\n"
                  "tmpfs 1000 990 10 99% /run/my mount\n")
    assert [(d.mount, round(d.used_pct)) for d in df] == [("/", 22), ("/run/my mount", 99)]
    mem = parse_meminfo("MemTotal 24683656\nMemAvailable 23650460\n")
    assert round(mem.available_pct) == 96


def test_imex_sections():
    assert imex_observation(Section("imex-query", "", RC_ABSENT), None).configured is False
    obs = imex_observation(Section("imex-query", "", 127), Section("imex-domain", "", 127))
    assert obs.configured and "not installed" in obs.error
    domain = json.dumps({"nodes": {
        "0": {"status": "READY", "host": "10.0.0.1", "hostName": "t01", "version": "570.172",
              "connections": {"0": {"status": "CONNECTED"}, "1": {"status": "DISCONNECTED"}}},
        "1": {"status": "READY", "host": "10.0.0.2", "hostName": "t02", "version": "570.172",
              "connections": {"0": {"status": "DISCONNECTED"}, "1": {"status": "CONNECTED"}}}},
        "timestamp": "9/4/2026 00:37:39.905", "status": "DEGRADED"})
    obs = imex_observation(Section("imex-query", "READY\n", 0), Section("imex-domain", domain, 0))
    assert (obs.daemon_state, obs.domain_state, obs.link_problems) == ("READY", "DEGRADED",
                                                                      ("t01 to t02: disconnected",))
    obs = imex_observation(Section("imex-query", "connection refused\n", 1), Section("imex-domain", "", 1))
    assert obs.daemon_state is None and "connection refused" in obs.error


def imex_tray(tmp_path, domain_status: str | None):
    """The probe's IMEX sections run by /bin/sh against a stand-in nvidia-imex-ctl that logs its calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    answer = json.dumps({"status": domain_status, "timestamp": "11/30/2026 01:00:00.000", "nodes": {
        "0": {"status": "READY" if domain_status == "UP" else "WAITING_FOR_PEERS", "host": "10.0.0.1",
              "hostName": "t01", "version": "570.172", "connections": {"0": {"status": "CONNECTED"}}}}}, indent=2)
    (tmp_path / "answer.json").write_text(answer + "\n")
    ctl = bindir / "nvidia-imex-ctl"
    ctl.write_text("#!/bin/sh\n"
                   f"echo \"$*\" >> {calls}\n"
                   "case \"$*\" in\n"
                   f"  *-N*) {'exit 1' if domain_status is None else 'cat ' + str(tmp_path / 'answer.json')} ;;\n"
                   "  *-q*) echo WAITING_FOR_PEERS ;;\n"
                   "esac\n")
    ctl.chmod(0o755)
    config = tmp_path / "config.cfg"
    config.write_text("SERVER_PORT=50000\n")
    body = probe_script(NODE_CHECK, NONCE, smi_timeout=5, imex_config=str(config))
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    proc = subprocess.run(["/bin/sh", "-c", body], capture_output=True, text=True, env=env, timeout=60)
    facts = parse_tray(NODE_CHECK, "t01", proc.stdout, proc.stderr, NONCE, gpu_facts=(None, None, (), None, None, "nvml"))
    return facts.imex, calls.read_text().splitlines()


def test_imex_asked_once_when_the_domain_is_up(tmp_path, processes):
    obs, calls = imex_tray(tmp_path, "UP")
    assert calls == [f"-c {tmp_path}/config.cfg -N -j"]                     # no -q: UP needs every daemon READY
    assert (obs.daemon_state, obs.domain_state, obs.error) == ("READY", "UP", None)


@pytest.mark.parametrize("status", ["DEGRADED", None])
def test_imex_daemon_asked_when_the_domain_is_not_up(tmp_path, status, processes):
    obs, calls = imex_tray(tmp_path, status)
    assert [c.split()[-1] for c in calls] == ["-j", "-q"]
    assert obs.daemon_state == "WAITING_FOR_PEERS"
    assert obs.domain_state == status


def test_imex_ready_by_domain_is_checked_against_the_parsed_answer():
    from mctl.facts.probe import RC_READY_BY_DOMAIN

    domain = json.dumps({"status": "DOWN", "nodes": {}, "note": '"status":"UP"'})
    obs = imex_observation(Section("imex-query", "", RC_READY_BY_DOMAIN), Section("imex-domain", domain, 0))
    assert obs.daemon_state is None and "reads as DOWN" in obs.error
