"""mctl deploy slurm on the lab: real slurmctld/slurmd/munged, real jobs, blocks from partitions.

One deploy per session (`slurm_lab`, tests/lab_fixture.py: this module asserts on its dry run and
result), then assertions against the running cluster. The site is the lab's own inventory with two
NVLink partitions added (p0 = trays 1-2, p1 = trays 3-4), the way an operator records them; the
topology this module changes is put back by `slurm_lab` for the next module.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers import deploy_slurm, srun, write_site


@pytest.fixture(scope="module")
def slurm(slurm_lab):
    """The session's deploy (tests/lab_fixture.py: the first on this lab, a --dry-run before it)."""
    return {"site": slurm_lab.site, "dry": slurm_lab.dry, "first": slurm_lab.first}


def test_dry_run_showed_new_files_and_key(slurm):
    dry = slurm["dry"]
    assert dry["dry_run"] is True
    statuses = {(f["file"], f["status"]) for f in dry["diff"]["files"]}
    for name in ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf"):
        assert (name, "new") in statuses
    assert dry["diff"]["munge_key"]["would-create"] == "lab-r1-head,lab-r1-tray[01-04]"
    assert dry["plan"]["version"].startswith("24.")


def test_every_tray_registered_and_blocks_match(lab, slurm):
    v = slurm["first"]["verification"]
    assert v["ok"] and v["unregistered"] == [] and v["blocks_match"]
    assert v["blocks_found"] == {"lab-r1-p0": "lab-r1-tray[01-02]", "lab-r1-p1": "lab-r1-tray[03-04]"}
    out = lab.run(lab.head, "sinfo -h -N -o '%N %T'").stdout.split("\n")
    states = dict(line.split() for line in out if line.strip())
    assert sorted(states) == lab.trays and set(states.values()) == {"idle"}
    topo = lab.run(lab.head, "scontrol show topology").stdout
    assert "BlockName=lab-r1-p0 BlockIndex=0 Nodes=lab-r1-tray[01-02] BlockSize=2" in topo
    node = lab.run(lab.head, "scontrol show node lab-r1-tray03").stdout
    assert "Gres=gpu:4" in node and "Port=" in node


def test_munge_key_is_the_sites_and_private(lab, slurm):
    key = lab.state_dir / "slurm" / "lab" / "munge.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    digest = hashlib.sha256(key.read_bytes()).hexdigest()
    for host in (lab.head, lab.trays[0]):
        out = lab.run(host, "stat -c '%U %a' /etc/munge/munge.key; sha256sum < /etc/munge/munge.key").stdout.split()
        assert out[:2] == ["munge", "400"] and out[2] == digest
    run_dir = Path(slurm["first"]["run"]["run_dir"])
    everything = "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())
    secret = key.read_bytes()[:48]
    assert secret.hex() not in everything.lower() and base64.b64encode(secret).decode() not in everything


def test_two_node_job_stays_in_one_block(lab, slurm):
    hosts = sorted(set(srun(lab, "-N2 hostname").stdout.split()))
    assert len(hosts) == 2
    assert hosts in (["lab-r1-tray01", "lab-r1-tray02"], ["lab-r1-tray03", "lab-r1-tray04"])


def test_segments_follow_blocks(lab, slurm):
    hosts = srun(lab, "-N4 --segment=2 hostname").stdout.split()
    assert sorted(hosts) == lab.trays
    # a segment larger than the base block (2 trays) cannot sit inside one block
    bad = srun(lab, "-N3 --segment=3 hostname", check=False)
    assert bad.returncode != 0 and "topology" in bad.stderr.lower()


def test_drained_tray_is_not_used(lab, slurm):
    lab.run(lab.head, "scontrol update NodeName=lab-r1-tray01 State=DRAIN Reason='mctl-test: drained'")
    try:
        for _ in range(3):
            hosts = sorted(set(srun(lab, "-N2 hostname").stdout.split()))
            # p0 has one usable tray left, so a 2-tray job can only go to p1
            assert hosts == ["lab-r1-tray03", "lab-r1-tray04"]
    finally:
        lab.run(lab.head, "scontrol update NodeName=lab-r1-tray01 State=RESUME")


def test_redeploy_changes_nothing(lab, slurm):
    proc, dry = deploy_slurm(lab, slurm["site"], "--dry-run")
    assert proc.returncode == 0 and dry["diff"]["changes"] == 0
    proc, data = deploy_slurm(lab, slurm["site"])
    assert proc.returncode == 0, proc.stderr
    assert {h: r["changed"] for h, r in data["run"]["hosts"].items()} == {h: 0 for h in lab.hosts}
    assert data["verification"]["ok"]


def test_unreachable_tray_refuses_before_changing_anything(lab, slurm):
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    control.fault(lab.dir, "lab-r1-tray04", FaultRequest(unreachable=True))
    try:
        proc, _ = deploy_slurm(lab, slurm["site"])
    finally:
        lab.clear_faults("lab-r1-tray04")
    assert proc.returncode == 3
    assert "lab-r1-tray04" in proc.stderr and "nothing was deployed" in proc.stderr


def test_topology_only_after_partition_change(lab, slurm, tmp_path):
    site = write_site(lab, tmp_path / "site", [{"name": "all", "trays": "lab-r1-tray[01-04]"}])
    proc, data = deploy_slurm(lab, site, "--topology-only")
    assert proc.returncode == 0, proc.stderr
    assert data["verification"]["blocks_found"] == {"lab-r1-all": "lab-r1-tray[01-04]"}
    changed = {h: r["changed"] for h, r in data["run"]["hosts"].items()}
    assert all(changed.values())                   # topology.conf everywhere (plus the reconfigure on the head)
    for host in (lab.head, lab.trays[-1]):
        assert "BlockName=lab-r1-all Nodes=lab-r1-tray[01-04]" in lab.run(host, "cat /etc/slurm/topology.conf").stdout
    assert "BlockName=lab-r1-all" in lab.run(lab.head, "scontrol show topology").stdout
    # a 3-tray job now fits in one block
    assert len(set(srun(lab, "-N3 --segment=3 hostname").stdout.split())) == 3


def test_node_check_is_slurms_health_check_by_default(lab, slurm):
    config = lab.run(lab.head, "scontrol show config").stdout
    values = {k.strip(): v.strip() for k, _, v in (l.partition("=") for l in config.splitlines()) if _}
    assert values["HealthCheckProgram"] == "/usr/local/sbin/mctl-node-check"
    # ANY,CYCLE since issue 27: slurmd spreads the checks over the interval (slurmctld shows it CYCLE,ANY)
    assert values["HealthCheckInterval"] == "300 sec" and values["HealthCheckNodeState"] == "CYCLE,ANY"
    tray = lab.trays[0]
    run = lab.run(tray, "/usr/local/sbin/mctl-node-check --no-drain --json", check=False, timeout=60)
    data = json.loads(run.stdout)
    # the lab has no NVML stand-in: the node check says it read nvidia-smi, and why (pynvml came in the bundle)
    assert data["gpu_source"].startswith("nvidia-smi (NVML did not load"), data["gpu_source"]
    assert lab.run(tray, "test -f /usr/local/lib/mctl-node-check/pynvml.py && echo yes").stdout.strip() == "yes"


def test_gres_follows_the_rack_inventory_a_missing_gpu_is_configured_as_it_is(lab, slurm):
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    short = lab.trays[-1]
    control.fault(lab.dir, short, FaultRequest(gpu_missing=1))
    try:
        inv = lab.mctl("rack", "inventory", lab.rack, timeout=180)
        assert inv.returncode == 1, inv.stdout + inv.stderr          # the missing GPU is a critical finding
        proc, data = deploy_slurm(lab, slurm["site"], "--dry-run")
        assert proc.returncode == 0, proc.stderr
        plan = data["plan"]
        assert any(f"{short} reported 3 GPUs" in w and "Gres=gpu:3" in w for w in plan["warnings"]), plan["warnings"]
        assert plan["gpus"]["per_tray"][short] == {"count": 3, "minors": [0, 2, 3], "source": "facts"}
        line = next(l for l in plan["files"]["slurm.conf"].splitlines() if l.startswith(f"NodeName={short} "))
        assert "Gres=gpu:3" in line
        assert f"NodeName={short} Name=gpu File=/dev/nvidia[0,2-3]" in plan["files"]["gres.conf"]
    finally:
        lab.clear_faults(short)
        again = lab.mctl("rack", "inventory", lab.rack, timeout=180)     # the GPU is back: the facts say 4 again
    assert again.returncode == 0, again.stdout + again.stderr
    proc, data = deploy_slurm(lab, slurm["site"], "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert data["plan"]["gpus"]["from_model"] is None and data["plan"]["gpus"]["per_tray"][short]["count"] == 4
    assert not [w for w in data["plan"]["warnings"] if "GPU" in w], data["plan"]["warnings"]
    # the rendered files are the same as before the fault: a snapshot with the model's counts changes nothing
    files = {f["file"]: f["status"] for f in data["diff"]["files"] if f["file"] in ("slurm.conf", "gres.conf")}
    assert files == {"slurm.conf": "same", "gres.conf": "same"}, data["diff"]["files"]
