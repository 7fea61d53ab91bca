"""Partition changes respect the jobs on their trays: real Slurm on the lab, the NMX-M emulator for the fabric.

A job runs on trays 1-2 (inside p0): deleting p1 (trays 3-4) goes ahead and the job keeps
running; going back to one partition for the whole rack touches trays 1-2, so it is refused
and names the job; with --drain --wait and the job cancelled meanwhile it holds trays 1-2,
waits, changes the partitions and releases the holds.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from mctl.lab.nmx_emulator import Config, NMXEmulator


def _wait(what: str, probe, deadline: float = 120.0, every: float = 1.0):
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def site(lab, tmp_path_factory):
    from mctl.lab.hosts import host_path

    if len(lab.trays) < 4:
        pytest.skip("needs a lab with 4 trays (MCTL_TEST_TRAYS)")
    tmp = tmp_path_factory.mktemp("partition-jobs")
    doc = yaml.safe_load(lab.inventory.read_text())
    rack = doc["racks"][lab.rack]
    rack.pop("partitions", None)
    emulator = None
    if "nmx" not in rack:
        trays = []
        state = {}
        for name in lab.trays:
            path = host_path(lab.dir, name, "/var/lib/mctl-lab/gpus.json")
            state = json.loads(path.read_text())
            trays.append({"name": name, "tray_index": state["tray_index"], "slot_id": state["slot_number"],
                          "host_id": state["host_id"], "gpus_json": str(path)})
        emulator = NMXEmulator(Config.from_dict({
            "listen": "127.77.251.3", "port": 0, "username": "admin", "password": "lab-secret",
            "domain_uuid": rack["nvlink_domain"], "chassis_serial": state["chassis_serial"],
            "state_file": str(tmp / "nmx-state.json"), "operation_delay_s": 0.05, "fabric_delay_s": 0.05,
            "trays": trays})).start()
        cred = tmp / "nmx.cred"
        cred.write_text("admin:lab-secret\n")
        cred.chmod(0o600)
        rack["nmx"] = {"url": emulator.url, "credentials_file": str(cred)}
    (tmp / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    base = ["-i", str(tmp), "--state-dir", str(tmp / "state")]
    proc = lab.mctl(*base, "--json", "deploy", "slurm", timeout=900)
    assert proc.returncode == 0, f"deploy slurm failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-2000:]}"
    # IMEX as this site's partitions want it (an earlier test's partitions may have left the daemons
    # not ready, and slurmd's node check rightly drains such a tray), then every tray idle
    proc = lab.mctl(*base, "imex", "apply", lab.rack, "--wait", "60", timeout=300)
    assert proc.returncode == 0, f"imex apply failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-2000:]}"
    lab.settle_slurm()
    try:
        yield {"base": base, "dir": tmp}
    finally:
        lab.run(lab.head, "scancel --user=root; true", check=False)
        lab.mctl(*base, "partition", "apply", lab.rack, "--prune", "--force", "--yes")
        lab.run(lab.head, "scontrol update NodeName=" + ",".join(lab.trays) + " State=RESUME "
                "Reason='test cleanup' 2>/dev/null; true", check=False)
        if emulator is not None:
            emulator.stop()


def _job_state(lab, job: str) -> str:
    return lab.run(lab.head, f"squeue -h -j {job} -o %T", check=False).stdout.strip()


def _start_job(lab, trays: str) -> str:
    out = lab.run(lab.head, f"sbatch --parsable -N2 -w {trays} -o /dev/null --job-name=mctl-test "
                            "--wrap 'sleep 600'").stdout.strip()
    job = out.split(";")[0]
    try:
        _wait(f"job {job} RUNNING", lambda: _job_state(lab, job) == "RUNNING")
    except AssertionError as exc:
        why = lab.run(lab.head, f"squeue -h -j {job} -o '%T %r'; sinfo -N -o '%N %T %E'", check=False).stdout
        raise AssertionError(f"{exc}\n{why}") from None
    return job


def _node_state(lab, tray: str) -> str:
    out = lab.run(lab.head, f"scontrol show node -o {tray}").stdout
    return out.split(" State=", 1)[1].split()[0]


def _mctl(lab, site, *args, timeout=300):
    return lab.mctl(*site["base"], *args, timeout=timeout)


def test_changes_respect_the_job(lab, site):
    t = lab.trays
    pair = f"{t[0]},{t[1]}"
    made = _mctl(lab, site, "partition", "create", lab.rack, "--template", "2x9")      # nothing runs yet
    assert made.returncode == 0, made.stderr
    job = _start_job(lab, pair)
    try:
        # a dry run shows the whole plan and the job, and changes nothing
        dry = _mctl(lab, site, "--json", "partition", "create", lab.rack, "--template", "all", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        change = json.loads(dry.stdout)["change"]
        assert change["affected_trays"] == list(t[:4])
        assert [w["id"] for w in change["work"]] == [job] and change["work"][0]["nodes"] == [t[0], t[1]]
        assert [b["nodes"] for b in change["slurm"]["blocks_after"]] == [f"{lab.rack}-tray[01-04]"]
        assert {d["domain"] for d in change["imex"]} == {"all"}
        before = (site["dir"] / "mctl.yml").read_text()

        # the whole rack again touches trays 1-2: refused, the job named, nothing changed
        refused = _mctl(lab, site, "partition", "create", lab.rack, "--template", "all")
        assert refused.returncode == 2, refused.stderr
        assert f"job {job} user root name 'mctl-test' R on" in refused.stderr and "--drain" in refused.stderr
        assert (site["dir"] / "mctl.yml").read_text() == before

        # deleting p1 (trays 3-4) does not touch the job's trays: it goes ahead, the job keeps running
        gone = _mctl(lab, site, "partition", "delete", lab.rack, "p1")
        assert gone.returncode == 0, gone.stderr
        assert _job_state(lab, job) == "RUNNING"
        assert "DRAIN" not in _node_state(lab, t[0])

        # --drain --wait: trays 1-2 are held, the job ends meanwhile, the change completes, the holds go
        def cancel_once_held():
            _wait("the trays held", lambda: "DRAIN" in _node_state(lab, t[0]), deadline=120)
            lab.run(lab.head, f"scancel {job}")

        canceller = threading.Thread(target=cancel_once_held, daemon=True)
        canceller.start()
        done = _mctl(lab, site, "partition", "create", lab.rack, "--template", "all", "--drain", "--wait", "180")
        canceller.join(timeout=150)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "held in Slurm" in done.stdout and "released" in done.stdout
        assert "name: all" in (site["dir"] / "mctl.yml").read_text()
        assert "DRAIN" not in _node_state(lab, t[0]) and "DRAIN" not in _node_state(lab, t[1])
    finally:
        lab.run(lab.head, f"scancel {job}; true", check=False)


def test_drain_timeout_keeps_the_holds(lab, site):
    t = lab.trays
    pair = f"{t[2]},{t[3]}"
    job = _start_job(lab, pair)
    try:
        out = _mctl(lab, site, "partition", "create", lab.rack, "--template", "2x9", "--drain", "--wait", "3")
        assert out.returncode == 3, out.stderr
        assert f"job {job}" in out.stderr and "stay held" in out.stderr and "State=RESUME" in out.stderr
        assert "DRAIN" in _node_state(lab, t[2])
        assert _job_state(lab, job) == "RUNNING"               # a hold never stops a running job
        assert "name: p0" not in (site["dir"] / "mctl.yml").read_text()
    finally:
        lab.run(lab.head, f"scancel {job}; scontrol update NodeName={pair} State=RESUME Reason=test; true",
                check=False)
