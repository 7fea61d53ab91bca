"""Rack-scale NVLink validation's pure parts (mctl/bringup/validate.py): the plan from the Slurm blocks, the srun
lines and the round's script, its answer parsed and judged (judge_nccl on the real GB200 NVL72 run, Slurm's
refusal with the trays' state), the finder's rounds on 18 trays, and the runs in the audit history."""

from __future__ import annotations

import base64
import itertools

import pytest

from mctl.bringup import validate as v
from mctl.errors import UsageError
from tests.helpers import real_text, site_with

pytestmark = pytest.mark.pure

NCCL_GB200 = "issue-coreweave-nccl-tests-pr43-gb200-nvl72-all-reduce.txt"
TWO_BY_NINE = [{"name": "p0", "trays": "r1-tray[01-09]"}, {"name": "p1", "trays": "r1-tray[10-18]"}]


def _rack(tmp_path, parts=TWO_BY_NINE, trays=18):
    site = site_with(tmp_path, parts=parts, trays=trays)
    return site, site.racks["r1"]


def test_the_plan_is_the_racks_slurm_blocks(tmp_path):
    site, rack = _rack(tmp_path)
    p = v.plan(site, rack)
    assert [(x.name, x.block, len(x.trays)) for x in p.partitions] == [("p0", "r1-p0", 9), ("p1", "r1-p1", 9)]
    assert v.plan(site, rack, partitions=["p1"]).partitions[0].trays[0] == "r1-tray10"
    with pytest.raises(UsageError, match="no partition p9"):
        v.plan(site, rack, partitions=["p9"])
    (tmp_path / "b").mkdir()
    whole = v.plan(*_rack(tmp_path / "b", parts=None, trays=4))
    assert [(x.name, x.trays) for x in whole.partitions] == [("r1", ("r1-tray01", "r1-tray02", "r1-tray03",
                                                                     "r1-tray04"))]


def test_srun_line_and_round_script_bound_and_clean_up_every_job(tmp_path):
    site, rack = _rack(tmp_path)
    job = v.Job("p0", "partition", v.plan(site, rack).partitions[0].trays)
    line = v.srun_command(job, "mctl-validate-x-1-0", 4, 300.0)
    assert line.startswith("timeout -k 10 330 srun --immediate=30 --job-name=mctl-validate-x-1-0 --nodes=9 --ntasks=9 "
                           "--ntasks-per-node=1 --nodelist=r1-tray[01-09] --exclusive --time=6 ")
    assert line.endswith("all_reduce_perf -b 8 -e 8G -f 2 -g 4 -n 20")
    script = v.round_script([job, v.Job("p1", "partition", ("r1-tray10",))], "x-1", 4, 300.0)
    assert script.count(" srun ") == 2 and "wait\n" in script
    assert 'scancel --quiet --name="$n"' in script and "for n in mctl-validate-x-1-0 mctl-validate-x-1-1;" in script
    assert "squeue -h -n mctl-validate-x-1-0,mctl-validate-x-1-1" in script and "sinfo -h -N -n r1-tray[01-10]" in script
    dry = v.dry_lines(v.plan(site, rack))
    assert len(dry) == 4 and "3 rounds" in dry[-1] and "--nodelist=r1-tray[10-18]" in dry[2]


def _answer(i, rc, out="", err=""):
    b = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    return f"{v.MARK} job={i} rc={rc} out={b(out)} err={b(err)}"


def test_a_round_answer_is_judged_as_burn_in_judges_nccl():
    real = real_text(NCCL_GB200)
    slow = real.replace("834.57", "401.20").replace("846.82", "399.00")
    text = "\n".join([_answer(0, 0, real, "srun: job 7 queued and waiting for resources\n"), _answer(1, 0, slow),
                      _answer(2, 124, real[:300]), f"{v.MARK}-node r1-tray01|idle|none"])
    ans = v.parse_round(text)
    jobs = [v.Job("p0", "partition", ("r1-tray01",)), v.Job("p1", "pair", ("a", "b")), v.Job("p2", "solo", ("c",))]
    ok, low, hung = (v.judge(j, ans.answers[i], ans.nodes) for i, j in enumerate(jobs))
    assert ok.ok and ok.busbw == 846.82 and "846.8 GB/s at 8 GiB" in ok.text
    assert not low.ok and low.bandwidth and low.busbw == 401.2 and "below the 648 GB/s NVLink 5 floor" in low.text
    assert not hung.ok and not hung.bandwidth and "did not finish in time (killed)" in hung.text
    assert ans.nodes == {"r1-tray01": ("idle", "none")} and ans.left == []
    assert not v.judge(jobs[0], None, {}).ok


def test_a_job_slurm_cannot_place_is_named_with_slurms_words_and_the_trays_state():
    err = ("srun: Requested partition configuration not available now\n"
           "srun: error: Unable to allocate resources: Requested node configuration is not available\n")
    ans = v.parse_round("\n".join([_answer(0, 1, "", err), f"{v.MARK}-node r1-tray03|idle|none",
                                   f"{v.MARK}-node r1-tray04|drained|ops: cable check",
                                   f"{v.MARK}-left 17 mctl-validate-x-1-0 COMPLETING"]))
    r = v.judge(v.Job("p1", "partition", ("r1-tray03", "r1-tray04")), ans.answers[0], ans.nodes)
    assert not r.ok and not r.placed
    assert r.text == ("Slurm did not place the job: Requested partition configuration not available now; Unable to "
                      "allocate resources: Requested node configuration is not available; r1-tray04 drained "
                      "(ops: cable check)")
    assert ans.left == ["17 mctl-validate-x-1-0 COMPLETING"]


def _simulate(trays, dragging, *, tool_fails=()):
    """Run the finder on one partition whose jobs fail when they hold a dragging tray."""
    part = v.PartitionPlan("p", "r-p", tuple(trays))
    finder = v.Finder([part])
    while True:
        jobs = finder.next_round()
        if not jobs:
            break
        results = []
        for j in jobs:
            bad = [t for t in j.trays if t in dragging]
            tool = any(t in tool_fails for t in j.trays)
            results.append(v.JobResult(j, not bad and not tool, "all_reduce_perf: hung" if tool else
                                       ("below the floor" if bad else "ok"), busbw=45.0 if bad else 770.0,
                                       bandwidth=bool(bad) and not tool))
        finder.record(results)
        assert len(finder.rounds) < 10
    return finder, finder.verdicts["p"]


TRAYS18 = [f"t{i:02d}" for i in range(1, 19)]


@pytest.mark.parametrize("trays", [TRAYS18, TRAYS18[:9], TRAYS18[:4], TRAYS18[:3], TRAYS18[:2]])
def test_the_finder_names_any_one_dragging_tray_within_the_bound(trays):
    for slow in trays:
        finder, verdict = _simulate(trays, {slow})
        assert list(verdict.dragging) == [slow] and verdict.status == "failed", (slow, verdict)
        assert len(finder.rounds) <= v.round_bound(len(trays)) <= 4
        assert all(len(set(j.job.trays)) == len(j.job.trays) for rs in finder.rounds for j in rs)
        for rs in finder.rounds:                          # a tray is in one job of a round at most
            used = [t for r in rs for t in r.job.trays]
            assert len(used) == len(set(used))
    assert v.round_bound(18) == 3


def test_the_finder_names_several_dragging_trays_and_a_partition_with_no_single_culprit():
    for pair in itertools.combinations(["t01", "t02", "t09", "t18"], 2):
        finder, verdict = _simulate(TRAYS18, set(pair))
        assert sorted(verdict.dragging) == sorted(pair) and len(finder.rounds) <= v.round_bound(18, 2) == 3
    finder, verdict = _simulate(TRAYS18, set(TRAYS18))             # every tray slow: no good tray to pair with
    assert sorted(verdict.dragging) == TRAYS18 and len(finder.rounds) == 3
    healthy, verdict = _simulate(TRAYS18, set())
    assert verdict.status == "passed" and len(healthy.rounds) == 1 and not verdict.dragging


def test_a_tool_failure_fails_the_partition_with_its_words_and_is_not_searched():
    finder, verdict = _simulate(TRAYS18, set(), tool_fails={"t05"})
    assert verdict.status == "failed" and verdict.text == "all_reduce_perf: hung" and not verdict.searched
    assert len(finder.rounds) == 1 and "not searched" in verdict.note


def test_validations_are_kept_in_the_audit_history(tmp_path):
    from mctl.audit.history import History

    h = History.open(tmp_path)
    doc = {"rack": "r1", "status": "failed", "dragging": ["r1-tray03"],
           "partitions": [{"name": "p1", "status": "failed", "busbw": 45.0, "text": "below", "trays": ["x"]}]}
    rid = h.record_validation("site", doc, started=1000.0, elapsed=12.5, now=1000.0 + 3600)
    assert h.validations(0.0) == [{"id": rid, "started": "1970-01-01T00:16:40+00:00", "elapsed": 12.5, "site": "site",
                                   "rack": "r1", "status": "failed", "dragging": ["r1-tray03"],
                                   "partitions": [{"name": "p1", "status": "failed", "busbw": 45.0, "text": "below"}]}]
    assert h.validations(2000.0) == []
    h.conn.execute("UPDATE validations SET report='{' WHERE id=?", (rid,))
    with pytest.raises(Exception, match="not JSON"):
        h.validations(0.0)
    h.close()


def _result(site, rack, status_by_part, dragging=()):
    vplan = v.plan(site, rack)
    out = v.Validation(vplan, "run", 0.0)
    for p in vplan.partitions:
        pv = v.PartitionVerdict(p, status=status_by_part[p.name], text="t")
        for t in dragging:
            if t in p.trays:
                pv.dragging[t] = v.JobResult(v.Job(p.name, "check", (t, p.trays[-1])), False, "below", busbw=45.0)
        out.verdicts.append(pv)
    out.rounds = [[]]
    return out


@pytest.fixture
def phase_ctx(tmp_path, monkeypatch):
    from mctl.bringup import mndiag
    from mctl.bringup.context import Context, Options, Reporter
    from mctl.health import burnin
    from mctl.sched.slurm import holds

    site, rack = _rack(tmp_path)
    held: list = []
    monkeypatch.setattr(mndiag, "dcgm_versions", lambda s, hosts: ({h.name: "4.2.3" for h in hosts}, {}))
    monkeypatch.setattr(burnin, "probe_tools", lambda s, hosts: ({h.name: {"all_reduce_perf": "/usr/bin/x"}
                                                                  for h in hosts}, {}))
    monkeypatch.setattr(holds, "hold", lambda s, trays, owner, reason: (held.append((list(trays), owner, reason))
                                                                         or (list(trays), {})))
    ctx = Context(site, rack, tmp_path, Options(), Reporter(), run_id="run1")
    return ctx, site, rack, held, monkeypatch


def test_the_bring_up_phase_holds_a_dragging_tray_again_and_fails_with_the_report(phase_ctx):
    from mctl.bringup.context import PhaseFailed
    from mctl.bringup.phases import validate as phase
    from mctl.sched.slurm import holds

    ctx, site, rack, held, monkeypatch = phase_ctx
    monkeypatch.setattr(v, "run_validation", lambda *a, **k: _result(site, rack, {"p0": "passed", "p1": "failed"},
                                                                     ["r1-tray12"]))
    with pytest.raises(PhaseFailed) as err:
        phase.run(ctx)
    assert err.value.exit_code == 1 and err.value.message == "NVLink validation failed on p1: r1-tray12 drags it"
    assert held == [(["r1-tray12"], holds.BRING_UP, holds.bringup_reason("run1"))]
    assert err.value.artifacts["validation"]["dragging"] == ["r1-tray12"]
    assert "r1-tray12: held by bring-up until repaired" in err.value.details

    monkeypatch.setattr(v, "run_validation", lambda *a, **k: _result(site, rack, {"p0": "passed", "p1": "passed"}))
    done = phase.run(ctx)
    assert done.status == "done" and "passed on 2 partition(s)" in done.summary and done.artifacts["validation"]

    monkeypatch.setattr(v, "run_validation", lambda *a, **k: _result(site, rack, {"p0": "passed", "p1": "unplaced"}))
    with pytest.raises(PhaseFailed, match="Slurm could not place the validation of p1") as err:
        phase.run(ctx)
    assert err.value.exit_code == 3


def test_the_bring_up_phase_is_skipped_with_burn_in_off(phase_ctx):
    import dataclasses

    from mctl.bringup.phases import validate as phase

    ctx, *_ = phase_ctx
    ctx.options = dataclasses.replace(ctx.options, burn_in="off")
    assert phase.run(ctx).summary == "--burn-in off" and phase.plan(ctx) == ["skipped: --burn-in off"]


def test_the_command_prints_its_plan_and_refuses_bad_input(tmp_path, capsys, monkeypatch):
    import json

    from mctl.bringup import mndiag
    from tests.unit.cli_helpers import run_cli

    asked: list = []
    monkeypatch.setattr(mndiag, "dcgm_versions", lambda s, hosts: (asked.append(len(hosts)) or (
        {h.name: ("4.3.1" if h.name <= "r1-tray09" else "4.2.3") for h in hosts}, {})))
    site_with(tmp_path, parts=TWO_BY_NINE, trays=18)
    base = ("-i", str(tmp_path), "--state-dir", str(tmp_path / "state"), "rack", "validate")
    res = run_cli(capsys, *base, "r1", "--dry-run", "--json")
    assert res.code == 0, res.err
    doc = json.loads(res.out)
    assert doc["dry_run"] and [p["nodes"] for p in doc["partitions"]] == ["r1-tray[01-09]", "r1-tray[10-18]"]
    assert "--nodelist=r1-tray[01-09]" in doc["plan"][1] and doc["min_busbw_gbs"] == 648.0
    # p0's trays have DCGM 4.3.1: mndiag; p1's 4.2.3: the all-reduce (one dpkg-query per tray, 18 trays)
    assert asked[-1] == 18 and [p["method"] for p in doc["partitions"]] == ["mndiag", "all-reduce"]
    assert "dcgmi mndiag --hostList 'r1-tray01;" in doc["plan"][1] and "all_reduce_perf" in doc["plan"][2]
    assert "r1-tray10 DCGM 4.2.3" in doc["partitions"][1]["method_why"]
    forced = json.loads(run_cli(capsys, *base, "r1", "--dry-run", "--json", "--method", "all-reduce").out)
    assert [p["method"] for p in forced["partitions"]] == ["all-reduce", "all-reduce"]
    assert run_cli(capsys, *base, "r1", "--dry-run", "--method", "dcgm").code == 2
    placed = json.loads(run_cli(capsys, *base, "r1", "--dry-run", "--json", "--place-wait", "7").out)
    assert placed["place_wait_s"] == 7 and "salloc --immediate=7 " in placed["plan"][1] and "(+7s" in placed["plan"][0]
    assert not (tmp_path / "state" / "locks").exists() or not any((tmp_path / "state" / "locks").iterdir())
    assert run_cli(capsys, *base, "r9", "--dry-run").code == 2
    bad = run_cli(capsys, *base, "r1", "--partition", "p7", "--dry-run")
    assert bad.code == 2 and "no partition p7" in bad.err
    assert run_cli(capsys, *base, "r1", "--job-deadline", "nan", "--dry-run").code == 2
    (tmp_path / "k").mkdir()
    site_with(tmp_path / "k", scheduler=None)
    none = run_cli(capsys, "-i", str(tmp_path / "k"), "rack", "validate", "r1", "--dry-run")
    assert none.code == 2 and "through Slurm" in none.err


def test_garbage_truncated_and_crashed_tables_fail_with_the_tools_words_and_are_not_searched():
    real = real_text(NCCL_GB200)
    job = v.Job("p0", "partition", ("a", "b"))
    cut = v.judge(job, v.Answer(0, real[: real.index("# Out of bounds")], ""), {})
    assert not cut.ok and not cut.bandwidth and "ends early" in cut.text
    junk = v.judge(job, v.Answer(0, "\x1b[2J#@!" + "x" * 50, ""), {})
    assert not junk.ok and not junk.bandwidth and "printed no result rows" in junk.text
    crash = v.judge(job, v.Answer(139, real[:400], "srun: error: a: task 0: Segmentation fault (core dumped)\n"), {})
    assert not crash.ok and not crash.bandwidth and "Segmentation fault" in crash.text
