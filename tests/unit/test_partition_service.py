"""`partition create|delete` as service functions: the result objects, without NMX-M (no endpoint, or pure)."""

from __future__ import annotations

import pytest

from mctl.errors import UsageError
from mctl.change import commands as ps
from mctl.change.plan import busy_trays
from mctl.change.service import held_hint
from mctl.model.change import RunningWork
from mctl.model.fabric import FabricGpu, GpuLocation, NmxPartition
from mctl.model.site import Partition
from tests.helpers import plan_for, site_with


def test_plan_create_template_records_nothing_until_committed(tmp_path):
    site = site_with(tmp_path)
    r = site.racks["r1"]
    before = (tmp_path / "mctl.yml").read_text()
    op = ps.plan_create(site, r, name=None, template="2x9", trays=(), no_apply=False, dry_run=False)
    assert [p.name for p in op.partitions] == ["p0", "p1"] and op.before == ()
    assert op.apply is False                        # the rack has no NMX-M endpoint
    assert op.edit.changed and (tmp_path / "mctl.yml").read_text() == before
    d = op.to_dict()
    assert list(d) == ["rack", "inventory", "inventory_changed", "partitions", "plan", "applied", "dry_run"]
    assert d["partitions"] == [{"name": "p0", "trays": "r1-tray[01-02]"}, {"name": "p1", "trays": "r1-tray[03-04]"}]
    assert d["plan"] is None and d["applied"] is False and d["inventory"] == str(tmp_path / "mctl.yml")
    assert list(op.to_dict(error="boom"))[-1] == "error" and op.to_dict(error="boom")["error"] == "boom"
    ps.record_create(op)
    assert "r1-tray[03-04]" in (tmp_path / "mctl.yml").read_text()
    assert ps.apply_create(op).applied is False     # nothing to apply without an endpoint


def test_plan_create_adds_one_and_refuses_a_name_taken(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-02]"}])
    r = site.racks["r1"]
    op = ps.plan_create(site, r, name="p1", template=None, trays=("r1-tray03",), no_apply=True, dry_run=True)
    assert [(p.name, p.trays) for p in op.partitions] == [("p0", ("r1-tray01", "r1-tray02")), ("p1", ("r1-tray03",))]
    assert [p.name for p in op.before] == ["p0"] and op.to_dict()["dry_run"] is True
    with pytest.raises(UsageError, match="already has a partition 'p0'") as exc:
        ps.plan_create(site, r, name="p0", template=None, trays=("r1-tray03",), no_apply=True, dry_run=False)
    assert "mctl partition delete r1 p0" in exc.value.hint


def test_whole_trays_of_gpu_members(tmp_path):
    site = site_with(tmp_path)
    r = site.racks["r1"]
    full = [("r1-tray01", g) for g in range(r.gpus_per_tray)]
    assert ps.whole_trays(site, r, "x", full, gpu_granularity=False) == ("r1-tray01",)
    assert ps.whole_trays(site, r, "x", full[:1], gpu_granularity=True) is None
    with pytest.raises(UsageError):
        ps.whole_trays(site, r, "x", full[:1], gpu_granularity=False)


def test_gpu_partition_needs_an_endpoint_and_cannot_be_recorded(tmp_path):
    site = site_with(tmp_path)
    r = site.racks["r1"]
    with pytest.raises(UsageError, match="cannot be recorded"):
        ps.check_gpu_partition(site, r, "half", [("r1-tray01", 0)], no_apply=True, dry_run=False)
    with pytest.raises(UsageError, match="no NMX-Manager endpoint"):
        ps.check_gpu_partition(site, r, "half", [("r1-tray01", 0)], no_apply=False, dry_run=False)


def test_plan_delete_inventory_only(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-02]"},
                                      {"name": "p1", "trays": "r1-tray[03-04]"}])
    r = site.racks["r1"]
    op = ps.plan_delete(site, r, "p1", no_apply=False, dry_run=False)
    assert op.asked_nmx is False and op.plan is None and op.edit is not None
    assert [p.name for p in op.after] == ["p0"]
    assert op.to_dict() == {"rack": "r1", "name": "p1", "inventory_changed": True, "plan": None, "change": None,
                            "applied": False, "dry_run": False}
    ps.commit_delete(op)
    assert "p1" not in (tmp_path / "mctl.yml").read_text()
    with pytest.raises(UsageError, match=r"rack r1 has no partition 'p9'$") as exc:
        ps.plan_delete(site, r, "p9", no_apply=False, dry_run=False)
    assert exc.value.hint == "see 'mctl partition list r1'"


def test_delete_plan_releases_the_members():
    gpus = [FabricGpu("r1-tray01", i, f"GPU-{i}", GpuLocation("dom", 1, 1, 1, i)) for i in (1, 0)]
    part = NmxPartition("abc", 3, "p1", "ID_BASED", "HEALTHY", ())
    plan = ps.delete_plan("r1", "https://nmx", part, gpus)
    (step,) = plan.changes
    assert step.action == "delete" and step.name == "p1" and step.nmx_id == "abc" and step.partition_id == 3
    assert step.before == tuple(sorted(gpus)) == plan.released and step.members == ()


def test_busy_trays_and_held_hint(tmp_path):
    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    cp = plan_for(site, [Partition("p0", "r1", ("r1-tray01", "r1-tray02")),
                         Partition("p1", "r1", ("r1-tray03", "r1-tray04"))],
                  [RunningWork("slurm", "7", "bob", "j", "R", ("r1-tray02", "r1-tray03", "r9-x"))])
    assert busy_trays(cp) == ["r1-tray02", "r1-tray03"]          # r9-x is not a tray the change touches
    assert held_hint([]) == ""
    assert held_hint(["r1-tray03"]).startswith("; r1-tray03 stay held in Slurm")
    assert "scontrol update NodeName=r1-tray03 State=RESUME" in held_hint(["r1-tray03"])


def test_apply_result_is_the_racks_json_entry(tmp_path):
    from mctl.model.fabric import PartitionPlan

    site = site_with(tmp_path, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    r = site.racks["r1"]
    plan = PartitionPlan("r1", "https://nmx", ())
    op = ps.PartitionApply(r, client=None, plan=plan, change=plan_for(site, r.partitions, nmx=plan))
    d = op.to_dict()
    assert list(d) == ["rack", "plan", "change", "applied"] and d["applied"] is False
    assert d["plan"] == plan.to_dict() and d["change"]["affected_trays"] == []
