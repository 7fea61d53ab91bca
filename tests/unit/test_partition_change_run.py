"""The steps of a partition change: their order, what applies, the rollback, the journal and --resume.

The runner is driven with stand-in steps (the real ones talk to NMX-M, the trays and
Slurm; tests/integration/test_partition_jobs.py runs those on the lab).
"""

from __future__ import annotations

import json

import pytest

from mctl.bringup import journal as jr
from mctl.errors import EnvironmentProblem, UsageError
from mctl.fabric import change as ch
from mctl.change import run as cr
from mctl.model.site import Partition


def test_steps_are_in_the_safe_order():
    assert ch.STEPS == ("hold", "record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up",
                        "slurm-topology", "slurm-verify", "labels", "release")
    assert set(ch.STEP_TITLES) == set(ch.STEPS)


@pytest.mark.parametrize("failed, done, undo", [
    ("hold", [], ["undo-release"]),
    ("record", ["hold"], ["undo-record", "undo-release"]),
    ("nmx", ["hold", "record"], ["undo-nmx", "undo-cliques", "undo-record", "undo-release"]),
    ("cliques", ["hold", "record", "nmx"], ["undo-nmx", "undo-cliques", "undo-record", "undo-release"]),
    ("imex-up", ["hold", "nmx", "cliques", "imex-files", "imex-restart"],
     ["undo-nmx", "undo-cliques", "undo-imex-files", "undo-imex-restart", "undo-imex-up", "undo-release"]),
    ("slurm-verify", ["hold", "record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up", "slurm-topology"],
     ["undo-nmx", "undo-cliques", "undo-imex-files", "undo-imex-restart", "undo-imex-up", "undo-slurm-topology",
      "undo-slurm-verify", "undo-record", "undo-release"]),
    ("labels", list(ch.STEPS[:9]),
     ["undo-nmx", "undo-cliques", "undo-imex-files", "undo-imex-restart", "undo-imex-up", "undo-slurm-topology",
      "undo-slurm-verify", "undo-labels", "undo-record", "undo-release"]),
    ("release", list(ch.STEPS[:10]), []),
])
def test_rollback_undoes_every_layer_touched_in_the_same_order(failed, done, undo):
    assert list(ch.rollback_steps(failed, done)) == undo


def test_steps_that_do_not_apply_say_why():
    kw = dict(has_nmx=True, record=True, affected=True)
    assert ch.step_applies("hold", scheduler=None, **kw) == \
        "the site runs no scheduler (no Slurm, no Kubernetes: nothing to hold)"
    # Kubernetes: the affected nodes are cordoned (and their pods evicted by --drain), uncordoned after
    assert ch.step_applies("hold", scheduler="k8s", **kw) is None
    assert ch.step_applies("release", scheduler="k8s", **kw) is None
    assert ch.step_applies("slurm-topology", scheduler="k8s", **kw) == "the site runs no Slurm"
    assert ch.step_applies("labels", scheduler="slurm", **kw) == "the site runs no Kubernetes"
    assert ch.step_applies("labels", scheduler="k8s", **kw) is None
    assert ch.step_applies("nmx", scheduler="slurm", has_nmx=False, record=True, affected=True) == \
        "the rack has no NMX-M endpoint"
    assert ch.step_applies("record", scheduler="slurm", has_nmx=True, record=False, affected=True)
    assert ch.step_applies("imex-files", scheduler="slurm", has_nmx=True, record=True, affected=False) == \
        "no tray changes partition"
    # NMX-M is asked even when no tray moves (--prune of an empty partition)
    assert ch.step_applies("nmx", scheduler="slurm", has_nmx=True, record=False, affected=False) is None


def test_cliques_settled():
    groups = [("t1", "t2"), ("t3", "t4")]
    old = {"t1": "u.1", "t2": "u.1", "t3": "u.1", "t4": "u.1"}
    # NMX-M not followed yet: one clique over both partitions
    assert cr.cliques_settled(groups, dict(old)) == ["clique u.1 spans 2 partitions"]
    assert cr.cliques_settled(groups, {"t1": "u.2", "t2": "u.2", "t3": "u.3", "t4": "u.3"}) == []
    # a new partition may reuse a deleted one's ID: the numbers are never judged, the grouping is
    assert cr.cliques_settled(groups, {"t1": "u.1", "t2": "u.1", "t3": "u.3", "t4": "u.3"}) == []
    # a GPU in progress (not attached) is not settled; nor is a partition with two cliques
    assert cr.cliques_settled(groups, {"t1": "u.2", "t2": None, "t3": "u.3", "t4": "u.3"})[0].startswith("t2: no clique")
    assert cr.cliques_settled(groups, {"t1": "u.2", "t2": "u.9", "t3": "u.3", "t4": "u.3"}) == \
        ["the partition of t1, t2 shows 2 cliques"]


# ------------------------------------------------------------------ the runner, with stand-in steps

class _Site:
    name = "lab"
    file = "/nonexistent/mctl.yml"

    def __init__(self, rack):
        self.racks = {"r1": rack}
        self.scheduler = type("S", (), {"type": "slurm"})()


class _Host:
    def __init__(self, name):
        self.name = name


class _Rack:
    name = "r1"
    nmx = object()
    partitions = ()

    def __init__(self):
        self.compute = [_Host(f"t{i}") for i in range(1, 5)]


@pytest.fixture()
def fake(monkeypatch):
    calls: list[str] = []
    fail: dict[str, int] = {}

    def make(step):
        def run(ctx):
            name = ("undo-" if ctx.undo else "") + step
            calls.append(name)
            if fail.get(name, 0) > 0:
                fail[name] -= 1
                raise EnvironmentProblem(f"{name} broke", hint="fix it")
            return cr.Outcome(jr.DONE, f"{name} ok", True)
        return run

    monkeypatch.setattr(cr, "_STEPS", {s: make(s) for s in ch.STEPS})
    monkeypatch.setattr(cr, "_slurm_deployed", lambda ctx: True)
    return calls, fail


def _spec():
    before = [Partition("all", "r1", ("t1", "t2", "t3", "t4"))]
    after = [Partition("p0", "r1", ("t1", "t2")), Partition("p1", "r1", ("t3", "t4"))]
    return cr.ChangeSpec.of("r1", "create", before, after, record=True)


def test_a_change_runs_every_step_once_in_order(tmp_path, fake):
    calls, _ = fake
    run = cr.run_change(_Site(_Rack()), _spec(), tmp_path)
    assert run.status == jr.RUN_SUCCEEDED and run.exit_code == 0 and run.error is None
    assert calls == [s for s in ch.STEPS if s != "labels"]           # a Slurm site: no Kubernetes labels
    data = json.loads(run.journal.path.read_text())
    assert data["kind"] == "partition-change" and data["change"]["after"][0] == {"name": "p0", "trays": ["t1", "t2"]}
    assert run.journal.path.parent.parent == tmp_path / "partition-change" / "r1"
    assert [s["status"] for s in run.to_dict()["steps"]] == ["done"] * 9 + ["skipped", "done"]


def test_a_step_that_does_not_apply_is_journaled_as_skipped(tmp_path, fake):
    calls, _ = fake
    site = _Site(_Rack())
    site.scheduler = None
    run = cr.run_change(site, _spec(), tmp_path)
    steps = {s["step"]: s for s in run.to_dict()["steps"]}
    assert steps["hold"]["status"] == "skipped" and "no Slurm" in steps["hold"]["summary"]
    assert steps["slurm-topology"]["summary"].startswith("not applicable:")
    assert "hold" not in calls and "nmx" in calls


def test_slurm_steps_wait_for_a_deployed_slurm(tmp_path, fake, monkeypatch):
    calls, _ = fake
    monkeypatch.setattr(cr, "_slurm_deployed", lambda ctx: False)
    run = cr.run_change(_Site(_Rack()), _spec(), tmp_path)
    steps = {s["step"]: s for s in run.to_dict()["steps"]}
    assert run.status == jr.RUN_SUCCEEDED
    for s in ("hold", "slurm-topology", "slurm-verify", "release"):
        assert steps[s]["status"] == "skipped" and "Slurm is not deployed yet" in steps[s]["summary"]
    assert calls == ["record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up"]


def test_a_failed_step_rolls_back_every_layer_it_touched(tmp_path, fake):
    calls, fail = fake
    fail["imex-up"] = 1
    run = cr.run_change(_Site(_Rack()), _spec(), tmp_path)
    assert run.status == "rolled-back" and run.exit_code == 3
    assert "step imex-up failed: imex-up broke; rolled back" in run.error.message
    assert calls == ["hold", "record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up",
                     "undo-nmx", "undo-cliques", "undo-imex-files", "undo-imex-restart", "undo-imex-up",
                     "undo-record", "undo-release"]
    steps = {s["step"]: s["status"] for s in run.to_dict()["steps"]}
    assert steps["slurm-topology"] == "excluded" and steps["imex-up"] == "failed"
    with pytest.raises(UsageError, match="nothing to resume"):
        cr.resume_change(_Site(_Rack()), "r1", tmp_path)


def test_a_rollback_that_stops_says_where_each_layer_is_and_resumes(tmp_path, fake):
    calls, fail = fake
    fail["nmx"] = 1
    fail["undo-nmx"] = 1                      # NMX-M does not answer for the rollback either
    run = cr.run_change(_Site(_Rack()), _spec(), tmp_path)
    assert run.status == "failed" and run.exit_code == 3
    msg = run.error.message
    assert "step nmx failed (nmx broke) and the rollback stopped at undo-nmx: undo-nmx broke" in msg
    assert "not yet back: NMX-M, the inventory" in msg
    assert "'mctl partition apply r1 --resume'" in run.error.hint
    calls.clear()
    again = cr.resume_change(_Site(_Rack()), "r1", tmp_path)
    assert again.status == "rolled-back" and again.resumed
    assert calls == ["undo-nmx", "undo-cliques", "undo-record", "undo-release"]


def test_a_killed_change_resumes_at_the_step_it_was_in(tmp_path, fake):
    calls, _ = fake
    spec = _spec()
    journal = cr.ChangeJournal.create(tmp_path, "lab", "x", "r1", list(ch.STEPS), list(ch.STEPS), {})
    journal.data["change"] = spec.to_dict()
    for s in ("hold", "record", "nmx"):
        journal.start(s)
        journal.finish(s, jr.DONE, "ok")
    journal.start("cliques")                  # then kill -9: the step stays "running", the process is gone
    journal.data["attempts"][-1]["pid"] = 999999999
    journal.save()
    run = cr.resume_change(_Site(_Rack()), "r1", tmp_path)
    assert run.status == jr.RUN_SUCCEEDED and run.resumed
    assert calls == [s for s in ch.STEPS[3:] if s != "labels"]
    history = run.journal.phase("cliques")["history"]
    assert history[0]["status"] == "killed"


def test_a_failed_release_is_not_rolled_back(tmp_path, fake):
    calls, fail = fake
    fail["release"] = 1
    run = cr.run_change(_Site(_Rack()), _spec(), tmp_path)
    assert run.status == "failed" and "done on every layer but the holds could not be released" in run.error.message
    assert not any(c.startswith("undo-") for c in calls)
    calls.clear()
    assert cr.resume_change(_Site(_Rack()), "r1", tmp_path).status == jr.RUN_SUCCEEDED
    assert calls == ["release"]


def test_a_damaged_change_record_is_named(tmp_path):
    from mctl.state.files import DamagedState

    with pytest.raises(DamagedState, match="cannot be read"):
        cr.ChangeSpec.from_dict(tmp_path / "journal.json", {"rack": "r1"})


# ------------------------------------------------------------------ isolate / restore (pure)

class _R:
    name = "r1"

    def __init__(self, parts=()):
        self.compute = [_Host(f"t{i}") for i in range(1, 7)]
        self.partitions = tuple(parts)


def _p(name, *trays):
    return Partition(name, "r1", tuple(trays))


def test_isolate_moves_the_tray_to_a_quarantine_partition():
    rack = _R([_p("p0", "t1", "t2", "t3"), _p("p1", "t4", "t5", "t6")])
    assert ch.isolate_partitions(rack, "t2") == (_p("p0", "t1", "t3"), _p("p1", "t4", "t5", "t6"),
                                                 _p("quarantine-t2", "t2"))
    assert ch.isolate_partitions(rack, "t2", to="default") == (_p("p0", "t1", "t3"), _p("p1", "t4", "t5", "t6"))
    # a rack without partitions is one partition of every tray
    assert ch.isolate_partitions(_R(), "t6") == (_p("all", "t1", "t2", "t3", "t4", "t5"), _p("quarantine-t6", "t6"))


@pytest.mark.parametrize("parts, tray, to, message", [
    ([_p("p0", "t1", "t3"), _p("quarantine-t2", "t2")], "t2", "quarantine", "isolated already"),
    ([_p("p0", "t1", "t3")], "t2", "default", "in no partition"),
    ([], "t9", "quarantine", "not a compute tray"),
    ([], "t1", "elsewhere", "--to must be one of"),
])
def test_isolate_refuses(parts, tray, to, message):
    with pytest.raises(UsageError, match=message):
        ch.isolate_partitions(_R(parts), tray, to=to)


def test_restore_puts_the_tray_back():
    before = (_p("p0", "t1", "t2", "t3"), _p("p1", "t4", "t5", "t6"))
    after = ch.isolate_partitions(_R(before), "t2")
    # the rack as the isolation left it: exactly back
    assert ch.restore_partitions(_R(after), "t2", (before, after)) == before
    # partitions changed since (p1 split): the tray joins its former partition by name
    changed = (_p("p0", "t1", "t3"), _p("p1", "t4", "t5"), _p("p2", "t6"), _p("quarantine-t2", "t2"))
    assert ch.restore_partitions(_R(changed), "t2", (before, after)) == (_p("p0", "t1", "t2", "t3"),
                                                                       _p("p1", "t4", "t5"), _p("p2", "t6"))
    with pytest.raises(UsageError, match="no finished 'mctl partition isolate t2'"):
        ch.restore_partitions(_R(after), "t2", None)
    with pytest.raises(UsageError, match="former partition 'p0' is gone"):
        ch.restore_partitions(_R((_p("p1", "t1", "t3"), _p("quarantine-t2", "t2"))), "t2", (before, after))


def test_last_isolation_reads_the_journals(tmp_path, fake):
    before = (_p("p0", "t1", "t2"), _p("p1", "t3", "t4"))
    after = (_p("p0", "t1", "t2"), _p("p1", "t3"), _p("quarantine-t4", "t4"))
    site = _Site(_Rack())
    assert cr.last_isolation(tmp_path, "r1", "t4") is None
    cr.run_change(site, cr.ChangeSpec.of("r1", "isolate", before, after, record=True, tray="t4"), tmp_path)
    assert cr.last_isolation(tmp_path, "r1", "t4") == (before, after)
    assert cr.last_isolation(tmp_path, "r1", "t3") is None
    cr.run_change(site, cr.ChangeSpec.of("r1", "restore", after, before, record=True, tray="t4"), tmp_path)
    assert cr.last_isolation(tmp_path, "r1", "t4") is None
