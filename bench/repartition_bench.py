#!/usr/bin/env python3
"""Repartition an 18-tray lab rack from `all` to `2x9` and time the convergence.

Target (issue 6): the NMX-M operation done and both IMEX domains UP on every tray in
<= 30 s. Measured from the start of `mctl partition create lab-r1 --template 2x9`
(record in the inventory, plan, NMX-M operations polled to completion, GPUs' clique IDs
changed through fabric state In Progress) to the end of `mctl imex apply lab-r1 --wait`
(files pushed where they differ, daemons restarted, every domain UP). The starting point
(`all` applied, one IMEX domain UP) is prepared first and not timed. Each round returns
the rack to `all` between measurements.

Usage: sudo python3 bench/repartition_bench.py [--trays 18] [--rounds 3] [--json]
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

TARGET_S = 30.0


def free_net() -> int:
    used = {int(a.split(".")[1]) for a, _p in procs.listening_tcp() if a.startswith("127.")}
    return next(n for n in range(150, 200) if n not in used)


def mctl(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"mctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def converge(env: dict, template: str) -> float:
    t0 = time.perf_counter()
    mctl(env, "partition", "create", "lab-r1", "--template", template)
    mctl(env, "imex", "apply", "lab-r1", "--wait", "120")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    half = args.trays // 2
    split = f"2x{half}"
    work = Path(tempfile.mkdtemp(prefix="mctl-repartbench-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(work), MCTL_INVENTORY=str(work / "lab"))
    mctl(env, "lab", "up", "--trays", str(args.trays), "--net", str(free_net()))
    samples = []
    try:
        mctl(env, "provision", "lab-r1", "--tags", "imex")
        converge(env, "all")
        for _ in range(args.rounds):
            samples.append(converge(env, split))
            status = json.loads(mctl(env, "imex", "status", "lab-r1", "--json").stdout)
            converge(env, "all")
        result = {"trays": args.trays, "from": "all", "to": split, "rounds": args.rounds,
                  "samples_s": [round(s, 2) for s in samples], "median_s": round(statistics.median(samples), 2),
                  "target_s": TARGET_S, "last_status": status, "load_avg": os.getloadavg()[0]}
        result["target_met"] = result["median_s"] <= TARGET_S
    finally:
        subprocess.run([sys.executable, "-m", "mctl", "lab", "down"], env=env, capture_output=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.trays} trays, all -> {split}: median {result['median_s']} s over {args.rounds} rounds "
              f"{result['samples_s']} (target <= {TARGET_S} s: {'met' if result['target_met'] else 'missed'})")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
