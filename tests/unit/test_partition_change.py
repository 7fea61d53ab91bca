"""The cross-layer plan of a partition change (pure) and the jobs rule that gates it."""

from __future__ import annotations

import pytest

from mctl.change.plan import plan_change
from mctl.fabric.change import DRAIN, FORCE, GO, REFUSE, before_from_plan, decide
from mctl.model.change import work_on
from mctl.model.imex import ImexSettings
from mctl.fabric.partitions import template_partitions
from mctl.sched.work import SQUEUE, parse_squeue, pod_work
from mctl.inventory import load_site
from mctl.model.change import RunningWork
from mctl.model.fabric import FabricGpu, GpuLocation, PartitionChange, PartitionPlan
from mctl.model.site import Partition
from tests.helpers import plan_for, site_with

NODES = "/etc/nvidia-imex/nodes_config.cfg"
CONFIG = "/etc/nvidia-imex/config.cfg"


def job(jid: str, *nodes: str, state: str = "R") -> RunningWork:
    return RunningWork("slurm", jid, "alice", f"job{jid}", state, tuple(nodes))


def test_all_to_2x2_every_layer(tmp_path):
    site = site_with(tmp_path)
    r = site.racks["r1"]
    after = list(template_partitions(r, "2x9"))
    assert [p.trays for p in after] == [("r1-tray01", "r1-tray02"), ("r1-tray03", "r1-tray04")]
    cp = plan_for(site, after)
    # every tray leaves the rack-wide default domain
    assert cp.affected == ("r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04")
    assert cp.trays[0].before is None and cp.trays[0].after == "p0"
    assert cp.trays[3].after_trays == ("r1-tray03", "r1-tray04")
    # IMEX: one domain per partition, node lists before (whole rack) and after (its two trays)
    assert [d.domain for d in cp.imex] == ["p0", "p1"]
    p0 = cp.imex[0]
    assert p0.nodes_after == "10.0.1.1\n10.0.1.2\n"
    assert p0.nodes_before["r1-tray01"] == "10.0.1.1\n10.0.1.2\n10.0.1.3\n10.0.1.4\n"
    assert NODES in p0.files["r1-tray01"] and CONFIG in p0.files["r1-tray01"]     # the domain name is in config
    assert p0.restart == ("r1-tray01", "r1-tray02")
    # Slurm: one rack block before, one block per partition after, and a reconfigure
    assert [(b["name"], b["nodes"]) for b in cp.slurm.blocks_before] == [("r1", "r1-tray[01-04]")]
    assert [(b["name"], b["nodes"]) for b in cp.slurm.blocks_after] == [("r1-p0", "r1-tray[01-02]"),
                                                                       ("r1-p1", "r1-tray[03-04]")]
    assert cp.slurm.reconfigure
    assert cp.labels == ()                          # not a Kubernetes site
    assert cp.to_dict()["affected_trays"] == list(cp.affected)


def test_only_trays_that_change_are_affected(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-02]"},
                                      {"name": "p1", "trays": "r1-tray[03-04]"}])
    r = site.racks["r1"]
    # split p1 into two one-tray partitions; p0 is untouched
    after = [r.partitions[0], Partition("p1", "r1", ("r1-tray03",)), Partition("p2", "r1", ("r1-tray04",))]
    work = [job("10", "r1-tray01", "r1-tray02"), job("11", "r1-tray03"), job("12", "r1-tray04", state="CG")]
    cp = plan_for(site, after, work)
    assert cp.affected == ("r1-tray03", "r1-tray04")
    assert cp.unaffected == ("r1-tray01", "r1-tray02")
    assert {d.domain for d in cp.imex} == {"p1", "p2"}
    assert all(t not in d.restart for d in cp.imex for t in cp.unaffected)
    assert [w.id for w in cp.work] == ["11", "12"]   # job 10 runs on trays outside the change
    blocks_after = [(b["name"], b["nodes"]) for b in cp.slurm.blocks_after]
    assert ("r1-p0", "r1-tray[01-02]") in blocks_after and ("r1-p2", "r1-tray04") in blocks_after


def test_identical_partitions_touch_nothing(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    cp = plan_for(site, list(site.racks["r1"].partitions), [job("1", "r1-tray01")])
    assert cp.affected == () and cp.imex == () and cp.work == ()
    assert not cp.slurm.reconfigure
    assert decide(cp, drain=False, force=False) == GO


def test_k8s_site_plans_labels_not_blocks(tmp_path):
    from mctl.sched.k8s.manifests import PARTITION_LABEL

    site = site_with(tmp_path, scheduler="k8s")
    cp = plan_for(site, list(template_partitions(site.racks["r1"], "2x9")))
    assert cp.slurm is None
    labels = {x.node: (x.label, x.before, x.after) for x in cp.labels}
    assert labels["r1-tray01"] == (PARTITION_LABEL, "r1", "r1-p0")
    assert labels["r1-tray04"] == (PARTITION_LABEL, "r1", "r1-p1")


def test_trays_leaving_every_domain_are_named(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    cp = plan_for(site, [Partition("p0", "r1", ("r1-tray01", "r1-tray02"))])
    assert cp.trays[-1].tray == "r1-tray04" and cp.trays[-1].after is None
    none = [d for d in cp.imex if d.domain == "(none)"]
    assert none and none[0].trays == ("r1-tray03", "r1-tray04") and none[0].restart == ()


def _gpu(tray: str, dev: int) -> FabricGpu:
    return FabricGpu(tray, dev, f"{tray}-{dev}", GpuLocation("d", 1, 1, 1, dev))


def test_before_comes_from_what_nmx_holds(tmp_path):
    # the inventory already says p0 = tray[01-04], but NMX-M holds p0 = tray[01-02] (an update is planned)
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    r = site.racks["r1"]
    before = tuple(_gpu(t, d) for t in ("r1-tray01", "r1-tray02") for d in range(4))
    after = tuple(_gpu(t, d) for t in ("r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04") for d in range(4))
    nmx = PartitionPlan("r1", "http://x", (PartitionChange("update", "p0", "ID_BASED", after, before, "members"),))
    assert before_from_plan(r, nmx) == (Partition("p0", "r1", ("r1-tray01", "r1-tray02")),)
    cp = plan_for(site, list(r.partitions), nmx=nmx)
    assert cp.affected == r.partitions[0].trays           # every tray's domain grows
    create = PartitionPlan("r1", "http://x", (PartitionChange("create", "p0", "ID_BASED", after, (), "new"),))
    assert before_from_plan(r, create) == ()              # NMX-M does not hold it yet


@pytest.mark.parametrize("work, known, drain, force, verdict", [
    ([], True, False, False, GO),
    ([job("7", "r1-tray03")], True, False, False, REFUSE),
    ([job("7", "r1-tray03")], True, True, False, DRAIN),
    ([job("7", "r1-tray03")], True, False, True, FORCE),
    ([], False, False, False, REFUSE),                    # the queue could not be read: never blind
    ([], False, True, False, REFUSE),
    ([], False, False, True, FORCE),
    ([RunningWork("k8s", "ns/p", None, "p", "Running", ("r1-tray03",), "4 nvidia.com/gpu")], True, True, False,
     DRAIN),                                              # --drain cordons the nodes and evicts the pods
    ([RunningWork("k8s", "ns/p", None, "p", "Running", ("r1-tray03",), "4 nvidia.com/gpu"), job("7", "r1-tray03")],
     True, True, False, REFUSE),                          # two schedulers' work on one tray: no drain does both
])
def test_jobs_rule(tmp_path, work, known, drain, force, verdict):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    cp = plan_for(site, [Partition("p0", "r1", ("r1-tray01", "r1-tray02")),
                         Partition("p1", "r1", ("r1-tray03", "r1-tray04"))], work, work_known=known,
                  work_error=None if known else "slurmctld did not answer")
    assert decide(cp, drain=drain, force=force) == verdict


def test_squeue_parsing():
    sep = "\x1f"
    text = "".join(sep.join(f) + "\n" for f in [
        ("42", "alice", "R", "r1-tray[01-02]", "train|big run"),
        ("43_1", "bob", "CG", "r1-tray03", "x"),
        ("44", "carol", "PD", "(null)", "waiting"),           # pending: holds nothing
        ("45", "dave", "S", "r1-tray04", ""),
    ]) + "garbage line\n"
    jobs = parse_squeue(text)
    assert [(j.id, j.user, j.state, j.nodes) for j in jobs] == [
        ("42", "alice", "R", ("r1-tray01", "r1-tray02")), ("43_1", "bob", "CG", ("r1-tray03",)),
        ("45", "dave", "S", ("r1-tray04",))]
    assert jobs[0].name == "train|big run"
    assert "--states=R,CG,S" in SQUEUE and "%N" in SQUEUE
    assert [j.id for j in work_on(jobs, ["r1-tray02"])] == ["42"]
    assert "job 42 user alice name 'train|big run' R on r1-tray[01-02]" == jobs[0].describe()


def test_pods_that_hold_gpus():
    def pod(name, node="r1-tray01", phase="Running", gpus=None, claims=None):
        res = {"limits": {"nvidia.com/gpu": gpus}} if gpus is not None else {}
        spec = {"nodeName": node, "containers": [{"name": "c", "resources": res}]}
        if claims:
            spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": "t"} for c in claims]
        return {"metadata": {"name": name, "namespace": "team"}, "spec": spec, "status": {"phase": phase}}

    w = pod_work(pod("a", gpus="4"))
    assert w is not None and w.id == "team/a" and w.nodes == ("r1-tray01",) and "4 nvidia.com/gpu" in w.why
    c = pod_work(pod("b", claims=["imex-channel"]))
    assert c is not None and "resource claim imex-channel" in c.why
    assert pod_work(pod("c")) is None                      # no GPU, no claim
    assert pod_work(pod("d", gpus="4", phase="Succeeded")) is None
    assert pod_work(pod("e", node=None, gpus="4")) is None  # not bound to a tray


# ------------------------------------------------------------------ the gate as the CLI applies it

def _busy_plan(tmp_path, work=None, known=True):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    cp = plan_for(site, [Partition("p0", "r1", ("r1-tray01", "r1-tray02")),
                         Partition("p1", "r1", ("r1-tray03", "r1-tray04"))],
                  [job("77", "r1-tray03", "r1-tray04")] if work is None else work, work_known=known,
                  work_error=None if known else "slurmctld did not answer")
    return site, cp


def gate(site, cp, *, drain, wait, force, yes, dry_run):
    """The jobs rule as the CLI applies it: the change service's gate with the terminal's UI."""
    from mctl.change.request import ChangeRequest
    from mctl.change.service import gate as service_gate
    from mctl.cli import render
    from mctl.cli.partition_change import TerminalUI

    req = ChangeRequest("apply", rack=cp.rack, drain=drain, wait=wait, force=force, yes=yes, dry_run=dry_run)
    return service_gate(site, cp, req, TerminalUI(render.output(False), yes=yes))


def test_gate_refuses_and_names_the_job(tmp_path):
    from mctl.errors import UsageError

    site, cp = _busy_plan(tmp_path)
    with pytest.raises(UsageError) as exc:
        gate(site, cp, drain=False, wait=None, force=False, yes=False, dry_run=False)
    assert exc.value.exit_code == 2
    assert "job 77 user alice name 'job77' R on r1-tray[03-04]" in exc.value.message
    assert "--drain" in exc.value.hint and "--force" in exc.value.hint
    # a dry run says what would happen and raises nothing
    assert gate(site, cp, drain=False, wait=None, force=False, yes=False, dry_run=True) == []


def test_gate_force_without_a_terminal_needs_yes(tmp_path, monkeypatch):
    import io

    from mctl.errors import UsageError

    site, cp = _busy_plan(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))      # not a TTY
    with pytest.raises(UsageError, match="no terminal to ask"):
        gate(site, cp, drain=False, wait=None, force=True, yes=False, dry_run=False)
    assert gate(site, cp, drain=False, wait=None, force=True, yes=True, dry_run=False) == []


def test_gate_unknown_work_refuses(tmp_path):
    from mctl.errors import UsageError

    site, cp = _busy_plan(tmp_path, work=[], known=False)
    with pytest.raises(UsageError, match="slurmctld did not answer"):
        gate(site, cp, drain=True, wait=5.0, force=False, yes=False, dry_run=False)


@pytest.mark.parametrize("args, message", [
    (["--drain", "--force"], "exclude each other"),
    (["--wait", "5"], "--wait goes with --drain"),
    (["--yes"], "--yes goes with --force"),
    (["--drain", "--wait", "nan"], "not a finite number"),
    (["--drain", "--wait", "-1"], "-1"),
])
def test_change_flags_are_checked(tmp_path, capsys, args, message):
    from tests.unit.cli_helpers import run_cli

    site_with(tmp_path)
    result = run_cli(capsys, "-i", str(tmp_path), "partition", "create", "r1", "--template", "2x9", *args)
    assert result.code == 2 and message in (result.out + result.err)


def test_first_partition_of_an_unpartitioned_rack_touches_the_rest_too(tmp_path):
    # without partitions the rack is one IMEX domain and one block: carving p1 out changes trays 1-2's peers too
    site = site_with(tmp_path)
    cp = plan_for(site, [Partition("p1", "r1", ("r1-tray03", "r1-tray04"))], [job("5", "r1-tray01")])
    assert cp.affected == ("r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04")
    assert cp.trays[0].before_trays == ("r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04")
    assert cp.trays[0].after is None and cp.trays[0].after_trays == ()
    assert [w.id for w in cp.work] == ["5"]
