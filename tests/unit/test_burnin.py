"""Burn-in's judges (mctl/health/burnin.py) on the real outputs of dcgmi and all_reduce_perf, on malformed
variants of them, and on the lab's stand-ins (mctl/lab/emulators/dcgmi.py, nccl_tests.py) run in-process
against a tray's gpus.json and faults.json.

Real samples: tests/fixtures/real/README.md, "Burn-in tools". Expectations are read from the files.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

from mctl.health import burnin
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import LabLayout
from mctl.lab.services import EMULATORS
from tests.helpers import real_text

pytestmark = pytest.mark.pure

DCGM_452 = "glimmer-dcgm-4.5.2-diag-r2-gb10.json"
DCGM_423 = "glimmer-dcgm-4.2.3-diag-r1-gb10.json"
HEALTH = "virtualclient-dcgmi-health-check.json"
NCCL_GB200 = "issue-coreweave-nccl-tests-pr43-gb200-nvl72-all-reduce.txt"
NCCL_FAILURE = "issue-nccl-tests-322-all-reduce-nccl-failure.txt"


def _persistence_fixed(text: str) -> str:
    """The 4.5.2 document with its one failing test (persistence mode off) passing: every other field as captured."""
    doc = json.loads(text)
    for cat in doc["DCGM Diagnostic"]["test_categories"]:
        for test in cat["tests"]:
            for r in test["results"]:
                r["status"] = "Pass"
                r.pop("warnings", None)
            test["test_summary"] = {"status": "Pass"}
    return json.dumps(doc)


# --- dcgmi diag -j --------------------------------------------------------------------------------

def test_real_dcgm_452_fails_on_its_persistence_warning_in_dcgms_words():
    v = burnin.judge_dcgm(226, real_text(DCGM_452), level=2, gpus=1)
    assert not v.ok
    assert v.text.startswith("dcgmi diag -r 2 failed: software (GPU 0): Persistence Mode: Persistence mode for GPU 0 "
                             "is disabled.")
    assert not burnin.judge_dcgm(0, real_text(DCGM_452), level=2, gpus=1).ok      # a Fail is a Fail whatever the exit


def test_real_dcgm_423_level_1_fails_the_same_way():
    v = burnin.judge_dcgm(226, real_text(DCGM_423), level=1, gpus=1)
    assert not v.ok and "software (GPU 0)" in v.text


def test_real_dcgm_document_with_its_tests_passing_passes():
    v = burnin.judge_dcgm(0, _persistence_fixed(real_text(DCGM_452)), level=2, gpus=1)
    assert v.ok and v.text == "dcgmi diag -r 2 passed: memory, pcie, software on 1 GPU(s)"


def test_dcgm_results_for_fewer_gpus_than_the_tray_has_fail():
    v = burnin.judge_dcgm(0, _persistence_fixed(real_text(DCGM_452)), level=2, gpus=4)
    assert not v.ok and "results for 1 of 4 GPUs" in v.text


def test_dcgm_passing_json_with_a_non_zero_exit_fails():
    v = burnin.judge_dcgm(226, _persistence_fixed(real_text(DCGM_452)), level=2, gpus=1)
    assert not v.ok and "exited 226" in v.text


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.01])
def test_truncated_dcgm_json_fails_naming_it(cut):
    text = real_text(DCGM_452)
    v = burnin.judge_dcgm(0, text[: int(len(text) * cut)], level=2, gpus=1)
    assert not v.ok and "dcgmi diag -r 2 printed truncated JSON" in v.text


def test_garbage_and_nothing_and_other_json_fail():
    assert "printed no JSON" in burnin.judge_dcgm(0, "\x1b[2J#@!\xff garbage\n", level=1).text
    assert "printed nothing" in burnin.judge_dcgm(0, "", level=1).text
    assert "no \"DCGM Diagnostic\" section" in burnin.judge_dcgm(0, '{"body": {}}', level=1).text
    assert "not an object" in burnin.judge_dcgm(0, "[1, 2]", level=1).text
    runtime = burnin.judge_dcgm(226, '{"DCGM Diagnostic": {"runtime_error": "Unable to connect to host engine"}}')
    assert not runtime.ok and "runtime error: Unable to connect to host engine" in runtime.text


def test_a_run_where_everything_was_skipped_never_passes():
    doc = json.loads(real_text(DCGM_452))
    for cat in doc["DCGM Diagnostic"]["test_categories"]:
        for test in cat["tests"]:
            for r in test["results"]:
                r["status"] = "Skip"
                r.pop("warnings", None)
    v = burnin.judge_dcgm(0, json.dumps(doc), level=2, gpus=1)
    assert not v.ok and "no test ran" in v.text


def test_a_crashed_or_killed_dcgmi_fails_with_what_it_said():
    text = real_text(DCGM_452)
    crashed = burnin.judge_dcgm(None, text[:300], "Segmentation fault\n", level=1, error="killed by signal SEGV")
    assert not crashed.ok and crashed.text == "dcgmi diag -r 1 killed by signal SEGV: Segmentation fault"
    killed = burnin.judge_dcgm(burnin.TIMEOUT_EXIT, "", level=3)
    assert not killed.ok and "did not finish in time" in killed.text


# --- dcgmi health -c -j ---------------------------------------------------------------------------

def test_real_health_check_is_healthy():
    assert burnin.judge_health(0, real_text(HEALTH)) == burnin.Verdict(True, "dcgmi health -c: Healthy", "dcgmi")


def test_health_not_healthy_truncated_or_missing_fails():
    doc = json.loads(real_text(HEALTH))
    doc["body"]["Overall Health"]["value"] = "Warning"
    assert "overall Warning" in burnin.judge_health(0, json.dumps(doc)).text
    text = real_text(HEALTH)
    assert "truncated JSON" in burnin.judge_health(0, text[: len(text) // 2]).text
    assert "\"Overall Health\" missing" in burnin.judge_health(0, '{"body": {}, "header": []}').text
    assert not burnin.judge_health(1, real_text(HEALTH)).ok


# --- all_reduce_perf ------------------------------------------------------------------------------

def test_real_gb200_all_reduce_is_read_and_passes_the_nvlink5_floor():
    run = burnin.parse_nccl(real_text(NCCL_GB200))
    assert [r[0] for r in run.rows] == [536870912, 1073741824, 2147483648, 4294967296, 8589934592]
    assert run.rows[-1] == (8589934592, 834.57, 846.82, 0)
    assert run.avg_busbw == 745.53 and run.out_of_bounds == 0
    v = burnin.judge_nccl(0, real_text(NCCL_GB200))
    assert v.ok and v.text == "all_reduce_perf: bus bandwidth 846.8 GB/s at 8 GiB (floor 648)"


def test_the_floor_comes_from_nvidias_figures():
    assert burnin.MIN_BUSBW_GBS == pytest.approx(900 * 0.8 * 0.9)
    v = burnin.judge_nccl(0, real_text(NCCL_GB200), min_busbw=900.0)
    assert not v.ok and "bus bandwidth 846.8 GB/s at 8 GiB, below the 900 GB/s NVLink 5 floor" in v.text


def test_real_nccl_failure_lines_fail_with_the_tools_words():
    v = burnin.judge_nccl(1, real_text(NCCL_FAILURE))
    assert not v.ok and v.text.startswith("all_reduce_perf: HCA-128: Test NCCL failure common.cu:1204 'unhandled cuda")
    assert not burnin.judge_nccl(0, real_text(NCCL_FAILURE)).ok        # the same words with exit 0


def test_truncated_wrong_and_garbage_nccl_output_fails():
    text = real_text(NCCL_GB200)
    early = burnin.judge_nccl(0, text[: text.index("# Out of bounds")])
    assert not early.ok and "ends early" in early.text
    wrong = text.replace("846.82      0", "846.82      7")
    assert "7 out-of-bounds (wrong) values" in burnin.judge_nccl(0, wrong).text
    oob = text.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    assert "3 out-of-bounds" in burnin.judge_nccl(0, oob).text
    assert "printed no result rows" in burnin.judge_nccl(0, "\x00\xff random bytes\n").text
    assert "did not finish in time" in burnin.judge_nccl(burnin.TIMEOUT_EXIT, text[:200]).text
    crashed = burnin.judge_nccl(None, text[:400], error="killed by signal SEGV")
    assert not crashed.ok and "killed by signal SEGV" in crashed.text


def test_commands_run_under_a_deadline():
    assert burnin.nccl_command("/usr/bin/all_reduce_perf", 4, "quick") == \
        "/usr/bin/all_reduce_perf -b 8 -e 8G -f 2 -g 4 -n 20"
    assert burnin._timed(burnin.dcgm_command("quick"), 300) == "timeout -k 10 300 dcgmi diag -r 1 -j"
    assert [s[1] for s in burnin.steps("medium")] == ["diag", "health", "nccl"]


# --- the lab's stand-ins, judged the same way ----------------------------------------------------

@pytest.fixture
def tray(tmp_path, monkeypatch):
    """A lab tray's GPU state files; returns a function running a stand-in in-process with the given faults."""
    monkeypatch.syspath_prepend(str(EMULATORS))
    for name in ("nvidia_smi", "dcgmi", "nccl_tests"):
        sys.modules.pop(name, None)
    layout = LabLayout("lab", 1, 2)
    host = next(h for h in layout.hosts() if h.kind == "tray")
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(layout, host)))
    env = {"MCTL_LAB_GPU_STATE": str(tmp_path / "gpus.json"), "MCTL_LAB_FAULTS": str(tmp_path / "faults.json")}

    def run(tool: str, argv: list[str], faults: dict | None = None) -> tuple[int, str, str]:
        (tmp_path / "faults.json").write_text(json.dumps(faults or {}))
        module = __import__({"dcgmi": "dcgmi", "all_reduce_perf": "nccl_tests"}[tool])
        out, err = io.StringIO(), io.StringIO()
        rc = module.main(argv, env=env, stdout=out, stderr=err)
        return rc, out.getvalue(), err.getvalue()

    return run


NCCL_ARGV = burnin.nccl_command("all_reduce_perf", 4, "quick").split()[1:]


def _judge(run, faults=None, level=2):
    rc, out, err = run("dcgmi", ["diag", "-r", str(level), "-j"], faults)
    diag = burnin.judge_dcgm(rc, out, err, gpus=4, level=level)
    assert run("dcgmi", ["health", "-s", "a"], faults)[0] == 0        # as health_command: the watches first
    rc, out, err = run("dcgmi", ["health", "-c", "-j"], faults)
    health = burnin.judge_health(rc, out, err)
    rc, out, err = run("all_reduce_perf", NCCL_ARGV, faults)
    return diag, health, burnin.judge_nccl(rc, out, err)


def test_stand_ins_pass_a_healthy_tray(tray):
    diag, health, nccl = _judge(tray, level=3)
    assert diag.ok and "targeted_stress" in diag.text and "on 4 GPU(s)" in diag.text
    assert health.ok
    assert nccl.ok and "at 8 GiB" in nccl.text


def test_stand_in_json_is_written_as_dcgmi_writes_it(tray):
    import dcgmi

    real = real_text(DCGM_452)
    assert dcgmi.dumps(json.loads(real)) == real
    rc, out, _err = tray("dcgmi", ["diag", "-r", "1", "-j"])
    assert rc == 0 and out.startswith('{\n\t"DCGM Diagnostic" : \n\t{\n\t\t"test_categories" : \n')


def test_uncorrectable_ecc_fails_the_memory_test(tray):
    diag, health, nccl = _judge(tray, {"ecc_uncorrectable": {"1": 2}})
    assert not diag.ok and "memory (GPU 1)" in diag.text
    assert not health.ok and "Memory system" in health.text
    assert nccl.ok


def test_nvlink_down_lowers_the_bus_bandwidth(tray):
    one = _judge(tray, {"nvlink_down": [[2, 5]]})
    assert not one[0].ok and "pcie (GPU 2)" in one[0].text and "NvLink link 5 is currently down" in one[0].text
    assert one[2].ok            # 17 of 18 links: still above the floor
    three = _judge(tray, {"nvlink_down": [[2, 5], [2, 6], [2, 7]]})[2]
    assert not three.ok and "below the 648 GB/s NVLink 5 floor" in three.text
    none = _judge(tray, {"nvlink_all_down": [0]})[2]
    assert not none.ok and "bus bandwidth 45.0 GB/s" in none.text


def test_a_fallen_off_gpu_fails_them_all(tray):
    diag, health, nccl = _judge(tray, {"fell_off_bus": [0]})
    assert not diag.ok and "software (GPU 0)" in diag.text and "memory (GPU 0)" in diag.text and "is lost" in diag.text
    assert not health.ok and "PCIe system" in health.text
    assert not nccl.ok and "Test CUDA failure common.cu:1279 'unknown error'" in nccl.text


def test_a_missing_gpu_is_missing_from_the_results(tray):
    diag, _health, nccl = _judge(tray, {"gpu_missing": [3]})
    assert not diag.ok and "results for 3 of 4 GPUs" in diag.text
    assert not nccl.ok and "invalid device ordinal" in nccl.text


@pytest.mark.parametrize("mode", ["garbage", "truncated"])
def test_a_misbehaving_tool_never_passes(tray, mode):
    faults = {"tool_faults": {"dcgmi": mode, "all_reduce_perf": mode}}
    diag, health, nccl = _judge(tray, faults)
    assert not diag.ok and not health.ok and not nccl.ok
    if mode == "truncated":
        assert "truncated JSON" in diag.text and "ends early" in nccl.text
