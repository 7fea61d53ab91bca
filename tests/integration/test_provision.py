"""Provisioning on the lab through ansible-runner: files and services on real trays,
idempotent re-runs, check mode, a failing tray, retry of failed hosts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

# --own-labs beside (scripts/test): in the second pytest, on its shared lab (minutes of Ansible; tests/beside.py)
pytestmark = pytest.mark.beside

REPO = Path(__file__).resolve().parents[2]


def provision(lab, *args: str) -> tuple[int, dict]:
    proc = lab.mctl("provision", *args, "--json", timeout=600)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def provisioned(lab):
    code, result = provision(lab, lab.rack)
    assert code == 0, result
    return result


def test_first_run_configures_every_tray(lab, provisioned):
    assert provisioned["status"] == "successful"
    assert sorted(provisioned["hosts"]) == sorted(lab.trays)
    for tray in lab.trays:
        recap = provisioned["hosts"][tray]
        assert recap["failed"] == 0 and recap["unreachable"] == 0
        limits = lab.run(tray, "cat /etc/security/limits.d/90-mctl.conf").stdout
        assert "* - memlock unlimited" in limits
        assert "options nvidia NVreg_EnableStreamMemOPs=1" in lab.run(tray, "cat /etc/modprobe.d/nvidia-mctl.conf").stdout
        imex = lab.run(tray, "cat /etc/nvidia-imex/config.cfg").stdout
        assert f"BIND_INTERFACE_IP={lab.addresses[tray]}" in imex
        assert "SERVER_PORT=50000" in imex
        hosts = lab.run(tray, "cat /etc/hosts").stdout
        assert "# BEGIN mctl site hosts" in hosts
        assert f"{lab.addresses[lab.trays[-1]]} {lab.trays[-1]}" in hosts
    run_dir = Path(provisioned["run_dir"])
    assert (run_dir / "request.json").is_file() and (run_dir / "recap.json").is_file()
    artifacts = run_dir / "artifacts" / provisioned["run_id"]
    assert "ansible-playbook" in (artifacts / "command").read_text()
    assert (artifacts / "stdout").stat().st_size > 0
    assert len(list((artifacts / "job_events").glob("*.json"))) > 10


def test_second_run_changes_nothing(lab, provisioned):
    code, result = provision(lab, lab.rack)
    assert code == 0
    assert {h: r["changed"] for h, r in result["hosts"].items()} == {t: 0 for t in lab.trays}


def test_check_diff_changes_nothing(lab, provisioned):
    tray = lab.trays[0]
    lab.run(tray, "echo '# local edit' >> /etc/security/limits.d/90-mctl.conf")
    try:
        code, result = provision(lab, tray, "--check", "--file-diff")
        assert code == 0
        assert result["check"] is True
        assert result["hosts"][tray]["changed"] >= 1
        assert "# local edit" in lab.run(tray, "cat /etc/security/limits.d/90-mctl.conf").stdout
    finally:
        code, result = provision(lab, tray, "--tags", "base")
        assert code == 0 and result["hosts"][tray]["changed"] == 1
    assert "# local edit" not in lab.run(tray, "cat /etc/security/limits.d/90-mctl.conf").stdout


def test_failing_tray_reported_and_retry_only_failed(lab, provisioned):
    bad = lab.trays[1]
    state = "/var/lib/mctl-lab/gpus.json"
    lab.run(bad, f"cp {state} /root/gpus.json.orig && sed -i 's/\"570.148.08\"/\"560.35.03\"/' {state}")
    try:
        code, result = provision(lab, lab.rack, "--tags", "nvidia")
        assert code == 3
        assert result["failed_hosts"] == [bad]
        recap = result["hosts"][bad]
        assert recap["failed_task"] == "Driver version matches the image"
        assert "wants 570.148.08" in recap["message"] and "560.35.03" in recap["message"]
        assert all(result["hosts"][t]["status"] == "ok" for t in lab.trays if t != bad)

        plain = lab.mctl("provision", lab.rack, "--tags", "nvidia", timeout=600)
        assert plain.returncode == 3
        assert f"{bad}: failed at task 'Driver version matches the image'" in plain.stdout
    finally:
        lab.run(bad, f"cp /root/gpus.json.orig {state}")
    code, result = provision(lab, lab.rack, "--tags", "nvidia", "--retry-failed")
    assert code == 0
    assert list(result["hosts"]) == [bad]


def test_unreachable_tray_does_not_stop_the_others(lab, provisioned):
    bad = lab.trays[-1]
    proc = lab.mctl("lab", "fault", "host", bad, "--unreachable", "--dir", str(lab.dir))
    assert proc.returncode == 0, proc.stderr
    try:
        code, result = provision(lab, lab.rack, "--tags", "base")
        assert code == 3
        assert result["hosts"][bad]["status"] == "unreachable"
        assert all(result["hosts"][t]["status"] == "ok" for t in lab.trays if t != bad)
    finally:
        lab.clear_faults(bad)


def test_bad_input(lab):
    proc = lab.mctl("provision", lab.rack, "--tags", "bogus")
    assert proc.returncode == 2 and "unknown tag bogus" in proc.stderr
    proc = lab.mctl("provision", lab.rack, "--image", "no-such-image")
    assert proc.returncode == 2 and "unknown image 'no-such-image'" in proc.stderr
    proc = lab.mctl("provision", "lab-r9-tray01")
    assert proc.returncode == 2 and "unknown host" in proc.stderr


def test_dry_run_plans_without_running(lab):
    proc = lab.mctl("provision", lab.rack, "--dry-run")
    assert proc.returncode == 0
    assert f"on {len(lab.trays)} hosts" in proc.stdout and "nothing changed (--dry-run)" in proc.stdout


def test_plain_ansible_playbook_reads_the_same_inventory(lab, provisioned):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    graph = subprocess.run(["ansible-inventory", "-i", str(lab.inventory), "--graph"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert graph.returncode == 0, graph.stderr
    assert lab.trays[0] in graph.stdout and "@lab_r1_compute" in graph.stdout
    run = subprocess.run(["ansible-playbook", "-i", str(lab.inventory), str(REPO / "playbooks" / "site.yml"),
                          "--limit", lab.trays[0], "--tags", "base"], capture_output=True, text=True, env=env,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "changed=0" in run.stdout and "failed=0" in run.stdout


def test_run_folder_records_only_the_allowed_environment(lab, provisioned):
    """ansible-runner records the environment it ran with; mctl gives it an allow-list, not its own
    environment (MCTL_INVENTORY, MCTL_STATE_DIR and anything secret stay out), and the run still works."""
    from mctl.ansible.runner import ENV_ALLOW

    env = json.loads((Path(provisioned["run_dir"]) / "artifacts" / provisioned["run_id"] / "command").read_text())["env"]
    assert not [k for k in env if k.startswith("MCTL_")]
    odd = [k for k in env if k not in ENV_ALLOW and not k.startswith(("ANSIBLE_", "AWX_", "RUNNER_", "LC_"))
           and k != "PATH"]
    assert odd == []


def test_provision_is_refused_while_the_rack_is_locked(lab, held_lock):
    from mctl.state import rack_lock_path

    with held_lock(rack_lock_path(lab.state_dir, lab.rack), "mctl rack bring-up") as pid:
        result = lab.mctl("provision", lab.trays[0])
        assert result.returncode == 2 and result.stdout == ""
        assert f"rack {lab.rack} is locked by pid {pid}" in result.stderr
