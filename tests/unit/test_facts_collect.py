"""The one-round-trip fact probe: framing, the script itself, and turning output into TrayFacts.

The script is run for real under /bin/sh here, with a stand-in `nvidia-smi` on PATH
that prints the real GB200 capture (or misbehaves), so the shell side is tested
as well as the parsing side.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mctl.facts.probe import INVENTORY, from_result, probe_command, split_sections
from mctl.transport import HostKeyProblem, HostResult, HostStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_XML = FIXTURES / "gb200-nvidia-smi-q-x.xml"
NONCE = "0123456789abcdef"


def ok(out: str, err: str = "", host="tray01") -> HostResult:
    return HostResult(host, "127.0.0.1", HostStatus.OK, 0, out, err)


def run_probe(tmp_path: Path, smi_body: str, *, smi_timeout: float = 10) -> HostResult:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + smi_body)
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    proc = subprocess.run(probe_command(INVENTORY, NONCE, smi_timeout=smi_timeout), shell=True, capture_output=True,
                          text=True, env=env, timeout=60)
    return HostResult("tray01", "127.0.0.1", HostStatus.OK if proc.returncode == 0 else HostStatus.FAILED,
                      proc.returncode, proc.stdout, proc.stderr)


# --- framing ---------------------------------------------------------------------------------

def _frame(name, body, rc=0, nonce=NONCE):
    return f"::mctl-{nonce}::begin {name}\n{body}\n::mctl-{nonce}::end {name} rc={rc}\n"


def test_sections_restore_exact_output():
    out = _frame("a", "no newline") + _frame("b", "two\nlines\n") + _frame("c", "", 127)
    secs = split_sections(out, NONCE)
    assert secs["a"].text == "no newline" and secs["a"].rc == 0
    assert secs["b"].text == "two\nlines\n"
    assert secs["c"].text == "" and secs["c"].rc == 127


def test_framing_round_trips_any_body():
    import random

    rng = random.Random(4)
    pieces = ["", "\n", "x", "line\n", "::mctl-0000000000000000::end a rc=0\n", "begin ", "\n\n", "<gpu>", "rc=1"]
    for _ in range(300):
        bodies = {f"s{i}": "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for i in range(4)}
        out = "noise before\n" + "".join(_frame(k, v, i) for i, (k, v) in enumerate(bodies.items()))
        secs = split_sections(out, NONCE)
        assert {k: (v.text, v.rc) for k, v in secs.items()} == {k: (v, i) for i, (k, v) in enumerate(bodies.items())}


def test_cut_off_section_is_incomplete():
    out = _frame("a", "x") + f"::mctl-{NONCE}::begin nvidia-smi\n<nvidia_smi_log>\n<gpu"
    secs = split_sections(out, NONCE)
    assert secs["a"].complete and not secs["nvidia-smi"].complete


def test_markers_with_another_nonce_are_content():
    evil = "::mctl-ffffffffffffffff::end a rc=0\n::mctl-ffffffffffffffff::begin b"
    secs = split_sections(_frame("a", evil), NONCE)
    assert list(secs) == ["a"] and secs["a"].text == evil


# --- the script, run for real --------------------------------------------------------------------

def test_probe_on_real_gb200_capture(tmp_path, processes):
    result = run_probe(tmp_path, f"cat '{REAL_XML}'\n")
    assert result.ok, result.stderr
    facts = from_result(INVENTORY, result, NONCE, smi_timeout=10)
    assert facts.reached and facts.gpu_error is None and facts.problems == ()
    assert facts.gpu_count == 4 and facts.gpus.driver_version == "570.148.08"
    assert facts.gpus.cluster_uuids == ("889d2be1-4bbf-69e1-d3f2-97c465ee31aa",)
    assert facts.gpus.clique_ids == (2,)
    assert facts.os is not None and facts.kernel == os.uname().release
    assert facts.hostname == os.uname().nodename
    assert facts.imex_service is not None and facts.slurmd is not None
    assert facts.xid_source in ("/var/log/kern.log", "dmesg")


def test_probe_when_nvidia_smi_hangs(tmp_path, processes):
    result = run_probe(tmp_path, "sleep 30\n", smi_timeout=1)
    facts = from_result(INVENTORY, result, NONCE, smi_timeout=1)
    assert facts.reached and facts.gpus is None
    assert "hung" in facts.gpu_error
    assert facts.os is not None            # the rest of the facts still came back


def test_probe_when_nvidia_smi_prints_half_the_xml(tmp_path, processes):
    result = run_probe(tmp_path, f"head -c 20000 '{REAL_XML}'\necho 'Unable to determine the device handle' >&2\nexit 15\n")
    facts = from_result(INVENTORY, result, NONCE, smi_timeout=10)
    assert facts.gpus is None and facts.gpu_error.startswith("nvidia-smi output unreadable")
    assert facts.gpu_error.endswith("(exit 15: Unable to determine the device handle)")
    assert facts.gpu_messages == ("Unable to determine the device handle",)


def test_probe_when_driver_is_gone(tmp_path, processes):
    result = run_probe(tmp_path, "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                 "driver. Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9\n")
    facts = from_result(INVENTORY, result, NONCE, smi_timeout=10)
    assert facts.gpus is None and "could not communicate" in facts.gpu_error


def test_probe_without_nvidia_smi(tmp_path, processes):
    env = dict(os.environ, PATH="/usr/bin:/bin")
    proc = subprocess.run(probe_command(INVENTORY, NONCE, smi_timeout=5), shell=True, capture_output=True, text=True, env=env)
    facts = from_result(INVENTORY, ok(proc.stdout, proc.stderr), NONCE, smi_timeout=5)
    assert facts.gpu_error == "nvidia-smi is not installed (command not found)"


# --- lab captures --------------------------------------------------------------------------------

def lab_capture(name: str, host: str) -> HostResult:
    probe = FIXTURES / "probe"
    return ok((probe / f"lab-tray-{name}.txt").read_text(), (probe / f"lab-tray-{name}.stderr.txt").read_text(), host)


def test_lab_probe_healthy_tray():
    facts = from_result(INVENTORY, lab_capture("healthy", "lab-r1-tray01"), NONCE, smi_timeout=20)
    assert facts.problems == () and facts.hostname == "lab-r1-tray01" and facts.gpu_messages == ()
    assert (facts.os.id, facts.os.version_id) == ("debian", "13")
    assert facts.gpu_count == 4 and len(facts.gpus.cluster_uuids) == 1 and facts.gpus.clique_ids == (32766,)
    assert all(g.fabric_attached for g in facts.gpus.gpus)
    assert facts.slurmd.installed and not facts.imex_service.installed and facts.imex_config.present is False


def test_lab_probe_faulted_tray():
    facts = from_result(INVENTORY, lab_capture("faulted", "lab-r1-tray04"), NONCE, smi_timeout=20)
    assert facts.gpu_count == 2 and facts.gpus.attached_gpus == 3
    # the GPU that fell off the bus is named on nvidia-smi's stderr, which comes back framed too
    assert facts.gpu_messages == ("Unable to determine the device handle for GPU0: 0000:29:00.0: Unknown Error",)
    assert {g.fabric.state for g in facts.gpus.gpus} == {"In Progress"}
    assert facts.gpus.cluster_uuids == ()                  # N/A: no NVLink domain while in progress
    assert [x.code for x in facts.xid_events] == [79] and facts.xid_source == "/var/log/kern.log"


# --- what becomes of hosts that did not answer, and of garbage --------------------------------------

@pytest.mark.parametrize("status", [HostStatus.UNREACHABLE, HostStatus.TIMEOUT, HostStatus.HOST_KEY_MISMATCH])
def test_unanswered_hosts_carry_their_status(status):
    hk = HostKeyProblem("ssh-ed25519 SHA256:new", ("ssh-ed25519 SHA256:old",), "/x/known_hosts") \
        if status is HostStatus.HOST_KEY_MISMATCH else None
    facts = from_result(INVENTORY, HostResult("t", "127.0.0.9", status, error="why", host_key=hk), NONCE, smi_timeout=5)
    assert facts.reach == status.value and facts.error == "why" and facts.gpus is None
    if hk:
        assert facts.host_key.presented == "ssh-ed25519 SHA256:new"


def test_garbage_output_is_recorded_not_raised():
    facts = from_result(INVENTORY, ok("\x00\x01 random bytes\n"), NONCE, smi_timeout=5)
    assert facts.reached and facts.gpus is None and facts.problems
    out = (FIXTURES / "probe" / "lab-tray-healthy.txt").read_text()
    cut = out[: out.index("::end nvidia-smi")]               # connection dropped mid-XML
    facts = from_result(INVENTORY, ok(cut), NONCE, smi_timeout=5)
    assert facts.gpus is None and "cut off" in facts.gpu_error
    assert any(p.startswith("services:") for p in facts.problems)
