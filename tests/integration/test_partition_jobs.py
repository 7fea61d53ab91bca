"""Partition changes respect the jobs on their trays: real Slurm on the lab, the NMX-M emulator for the fabric.

A job runs on trays 1-2 (inside p0): deleting p1 (trays 3-4) goes ahead and the job keeps
running; going back to one partition for the whole rack touches trays 1-2, so it is refused
and names the job; with --drain --wait and the job cancelled meanwhile it holds trays 1-2,
waits, changes the partitions and releases the holds.

Every change is applied across the layers (issue 18, deliverable 3): after one, the GPUs'
cliques, `nvidia-imex-ctl -N` on every tray, `scontrol show topology` and a `srun --segment`
job all follow the new partitions; a change killed with SIGKILL after its NMX-M step is
finished by `partition apply --resume`; an NMX-M operation that fails rolls every layer back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from functools import partial
from pathlib import Path

import pytest
import yaml

from mctl.lab.nmx_emulator import Config, NMXEmulator
from tests.helpers import wait_for


_wait = partial(wait_for, timeout=120.0, every=1.0)       # every wait here: two minutes, polled each second


@pytest.fixture(scope="module")
def site(slurm_lab, tmp_path_factory):
    from mctl.lab.hosts import host_path

    lab = slurm_lab.lab
    tmp = tmp_path_factory.mktemp("partition-jobs")
    doc = yaml.safe_load(lab.inventory.read_text())
    rack = doc["racks"][lab.rack]
    rack.pop("partitions", None)
    # a partition change's --drain holds every tray it touches, each with a grant of the site's safety
    # budget (all or nothing); this site's maintenance may hold its whole rack (p0 -> all touches 4 trays)
    doc["safety"] = {"budget": {"rack_share": 1.0, "site_share": 1.0, "allow_whole_rack": True}}
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
    nmx = dict(rack["nmx"])
    base = ["-i", str(tmp), "--state-dir", str(tmp / "state")]
    # this site's own deploy (no partition yet: one block); the next module asking for slurm_lab gets the
    # session's deploy back
    proc = lab.mctl(*base, "--json", "deploy", "slurm", timeout=900)
    assert proc.returncode == 0, f"deploy slurm failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-2000:]}"
    # IMEX as this site's partitions want it (an earlier test's partitions may have left the daemons
    # not ready, and slurmd's node check rightly drains such a tray), then every tray idle
    proc = lab.mctl(*base, "imex", "apply", lab.rack, "--imex-wait", "60", timeout=300)
    assert proc.returncode == 0, f"imex apply failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-2000:]}"
    lab.settle_slurm()
    try:
        yield {"base": base, "dir": tmp, "nmx": nmx}
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
            _wait("the trays held", lambda: "DRAIN" in _node_state(lab, t[0]), timeout=120)
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


# ------------------------------------------------------------------ the change across every layer (issue 18)

def _layers(lab):
    """What each layer holds now: {tray: clique label}, {tray: (IMEX state, node addresses)}, Slurm's blocks,
    the trays Slurm has drained."""
    from mctl.facts.imex import parse_domain_text
    from mctl.facts.nvidia_smi import parse_xml
    from mctl.sched.slurm.facts import parse_show_topology

    from concurrent.futures import ThreadPoolExecutor

    cliques, imex = {}, {}
    probe = "nvidia-smi -q -x; echo @@mctl-test; nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg -N"
    with ThreadPoolExecutor(len(lab.trays)) as pool:
        outs = dict(zip(lab.trays, pool.map(lambda t: lab.run(t, probe, check=False).stdout, lab.trays)))
    for t in lab.trays:
        xml, _, text = outs[t].partition("@@mctl-test\n")
        cliques[t] = parse_xml(xml).clique_label
        status = parse_domain_text(text)
        imex[t] = (status.state, status.addresses)
    topo = lab.run(lab.head, "scontrol show topology").stdout
    blocks = {e.name: e.nodes for e in parse_show_topology(topo) if e.kind == "block"}
    drained = lab.run(lab.head, "sinfo -h -N -t drain,draining,drained -o %N", check=False).stdout.split()
    return cliques, imex, blocks, sorted(set(drained))


def _assert_layers(lab, groups, blocks, drained=()):
    """Every layer follows *groups* (lists of trays): one clique each, an IMEX domain UP of exactly its trays,
    the Slurm blocks *blocks*, nothing held (but *drained*)."""
    address = lab.addresses
    want_drained = drained

    def settled():
        cliques, imex, found, drained = _layers(lab)
        ok = found == blocks and drained == sorted(want_drained)
        for g in groups:
            ok = ok and len({cliques[t] for t in g}) == 1 and cliques[g[0]] is not None
            ok = ok and all(imex[t] == ("UP", tuple(address[x] for x in g)) for t in g)
        ok = ok and len({cliques[g[0]] for g in groups}) == len(groups)
        return ok or None

    try:
        _wait("every layer to follow the partitions", settled, timeout=30)
    except AssertionError:
        raise AssertionError(f"layers: {_layers(lab)}; wanted {groups} and {blocks}") from None


def _journal(site) -> dict:
    runs = sorted((site["dir"] / "state" / "partition-change" / "lab-r1").glob("*/journal.json"))
    return json.loads(runs[-1].read_text())


def _nmx_fault(site, doc: dict) -> None:
    from mctl.fabric.nmx import load_credentials

    cred = load_credentials(site["nmx"]["credentials_file"])
    req = urllib.request.Request(site["nmx"]["url"].rstrip("/") + "/_lab/faults", data=json.dumps(doc).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    import base64
    token = base64.b64encode(f"{cred.username}:{cred.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_a_killed_change_is_finished_by_resume_on_every_layer(lab, site):
    t = lab.trays
    lab.settle_slurm()
    proc = subprocess.Popen([sys.executable, "-m", "mctl", *site["base"], "partition", "create", lab.rack,
                             "--template", "2x9"], env=lab._env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        def past_nmx():
            try:
                data = _journal(site)
            except (IndexError, ValueError, OSError):
                return None
            try:        # the journal's first save comes before its change is recorded
                return data["change"]["after"][0]["name"] == "p0" and data["status"] == "running" and \
                    {p["name"]: p["status"] for p in data["phases"]}.get("nmx") == "done"
            except (KeyError, IndexError, TypeError):
                return None
        _wait("the change past its NMX-M step", past_nmx, timeout=120, every=0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    data = _journal(site)
    assert data["status"] == "running"                    # as the killed process left it
    left = [p["name"] for p in data["phases"] if p["status"] not in ("done", "skipped")]
    assert left and "nmx" not in left and left[-1] == "release"
    resumed = _mctl(lab, site, "--json", "partition", "apply", lab.rack, "--resume")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout[-3000:]
    run = json.loads(resumed.stdout)["run"]
    assert run["resumed"] and run["status"] == "succeeded" and run["ran"][0] == left[0] and "nmx" not in run["ran"]
    steps = {s["step"]: s for s in run["steps"]}
    assert list(steps) == ["hold", "record", "nmx", "cliques", "imex-files", "imex-restart", "imex-up",
                           "slurm-topology", "slurm-verify", "labels", "release"]
    assert steps["labels"]["status"] == "skipped" and "no Kubernetes" in steps["labels"]["summary"]
    assert all(s["status"] == "done" for n, s in steps.items() if n != "labels"), steps

    # the whole chain follows the new partitions: cliques, IMEX on every tray, Slurm's blocks, no hold left
    _assert_layers(lab, [t[:2], t[2:4]], {f"{lab.rack}-p0": f"{lab.rack}-tray[01-02]",
                                          f"{lab.rack}-p1": f"{lab.rack}-tray[03-04]"})
    # a job of two segments of two lands inside the new blocks, one segment per block
    out = lab.run(lab.head, "srun -N4 --segment=2 -l hostname | sort", timeout=60).stdout
    hosts = [line.split(": ", 1)[1] for line in out.split("\n") if ": " in line]
    assert sorted(hosts[:2]) in ([t[0], t[1]], [t[2], t[3]]) and sorted(hosts) == list(t[:4])
    # a segment of three no longer fits in one block
    assert lab.run(lab.head, "srun -N3 --segment=3 hostname", check=False, timeout=60).returncode != 0
    # the IMEX files it replaced are kept beside them
    assert lab.run(t[0], "test -f /etc/nvidia-imex/nodes_config.cfg.mctl-bak", check=False).returncode == 0


def test_a_failed_nmx_operation_rolls_every_layer_back(lab, site):
    t = lab.trays
    lab.settle_slurm()
    before = (site["dir"] / "mctl.yml").read_text()
    assert "name: p1" in before
    _nmx_fault(site, {"fail_operations": 1})
    try:
        out = _mctl(lab, site, "--json", "partition", "create", lab.rack, "--template", "all")
    finally:
        _nmx_fault(site, {"clear": True})
    assert out.returncode == 3, out.stderr + out.stdout[-3000:]
    assert "step nmx failed" in out.stderr and "rolled back" in out.stderr
    run = json.loads(out.stdout)["run"]
    steps = {s["step"]: s for s in run["steps"]}
    assert run["status"] == "rolled-back" and steps["nmx"]["status"] == "failed"
    assert steps["imex-files"]["status"] == "excluded"
    assert [s for s in steps if s.startswith("undo-")] == ["undo-nmx", "undo-cliques", "undo-record",
                                                           "undo-release"]
    assert all(steps[s]["status"] == "done" for s in steps if s.startswith("undo-")), steps
    assert (site["dir"] / "mctl.yml").read_text() == before
    _assert_layers(lab, [t[:2], t[2:4]], {f"{lab.rack}-p0": f"{lab.rack}-tray[01-02]",
                                          f"{lab.rack}-p1": f"{lab.rack}-tray[03-04]"})


def test_isolate_then_restore_a_tray(lab, site):
    t = lab.trays
    lab.settle_slurm()
    lab.run(lab.head, f"scontrol update NodeName={t[3]} State=DRAIN Reason='mctl-test: isolate'")
    try:
        out = _mctl(lab, site, "--json", "partition", "isolate", t[3])
        assert out.returncode == 0, out.stderr + out.stdout[-3000:]
        assert json.loads(out.stdout)["run"]["status"] == "succeeded"
        q = f"quarantine-{t[3]}"
        assert f"name: {q}" in (site["dir"] / "mctl.yml").read_text()
        _assert_layers(lab, [t[:2], [t[2]], [t[3]]], {f"{lab.rack}-p0": f"{lab.rack}-tray[01-02]",
                                                     f"{lab.rack}-p1": t[2], f"{lab.rack}-{q}": t[3]},
                       drained=[t[3]])
        back = _mctl(lab, site, "--json", "partition", "restore", t[3])
        assert back.returncode == 0, back.stderr + back.stdout[-3000:]
        assert json.loads(back.stdout)["run"]["status"] == "succeeded"
        _assert_layers(lab, [t[:2], t[2:4]], {f"{lab.rack}-p0": f"{lab.rack}-tray[01-02]",
                                              f"{lab.rack}-p1": f"{lab.rack}-tray[03-04]"}, drained=[t[3]])
    finally:
        lab.run(lab.head, f"scontrol update NodeName={t[3]} State=RESUME; true", check=False)
