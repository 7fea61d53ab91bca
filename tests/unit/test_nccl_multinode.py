"""The lab's all_reduce_perf as a multi-node job (mctl/lab/emulators/nccl_tests.py): the ranks of one srun step,
each run in-process in a thread with its own tray's gpus.json and faults.json and Slurm's environment, joined over
TCP on 127.0.0.1 as NCCL's bootstrap joins them; rank 0's table judged by health.burnin.judge_nccl."""

from __future__ import annotations

import io
import json
import random
import sys
import threading

import pytest

from mctl.health import burnin
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import LabLayout
from mctl.lab.services import EMULATORS

ARGV = ["-b", "8", "-e", "8G", "-f", "2", "-g", "4", "-n", "5"]


@pytest.fixture
def ranks(tmp_path, monkeypatch, sockets):
    """run([faults of rank 0, faults of rank 1, ...], start=None) -> [(rc, stdout)] of the ranks."""
    monkeypatch.syspath_prepend(str(EMULATORS))
    for name in ("nvidia_smi", "nccl_tests"):
        sys.modules.pop(name, None)
    import nccl_tests

    monkeypatch.setattr(nccl_tests, "BOOTSTRAP_S", 3.0)
    layout = LabLayout("lab", 1, 4)
    trays = [h for h in layout.hosts() if h.kind == "tray"]

    def run(faults: list[dict], start: list[int] | None = None) -> list[tuple[int, str]]:
        job = random.randrange(1, 1 << 20)
        out: list[tuple[int, str]] = [(-1, "")] * len(faults)

        def one(rank: int) -> None:
            d = tmp_path / f"job{job}-rank{rank}"
            d.mkdir()
            (d / "gpus.json").write_text(json.dumps(gpu_state(layout, trays[rank])))
            (d / "faults.json").write_text(json.dumps(faults[rank]))
            env = {"MCTL_LAB_GPU_STATE": str(d / "gpus.json"), "MCTL_LAB_FAULTS": str(d / "faults.json"),
                   "SLURM_NTASKS": str(len(faults)), "SLURM_PROCID": str(rank), "SLURM_JOB_ID": str(job),
                   "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost"}
            buf = io.StringIO()
            rc = nccl_tests.main(list(ARGV), env=env, stdout=buf)
            out[rank] = (rc, buf.getvalue())

        threads = [threading.Thread(target=one, args=(r,)) for r in (start if start is not None else range(len(faults)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        return out

    return run


def test_a_healthy_ring_of_three_trays_prints_one_table_naming_every_rank(ranks):
    (rc0, out0), (rc1, out1), (rc2, out2) = ranks([{}, {}, {}])
    assert (rc0, rc1, rc2) == (0, 0, 0) and out1 == out2 == ""
    assert out0.count("#  Rank ") == 12 and "#  Rank 11 Group  0" in out0
    v = burnin.judge_nccl(rc0, out0)
    assert v.ok and "at 8 GiB" in v.text


def test_the_slowest_tray_sets_the_rings_bandwidth(ranks):
    (rc0, out0), _r1 = ranks([{}, {"nvlink_all_down": [1]}])
    v = burnin.judge_nccl(rc0, out0)
    assert rc0 == 0 and not v.ok and "bus bandwidth 45.0 GB/s" in v.text


def test_a_lost_gpu_on_a_peer_fails_the_run_with_nccls_and_cudas_words(ranks):
    (rc0, out0), (rc1, out1) = ranks([{}, {"fell_off_bus": [0]}])
    assert rc0 == 1 and "Test NCCL failure common.cu:1204 'remote process exited or there was a network error / '" \
        in out0
    assert rc1 == 1 and "Test CUDA failure common.cu:1279 'unknown error'" in out1
    assert not burnin.judge_nccl(rc0, out0 + out1).ok


def test_a_rank_that_never_joins_fails_rank_0_at_the_bootstrap_deadline(ranks):
    (rc0, out0), _missing = ranks([{}, {}], start=[0])
    assert rc0 == 1 and "NCCL WARN Bootstrap : 1 of 2 ranks did not join within 3s (ranks 1)" in out0
    v = burnin.judge_nccl(rc0, out0)
    assert not v.ok and "ranks did not join" in v.text and "unhandled system error" in out0


def test_a_rank_without_rank_0_fails_with_the_connect_error(ranks):
    _missing, (rc1, out1) = ranks([{}, {}], start=[1])
    assert rc1 == 1 and "NCCL WARN socketConnect: Connect to 127.0.0.1<" in out1


def test_a_peers_garbage_is_rank_0s_output_and_never_passes(ranks):
    (rc0, out0), _r1 = ranks([{}, {"tool_faults": {"all_reduce_perf": "garbage"}}])
    assert rc0 == 0 and "#  Rank" not in out0
    assert not burnin.judge_nccl(rc0, out0).ok


def test_the_slurm_node_list_expands_as_slurm_writes_it(ranks):
    import nccl_tests

    assert nccl_tests.expand_nodelist("lab-r1-tray[01-03,09],lab-r1-head") == [
        "lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03", "lab-r1-tray09", "lab-r1-head"]
