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
lic = nodes.setdefault("_licenses", {})            # name -> count (slurm.conf's Licenses=)
res = nodes.setdefault("_reservations", {})        # name -> {"licenses": {name: n}, "comment": ...}
def save():
    json.dump(nodes, open(path, "w"))
if args[:2] == ["show", "license"]:                # as 24.11 prints it; nothing for an unknown name
    for name in args[2:] or list(lic):
        if name in lic:
            taken = sum(r["licenses"].get(name, 0) for r in res.values())
            print(f"LicenseName={name}\n    Total={lic[name]} Used=0 Free={lic[name]} Reserved={taken} Remote=no")
    sys.exit(0)
if args[:2] == ["show", "reservation"]:
    names = [a for a in args[2:] if a != "-o"]
    if names and names[0] not in res:
        print(f"Reservation {names[0]} not found"); sys.exit(1)
    shown = names or list(res)
    if not shown:
        print("No reservations in the system")
    for name in shown:
        r = res[name]
        print(f"ReservationName={name} StartTime=2026-12-02T15:02:00 Flags=ANY_NODES "
              f"Licenses={','.join(f'{k}:{v}' for k, v in r['licenses'].items())} State=ACTIVE Comment={r['comment']}")
    sys.exit(0)
if args[:2] == ["create", "reservation"]:
    kv = dict(a.split("=", 1) for a in args[2:])
    name = kv["ReservationName"]
    if name in res:
        print("Error creating the reservation: Duplicate reservation name"); sys.exit(1)
    want = {k: int(v) for k, v in (x.split(":") for x in kv["Licenses"].split(","))}
    for k, n in want.items():
        if k not in lic or sum(r["licenses"].get(k, 0) for r in res.values()) + n > lic[k]:
            print("Error creating the reservation: Invalid license specification"); sys.exit(1)
    res[name] = {"licenses": want, "comment": kv.get("Comment", "(null)")}
    save()
    print(f"Reservation created: {name}")
    sys.exit(0)
if args[:2] == ["delete", "reservation"] or (args[:1] == ["delete"] and args[1].startswith("reservation=")):
    name = args[1].split("=", 1)[1] if "=" in args[1] else args[2]
    if res.pop(name, None) is None:
        print(f"delete_reservation reservation={name}: Requested reservation is invalid"); sys.exit(1)
    save()
    sys.exit(0)
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
            # the safety budget mctl deploy slurm renders (generous unless a test gives its own)
            nodes.setdefault("_licenses", {"mctl_budget_site": 99, "mctl_budget_rack_none": 99, "mctl_budget_trip": 1})
            state.write_text(json.dumps(nodes))

        def nodes(self):
            return {k: v for k, v in json.loads(state.read_text()).items() if k not in ("_licenses", "_reservations")}

        def reservations(self):
            return json.loads(state.read_text()).get("_reservations", {})

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


# --- the safety budget (mctl.sched.slurm.budget): a grant per tray, in the same script as its drain --------

BUDGET_1 = {"mctl_budget_site": 2, "mctl_budget_rack_r1": 1, "mctl_budget_trip": 1}


def _drain(host: str, **kw) -> Decision:
    return Decision(host, DRAIN, "x", reason="mctl: xid 79 gpu0", rack="r1", **kw)


def test_the_budget_grants_each_drain_once_and_trips_when_full(slurm, processes):
    slurm.set(_licenses=BUDGET_1, t1={"state": "IDLE"}, t2={"state": "IDLE"}, t3={"state": "IDLE"})
    ds = [_drain("t1"), _drain("t2")]
    first, second = parse_apply(slurm.run(apply_script(ds)), ds)
    assert first.ok and not second.ok and second.refused and not second.not_ours
    assert "held back by the safety budget: every grant of rack r1 or of the site is taken" in second.error
    assert "Reserved=1" in second.error                              # what slurmctld said, for the operator
    assert slurm.nodes()["t2"] == {"state": "IDLE"}                  # never drained
    res = slurm.reservations()
    assert set(res) == {"mctl_budget_t1", "mctl_budget_tripped"}
    assert res["mctl_budget_tripped"]["comment"].startswith("refused t2: mctl: xid 79 gpu0")
    # tripped: sticky, whatever the count says, until a person resets it
    (third,) = parse_apply(slurm.run(apply_script([_drain("t3")])), [_drain("t3")])
    assert third.refused and "it is tripped (refused t2: mctl: xid 79 gpu0)" in third.error
    # the same tray drained again (the node check after the watch) asks no second grant
    slurm.run("scontrol update NodeName=t1 State=RESUME")
    (again,) = parse_apply(slurm.run(apply_script([_drain("t1")])), [_drain("t1")])
    assert not again.ok and "tripped" in again.error                # tripped comes first
    # a resume is never refused, and gives the grant back
    slurm.run("scontrol update NodeName=t1 State=DRAIN Reason=mctl:x")
    rs = [Decision("t1", RESUME, "healthy")]
    assert parse_apply(slurm.run(apply_script(rs)), rs)[0].ok
    assert set(slurm.reservations()) == {"mctl_budget_tripped"}


def test_a_drain_that_does_not_happen_gives_its_grant_back(slurm, processes):
    slurm.set(_licenses=BUDGET_1, t1={"state": "IDLE+DRAIN", "reason": "ops: cable"})
    (r,) = parse_apply(slurm.run(apply_script([_drain("t1")])), [_drain("t1")])
    assert r.refused and slurm.reservations() == {}                  # the guard refused before the grant


def test_a_leak_is_counted_but_never_held_back(slurm, processes):
    slurm.set(_licenses=BUDGET_1, t1={"state": "IDLE"}, t2={"state": "IDLE"})
    ds = [_drain("t1", outranks_budget=True), _drain("t2", outranks_budget=True)]
    assert [r.ok for r in parse_apply(slurm.run(apply_script(ds)), ds)] == [True, True]
    assert slurm.nodes()["t2"]["state"] == "IDLE+DRAIN"
    assert "mctl_budget_t1" in slurm.reservations()                  # counted where a grant was left


def test_no_budget_in_slurm_is_said_and_drains_nothing(slurm, processes):
    slurm.set(_licenses={}, t1={"state": "IDLE"})
    (r,) = parse_apply(slurm.run(apply_script([_drain("t1")])), [_drain("t1")])
    assert r.refused and "the safety budget is not in Slurm" in r.error and "mctl deploy slurm" in r.error
    assert slurm.nodes()["t1"] == {"state": "IDLE"}


def test_a_commands_hold_refused_by_the_budget_does_not_trip_it(slurm, processes):
    """A partition change's or a rollout's hold is a person's command: the refusal is said to them, and the
    site's budget stays open for the watch and the node checks."""
    from mctl.sched.slurm import holds

    slurm.set(_licenses=BUDGET_1, t1={"state": "IDLE"}, t2={"state": "IDLE"})
    out = slurm.run(holds.hold_script(holds.PARTITION_CHANGE, ["t1", "t2"], "mctl: partition change of r1",
                                      {"t1": "r1", "t2": "r1"}))
    r1, r2 = (holds.parse_actions(out, ["t1", "t2"])[t] for t in ("t1", "t2"))
    assert r1[0] == "done" and r2[0] == "refused" and holds.BUDGET_REFUSAL in r2[1]
    assert holds.budget_refused({"t2": r2[1]}) == {"t2": r2[1]}
    assert set(slurm.reservations()) == {"mctl_budget_t1"}            # no mctl_budget_tripped
