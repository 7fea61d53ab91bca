#!/usr/bin/env python3
"""Repartition an 18-tray lab rack with Slurm across every layer, and isolate one tray; time each change.

Targets (issue 18): `all` -> `2x9` -> `3x6`, each the full change (hold, inventory, NMX-M,
GPUs' cliques, IMEX files and restart, every domain UP, Slurm topology.conf +
reconfigure verified in `scontrol show topology`, holds released) <= 40 s; `partition
isolate` of one drained tray <= 20 s. Each change is one `mctl --json partition create
lab-r1 --template T` (or `partition isolate TRAY`), timed from start to exit, whose
journaled run must end `succeeded`; its per-step seconds are kept. The starting point
(IMEX provisioned, Slurm deployed, `all` applied) is prepared first and not timed; each
round goes back to `all` untimed. The 1-minute load average is recorded before each
round (other sessions share the machine).

Usage: sudo python3 bench/repartition_bench.py [--trays 18] [--rounds 2] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mctl.lab import procs  # noqa: E402

TARGET_S = 40.0
ISOLATE_TARGET_S = 20.0


def free_net() -> int:
    used = {int(a.split(".")[1]) for a, _p in procs.listening_tcp() if a.startswith("127.")}
    return next(n for n in range(150, 200) if n not in used)


def mctl(env: dict, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"mctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr}")
    return proc


def change(env: dict, *args: str) -> dict:
    """One change, timed; its run's steps with their seconds."""
    t0 = time.perf_counter()
    proc = mctl(env, "--json", "partition", *args)
    seconds = time.perf_counter() - t0
    run = json.loads(proc.stdout).get("run") or {}
    if run.get("status") != "succeeded":
        raise SystemExit(f"partition {' '.join(args)}: run {run.get('status')}: {run.get('error')}")
    return {"s": round(seconds, 2), "steps": {s["step"]: s["seconds"] for s in run["steps"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mctl-repartbench-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(work), MCTL_INVENTORY=str(work / "lab"), NO_COLOR="1")
    mctl(env, "lab", "up", "--compute-trays", str(args.trays), "--net", str(free_net()))
    tray = f"lab-r1-tray{args.trays // 2:02d}"
    rounds = []
    try:
        mctl(env, "provision", "lab-r1", "--tags", "imex")
        mctl(env, "deploy", "slurm")
        mctl(env, "imex", "apply", "lab-r1", "--imex-wait", "120")
        mctl(env, "partition", "create", "lab-r1", "--template", "all")
        for _ in range(args.rounds):
            row: dict = {"load_avg": round(os.getloadavg()[0], 1)}
            mctl(env, "partition", "create", "lab-r1", "--template", "all")
            row["2x9"] = change(env, "create", "lab-r1", "--template", "2x9")
            row["3x6"] = change(env, "create", "lab-r1", "--template", "3x6")
            mctl(env, "exec", "lab-r1-head", "--", f"scontrol update NodeName={tray} State=DRAIN Reason=bench")
            row["isolate"] = change(env, "isolate", tray)
            row["restore"] = change(env, "restore", tray)
            mctl(env, "exec", "lab-r1-head", "--", f"scontrol update NodeName={tray} State=RESUME")
            row["load_avg_after"] = round(os.getloadavg()[0], 1)
            rounds.append(row)
    finally:
        if not args.keep:
            subprocess.run([sys.executable, "-m", "mctl", "lab", "down"], env=env, capture_output=True)
    med = {k: round(statistics.median(r[k]["s"] for r in rounds), 2) for k in ("2x9", "3x6", "isolate", "restore")}
    result = {"trays": args.trays, "rounds": rounds, "median_s": med, "target_s": TARGET_S,
              "isolate_target_s": ISOLATE_TARGET_S,
              "target_met": med["2x9"] <= TARGET_S and med["3x6"] <= TARGET_S and med["isolate"] <= ISOLATE_TARGET_S}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for i, r in enumerate(rounds, start=1):
            print(f"round {i} (load {r['load_avg']} -> {r['load_avg_after']}): all->2x9 {r['2x9']['s']} s, "
                  f"2x9->3x6 {r['3x6']['s']} s, isolate {r['isolate']['s']} s, restore {r['restore']['s']} s")
            print(f"  steps of 2x9->3x6: {r['3x6']['steps']}")
        print(f"medians: {med} (targets: changes <= {TARGET_S} s, isolate <= {ISOLATE_TARGET_S} s: "
              f"{'met' if result['target_met'] else 'missed'})")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
