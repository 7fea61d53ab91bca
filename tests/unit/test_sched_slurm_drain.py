"""The drain/resume script, run by /bin/sh against a stand-in `scontrol` that keeps node state in a file.

The stand-in prints `show node -o` lines in Slurm 24.11's form (captured from the lab) and
applies `update ... State=DRAIN|RESUME Reason=...` the way slurmctld does, so the guards in
the script are exercised for real: already drained, down, reason no longer mctl's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mctl.model.drain import DRAIN, RESUME, Decision
from mctl.sched.slurm.drain import RESUMED_REASON, apply_script, controller_down, parse_apply, read_nodes

SCONTROL = r'''#!PYTHON
import json, sys
path = "STATE"
nodes = json.load(open(path))
args = sys.argv[1:]
if args[:3] == ["show", "node", "-o"]:
    if nodes.get("_down_controller"):
        print("slurm_load_node error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
        sys.exit(1)
    for name in (args[3:] or [n for n in nodes if not n.startswith("_")]):
        n = nodes.get(name)
        if n is None:
            print(f"Node {name} not found"); sys.exit(1)
        reason = f" Reason={n['reason']} [root@2026-11-29T20:25:10]" if n.get("reason") else ""
        print(f"NodeName={name} Arch=x86_64 CoresPerSocket=2 Gres=gpu:4 NodeAddr=127.0.0.1 Port=1 "
              f"State={n['state']} ThreadsPerCore=1 Partitions=gpu  CurrentWatts=0 AveWatts=0 {reason}")
    sys.exit(0)
if args[:1] == ["update"]:
    if nodes.get("_slow_update"):       # scontrol retrying a slurmctld that is down, then applying
        import time; time.sleep(nodes["_slow_update"])
    kv = dict(a.split("=", 1) for a in args[1:])
    n = nodes[kv["NodeName"]]
    if kv["State"] == "DRAIN":
        n["state"] = n["state"].split("+")[0] + "+DRAIN"; n["reason"] = kv["Reason"]
    elif kv["State"] == "RESUME":
        if "DRAIN" not in n["state"]:
            print("slurm_update error: Invalid node state specified"); sys.exit(1)
        # as slurmctld 24.11 does: the last reason stays unless the update gives a new one
        n["state"] = n["state"].split("+")[0]
        if kv.get("Reason"):
            n["reason"] = kv["Reason"]
    json.dump(nodes, open(path, "w"))
    sys.exit(0)
sys.exit(2)
'''


@pytest.fixture
def slurm(tmp_path):
    state = tmp_path / "nodes.json"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "scontrol"
    script.write_text(SCONTROL.replace("PYTHON", sys.executable).replace("STATE", str(state)))
    script.chmod(0o755)

    class Slurm:
        def set(self, **nodes):
            state.write_text(json.dumps(nodes))

        def nodes(self):
            return json.loads(state.read_text())

        def run(self, script_text: str) -> str:
            env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
            proc = subprocess.run(["/bin/sh", "-c", script_text], capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

    return Slurm()


def test_drain_and_resume_through_the_script(slurm, processes):
    slurm.set(t1={"state": "IDLE"}, t2={"state": "ALLOCATED"})
    ds = [Decision("t1", DRAIN, "x", reason="mctl: xid 79 gpu0 (fell off bus)"),
          Decision("t2", DRAIN, "x", reason="mctl: nvlink gpu1 link5 down")]
    results = parse_apply(slurm.run(apply_script(ds)), ds)
    assert [r.ok for r in results] == [True, True]
    assert slurm.nodes() == {"t1": {"state": "IDLE+DRAIN", "reason": "mctl: xid 79 gpu0 (fell off bus)"},
                             "t2": {"state": "ALLOCATED+DRAIN", "reason": "mctl: nvlink gpu1 link5 down"}}
    views, _ = read_nodes(slurm.run("scontrol show node -o"))
    assert views["t1"].mctl_drain and views["t1"].reason == "mctl: xid 79 gpu0 (fell off bus)"
    rs = [Decision("t1", RESUME, "healthy"), Decision("t2", RESUME, "healthy")]
    assert all(r.ok for r in parse_apply(slurm.run(apply_script(rs)), rs))
    # Slurm keeps the last reason of a resumed node: the resume replaced mctl's in the same update.
    assert slurm.nodes() == {"t1": {"state": "IDLE", "reason": RESUMED_REASON},
                             "t2": {"state": "ALLOCATED", "reason": RESUMED_REASON}}
    views, _ = read_nodes(slurm.run("scontrol show node -o"))
    assert not views["t1"].drained and views["t1"].reason is None and not RESUMED_REASON.startswith("mctl:")


def test_guards_refuse_at_the_last_moment(slurm, processes):
    slurm.set(t1={"state": "IDLE+DRAIN", "reason": "ops: cable"}, t2={"state": "DOWN*"},
              t3={"state": "IDLE+DRAIN", "reason": "ops: took it over"}, t4={"state": "DOWN+DRAIN",
                                                                              "reason": "mctl: x"})
    ds = [Decision("t1", DRAIN, "x", reason="mctl: a"), Decision("t2", DRAIN, "x", reason="mctl: b"),
          Decision("t3", RESUME, "x"), Decision("t4", RESUME, "x")]
    r1, r2, r3, r4 = parse_apply(slurm.run(apply_script(ds)), ds)
    assert (r1.ok, r1.refused, r1.not_ours) == (False, True, False) and "IDLE+DRAIN" in r1.error
    assert (r2.ok, r2.refused) == (False, True) and "DOWN*" in r2.error
    assert (r3.ok, r3.refused, r3.not_ours) == (False, True, True)
    assert (r4.ok, r4.refused, r4.not_ours) == (False, True, False)
    assert slurm.nodes()["t1"]["reason"] == "ops: cable" and slurm.nodes()["t3"]["reason"] == "ops: took it over"


def test_controller_down_marks_actions_unreachable(slurm, processes):
    slurm.set(_down_controller=True, t1={"state": "IDLE"})
    ds = [Decision("t1", DRAIN, "x", reason="mctl: a")]
    (r,) = parse_apply(slurm.run(apply_script(ds)), ds)
    assert not r.ok and r.unreachable and "Unable to contact slurm controller" in r.error


def test_reasons_with_shell_characters_are_quoted(slurm, processes):
    slurm.set(t1={"state": "IDLE"})
    reason = "mctl: it's $(rm -rf /) `x` \"q\""
    ds = [Decision("t1", DRAIN, "x", reason=reason)]
    assert parse_apply(slurm.run(apply_script(ds)), ds)[0].ok
    assert slurm.nodes()["t1"]["reason"] == reason


def test_missing_result_marker_is_treated_as_unreachable():
    ds = [Decision("t1", DRAIN, "x", reason="mctl: a")]
    (r,) = parse_apply("", ds)
    assert r.unreachable and not r.ok
    with pytest.raises(ValueError):
        apply_script([Decision("t1", "skip", "x")])


def test_controller_down_texts():
    assert controller_down("slurm_load_node error: Unable to contact slurm controller (connect failure)")
    assert controller_down("scontrol: error: Socket timed out on send/recv operation")
    assert not controller_down("Node t9 not found")


def test_no_scontrol_outlives_the_deadline_on_the_controller(slurm, processes):
    """Dropping the connection at mctl's deadline does not stop a command on the controller: an
    scontrol retrying a slurmctld that is down would apply the resume when it comes back, after mctl
    logged it queued (found by bench/chaos.py). With limit_s the script kills it there, and the
    result reads as the controller not answering (queued)."""
    import time

    slurm.set(t1={"state": "IDLE+DRAIN", "reason": "mctl: xid 79 gpu0 (fell off bus)"}, _slow_update=8)
    ds = [Decision("t1", RESUME, "healthy")]
    started = time.monotonic()
    (r,) = parse_apply(slurm.run(apply_script(ds, limit_s=3)), ds)
    assert time.monotonic() - started < 6
    assert not r.ok and r.unreachable and "deadline" in r.error
    time.sleep(0.5)
    assert slurm.nodes()["t1"]["state"] == "IDLE+DRAIN"          # killed before it applied
    slurm.set(t1={"state": "IDLE+DRAIN", "reason": "mctl: xid 79 gpu0 (fell off bus)"})
    (r,) = parse_apply(slurm.run(apply_script(ds, limit_s=5)), ds)
    assert r.ok and slurm.nodes()["t1"]["state"] == "IDLE"        # a quick scontrol is not cut
