"""Burn-in on the lab: the trays' dcgmi and all_reduce_perf (the lab's packages datacenter-gpu-manager-4-core
and nccl-tests, mctl/lab/emulators/dcgmi.py and nccl_tests.py) run over SSH and judged (mctl/health/burnin.py).

1. Bring-up's burn-in phase (`mctl rack bring-up --from burn-in --until burn-in --burn-in medium`) on a
   site that runs no scheduler (so every tray is the phase's): a healthy tray passes; an uncorrectable
   ECC fails the memory test, every NVLink of a GPU down lowers the bus bandwidth under the floor, a GPU
   fallen off the bus fails them all; the phase fails naming those three trays, exit 1.
2. Tools that misbehave (`lab fault gpu --tool-fault`): a hanging dcgmi is killed at its deadline and
   nothing of it is left on the tray, a crashing all_reduce_perf and a dcgmi printing truncated JSON
   fail their trays with the tools' words; the healthy tray passes all the same.
3. The ladder's validation (`health.ladder.burn_in: quick`, real Slurm, the reboot rung through the
   trays' BMCs): two trays lose a GPU (XID 79), are drained, their evidence taken (the bundle the
   reboot's action-log line names) and rebooted; both pass their checks, then
   burn-in: the one whose dcgmi prints truncated JSON fails it (DCGM's words in the action log), is
   marked for repair and stays drained; the other passes and is resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import HEALTH, Watch, fault, power_restored, sinfo, ssh_ok, wait_for

# --own-labs beside (scripts/test): in the second pytest, on its shared lab (balances the two sessions;
# tests/beside.py, D125)
pytestmark = pytest.mark.beside

LADDER = {"reboot": True, "burn_in": "quick", "burn_in_deadline": "60s", "fail_after_sweeps": 2, "max_failures": 1,
          "failure_window": "1h", "reboot_deadline": "90s", "verify_deadline": "60s", "retry_after": "2s"}


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
    assert by_tray[healthy] and all("passed" in ln or "Healthy" in ln or ("bus bandwidth" in ln and "below" not in ln)
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


def _log(state: Path) -> list[dict]:
    """The action log as written so far (a rung's intent may still wait for its result)."""
    path = state / "health" / "actions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _of(log, tray, action, **match):
    return [e for e in log if e.get("tray") == tray and e["action"] == action
            and all(e.get(k) == v for k, v in match.items())]


def test_the_ladders_validation_keeps_out_a_tray_that_fails_burn_in_and_resumes_one_that_passes(
        lab, health_site, tmp_path):
    doc = yaml.safe_load((health_site / "mctl.yml").read_text())
    if not doc.get("bmc"):
        pytest.skip("the lab has no BMCs")
    doc["health"] = {**HEALTH, "breaker": {"max_drained_share": 0.5, "window": "1h"}, "ladder": LADDER}
    site = tmp_path / "site"
    site.mkdir()
    (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    state = tmp_path / "state"
    good, bad = lab.trays[0], lab.trays[1]
    watch = Watch(lab, site, state, "--interval", "1")
    try:
        wait_for("the first sweep", lambda: watch.sweeps() >= 1, 60)
        fault(lab, bad, tool_fault="dcgmi:truncated")          # the checks only warn (dcgm.health): burn-in fails it
        fault(lab, good, xid=79, gpu=0)
        fault(lab, bad, xid=79, gpu=0)
        wait_for(f"{good} recovered", lambda: _of(_log(state), good, "recovered"), 240)
        wait_for(f"{bad} marked for repair", lambda: _of(_log(state), bad, "repair"), 240)
        log = _log(state)
        for tray in (good, bad):
            assert _of(log, tray, "drain"), tray
            (reboot,) = _of(log, tray, "reboot")
            assert _of(log, tray, "ladder", phase="verify", result="ok"), tray
            # evidence before the rung: the bundle the reboot's line names holds the XID, taken before the boot
            bundle = state / reboot["evidence"]
            assert "before-reboot" in bundle.name and "Xid (PCI:" in (bundle / "kernel.log").read_text(), reboot
        (passed,) = _of(log, good, "ladder", phase="burn-in", result="ok")
        (resume,) = _of(log, good, "resume")
        assert resume["result"] == "ok"
        (failed,) = _of(log, bad, "ladder", phase="burn-in", result="failed")
        assert "dcgmi diag -r 1 printed truncated JSON" in failed["why"], failed
        assert not _of(log, bad, "resume")
        wait_for(f"{good} idle in Slurm", lambda: sinfo(lab)[good] == ("idle", ""), 60)
        assert "drain" in sinfo(lab)[bad][0]
        print(f"\nladder validation: burn-in on {good} took {passed.get('seconds')}s; {bad}: {failed['why']}")
    finally:
        code = watch.stop()
        said = watch.proc.stderr.read()
        print("\n".join(watch.lines[-30:]), said[-2000:], sep="\n")
        for tray in (good, bad):              # a tray the ladder is rebooting comes back first
            wait_for(f"SSH on {tray}", lambda tray=tray: ssh_ok(lab, tray), 180)
            lab.clear_faults(tray)
        power_restored(lab)
        lab.settle_slurm(timeout=180)
    assert code == 0, said
