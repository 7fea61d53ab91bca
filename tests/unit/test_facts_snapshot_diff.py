"""What changed between two inventory snapshots (compared in their stored JSON form)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mctl.facts.nvidia_smi import parse_xml
from mctl.model.findings import critical
from mctl.model.inventory_snapshot import diff_snapshots
from mctl.model.tray import TrayFacts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = parse_xml((FIXTURES / "gb200-nvidia-smi-q-x.xml").read_text())


def snap(trays, findings=()):
    # through JSON, exactly as a stored snapshot is read back
    return json.loads(json.dumps({"trays": [t.snapshot_dict() for t in trays],
                                  "findings": [f.to_dict() for f in findings]}))


def tray(name="t01", report=REAL, **kw):
    return TrayFacts(name, "10.0.0.1", "ok", gpus=report, **kw)


def kinds(changes):
    return [(c.host, c.kind) for c in changes]


def test_identical_runs_have_no_changes():
    assert diff_snapshots(snap([tray()]), snap([tray()])) == []


def test_changed_serial_at_same_module_is_a_hardware_swap():
    gpus = list(REAL.gpus)
    gpus[2] = replace(gpus[2], serial="1799999999999", uuid="GPU-00000000-1111-2222-3333-444444444444")
    changes = diff_snapshots(snap([tray()]), snap([tray(report=replace(REAL, gpus=tuple(gpus)))]))
    assert kinds(changes) == [("t01", "gpu-swap")]
    c = changes[0]
    assert "hardware swap" in c.message and c.before == REAL.gpus[2].serial and c.after == "1799999999999"
    assert f"module {REAL.gpus[2].module_id}" in c.message


def test_changed_clique_is_a_partition_change():
    moved = replace(REAL, gpus=tuple(replace(g, fabric=replace(g.fabric, clique_id=5)) for g in REAL.gpus))
    changes = diff_snapshots(snap([tray()]), snap([tray(report=moved)]))
    assert kinds(changes) == [("t01", "clique")]
    assert changes[0].message == "clique 2 -> 5: partition change"


def test_vanished_gpu_and_driver_change():
    fewer = replace(REAL, gpus=REAL.gpus[:3], driver_version="575.51.03")
    changes = diff_snapshots(snap([tray()]), snap([tray(report=fewer)]))
    assert sorted(kinds(changes)) == [("t01", "driver"), ("t01", "gpu-missing")]


def test_tray_going_dark_is_one_reach_change_plus_its_finding():
    dark = TrayFacts("t02", "10.0.0.2", "unreachable", error="Connection refused")
    finding = critical("t02", "ssh.unreachable", "unreachable: Connection refused")
    changes = diff_snapshots(snap([tray(), tray("t02")]), snap([tray(), dark], [finding]))
    assert kinds(changes) == [("t02", "reach"), ("t02", "finding-new")]
    assert changes[0].message == "was ok, now unreachable (Connection refused)"
    back = diff_snapshots(snap([tray(), dark], [finding]), snap([tray(), tray("t02")]))
    assert kinds(back) == [("t02", "reach"), ("t02", "finding-resolved")]


def test_trays_added_or_removed_from_inventory():
    changes = diff_snapshots(snap([tray()]), snap([tray(), tray("t02")]))
    assert kinds(changes) == [("t02", "tray")] and "added" in changes[0].message


def test_gpu_facts_lost_is_one_change_not_one_per_gpu():
    broken = TrayFacts("t01", "10.0.0.1", "ok", gpu_error="nvidia-smi hung: no answer within 57s")
    changes = diff_snapshots(snap([tray()]), snap([broken]))
    assert kinds(changes) == [("t01", "gpu-facts")]
    assert changes[0].message == "GPU facts lost: nvidia-smi hung: no answer within 57s"
