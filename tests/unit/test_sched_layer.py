"""The one scheduler layer: a Slurm node's state read once, the guarded script builder, its result parser.

The scripts run in a real /bin/sh against a stand-in `scontrol` function that prints one
`show node -o` line (Slurm 24.11's form, as the lab prints it) and echoes the updates, so
each guard is exercised as the controller would run it.
"""

from __future__ import annotations

import subprocess
from datetime import datetime

import pytest

from mctl.model.drain import (DRAIN, RESUME, ActResult, Decision, NodeView, PendingAction, drain_refusal,
                              resume_refusal)
from mctl.sched.slurm import drain as sd
from mctl.sched.slurm.facts import NodeState, split_reason


def _run(script: str, state: str, reason: str | None = None) -> str:
    line = f"NodeName=t1 Arch=x86_64 State={state} ThreadsPerCore=1" + (f" Reason={reason}" if reason else "")
    fake = (f"scontrol() {{ if [ \"$1\" = show ]; then echo '{line}'; else echo UPDATED \"$@\"; fi; }}\n")
    return subprocess.run(["/bin/sh", "-c", fake + script], capture_output=True, text=True, timeout=30).stdout


# --- the node's state, read once ---------------------------------------------------------------------

def test_reason_stamp_is_split_once_for_every_user():
    assert split_reason("mctl: xid 79 [root@2026-11-29T19:51:38]") == (
        "mctl: xid 79", split_reason("x [root@2026-11-29T19:51:38]")[1])
    text, stamp = split_reason("bad fan [alice@2026-01-01T00:00:00]")
    assert text == "bad fan" and stamp.who == "alice" and stamp.since == datetime(2026, 1, 1)
    assert split_reason("(null)") == (None, None) and split_reason(None) == (None, None)
    assert split_reason("[slurm@2026-01-01T00:00:00]")[0] is None             # a stamp and no reason
    text, stamp = split_reason("odd [who@yesterday]")                        # not ISO: kept apart, no time
    assert text == "odd" and stamp.who == "who" and stamp.since is None
    assert split_reason("a [b] c") == ("a [b] c", None)                      # brackets that are no stamp


def test_drained_down_and_owner_are_one_definition():
    held = NodeState("t1", "IDLE+DRAIN", "mctl: bring-up RUN: x [root@2026-01-01T00:00:00]")
    assert held.drained and not held.down and held.owned_by("mctl: bring-up") and held.owned_by("mctl:")
    assert held.reason_text == "mctl: bring-up RUN: x" and held.stamp.who == "root"
    fail = NodeState("t2", "FAIL*", "failing disk")
    assert fail.drained and fail.view().drained and not fail.owned_by("mctl:")
    resumed = NodeState("t3", "IDLE", "mctl: xid 79 [root@2026-01-01T00:00:00]")   # Slurm keeps the last reason
    assert not resumed.drained and resumed.current_reason is None and not resumed.owned_by("mctl:")
    assert resumed.view() == NodeView("t3", True, False, False, None, "IDLE")
    down = NodeState("t4", "DOWN*+DRAIN", "mctl: x [root@2026-01-01T00:00:00]")
    assert down.view() == NodeView("t4", True, True, True, "mctl: x", "DOWN*+DRAIN", "root@2026-01-01T00:00:00")
    assert NodeState("t5", "IDLE+DRAIN", "mctl: x").view().stamp is None       # no stamp: none made up
    assert NodeState("t6", "UNKNOWN+DRAIN", "mctl: x").view().unregistered and not down.view().unregistered


# --- the script builder -----------------------------------------------------------------------------

def test_drain_step_refuses_any_holder_and_quotes_the_reason(processes):
    script = sd.script([sd.drain_step("t1", "mctl: it's $(x)")])
    assert "*DRAIN*|*DOWN*|*FAIL*" in script and "Reason='mctl: it'\"'\"'s $(x)'" in script
    out = _run(script, "IDLE")
    assert "UPDATED update NodeName=t1 State=DRAIN Reason=mctl: it's $(x)" in out
    assert sd.parse(out, ["t1"])["t1"].ok
    for state in ("IDLE+DRAIN", "DOWN*", "FAIL", "MIXED+DRAINING"):
        out = _run(script, state, "ops: cable")
        assert "UPDATED" not in out, state
        assert sd.parse(out, ["t1"])["t1"] == sd.StepResult("t1", "refused", f"refused: the node is {state}")


def test_resume_step_guards_the_owner_and_sets_its_own_reason(processes):
    watch = sd.script([sd.resume_step("t1")])
    out = _run(watch, "IDLE+DRAIN", "mctl: xid 79 [root@2026-01-01T00:00:00]")
    assert f"UPDATED update NodeName=t1 State=RESUME Reason={sd.RESUMED_REASON}" in out
    out = _run(watch, "IDLE+DRAIN", "ops: took it over")
    assert sd.parse(out, ["t1"])["t1"] == sd.StepResult("t1", "not-ours", "refused: the reason is no longer mctl's")
    out = _run(watch, "DOWN+DRAIN", "mctl: x")              # the watch never resumes a down node
    assert "UPDATED" not in out and sd.parse(out, ["t1"])["t1"].status == "refused"


def test_bring_up_guard_is_the_same_builder_with_its_own_prefix(processes):
    open_step = sd.resume_step("t1", prefix="mctl: bring-up", reason="opened", owner="bring-up", verb="left alone",
                               not_down=False, held=True)
    script = sd.script([open_step])
    # a health drain (mctl:, but not bring-up's) is someone else's to bring-up
    out = _run(script, "IDLE+DRAIN", "mctl: xid 79")
    assert sd.parse(out, ["t1"])["t1"] == sd.StepResult("t1", "not-ours",
                                                        "left alone: the reason is no longer bring-up's")
    out = _run(script, "DOWN+DRAIN", "mctl: bring-up RUN: x")   # bring-up opens its own down hold
    assert "UPDATED update NodeName=t1 State=RESUME Reason=opened" in out
    out = _run(script, "IDLE", "mctl: bring-up RUN: x")         # not drained any more: nothing to open
    assert sd.parse(out, ["t1"])["t1"] == sd.StepResult("t1", "refused", "left alone: the node is IDLE, not drained")


def test_one_script_carries_many_steps_with_one_marker_each():
    steps = [sd.drain_step("a", "mctl: x"), sd.resume_step("b"), sd.drain_step("c", "mctl: y")]
    script = sd.script(steps)
    assert script.count(sd.MARK) == 3 and script.count("scontrol update") == 3
    bounded = sd.script(steps, limit_s=10)
    assert "mctl_end=$(( $(date +%s) + 8 ))" in bounded and "$(scontrol " not in bounded
    assert "{ sc update" in bounded


# --- the result parser ------------------------------------------------------------------------------

def test_parser_reads_every_outcome():
    out = "\n".join([
        "", f"{sd.MARK} a rc=0",
        "refused: the node is IDLE+DRAIN", f"{sd.MARK} b rc={sd.RC_REFUSED}",
        "refused: the reason is no longer mctl's", f"{sd.MARK} c rc={sd.RC_NOT_OURS}",
        "slurm_update error: Invalid node name specified", f"{sd.MARK} d rc=1",
        "slurm_load_node error: Unable to contact slurm controller (connect failure)", f"{sd.MARK} e rc=1",
        f"{sd.MARK} f rc=1",
    ])
    r = sd.parse(out, ["a", "b", "c", "d", "e", "f", "g"])
    assert [r[h].status for h in "abcdefg"] == ["done", "refused", "not-ours", "failed", "unreachable", "failed",
                                               "unreachable"]
    assert r["d"].text == "slurm_update error: Invalid node name specified"
    assert r["f"].text == "scontrol exited 1" and r["g"].text == ""


def test_parser_ignores_a_forged_marker_for_another_host_inside_text():
    out = f"{sd.MARK} b rc=0 and more\n{sd.MARK} a rc=3\n"
    r = sd.parse(out, ["a", "b"])
    assert r["a"].status == "refused" and r["b"].status == "unreachable"


def test_decisions_map_onto_steps_and_results():
    ds = [Decision("t1", DRAIN, "x", reason="mctl: a"), Decision("t2", RESUME, "x")]
    script = sd.apply_script(ds)
    assert "State=DRAIN Reason='mctl: a'" in script and "Reason='resumed by mctl'" in script
    r1, r2 = sd.parse_apply(f"{sd.MARK} t1 rc=0\nrefused: x\n{sd.MARK} t2 rc=4\n", ds)
    assert r1 == ActResult(ds[0], True)
    assert r2 == ActResult(ds[1], False, "refused: x", refused=True, not_ours=True)
    with pytest.raises(ValueError):
        sd.apply_script([Decision("t1", "skip", "x")])


# --- the shared guards and the pending action ---------------------------------------------------------

def test_one_set_of_guards_for_every_scheduler():
    free, mine = NodeView("t", state="IDLE"), NodeView("t", drained=True, reason="mctl: x", state="IDLE+DRAIN")
    theirs = NodeView("t", drained=True, reason="ops", state="IDLE+DRAIN")
    down = NodeView("t", drained=True, down=True, reason="mctl: x", state="DOWN+DRAIN")
    assert drain_refusal(free) is None and resume_refusal(mine) is None
    assert drain_refusal(None).kind == "unknown" and drain_refusal(theirs).kind == "drained"
    assert drain_refusal(down).kind == "down" and resume_refusal(down).kind == "down"
    assert resume_refusal(free).kind == "not-drained" and resume_refusal(theirs).kind == "not-ours"
    assert resume_refusal(theirs).not_ours and not resume_refusal(down).not_ours


def test_pending_action_keeps_the_on_disk_form():
    drain = PendingAction(DRAIN, "mctl: x", 5.0, "full text")
    assert drain.to_dict() == {"action": "drain", "reason": "mctl: x", "full": "full text", "since": 5.0}
    resume = PendingAction(RESUME, "mctl: x", 6.0)
    assert resume.to_dict() == {"action": "resume", "reason": "mctl: x", "since": 6.0}
    assert PendingAction.from_dict(drain.to_dict()) == drain and PendingAction.from_dict(resume.to_dict()) == resume
    assert PendingAction.from_dict({"action": "drain"}) == PendingAction(DRAIN, None, None)
