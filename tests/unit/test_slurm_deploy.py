"""mctl deploy slurm: refusals before anything changes, the MUNGE key, --dry-run diffs, verification."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml

from mctl.inventory import load_site
from mctl.sched.slurm import deploy, munge, parse_slurmd_c, parse_version, render
from mctl.sched.slurm.remote import HostFiles, judge, parse_fetch
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
CAPTURED = REPO / "tests" / "fixtures" / "golden" / "slurm" / "captured"


def inventory(tmp_path: Path, scheduler: dict | None, partitions=None) -> Path:
    doc = {"plugin": "mctl", "site": "t", "ssh": {"known_hosts": "kh"},
           "racks": {"lab-r1": {"shape": {"compute_trays": 4, "switch_trays": 0},
                                "head": {"name": "lab-r1-head", "address": "127.83.1.100"},
                                "compute": {"nodes": "lab-r1-tray[01-04]", "addresses": "127.83.1.[1-4]"}}}}
    if partitions:
        doc["racks"]["lab-r1"]["partitions"] = partitions
    if scheduler is not None:
        doc["scheduler"] = scheduler
    (tmp_path / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path


def lab_config(tmp_path: Path):
    site = load_site(inventory(tmp_path, {"type": "slurm", "controller": "lab-r1-head"},
                               [{"name": "p0", "trays": "lab-r1-tray[01-03]"}, {"name": "p1", "trays": "lab-r1-tray04"}]))
    hw = parse_slurmd_c((CAPTURED / "slurmd-C.txt").read_text())[1]
    return site, render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()})


def test_scheduler_must_match_the_command(tmp_path, capsys):
    inv = inventory(tmp_path, {"type": "k8s"})
    result = run_cli(capsys, "-i", str(inv), "--state-dir", str(tmp_path / "state"), "deploy", "slurm")
    assert result.code == 2
    assert "the inventory's scheduler is k8s, not slurm" in result.err
    assert "mctl deploy k8s" in result.err
    assert not (tmp_path / "state").exists()          # refused before anything was written


def test_no_scheduler_section(tmp_path, capsys):
    inv = inventory(tmp_path, None)
    result = run_cli(capsys, "-i", str(inv), "deploy", "slurm", "--dry-run")
    assert result.code == 2 and "no scheduler section" in result.err and "Traceback" not in result.err


def test_munge_key_made_once_and_private(tmp_path):
    path = munge.key_path(tmp_path, "site")
    assert munge.digest(path) is None
    assert munge.ensure_key(path) is True
    first = path.read_bytes()
    assert len(first) == munge.KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    assert munge.ensure_key(path) is False           # kept, never regenerated
    assert path.read_bytes() == first and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_fetch_output_parsing():
    text = "slurm.conf\tQQo=\ngres.conf\t-\ntopology.conf\t\nmunge.key\tabc123\n"
    got = parse_fetch("h", text, ["slurm.conf", "gres.conf", "topology.conf"])
    assert got.files == {"slurm.conf": "A\n", "gres.conf": None, "topology.conf": ""}
    assert got.munge_digest == "abc123"


def test_dry_run_groups_hosts_and_diffs(tmp_path, monkeypatch):
    site, cfg = lab_config(tmp_path)
    plan = deploy.SlurmPlan(site, tmp_path / "state", cfg, [cfg.controller] + site.compute_trays())
    munge.ensure_key(plan.key_path)
    key = munge.digest(plan.key_path)
    old_topo = cfg.files["topology.conf"].replace("lab-r1-tray[01-03]", "lab-r1-tray[01-02]")

    def fake_fetch(_site, hosts, conf_dir, names):
        assert conf_dir == "/etc/slurm"
        out = []
        for h in hosts:
            files = dict(cfg.files)
            if h.name == "lab-r1-tray04":
                files["topology.conf"] = old_topo
                files["gres.conf"] = None
            out.append(HostFiles(h.name, files, key if h.name != "lab-r1-tray02" else "0" * 64))
        return out

    monkeypatch.setattr("mctl.sched.slurm.remote.fetch_current", fake_fetch)
    d = deploy.dry_run(plan)
    by = {(f.name, f.status): f for f in d.files}
    assert by[("slurm.conf", "same")].hosts == ["lab-r1-head", "lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03",
                                                "lab-r1-tray04"]
    topo = by[("topology.conf", "changed")]
    assert topo.hosts == ["lab-r1-tray04"]
    assert "-BlockName=lab-r1-p0 Nodes=lab-r1-tray[01-02]" in topo.diff
    assert "+BlockName=lab-r1-p0 Nodes=lab-r1-tray[01-03]" in topo.diff
    assert by[("gres.conf", "new")].hosts == ["lab-r1-tray04"]
    assert d.munge["differs"] == ["lab-r1-tray02"] and len(d.munge["same"]) == 4
    assert d.changes == 3
    assert key not in json.dumps(d.to_dict())        # a digest is compared, never shown


def test_judge_on_real_output(tmp_path):
    _site, cfg = lab_config(tmp_path)
    text = ((CAPTURED / "scontrol-show-node-o.txt").read_text() + "@@mctl-topology\n"
            + (CAPTURED / "scontrol-show-topology.txt").read_text() + "@@mctl-config\n"
            + "TopologyPlugin          = topology/block\nSwitchType              = switch/nvidia_imex\n"
            + "@@mctl-partition\n" + (CAPTURED / "scontrol-show-partition-o.txt").read_text())
    v = judge(text, cfg, 1.0)
    assert v.ok and v.blocks_match and v.unregistered == [] and v.drained == ["lab-r1-tray02"]
    assert v.topology_plugin == "topology/block"
    down = judge(text.replace("State=UP", "State=DOWN"), cfg, 1.0)
    assert not down.ok and "partition gpu is DOWN with 4 nodes" in " ".join(down.problems())


def test_judge_reports_unregistered_and_wrong_blocks(tmp_path):
    _site, cfg = lab_config(tmp_path)
    nodes = (CAPTURED / "scontrol-show-node-o.txt").read_text().replace(
        "State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime="
        "2026-11-29T19:17:41 SlurmdStartTime=2026-11-29T19:51:15 LastBusyTime=2026-11-29T19:51:15 "
        "ResumeAfterTime=None CfgTRES=cpu=2,mem=23G,billing=2 AllocTRES= CurrentWatts=0 AveWatts=0 \n",
        "State=DOWN*+NOT_RESPONDING ThreadsPerCore=1\n", 1)
    topo = "BlockName=lab-r1-p0 BlockIndex=0 Nodes=lab-r1-tray[01-02] BlockSize=2\n"
    v = judge(nodes + "@@mctl-topology\n" + topo + "@@mctl-config\nTopologyPlugin = topology/block\n", cfg, 3.0)
    assert not v.ok and not v.blocks_match
    assert v.unregistered == ["lab-r1-tray03"]
    problems = " ".join(v.problems())
    assert "lab-r1-tray03 DOWN*+NOT_RESPONDING" in problems and "does not match the partitions" in problems
    # what the tray said when asked (slurmd's unit state, its log's last line) is part of the report
    v.seen_on_trays = {"lab-r1-tray03": "slurmd failed | error: Unable to bind listen port (6818)"}
    assert "lab-r1-tray03: slurmd failed | error: Unable to bind listen port (6818)" in v.problems()
    assert v.to_dict()["seen_on_trays"] == v.seen_on_trays


def test_tray_look_command_quotes_the_log_folder():
    from mctl.sched.slurm.remote import _tray_look_command

    cmd = _tray_look_command("/var/log/slurm dir; rm -rf x/")
    assert "tail -n 1 '/var/log/slurm dir; rm -rf x/slurmd.log'" in cmd


def test_plan_to_dict_has_no_secret(tmp_path):
    site, cfg = lab_config(tmp_path)
    plan = deploy.SlurmPlan(site, tmp_path, cfg, [cfg.controller] + site.compute_trays())
    d = plan.to_dict()
    assert d["munge_key"] == {"path": str(munge.key_path(tmp_path, "t")), "exists": False}
    assert d["topology_plugin"] == "topology/block" and d["block_sizes"] == [1, 2]


def test_topology_only_needs_a_running_slurm(tmp_path, monkeypatch):
    site, _cfg = lab_config(tmp_path)
    from mctl.errors import UsageError

    monkeypatch.setattr("mctl.sched.slurm.remote.controller_state",
                        lambda _site, _ctrl: (parse_version("slurm 24.11.5"), None))
    try:
        deploy.plan_slurm(site, tmp_path / "state", topology_only=True)
    except UsageError as exc:
        assert "slurmctld does not answer on lab-r1-head" in exc.message and "full 'mctl deploy slurm'" in exc.hint
    else:
        raise AssertionError("topology-only went ahead without a running Slurm")
    monkeypatch.setattr("mctl.sched.slurm.remote.controller_state",
                        lambda _site, _ctrl: (parse_version("slurm 24.11.5"), "topology/block"))
    plan = deploy.plan_slurm(site, tmp_path / "state", topology_only=True)
    assert list(plan.config.files) == ["topology.conf"] and plan.topology_only


def test_gpus_from_the_last_rack_inventory_snapshot_reach_the_playbook(tmp_path):
    from mctl.model.gpu import Gpu, GpuReport
    from mctl.model.tray import TrayFacts
    from mctl.rackinv.service import SNAPSHOT_KIND
    from mctl.state import save_snapshot

    site, cfg = lab_config(tmp_path)
    state = tmp_path / "state"
    gpus, warnings = deploy.gpus_from_inventory(site, state)
    assert {g.source for g in gpus.values()} == {"model"} and "no rack inventory of lab-r1" in warnings[0]

    def tray(h, minors):
        g = tuple(Gpu(i, f"GPU-{h.name}-{m}", f"0000000{m}:01:00.0", minor_number=m) for i, m in enumerate(minors))
        return TrayFacts(h.name, h.address, "ok", gpus=GpuReport("570.148.08", "12.8", len(g), g)).snapshot_dict()

    trays = site.racks["lab-r1"].compute
    save_snapshot(state, SNAPSHOT_KIND, "lab-r1", {"schema": 1, "rack": "lab-r1", "trays": [
        tray(h, (0, 2, 3) if h.name == "lab-r1-tray04" else (0, 1, 2, 3)) for h in trays]})
    gpus, warnings = deploy.gpus_from_inventory(site, state)
    assert gpus["lab-r1-tray04"].count == 3 and [w for w in warnings if "lab-r1-tray04 reported 3 GPUs" in w]
    plan = deploy.SlurmPlan(site, state, cfg, [cfg.controller] + site.compute_trays(), gpus=gpus)
    extra = deploy._extravars(plan)
    assert extra["slurm_gpu_minors_by_host"]["lab-r1-tray04"] == [0, 2, 3] and extra["slurm_node_check"] is True
    assert plan.to_dict()["gpus"]["from_facts"] == "lab-r1-tray[01-04]"
