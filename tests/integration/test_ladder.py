"""The recovery ladder on the lab, with real Slurm and the trays' Redfish BMCs (docs/health.md).

One test, the power cycle being the costly part: `mctl health watch` with the power-cycle rung on
(1 s interval) and nobody at the keyboard.

1. A frozen tray (`lab fault --freeze`: every process SIGSTOPped, SSH answers nothing) is drained
   after its misses, power-cycled through its BMC (the freeze ends with the power), comes back with
   a new boot id, passes its checks and is resumed in Slurm; the action log has the time of each rung.
2. A GPU missing on the same tray (hardware: it survives every power cycle, as a dead GPU does) is
   drained, power-cycled three times, each recovery failing its checks, then marked for repair: the
   metric, the repair hook run with its arguments, never resumed; no fourth power cycle. (The
   `tray.repair` finding a marked record gives is unit-tested: tests/unit/test_ladder.py.)

The watch's interval is 1 s, the tray deadline 5 s; every wait below has its own deadline.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import Watch, fault, power_restored, sinfo, wait_for

LADDER = {"power_cycle": True, "power_cycle_when": "unfixed", "fail_after_sweeps": 2, "max_failures": 3,
          "failure_window": "1h", "power_cycle_deadline": "45s", "verify_deadline": "45s", "retry_after": "2s"}
HOOK = ("import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')")


@pytest.fixture
def ladder_site(health_site, tmp_path) -> Path:
    doc = yaml.safe_load((health_site / "mctl.yml").read_text())
    if not doc.get("bmc"):
        pytest.skip("the lab has no BMCs")
    hooked = tmp_path / "tickets.jsonl"
    doc["health"]["ladder"] = {**LADDER, "repair_hook": [sys.executable, "-c", HOOK, str(hooked), "{tray}",
                                                         "{rack}", "{failures}", "{reason}"]}
    folder = tmp_path / "ladder-site"
    folder.mkdir()
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def _log(state: Path) -> list[dict]:
    path = state / "health" / "actions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _of(log, tray, action, **match):
    return [e for e in log if e.get("tray") == tray and e["action"] == action
            and all(e.get(k) == v for k, v in match.items())]


def _restore(lab, tray):
    """The tray on, back in Slurm and without faults, whatever the test left."""
    lab.clear_faults(tray)
    power_restored(lab)
    lab.settle_slurm(timeout=180)       # mctl: drains and DOWN nodes lifted (again while they settle), all idle


def test_a_frozen_tray_is_power_cycled_and_resumed_then_three_failed_recoveries_mark_it_for_repair(
        lab, ladder_site, tmp_path):
    tray = lab.trays[2]
    state = tmp_path / "state"
    prom = tmp_path / "mctl.prom"
    boot = lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    watch = Watch(lab, ladder_site, state, "--interval", "1", "--metrics-textfile", str(prom))
    try:
        wait_for("the first sweep", lambda: watch.sweeps() >= 1, 60)
        t0, wall0 = time.monotonic(), time.time()
        fault(lab, tray, unreachable=True)
        # 1. detected, drained, power-cycled, checks passed, resumed: without anyone
        wait_for("the recovery", lambda: _of(_log(state), tray, "recovered"), 150)
        took = time.monotonic() - t0
        log = _log(state)
        (drain,) = _of(log, tray, "drain")
        assert drain["reason"].startswith("mctl: unreachable")
        (cycle,) = _of(log, tray, "power-cycle")
        assert cycle["result"] == "ok" and "PowerCycle sent" in cycle["detail"]
        assert _of(log, tray, "intent", intent="power-cycle")           # written before the POST
        back = _of(log, tray, "ladder", phase="power-cycle", result="ok")
        checks = _of(log, tray, "ladder", phase="verify", result="ok")
        (done,) = _of(log, tray, "recovered")
        assert back and checks and done["tried"] == ["power-cycle"]
        (resume,) = _of(log, tray, "resume")
        assert resume["result"] == "ok"
        wait_for(f"{tray} idle in Slurm", lambda: sinfo(lab)[tray] == ("idle", ""), 30)
        assert lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot
        from datetime import datetime

        drained_after = datetime.fromisoformat(drain["time"]).timestamp() - wall0
        print(f"\nladder rungs for a frozen tray: fault to drained {drained_after:.1f}s, power cycle -> back "
              f"{back[0]['seconds']:.1f}s, checks {checks[0]['seconds']:.1f}s, recovery {done['seconds']:.1f}s, "
              f"fault to resumed {took:.1f}s; resume: {resume['why']}")

        # 2. a GPU that stays missing: three recoveries fail, the tray is marked for repair, no fourth
        fault(lab, tray, gpu_missing=1)
        wait_for("the mark for repair", lambda: _of(_log(state), tray, "repair"), 240)
        seen = watch.sweeps()
        wait_for("three more sweeps", lambda: watch.sweeps() >= seen + 3, 60)
        log = _log(state)
        assert len(_of(log, tray, "power-cycle")) == 4                   # one in part 1, three here, no fifth
        assert len(_of(log, tray, "recovery-failed")) == 3
        (hook,) = _of(log, tray, "repair-hook")
        assert hook["result"] == "ok", hook
        (ticket,) = [json.loads(line) for line in (tmp_path / "tickets.jsonl").read_text().splitlines()]
        assert ticket[:3] == [tray, lab.rack, "3"] and "3 failed recoveries" in ticket[3]
        assert f'mctl_health_marked_for_repair{{site="' in prom.read_text()
        assert any(line.startswith("mctl_health_marked_for_repair") and f'tray="{tray}"' in line and
                   line.endswith(" 1") for line in prom.read_text().splitlines())
        assert "drain" in sinfo(lab)[tray][0]                           # held out of service, never resumed
        assert not any(e["action"] == "resume" for e in log[log.index(_of(log, tray, "repair")[0]):])
    finally:
        code = watch.stop()
        said = watch.proc.stderr.read()
        print("\n".join(watch.lines[-40:]), said[-3000:], sep="\n")
        _restore(lab, tray)
    assert code == 0, said
