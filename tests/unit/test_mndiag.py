"""rack validate's DCGM multi-node diagnostic (mctl/bringup/mndiag.py): the choice of method, the command, the
judge of dcgmi mndiag's JSON (its contract from NVIDIA/DCGM dcgmi/MnDiag.cpp, no capture exists), and the lab's
stand-in (mctl/lab/emulators/dcgmi.py `mndiag`) run in-process, judged the same way."""

from __future__ import annotations

import io
import json
import sys

import pytest

from mctl.bringup import mndiag, validate
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import LabLayout
from mctl.lab.services import EMULATORS

pytestmark = pytest.mark.pure

TRAYS = ("lab-r1-tray01", "lab-r1-tray02")


def _doc(status="Pass", failing=None, hosts=TRAYS, gpus=4, drop=None):
    """A response as dcgmi/MnDiag.cpp's HelperJsonBuildOutput writes it (key names: NvvsJsonStrings.h)."""
    failing = failing or {}
    results = []
    for hid, _h in enumerate(hosts):
        for g in range(gpus):
            if drop == (hid, g):
                continue
            r = {"host_id": hid, "entity_group": "GPU", "entity_group_id": 1, "entity_id": g, "status": "Pass"}
            if (hid, g) in failing:
                r["status"] = "Fail"
                r["warnings"] = [{"warning": failing[(hid, g)], "error_id": 0, "error_category": 1,
                                  "error_severity": 2}]
            results.append(r)
    return {"DCGM Diagnostic": "DCGM Multi-Node Diagnostic",
            "metadata": {"num_hosts": len(hosts), "num_entities": len(results)},
            "hosts": [{"host_id": i, "hostname": h, "dcgm_version": "4.3.1", "driver_version": "570.148.08",
                       "num_entities": gpus, "entities": []} for i, h in enumerate(hosts)],
            "test_categories": [{"category": "Multi-Node Tests", "tests": [
                {"name": "MNUBERGEMM", "status": status, "test_summary": {"status": status}, "results": results}]}]}


def _text(doc) -> str:
    return json.dumps(doc, indent=3, sort_keys=True, separators=(",", " : ")) + "\n"


# --- the judge ------------------------------------------------------------------------------------

def test_a_passing_run_passes():
    v = mndiag.judge(TRAYS, 4, 0, _text(_doc()))
    assert v.ok and v.failing == {} and v.text == "mnubergemm Pass on 2 host(s), 8 GPU(s)"


def test_a_failing_host_is_named_from_its_own_results():
    v = mndiag.judge(TRAYS, 4, 0, _text(_doc("Fail", {(1, 2): "GPU 2's NvLink link 0 is currently down"})))
    assert not v.ok and v.failing == {"lab-r1-tray02": "GPU 2 Fail: GPU 2's NvLink link 0 is currently down"}
    assert v.text == "mnubergemm Fail on lab-r1-tray02"


def test_exit_0_with_a_failed_test_still_fails():
    # dcgmi exits 0 once the run completed, whatever the result: the JSON decides
    assert not mndiag.judge(TRAYS, 4, 0, _text(_doc("Fail"))).ok


@pytest.mark.parametrize("text,words", [
    ("", "printed nothing"),
    ("\x1b[2J#@!\xff" + "q" * 50, "printed no JSON"),
    ("{ \"DCGM Diagnostic\" : \"DCGM Multi-Node Diagnostic\", \"hosts\" : [", "does not parse"),
    ('{"DCGM Diagnostic": {"test_categories": []}}', "not a multi-node diagnostic's"),
    ('{"DCGM Diagnostic": "DCGM Multi-Node Diagnostic", "hosts": [{"hostname": "x"}]}', "lacks a field"),
])
def test_garbage_truncated_or_empty_output_never_passes(text, words):
    v = mndiag.judge(TRAYS, 4, 0, text, "")
    assert not v.ok and words in v.text and v.failing == {}, v.text


def test_truncated_json_from_the_stand_in_half_fails():
    text = _text(_doc())
    v = mndiag.judge(TRAYS, 4, 0, text[: len(text) // 2])
    assert not v.ok and "does not parse" in v.text


def test_a_killed_run_says_so():
    v = mndiag.judge(TRAYS, 4, 124, "", "salloc: Job allocation 7 has been revoked")
    assert not v.ok and v.text.startswith("dcgmi mndiag did not finish in time (killed)")


def test_a_runtime_error_fails_with_the_tools_words():
    doc = {"DCGM Diagnostic": "DCGM Multi-Node Diagnostic", "metadata": {"num_hosts": 0, "num_entities": 0},
           "runtime_error": "Error: Unable to complete multi-node diagnostic on host lab-r1-tray01. Return: (x) -3\n"}
    v = mndiag.judge(TRAYS, 4, 253, _text(doc))
    assert not v.ok and "Unable to complete multi-node diagnostic on host lab-r1-tray01" in v.text


def test_a_host_missing_or_short_of_gpus_is_named():
    v = mndiag.judge(TRAYS, 4, 0, _text(_doc(hosts=TRAYS[:1])))
    assert not v.ok and v.failing == {"lab-r1-tray02": "not among mndiag's hosts"}
    v = mndiag.judge(TRAYS, 4, 0, _text(_doc(drop=(0, 3))))
    assert not v.ok and v.failing == {"lab-r1-tray01": "3 of 4 GPUs in mndiag's results (GPUs 0, 1, 2)"}


def test_an_mpi_error_without_a_gpu_fails_and_says_it():
    doc = _doc("Fail")
    doc["test_categories"][0]["tests"][0]["mpi_error"] = {"warning": "Error: mpirun exited 1", "error_category": "MPI"}
    v = mndiag.judge(TRAYS, 4, 0, _text(doc))
    assert not v.ok and v.failing == {} and v.text == "mnubergemm Fail: Error: mpirun exited 1"


# --- the method, the command ----------------------------------------------------------------------

def test_mndiag_only_where_every_tray_has_dcgm_4_3():
    assert mndiag.partition_method({"a": "4.3.1", "b": "4.5.2"}, ["a", "b"])[0] == "mndiag"
    how, why = mndiag.partition_method({"a": "4.3.1", "b": "4.2.3"}, ["a", "b"])
    assert how == "all-reduce" and "b DCGM 4.2.3" in why
    how, why = mndiag.partition_method({"a": "4.3.1"}, ["a", "b"], unreachable={"b": "unreachable: refused"})
    assert how == "all-reduce" and "b not asked (unreachable: refused)" in why
    assert mndiag.partition_method({}, ["a"], "mndiag")[0] == "mndiag"
    assert mndiag.partition_method({"a": "4.3.1"}, ["a"], "all-reduce")[0] == "all-reduce"
    assert not mndiag.supports(None) and not mndiag.supports("3.3.9") and mndiag.supports("10.0")


def test_the_command_runs_from_the_first_tray_in_an_allocation_of_the_block():
    cmd = mndiag.command(TRAYS, "mctl-validate-1-0", 300, 30)
    assert cmd == ("timeout -k 10 330 salloc --immediate=30 --job-name=mctl-validate-1-0 --nodes=2 "
                   "--nodelist=lab-r1-tray[01-02] --exclusive --time=6 srun --nodes=1 --ntasks=1 "
                   "--nodelist=lab-r1-tray01 --kill-on-bad-exit=1 dcgmi mndiag --hostList "
                   "'lab-r1-tray01;lab-r1-tray02' --run mnubergemm --json")
    with pytest.raises(ValueError):
        mndiag.host_list(["a;rm -rf /"])
    with pytest.raises(ValueError):
        mndiag.host_list([f"t{i}" for i in range(73)])


def test_versions_read_from_dpkg():
    text = "datacenter-gpu-manager-4-core\t1:4.3.1-1\tii \ndatacenter-gpu-manager\t1:3.3.9-1\trc \n"
    assert mndiag.parse_versions(text) == "4.3.1"
    assert mndiag.parse_versions("") is None
    assert "dpkg-query -W" in mndiag.versions_command() and "timeout 10" in mndiag.versions_command()


def test_the_finder_runs_mndiag_once_and_names_its_failing_tray():
    part = validate.PartitionPlan("p1", "b1", TRAYS, method="mndiag", why="every tray has DCGM 4.3.1")
    other = validate.PartitionPlan("p0", "b0", ("lab-r1-tray03", "lab-r1-tray04"))
    finder = validate.Finder([part, other])
    jobs = finder.next_round()
    assert [(j.kind, j.partition) for j in jobs] == [("mndiag", "p1"), ("partition", "p0")]
    script = validate.round_script(jobs, "R", 4, 300)
    assert "salloc --immediate=30" in script and "all_reduce_perf -b 8" in script
    answer = validate.Answer(0, _text(_doc("Fail", {(1, 0): "GPU 0 is lost"})), "salloc: Granted job allocation 9\n")
    r = validate.judge(jobs[0], answer, {}, gpus=4)
    assert not r.ok and r.failing == {"lab-r1-tray02": "GPU 0 Fail: GPU 0 is lost"}
    good = validate.JobResult(jobs[1], True, "ok", busbw=770.0)
    finder.record([r, good])
    assert finder.done
    v = finder.verdicts["p1"]
    assert v.status == "failed" and not v.searched and v.failing == {"lab-r1-tray02": "GPU 0 Fail: GPU 0 is lost"}
    out = validate.Validation(validate.ValidationPlan("r1", (part, other), 4, 300, 648.0), "R", 0.0,
                              verdicts=list(finder.verdicts.values()), rounds=finder.rounds)
    assert out.named() == ["lab-r1-tray02"] and out.to_dict()["failing"] == ["lab-r1-tray02"]
    assert out.to_dict()["partitions"][0]["method"] == "mndiag"
    assert "  lab-r1-tray02 fails p1's mndiag: GPU 0 Fail: GPU 0 is lost" in out.lines()


def test_slurms_refusal_of_the_allocation_is_unplaced():
    job = validate.Job("p1", "mndiag", TRAYS)
    err = "salloc: error: Job submit/allocate failed: Requested node configuration is not available\n"
    r = validate.judge(job, validate.Answer(1, "", err), {"lab-r1-tray01": ("drained", "maint")})
    assert not r.placed and "Requested node configuration is not available" in r.text and "tray01 drained" in r.text


# --- the lab's stand-in ---------------------------------------------------------------------------

@pytest.fixture
def dcgmi(tmp_path, monkeypatch):
    """The stand-in module, and a function making one lab tray's state (its env) with the given faults."""
    monkeypatch.syspath_prepend(str(EMULATORS))
    for name in ("nvidia_smi", "dcgmi"):
        sys.modules.pop(name, None)
    import dcgmi as module

    layout = LabLayout("lab", 1, 2)
    hosts = [h for h in layout.hosts() if h.kind == "tray"]

    def tray(i: int, faults: dict | None = None) -> dict:
        d = tmp_path / f"t{i}"
        d.mkdir(exist_ok=True)
        (d / "gpus.json").write_text(json.dumps(gpu_state(layout, hosts[i])))
        (d / "faults.json").write_text(json.dumps(faults or {}))
        return {"MCTL_LAB_GPU_STATE": str(d / "gpus.json"), "MCTL_LAB_FAULTS": str(d / "faults.json")}

    return module, tray


def _run(module, envs: dict, argv, head_env):
    """main() with the workers' reports taken from each host's own state (what srun --overlap gathers)."""
    def gather(hosts, env=None, timeout=0):
        reports = {}
        for h in hosts:
            if h not in envs:
                raise RuntimeError(f"no report from {h} (srun exit 1)")
            reports[h] = dict(module.worker_report(envs[h]), host=h)
        return reports
    module.gather = gather
    out, err = io.StringIO(), io.StringIO()
    rc = module.main(argv, env=head_env, stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


ARGV = ["mndiag", "--hostList", "lab-r1-tray01;lab-r1-tray02", "--run", "mnubergemm", "--json"]


def test_stand_in_healthy_trays_pass(dcgmi):
    module, tray = dcgmi
    envs = {"lab-r1-tray01": tray(0), "lab-r1-tray02": tray(1)}
    rc, out, _err = _run(module, envs, ARGV, envs["lab-r1-tray01"])
    assert rc == 0 and out.startswith('{\n   "DCGM Diagnostic" : "DCGM Multi-Node Diagnostic",')
    v = mndiag.judge(TRAYS, 4, rc, out)
    assert v.ok, v.text
    doc = json.loads(out)
    assert [h["hostname"] for h in doc["hosts"]] == list(TRAYS) and doc["metadata"]["num_entities"] == 8


@pytest.mark.parametrize("faults,words", [
    ({"nvlink_down": [[1, 3]]}, "GPU 1 Fail: GPU 1's NvLink link 3 is currently down"),
    ({"fell_off_bus": [2]}, "GPU 2 Fail: GPU 2 is lost"),
    ({"ecc_uncorrectable": {"0": 2}}, "GPU 0 Fail: Detected 2 volatile double-bit ECC error(s) in GPU 0."),
    ({"gpu_missing": [3]}, "3 of 4 GPUs in mndiag's results"),
])
def test_stand_in_faults_fail_the_tray_and_name_it(dcgmi, faults, words):
    module, tray = dcgmi
    envs = {"lab-r1-tray01": tray(0), "lab-r1-tray02": tray(1, faults)}
    rc, out, _err = _run(module, envs, ARGV, envs["lab-r1-tray01"])
    v = mndiag.judge(TRAYS, 4, rc, out)
    assert rc == 0 and not v.ok and list(v.failing) == ["lab-r1-tray02"] and words in v.failing["lab-r1-tray02"], v


@pytest.mark.parametrize("mode", ["garbage", "truncated"])
def test_stand_in_tool_faults_never_pass(dcgmi, mode):
    module, tray = dcgmi
    envs = {"lab-r1-tray01": tray(0, {"tool_faults": {"dcgmi": mode}}), "lab-r1-tray02": tray(1)}
    rc, out, _err = _run(module, envs, ARGV, envs["lab-r1-tray01"])
    assert not mndiag.judge(TRAYS, 4, rc, out).ok


def test_stand_in_an_unreached_host_is_a_runtime_error(dcgmi):
    module, tray = dcgmi
    envs = {"lab-r1-tray01": tray(0)}
    rc, out, _err = _run(module, envs, ARGV, envs["lab-r1-tray01"])
    v = mndiag.judge(TRAYS, 4, rc, out)
    assert rc == 253 and not v.ok and "no report from lab-r1-tray02" in v.text


def test_stand_in_text_form_and_host_spec_grammar(dcgmi):
    module, tray = dcgmi
    envs = {"lab-r1-tray01": tray(0), "lab-r1-tray02": tray(1, {"nvlink_down": [[0, 1]]})}
    rc, out, _err = _run(module, envs, ARGV[:-1], envs["lab-r1-tray01"])
    assert rc == 0 and out.startswith("Multi-node diagnostic failed.\n")
    assert "| Host 1                    | Fail" in out and "| Hosts With Errors         | 1" in out
    assert module.parse_host_list("a;b:5556=0,2-3;c:unix:///run/x.sock=*") == [
        ("a", "5555", None), ("b", "5556", [0, 2, 3]), ("c", "unix:///run/x.sock", None)]
    for bad in ("", "a;;b", "a;a", "a:99999", "a=3-1", "a:unix://rel", ";".join(f"h{i}" for i in range(73))):
        with pytest.raises(module.HostSpecError):
            module.parse_host_list(bad)
    out_, err = io.StringIO(), io.StringIO()
    assert module.main(["mndiag", "--run", "mnubergemm"], env=envs["lab-r1-tray01"], stdout=out_, stderr=err) == 255


def test_stand_in_version_is_the_package_and_gates_mndiag(dcgmi, tmp_path):
    module, tray = dcgmi
    status = tmp_path / "status"
    status.write_text("Package: datacenter-gpu-manager-4-core\nStatus: install ok installed\nVersion: 1:4.2.3-1\n\n")
    assert module.version(str(status)) == "4.2.3" and not module.has_mndiag("4.2.3")
    status.write_text("Package: datacenter-gpu-manager-4-core\nStatus: install ok installed\nVersion: 1:4.5.2-1\n")
    assert module.version(str(status)) == "4.5.2" and module.has_mndiag("4.5.2")
    assert module.version(str(tmp_path / "none")) == module.VERSION
