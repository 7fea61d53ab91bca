#!/usr/bin/env python3
"""Benchmark `mctl rack validate` on a 2x9 lab rack: a healthy rack, then one tray dragging its partition.

Targets, on 2 cores (issue 28): `rack validate` of a 2x9 rack <= 60 s; the finder names a dragging tray
in <= 4 rounds on 18 trays. The lab starts with 18 pre-tooled trays (the lab's all_reduce_perf installed),
the partitions recorded with the 2x9 template, Slurm deployed from them (one block per partition); then
each run is the real CLI in a subprocess (`mctl --json rack validate lab-r1`), timed wall and CPU (the
CLI and every descendant it waited for). The dragging tray has every NVLink of GPU 1 down
(`mctl lab fault gpu TRAY --nvlink-down 1:all`): its partition's ring falls to the lab's host-memory path.
A third run searches with every partition at once: one dragging tray in each partition.

    sudo python3 bench/validate_bench.py                   # a fresh 18-tray lab on a free 127.N block
    sudo python3 bench/validate_bench.py --slow-tray lab-r1-tray13 --json
    sudo python3 bench/validate_bench.py --lab DIR         # a running lab with Slurm deployed and 2x9 recorded

Exit 0 when both targets are met (and the named trays are the faulted ones), 1 when one is missed, 2 on a
setup problem.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bringup_bench import free_net, timed_cli  # noqa: E402

VALIDATE_TARGET_S = 60.0
ROUNDS_TARGET = 4


def _fault(lab_dir: Path, tray: str, **request) -> None:
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    control.fault(lab_dir, tray, FaultRequest(**request))


def _summary(res: dict) -> dict:
    data = res["data"] or {}
    return {k: v for k, v in res.items() if k not in ("data", "stderr")} | {
        "status": data.get("status"), "rounds": len(data.get("rounds") or []), "dragging": data.get("dragging"),
        "jobs_per_round": [len(r) for r in data.get("rounds") or []],
        "partitions": {p["name"]: (p["status"], p["busbw"]) for p in data.get("partitions") or []},
        "elapsed_s": data.get("elapsed")} | ({"stderr": res["stderr"]} if res["rc"] not in (0, 1) else {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", type=Path, help="use this running lab (Slurm deployed from 2x9) instead of starting one")
    ap.add_argument("--slow-tray", default="lab-r1-tray07")
    ap.add_argument("--second-slow-tray", default="lab-r1-tray16")
    ap.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("validate_bench: run as root (the lab needs namespaces)", file=sys.stderr)
        return 2
    from mctl.lab import control

    started_lab = None
    if args.lab:
        lab_dir = args.lab.resolve()
        state_dir = lab_dir.parent
    else:
        state_dir = Path(tempfile.mkdtemp(prefix="mctl-validate-bench-"))
        lab_dir = state_dir / "lab"
        net = free_net()
        t0 = time.monotonic()
        started_lab = control.up(lab_dir, racks=1, trays=18, net=net, os_only=False)
        print(f"lab up: 18 pre-tooled trays on 127.{net}.1.x in {time.monotonic() - t0:.1f}s ({lab_dir})",
              file=sys.stderr)
    env = dict(os.environ, MCTL_STATE_DIR=str(state_dir), MCTL_INVENTORY=str(lab_dir), NO_COLOR="1")
    runs: dict[str, dict] = {}
    try:
        if started_lab is not None:
            for step in (["partition", "create", "lab-r1", "--template", "2x9", "--no-apply"], ["deploy", "slurm"]):
                t0 = time.monotonic()
                rec = subprocess.run([sys.executable, "-m", "mctl", *step], env=env, capture_output=True, text=True,
                                     timeout=1800)
                if rec.returncode != 0:
                    print(f"{' '.join(step)} failed: {rec.stdout[-2000:]} {rec.stderr[-2000:]}", file=sys.stderr)
                    return 2
                print(f"{' '.join(step)}: {time.monotonic() - t0:.1f}s", file=sys.stderr)
        runs["healthy"] = _summary(timed_cli(["--json", "rack", "validate", "lab-r1"], env))
        print(f"healthy: {runs['healthy']}", file=sys.stderr)
        try:
            _fault(lab_dir, args.slow_tray, nvlink_down="1:all")
            runs["one_dragging"] = _summary(timed_cli(["--json", "rack", "validate", "lab-r1"], env))
            print(f"one dragging: {runs['one_dragging']}", file=sys.stderr)
            _fault(lab_dir, args.second_slow_tray, nvlink_down="2:all")
            runs["one_per_partition"] = _summary(timed_cli(["--json", "rack", "validate", "lab-r1"], env))
            print(f"one per partition: {runs['one_per_partition']}", file=sys.stderr)
        finally:
            for tray in (args.slow_tray, args.second_slow_tray):
                _fault(lab_dir, tray, clear=True)
    finally:
        if started_lab is not None and not args.keep:
            control.down(lab_dir)
    healthy, one, two = runs["healthy"], runs["one_dragging"], runs["one_per_partition"]
    ok_time = healthy["rc"] == 0 and healthy["status"] == "passed" and healthy["wall_s"] <= VALIDATE_TARGET_S
    ok_rounds = (one["dragging"] == [args.slow_tray] and one["rounds"] <= ROUNDS_TARGET
                 and sorted(two["dragging"] or []) == sorted([args.slow_tray, args.second_slow_tray])
                 and two["rounds"] <= ROUNDS_TARGET)
    report = {"trays": 18, "shape": "2x9", "cores": os.cpu_count(), "runs": runs,
              "targets": {"validate_s": VALIDATE_TARGET_S, "rounds": ROUNDS_TARGET, "validate_met": ok_time,
                          "rounds_met": ok_rounds}}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'run':<18} {'rc':>3} {'wall s':>7} {'CPU s':>6} {'load':>11} {'rounds':>6}  jobs/round  dragging")
        for name, r in runs.items():
            print(f"{name:<18} {r['rc']:>3} {r['wall_s']:>7} {r['cpu_s']:>6} "
                  f"{str(r['load'][0]) + '->' + str(r['load'][1]):>11} {r['rounds']:>6}  "
                  f"{','.join(map(str, r['jobs_per_round'])):<10}  {', '.join(r['dragging'] or []) or '-'}")
        print(f"validate <= {VALIDATE_TARGET_S:.0f}s: {'met' if ok_time else 'MISSED'}; "
              f"dragging tray named in <= {ROUNDS_TARGET} rounds: {'met' if ok_rounds else 'MISSED'}")
    return 0 if ok_time and ok_rounds else 1


if __name__ == "__main__":
    sys.exit(main())
