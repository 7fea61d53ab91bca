"""The ladder's GPU reset with NVIDIA's preconditions (issue 30, 9): refused while processes hold the GPUs
(named), persistence mode off, one reset of the set, persistence restored, the result verified; on a
GB200 tray the whole tray's GPUs together, and the rung says so.

The script runs under /bin/sh against the lab's nvidia-smi (the emulators tier); the scope and the
result parser are pure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mctl.facts.nvidia_smi import parse_xml
from mctl.health import gpu_reset, ladder
from mctl.lab import faults as faultlib
from mctl.lab.emulators import nvidia_smi as emu
from mctl.model.tray import TrayFacts
from tests.helpers import REAL_SAMPLES, SMI_EMULATOR, contract_state

GB200 = parse_xml((REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text())


def test_on_gb200_a_reset_takes_the_whole_tray_and_says_so():
    facts = TrayFacts(host="t01", gpus=GB200)
    one = GB200.gpus[1].pci_bus_id
    kernel_form = one.split(":", 1)[0][-4:] + ":" + one.split(":", 1)[1].rsplit(".", 1)[0]     # 0008:01:00 style
    gpus, note = ladder.reset_scope(facts, (kernel_form,))
    assert gpus == tuple(g.pci_bus_id for g in GB200.gpus) and len(gpus) == 4
    assert note.startswith("GB200: the tray's 4 GPUs are NVLink-connected and reset together, not only " + one)
    # a GPU the facts do not show (fell off the bus): as the XIDs named it, nothing guessed
    assert ladder.reset_scope(facts, ("0abc:01:00",)) == (("0abc:01:00",), None)


def test_elsewhere_only_the_named_gpus():
    from dataclasses import replace

    h100 = replace(GB200, gpus=tuple(replace(g, product_name="NVIDIA H100 80GB HBM3") for g in GB200.gpus))
    one = h100.gpus[2].pci_bus_id
    assert ladder.reset_scope(TrayFacts(host="t01", gpus=h100), (one,)) == ((one,), None)


def test_the_rung_carries_the_whole_tray_note():
    from mctl.model.settings import LadderSettings

    obs = ladder.Observation("t01", "r1", True, "ok", True, 0, idle=True, reset_gpus=("A", "B"), why="gpu.xid: 95",
                             reset_note="GB200: the tray's 4 GPUs are NVLink-connected and reset together")
    out = ladder.TrayStep(ladder.LadderState())
    ladder._start_rung(ladder.LadderState(), obs, LadderSettings(gpu_reset=True), ladder.GPU_RESET, "gpu.xid: 95",
                       0.0, out)
    assert out.rungs[0].gpus == ("A", "B") and "reset together" in out.rungs[0].why


def test_parse_reads_each_outcome():
    m = gpu_reset.MARK
    refused = gpu_reset.parse(f"{m} busy 00000008:01:00.0 4242 python3\n", gpu_reset.RC_BUSY)
    assert refused.status == "refused" and "pid 4242 python3" in refused.text
    ok = gpu_reset.parse(f"{m} pm-off A\n{m} reset exit 0\n{m} said GPU A was successfully reset.\n{m} pm-on A\n"
                         f"{m} verified\n", 0)
    assert ok.status == "ok" and ok.persistence_restored == ["A"] and "verified" in ok.text
    failed = gpu_reset.parse(f"{m} pm-off A\n{m} reset exit 255\n{m} said GPU A: In use by another client\n"
                             f"{m} pm-on A\n", 14)
    assert failed.status == "failed" and "exit 255" in failed.text and failed.persistence_restored == ["A"]
    assert gpu_reset.parse("", None).status == "failed"           # nothing read: never a success


def _tray(tmp_path, faults: dict):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} -I {SMI_EMULATOR} \"$@\"\n")
    (bindir / "nvidia-smi").chmod(0o755)
    (tmp_path / "gpus.json").write_text(json.dumps(contract_state()))
    (tmp_path / "faults.json").write_text(json.dumps(faults))
    return dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", **{emu.STATE_ENV: str(tmp_path / "gpus.json"),
                                                                emu.FAULTS_ENV: str(tmp_path / "faults.json")})


def _run(env, gpus):
    proc = subprocess.run(["/bin/sh", "-c", gpu_reset.script(gpus, 30)], capture_output=True, text=True, env=env,
                          timeout=120)
    return gpu_reset.parse(proc.stdout, proc.returncode), proc


BUSES = tuple(g["pci_bus_id"] for g in contract_state()["gpus"])


def test_refused_while_a_process_holds_a_gpu_and_nothing_changed(tmp_path, processes):
    doc = faultlib.apply(None, faultlib.FaultRequest(target="gpu", gpu_process="2:python3"), now=1.0)
    env = _tray(tmp_path, doc)
    result, proc = _run(env, BUSES)
    assert result.status == "refused", proc.stdout
    assert result.busy == [(BUSES[2], str(doc["gpu_processes"][0]["pid"]), "python3")]
    assert result.persistence_off == []
    assert json.loads((tmp_path / "faults.json").read_text()).get("persistence_off", []) == []


def test_persistence_off_reset_persistence_back_verified(tmp_path, processes):
    doc = faultlib.apply(None, faultlib.FaultRequest(target="gpu", xid=95, gpu=1), now=1.0)
    env = _tray(tmp_path, doc)
    before = parse_xml(subprocess.run(["nvidia-smi", "-q", "-x"], env=env, capture_output=True, text=True).stdout)
    assert before.gpus[1].gpu_recovery_action == "Reset"
    result, proc = _run(env, BUSES)
    assert result.status == "ok", proc.stdout
    assert result.persistence_off == list(BUSES) and result.persistence_restored == list(BUSES)
    assert result.verified and any("successfully reset" in s for s in result.said)
    after = json.loads((tmp_path / "faults.json").read_text())
    assert after["persistence_off"] == [] and after["xid"] == []          # the reset ended the XID's effect
    xml = parse_xml(subprocess.run(["nvidia-smi", "-q", "-x"], env=env, capture_output=True, text=True).stdout)
    assert xml.gpus[1].gpu_recovery_action == "None"


def test_a_plain_reset_with_persistence_on_is_what_fails(tmp_path, processes):
    """What the old rung sent: nvidia-smi refuses it while persistence mode holds the GPU."""
    env = _tray(tmp_path, {})
    proc = subprocess.run(["nvidia-smi", "--gpu-reset", "-i", BUSES[0]], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "In use by another client" in proc.stdout


@pytest.mark.parametrize("text", ["0", "0:", "4:python3", "0:bad name", "x:python3"])
def test_bad_gpu_process_flags_are_refused(text):
    from mctl.errors import UsageError

    with pytest.raises(UsageError):
        faultlib.validate(faultlib.FaultRequest(target="gpu", gpu_process=text))
