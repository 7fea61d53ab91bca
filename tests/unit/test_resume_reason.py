"""A resume leaves no hold reason behind (Slurm keeps a resumed node's last reason, checked in the lab)."""

from __future__ import annotations

import subprocess

from mctl.sched.slurm import holds
from mctl.sched.slurm.facts import parse_show_nodes


def _run(state: str, reason: str) -> tuple[str, dict]:
    fake = ("scontrol() { if [ \"$1\" = show ]; then echo "
            f"'NodeName=t2 Arch=x86_64 State={state} ThreadsPerCore=1 Reason={reason}'; "
            "else echo UPDATED \"$@\"; fi; }\n")
    out = subprocess.run(["bash", "-c", fake + holds.release_script(holds.BRING_UP, ["t2"])], capture_output=True,
                         text=True).stdout
    return out, holds.parse_actions(out, ["t2"])


def test_bring_up_resume_replaces_its_hold_reason_in_the_same_update(processes):
    out, result = _run("IDLE+DRAIN", "mctl: bring-up RUN: opens when health and burn-in pass [root@2026-12-01T08:58]")
    assert result["t2"][0] == "done"
    (update,) = [l for l in out.splitlines() if l.startswith("UPDATED")]
    assert update == "UPDATED update NodeName=t2 State=RESUME Reason=opened by mctl bring-up"
    assert not holds.REASON_OPENED.startswith("mctl:")       # never taken for a hold by any guard


def test_bring_up_resume_leaves_a_node_that_is_no_longer_drained_alone(processes):
    # A tray resumed before (the reason stayed) or down: no RESUME of a DOWN node, no failed update.
    for state in ("IDLE", "DOWN+NOT_RESPONDING", "ALLOCATED"):
        out, result = _run(state, "mctl: bring-up RUN: opens when health and burn-in pass")
        assert "UPDATED" not in out, state
        assert result["t2"] == ("refused", f"left alone: the node is {state}, not drained"), state


def test_a_resumed_nodes_stale_reason_does_not_count():
    text = ("NodeName=t1 State=IDLE ThreadsPerCore=1 Reason=mctl: bring-up RUN: opens when health [root@2026-12-01]\n"
            "NodeName=t2 State=IDLE+DRAIN ThreadsPerCore=1 Reason=mctl: xid 79 [root@2026-12-01T08:58:57]\n"
            "NodeName=t3 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=Not responding [slurm@2026-12-01]\n")
    views = {n.name: n.view() for n in parse_show_nodes(text)}
    assert views["t1"].reason is None and not views["t1"].drained and not views["t1"].mctl_drain
    assert views["t2"].reason == "mctl: xid 79" and views["t2"].mctl_drain
    assert views["t3"].reason == "Not responding" and views["t3"].down
