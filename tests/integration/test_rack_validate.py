"""`mctl rack validate` on the session's Slurm lab (p0 = trays 1-2, p1 = trays 3-4): the lab's all_reduce_perf
(mctl/lab/emulators/nccl_tests.py) runs as one srun job per partition, one task per tray, the ranks joined over
TCP on the lab's loopback addresses (mctl/bringup/validate.py).

1. A healthy rack passes in one round, every partition's ring on all its trays; the run is in the audit history.
2. A GPU with every NVLink down drags its partition: the finder names that tray (alone, in round 2)
   (the pairs of a larger partition are the unit tests' and the bench's: the lab's Slurm blocks hold two trays).
3. A hanging all_reduce_perf fails its partition with the tool's words at the job's deadline, and nothing is
   left allocated (squeue shows no job).
4. A tray drained by an operator: Slurm cannot place its partition's job; the run names Slurm's refusal and
   the tray's state and reason, exit 3, nothing allocated.
Tests 1-4 ask for the all-reduce (--method all-reduce): the lab's trays carry DCGM 4.3.1, so the default
(auto) runs DCGM's mndiag there:
5. mndiag on the lab's DCGM 4.3.1 (the lab's dcgmi, mctl/lab/emulators/dcgmi.py): chosen for both partitions
   (each says so), a healthy rack passes in one round, and a tray with an NVLink down is named from mndiag's
   own per-host results (no search); nothing left allocated.
6. A hanging dcgmi mndiag (the head tray's tool fault) fails its partition with the tool's words at the
   job's deadline, never passes, nothing left allocated.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import fault, wait_for


def _validate(lab, site, state, *args, timeout=180, method="all-reduce"):
    res = lab.mctl("-i", str(site), "--state-dir", str(state), "rack", "validate", lab.rack, "--json",
                   "--method", method, *args, timeout=timeout)
    doc, _end = json.JSONDecoder().raw_decode(res.stdout)
    return res, doc


def _no_jobs(lab) -> bool:
    return lab.run(lab.head, "squeue -h -o %i", timeout=30).stdout.strip() == ""


@pytest.fixture
def clean(lab):
    yield
    lab.clear_faults()


def test_healthy_rack_passes_in_one_round_and_is_in_the_audit_history(lab, slurm_site, tmp_path, clean):
    state = tmp_path / "state"
    t0 = time.monotonic()
    res, doc = _validate(lab, slurm_site, state)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert doc["status"] == "passed" and len(doc["rounds"]) == 1, doc
    parts = {p["name"]: p for p in doc["partitions"]}
    assert set(parts) == {"p0", "p1"} and all(p["status"] == "passed" and p["busbw"] > 648 for p in parts.values())
    assert took < 60, took
    hist = lab.mctl("--state-dir", str(state), "audit", "history", "--json")
    runs = json.loads(hist.stdout)["validations"]
    assert [(v["rack"], v["status"]) for v in runs] == [(lab.rack, "passed")], runs
    assert _no_jobs(lab)


def test_a_dragging_tray_is_named(lab, slurm_site, tmp_path, clean):
    slow = lab.trays[2]                                          # p1 = trays 3-4
    fault(lab, slow, nvlink_down="1:all")
    res, doc = _validate(lab, slurm_site, tmp_path / "state")
    assert res.returncode == 1, res.stdout + res.stderr
    parts = {p["name"]: p for p in doc["partitions"]}
    assert parts["p0"]["status"] == "passed" and parts["p1"]["status"] == "failed", parts
    assert "below the 648 GB/s NVLink 5 floor" in parts["p1"]["text"]
    assert [d["tray"] for d in parts["p1"]["dragging"]] == [slow] and doc["dragging"] == [slow], parts["p1"]
    assert len(doc["rounds"]) == 2, doc["rounds"]

    assert _no_jobs(lab)


def test_a_hanging_tool_fails_its_partition_at_the_deadline_and_leaves_nothing_allocated(lab, slurm_site, tmp_path,
                                                                                        clean):
    fault(lab, lab.trays[1], tool_fault="all_reduce_perf:hang")  # p0's second rank
    t0 = time.monotonic()
    res, doc = _validate(lab, slurm_site, tmp_path / "state", "--partition", "p0", "--job-deadline", "10",
                         "--place-wait", "5")
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stdout + res.stderr
    (p0,) = doc["partitions"]
    assert p0["status"] == "failed" and "all_reduce_perf did not finish in time (killed)" in p0["text"], p0
    assert not p0["searched"] and len(doc["rounds"]) == 1
    assert took < 10 + 5 + 10 + 30, took                         # the deadline, the placement, the kill grace, CLI
    assert doc["left_allocated"] == [] and _no_jobs(lab)


def test_a_job_slurm_cannot_place_is_named_with_slurms_reason(lab, slurm_site, tmp_path, clean):
    tray = lab.trays[3]
    lab.run(lab.head, f"scontrol update NodeName={tray} State=DRAIN Reason='ops: cable check'")
    try:
        res, doc = _validate(lab, slurm_site, tmp_path / "state", "--partition", "p1", "--place-wait", "5")
        assert res.returncode == 3, res.stdout + res.stderr
        (p1,) = doc["partitions"]
        assert p1["status"] == "unplaced" and "Slurm did not place the job" in p1["text"], p1
        assert tray in p1["text"] and "ops: cable check" in p1["text"], p1
        assert _no_jobs(lab)
    finally:
        lab.run(lab.head, f"scontrol update NodeName={tray} State=RESUME", check=False)
        wait_for(f"{tray} idle again", lambda: "drain" not in lab.run(
            lab.head, f"sinfo -h -N -n {tray} -o %T", timeout=30).stdout, 60, every=0.5)


def test_mndiag_runs_where_dcgm_is_4_3_and_names_the_faulted_tray(lab, slurm_site, tmp_path, clean):
    res, doc = _validate(lab, slurm_site, tmp_path / "state", method="auto")
    assert res.returncode == 0, res.stdout + res.stderr
    parts = {p["name"]: p for p in doc["partitions"]}
    assert {n: p["method"] for n, p in parts.items()} == {"p0": "mndiag", "p1": "mndiag"}, parts
    assert all("DCGM 4.3.1" in p["method_why"] and p["status"] == "passed" for p in parts.values()), parts
    assert len(doc["rounds"]) == 1 and all("Pass on 2 host(s), 8 GPU(s)" in p["text"] for p in parts.values())
    assert _no_jobs(lab)

    bad = lab.trays[3]                                           # p1 = trays 3-4
    fault(lab, bad, nvlink_down="2:5")
    res, doc = _validate(lab, slurm_site, tmp_path / "state", method="auto")
    assert res.returncode == 1, res.stdout + res.stderr
    parts = {p["name"]: p for p in doc["partitions"]}
    assert parts["p0"]["status"] == "passed" and parts["p1"]["status"] == "failed", parts
    assert [f["tray"] for f in parts["p1"]["failing"]] == [bad] and doc["failing"] == [bad], parts["p1"]
    assert "GPU 2's NvLink link 5 is currently down" in parts["p1"]["failing"][0]["text"]
    assert not parts["p1"]["searched"] and len(doc["rounds"]) == 1
    text = lab.mctl("-i", str(slurm_site), "--state-dir", str(tmp_path / "state"), "rack", "validate", lab.rack,
                    "--partition", "p1", timeout=180)
    assert text.returncode == 1 and "p1 (" in text.stdout and "[mndiag]: failed" in text.stdout, text.stdout
    assert f"{bad} fails p1's mndiag: GPU 2 Fail" in text.stdout, text.stdout
    assert _no_jobs(lab)


def test_a_hanging_mndiag_fails_its_partition_at_the_deadline(lab, slurm_site, tmp_path, clean):
    fault(lab, lab.trays[0], tool_fault="dcgmi:hang")            # p0's head node runs dcgmi mndiag
    t0 = time.monotonic()
    res, doc = _validate(lab, slurm_site, tmp_path / "state", "--partition", "p0", "--job-deadline", "10",
                         "--place-wait", "5", method="auto")
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stdout + res.stderr
    (p0,) = doc["partitions"]
    assert p0["method"] == "mndiag" and p0["status"] == "failed", p0
    assert "dcgmi mndiag did not finish in time (killed)" in p0["text"], p0
    assert took < 10 + 5 + 10 + 40, took
    assert doc["left_allocated"] == [] and _no_jobs(lab)
