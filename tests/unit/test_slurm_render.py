"""Slurm renderers against golden files, and the choices they make from version and settings.

Regenerate the golden files after an intended change with:
    MCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_slurm_render.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from mctl.errors import UsageError
from mctl.inventory import load_site
from mctl.sched.slurm import parse_slurmd_c, parse_version, render
from tests.helpers import SLURM_GOLDEN, SLURM_LAB_SETTINGS, lab_like_site

REPO = Path(__file__).resolve().parents[2]
REGEN = os.environ.get("MCTL_REGEN_GOLDEN") == "1"
EXAMPLE = REPO / "inventories" / "example-gb200"


def golden(folder: str, files: dict[str, str]) -> None:
    where = SLURM_GOLDEN / folder
    if REGEN:
        where.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (where / name).write_text(text)
    assert sorted(files) == sorted(p.name for p in where.iterdir())
    for name, text in files.items():
        assert text == (where / name).read_text(), f"{folder}/{name} differs (MCTL_REGEN_GOLDEN=1 to update)"


def gb200_hardware(site):
    _name, hw = parse_slurmd_c((SLURM_GOLDEN / "gb200-slurmd-C.txt").read_text())
    return {t.name: hw for t in site.compute_trays()}


@pytest.fixture(scope="module")
def example():
    return load_site(EXAMPLE)


def write_site(tmp_path: Path, doc: dict) -> Path:
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path


def test_golden_example_block(example):
    cfg = render(example, parse_version("slurm 24.11.5"), gb200_hardware(example))
    golden("example-24.11", cfg.files)
    assert cfg.plugin == "block" and cfg.imex
    assert [b.name for b in cfg.blocks] == ["rack-a-p0", "rack-a-p1", "rack-b-all"]
    assert cfg.block_sizes == [9, 18, 36]
    # the example's blocks differ in size (9, 9, 18): the operator is told what that means
    assert any("differ in size" in w for w in cfg.warnings)


def test_golden_example_tree_fallback(example):
    cfg = render(example, parse_version("slurm 23.02.7"), gb200_hardware(example))
    golden("example-23.02", cfg.files)
    assert cfg.plugin == "tree" and not cfg.imex and cfg.block_sizes == []
    assert any("falling back to topology/tree" in w for w in cfg.warnings)
    assert any("no switch/nvidia_imex" in w for w in cfg.warnings)
    assert "SwitchType" not in cfg.files["slurm.conf"]


def test_golden_lab_settings(tmp_path):
    site = lab_like_site(tmp_path, slurm=SLURM_LAB_SETTINGS,
                    partitions=[{"name": "p0", "trays": "lab-r1-tray[01-02]"},
                                {"name": "p1", "trays": "lab-r1-tray[03-04]"}])
    _n, hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())
    cfg = render(site, parse_version((SLURM_GOLDEN / "captured" / "slurmctld-V.txt").read_text()),
                 {t.name: hw for t in site.compute_trays()})
    golden("lab-24.11", cfg.files)
    conf = cfg.files["slurm.conf"]
    assert "ClusterName=lab\n" in conf                              # Slurm wants it lower case
    assert "HealthCheckProgram=/usr/local/sbin/mctl-node-check\n" in conf
    assert "Port=[16101-16104]" in conf and "NodeAddr=127.77.1.[1-4]" in conf
    assert cfg.files["cgroup.conf"].splitlines()[1] == "CgroupPlugin=disabled"


def test_health_check_on_by_default(example):
    conf = render(example, parse_version("slurm 24.11.5"), gb200_hardware(example)).files["slurm.conf"]
    lines = [l for l in conf.splitlines() if l.startswith("HealthCheck")]
    assert lines == ["HealthCheckProgram=/usr/local/sbin/mctl-node-check", "HealthCheckInterval=300",
                     "HealthCheckNodeState=ANY,CYCLE"]


def test_health_check_off_when_the_site_says_so(tmp_path):
    off = lab_like_site(tmp_path, slurm={"node_check": False})
    hw = gb200_hardware(off)
    assert "HealthCheck" not in render(off, parse_version("slurm 24.11.5"), hw).files["slurm.conf"]
    (tmp_path / "tuned").mkdir()
    (tmp_path / "legacy").mkdir()
    tuned = lab_like_site(tmp_path / "tuned", slurm={"health_check_interval": 60, "health_check_node_state": "IDLE,MIXED",
                                                 "node_check_program": "/opt/mctl/bin/node-check"})
    conf = render(tuned, parse_version("slurm 24.11.5"), hw).files["slurm.conf"]
    assert "HealthCheckProgram=/opt/mctl/bin/node-check\nHealthCheckInterval=60\nHealthCheckNodeState=IDLE,MIXED\n" in conf
    # the old, undocumented name still decides where an inventory sets it
    legacy = lab_like_site(tmp_path / "legacy", slurm={"node_check_installed": False})
    assert "HealthCheck" not in render(legacy, parse_version("slurm 24.11.5"), hw).files["slurm.conf"]


def test_block_without_block_sizes_on_23_11(example):
    cfg = render(example, parse_version("slurm 23.11.10"), gb200_hardware(example))
    assert cfg.plugin == "block" and not cfg.imex
    assert "BlockSizes" not in cfg.files["topology.conf"]
    assert "BlockName=rack-a-p0 Nodes=rack-a-tray[01-09]" in cfg.files["topology.conf"]
    assert any("predates BlockSizes" in w for w in cfg.warnings)


def test_explicit_block_on_old_slurm_refuses(tmp_path):
    site = lab_like_site(tmp_path, slurm={"topology": "block"})
    hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())[1]
    with pytest.raises(UsageError, match="has no topology/block"):
        render(site, parse_version("slurm 23.02.1"), {t.name: hw for t in site.compute_trays()})


def test_too_old_slurm_refuses(example):
    with pytest.raises(UsageError, match=r"Slurm 21\.08\.8 on rack-a-head is too old") as exc:
        render(example, parse_version("slurm 21.08.8"), gb200_hardware(example))
    assert "nothing was changed" in exc.value.hint


def test_disabled_cgroup_with_cgroup_plugins_refuses(tmp_path):
    site = lab_like_site(tmp_path, slurm={"cgroup_plugin": "disabled"})
    hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())[1]
    with pytest.raises(UsageError, match="proctrack/cgroup"):
        render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()})


def test_missing_facts_refuse(example):
    hw = gb200_hardware(example)
    hw.pop("rack-b-tray07")
    with pytest.raises(UsageError, match="rack-b-tray07"):
        render(example, parse_version("slurm 24.11.5"), hw)


def test_extra_overrides_and_adds(tmp_path):
    site = lab_like_site(tmp_path, slurm={"extra": {"selecttypeparameters": "CR_Core", "MailProg": "/bin/true"}})
    hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())[1]
    conf = render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()}).files["slurm.conf"]
    assert "selecttypeparameters=CR_Core\n" in conf and "CR_Core_Memory" not in conf
    assert conf.count("MailProg=/bin/true") == 1


def test_node_lines_split_when_hardware_or_ports_differ(tmp_path):
    site = lab_like_site(tmp_path, trays=4)
    small = parse_slurmd_c("NodeName=x CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 "
                           "RealMemory=4000")[1]
    big = parse_slurmd_c("NodeName=x CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 "
                         "RealMemory=8000")[1]
    hw = {"lab-r1-tray01": small, "lab-r1-tray02": small, "lab-r1-tray03": big, "lab-r1-tray04": small}
    lines = [ln for ln in render(site, parse_version("slurm 24.11.5"), hw).files["slurm.conf"].splitlines()
             if ln.startswith("NodeName=")]
    assert lines[0].startswith("NodeName=lab-r1-tray[01-02] NodeAddr=127.77.1.[1-2] Port=[16101-16102] CPUs=2 ")
    assert lines[1].startswith("NodeName=lab-r1-tray03 NodeAddr=127.77.1.3 Port=16103 CPUs=4 ")
    assert lines[2].startswith("NodeName=lab-r1-tray04 NodeAddr=127.77.1.4 Port=16104 CPUs=2 ")
    assert "RealMemory=3072" in lines[0]          # rounded down to whole GiB


def test_topology_only_renders_topology_alone(example):
    cfg = render(example, parse_version("slurm 24.11.5"), None, topology_only=True)
    assert list(cfg.files) == ["topology.conf"]
    assert cfg.files["topology.conf"] == (SLURM_GOLDEN / "example-24.11" / "topology.conf").read_text()


# ------------------------------------------------------------------ GPUs from the trays' facts

def _snapshot_of(site, rack: str, minors_by_tray: dict, *, unreached: tuple = ()) -> dict:
    """A rack inventory snapshot as mctl rack inventory writes it (TrayFacts.snapshot_dict per tray)."""
    from mctl.model.gpu import Gpu, GpuReport
    from mctl.model.tray import TrayFacts

    trays = []
    for h in site.racks[rack].compute:
        if h.name in unreached:
            trays.append(TrayFacts(h.name, h.address, "timeout", error="no answer").snapshot_dict())
            continue
        minors = minors_by_tray.get(h.name, (0, 1, 2, 3))
        gpus = tuple(Gpu(i, f"GPU-{h.name}-{m}", f"0000000{m}:01:00.0", minor_number=m) for i, m in enumerate(minors))
        trays.append(TrayFacts(h.name, h.address, "ok", gpus=GpuReport("570.148.08", "12.8", len(gpus), gpus)).snapshot_dict())
    return {"schema": 1, "kind": "rack-inventory", "rack": rack, "taken_at": "2026-12-01T09:00:00+00:00",
            "trays": trays}


def test_gres_follows_the_trays_facts_a_missing_gpu_is_configured_as_it_is(tmp_path):
    from mctl.sched.slurm.gpus import tray_gpus

    site = lab_like_site(tmp_path, slurm=SLURM_LAB_SETTINGS)
    _n, hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())
    snap = _snapshot_of(site, "lab-r1", {"lab-r1-tray02": (0, 1, 3)})
    gpus, warnings = tray_gpus(site, {"lab-r1": snap})
    assert gpus["lab-r1-tray02"].count == 3 and gpus["lab-r1-tray02"].source == "facts"
    assert [w for w in warnings if "lab-r1-tray02 reported 3 GPUs" in w and "Gres=gpu:3" in w], warnings
    cfg = render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()}, gpus=gpus)
    nodes = [l for l in cfg.files["slurm.conf"].splitlines() if l.startswith("NodeName=")]
    assert [l.split()[0] + " " + next(p for p in l.split() if p.startswith("Gres=")) for l in nodes] == [
        "NodeName=lab-r1-tray01 Gres=gpu:4", "NodeName=lab-r1-tray02 Gres=gpu:3",
        "NodeName=lab-r1-tray[03-04] Gres=gpu:4"]
    gres = cfg.files["gres.conf"].splitlines()[2:]
    assert gres == ["NodeName=lab-r1-tray[01,03-04] Name=gpu File=/dev/nvidia[0-3]",
                    "NodeName=lab-r1-tray02 Name=gpu File=/dev/nvidia[0-1,3]"]


def test_gres_without_facts_falls_back_to_the_model_and_says_so(tmp_path):
    from mctl.sched.slurm.gpus import tray_gpus

    site = lab_like_site(tmp_path, slurm=SLURM_LAB_SETTINGS)
    gpus, warnings = tray_gpus(site, {"lab-r1": None})
    assert {g.count for g in gpus.values()} == {4} and {g.source for g in gpus.values()} == {"model"}
    assert warnings == ["no rack inventory of lab-r1 (mctl rack inventory lab-r1): Gres from the rack model, "
                        "4 GPUs per tray"]
    _n, hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())
    hardware = {t.name: hw for t in site.compute_trays()}
    with_model = render(site, parse_version("slurm 24.11.5"), hardware, gpus=gpus)
    assert with_model.files == render(site, parse_version("slurm 24.11.5"), hardware).files   # same as before
    # a tray the inventory could not reach keeps the model's count, named
    snap = _snapshot_of(site, "lab-r1", {}, unreached=("lab-r1-tray04",))
    gpus, warnings = tray_gpus(site, {"lab-r1": snap})
    assert gpus["lab-r1-tray04"] == gpus["lab-r1-tray04"].__class__(4, (0, 1, 2, 3), "model")
    assert warnings == ["no GPU facts for lab-r1-tray04 in the rack inventory of 2026-12-01T09:00:00+00:00: Gres "
                        "from the rack model, 4 GPUs per tray"]


def test_minor_files():
    from mctl.sched.slurm.render import minor_files

    assert minor_files((0,)) == "/dev/nvidia0" and minor_files((0, 1, 2, 3)) == "/dev/nvidia[0-3]"
    assert minor_files((0, 2, 3, 5)) == "/dev/nvidia[0,2-3,5]"
