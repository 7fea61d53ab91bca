"""Burn-in on the lab: the trays' dcgmi and all_reduce_perf (the lab's packages datacenter-gpu-manager-4-core
and nccl-tests, mctl/lab/emulators/dcgmi.py and nccl_tests.py) run over SSH and judged (mctl/health/burnin.py).

1. Bring-up's burn-in phase (`mctl rack bring-up --from burn-in --until burn-in --burn-in medium`) on a
   site that runs no scheduler (so every tray is the phase's): a healthy tray passes; an uncorrectable
   ECC fails the memory test, every NVLink of a GPU down lowers the bus bandwidth under the floor, a GPU
   fallen off the bus fails them all; the phase fails naming those three trays, exit 1.
2. Tools that misbehave (`lab fault gpu --tool-fault`): a hanging dcgmi is killed at its deadline and
   nothing of it is left on the tray, a crashing all_reduce_perf and a dcgmi printing truncated JSON
   fail their trays with the tools' words; the healthy tray passes all the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import fault, wait_for


@pytest.fixture
def no_scheduler_site(lab, tmp_path) -> Path:
    doc = yaml.safe_load(lab.inventory.read_text())
    doc.pop("scheduler", None)
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


@pytest.fixture
def clean(lab):
    yield
    lab.clear_faults()


def _tools_present(lab):
    for tray in lab.trays:
        out = lab.run(tray, "command -v dcgmi all_reduce_perf").stdout.split()
        assert out == ["/usr/bin/dcgmi", "/usr/bin/all_reduce_perf"], f"{tray}: {out}"


def test_bring_up_burn_in_fails_the_faulted_trays_and_passes_the_healthy_one(lab, no_scheduler_site, tmp_path,
                                                                             clean):
    _tools_present(lab)
    healthy, ecc, nvlink, lost = lab.trays[:4]
    fault(lab, ecc, ecc_uncorrectable=2, gpu=1)
    fault(lab, nvlink, nvlink_down="2:all")
    fault(lab, lost, fell_off_bus=True, gpu=0)
    res = lab.mctl("-i", str(no_scheduler_site), "--state-dir", str(tmp_path / "state"), "rack", "bring-up",
                   lab.rack, "--from", "burn-in", "--until", "burn-in", "--burn-in", "medium", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    doc, _end = json.JSONDecoder().raw_decode(res.stdout)
    assert doc["status"] == "failed" and doc["failed_phase"] == "burn-in", doc
    journal = json.loads(next((tmp_path / "state" / "bringup" / lab.rack).glob("*/journal.json")).read_text())
    (phase,) = [p for p in journal["phases"] if p["name"] == "burn-in"]
    lines = phase.get("details") or []
    assert lines, phase
    by_tray = {t: [ln for ln in lines if ln.startswith(f"{t}: ")] for t in lab.trays}
    assert by_tray[healthy] and all("passed" in ln or "Healthy" in ln or "bus bandwidth" in ln and "below" not in ln
                                    for ln in by_tray[healthy]), by_tray[healthy]
    assert any("memory (GPU 1)" in ln for ln in by_tray[ecc]), by_tray[ecc]
    assert any("below the 648 GB/s NVLink 5 floor" in ln for ln in by_tray[nvlink]), by_tray[nvlink]
    assert any("is lost" in ln for ln in by_tray[lost]) and any("Test CUDA failure" in ln for ln in by_tray[lost])
    from mctl.model.site import fold

    assert f"burn-in failed on {fold([ecc, nvlink, lost])}" in json.dumps(phase["error"]), phase["error"]


def test_a_hanging_crashing_or_truncating_tool_fails_its_tray_and_the_others_go_on(lab, clean):
    from mctl.health import burnin
    from mctl.inventory import load_site

    _tools_present(lab)
    healthy, hangs, crashes, truncates = lab.trays[:4]
    fault(lab, hangs, tool_fault="dcgmi:hang")
    fault(lab, crashes, tool_fault="all_reduce_perf:crash")
    fault(lab, truncates, tool_fault="dcgmi:truncated")
    site = load_site(lab.inventory)
    hosts = [site.host(t) for t in lab.trays[:4]]
    tools, failed = burnin.probe_tools(site, hosts)
    assert not failed
    verdicts = burnin.run_burn_in(site, hosts, tools, 4, "quick", deadline=8)
    text = {t: [v.text for v in vs] for t, vs in verdicts.items()}
    assert all(v.ok for v in verdicts[healthy]) and len(verdicts[healthy]) == 3, text[healthy]
    assert "dcgmi diag -r 1 did not finish in time (killed)" in text[hangs], text[hangs]
    assert "dcgmi health -c did not finish in time (killed)" in text[hangs], text[hangs]
    assert verdicts[hangs][2].ok, text[hangs]                # NCCL is not hung there: it still ran
    assert any(t.startswith("all_reduce_perf exited 139") or "signal" in t for t in text[crashes]), text[crashes]
    assert any("printed truncated JSON" in t for t in text[truncates]), text[truncates]
    # the hung dcgmi was killed on the tray by timeout(1): nothing of it is left running
    wait_for("no dcgmi left on the tray", lambda: lab.run(hangs, "pgrep -f /usr/bin/dcgmi", check=False).returncode == 1,
             30)
