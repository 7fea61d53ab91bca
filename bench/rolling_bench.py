#!/usr/bin/env python3
"""A rolling driver upgrade 570 -> 580 of an 18-tray lab rack with jobs running; time each batch, count killed jobs.

Issue 27.3: `mctl provision lab-r1 --image lab-debian13-580 --rolling N --drain`, N trays at a time
(hold, wait for their jobs, install, reboot, verify with image diff and the node check, release),
while Slurm jobs run on some trays. The starting point (a pre-tooled lab on branch 570, Slurm
deployed, IMEX applied, every tray provisioned with its image) is prepared first and not timed. Then
jobs are submitted (each writes "done" to its output file when it ends), the rollout is timed from
start to exit, and each batch's seconds (its wait for jobs apart from its own work) are read from the
rollout's journal. A job killed leaves no "done": the count of jobs that did not end on their own is
the figure that must be 0. The 1-minute load average is recorded before and after (other sessions
share the machine). With --back the rack is rolled back to 570 the same way (timed, no jobs).

Usage: sudo python3 bench/rolling_bench.py [--trays 18] [--rolling 3] [--net 96] [--state-dir /tmp/rolling-state]
                                            [--jobs 4] [--job-s 60] [--back] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

IMAGE = "lab-debian13-580"


def mctl(env: dict, *args: str, timeout: float = 3600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"mctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr}")
    return proc


def on(env: dict, host: str, command: str) -> str:
    return mctl(env, "lab", "ssh", host, "--", command).stdout


def batches(doc: dict) -> list[dict]:
    """Each batch's trays, wall seconds, its wait for jobs and the rest of its steps, from the rollout's steps."""
    out: dict[int, dict] = {}
    for s in doc["steps"]:
        if not s["step"].startswith("batch-"):
            continue
        head, step = s["step"].split(":", 1)
        b = out.setdefault(int(head.split("-")[1]), {"steps": {}})
        b["steps"][step] = s["seconds"] or 0.0
    for b in doc["batches"]:
        row = out[b["number"]]
        row["trays"] = b["trays"]
        row["wait_s"] = round(row["steps"].get("wait", 0.0), 1)
        row["work_s"] = round(sum(v for k, v in row["steps"].items() if k != "wait"), 1)
        row["total_s"] = round(row["wait_s"] + row["work_s"], 1)
    return [out[k] for k in sorted(out)]


def rollout(env: dict, image: str | None, size: int, wait: float) -> dict:
    args = ["--json", "provision", "lab-r1", "--rolling", str(size), "--drain", "--wait", str(wait)]
    if image:
        args[3:3] = ["--image", image]
    started, t0 = time.time(), time.perf_counter()
    proc = mctl(env, *args, check=False)
    seconds = time.perf_counter() - t0
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0:
        raise SystemExit(f"rollout exited {proc.returncode}: {doc.get('error')}\n{proc.stderr[-3000:]}")
    rows = batches(doc)
    created = json.loads(Path(doc["journal"]).read_text())["created"]
    return {"s": round(seconds, 1), "batches": rows, "check_and_plan_s": round(created - started, 1),
            "run_id": doc["run_id"],
            "median_batch_work_s": round(statistics.median(r["work_s"] for r in rows), 1) if rows else None,
            "median_batch_total_s": round(statistics.median(r["total_s"] for r in rows), 1) if rows else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rolling", type=int, default=3, help="trays per batch")
    ap.add_argument("--net", type=int, default=96)
    ap.add_argument("--state-dir", default="/tmp/rolling-state")
    ap.add_argument("--jobs", type=int, default=4, help="jobs running when the rollout starts (2 trays each)")
    ap.add_argument("--job-s", type=int, default=60, help="each job's length; the i-th runs i times as long")
    ap.add_argument("--back", action="store_true", help="roll back to 570 afterwards, timed")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    state = Path(args.state_dir)
    env = dict(os.environ, MCTL_STATE_DIR=str(state), MCTL_INVENTORY=str(state / "lab"), NO_COLOR="1")
    mctl(env, "lab", "up", "--trays", str(args.trays), "--net", str(args.net))
    result: dict = {"trays": args.trays, "rolling": args.rolling, "lab": "pre-tooled (branch 570), no faults"}
    try:
        t0 = time.perf_counter()
        mctl(env, "deploy", "slurm")
        mctl(env, "imex", "apply", "lab-r1", "--wait", "120")
        mctl(env, "provision", "lab-r1")
        result["prepare_s"] = round(time.perf_counter() - t0, 1)
        trays = [f"lab-r1-tray{i:02d}" for i in range(1, args.trays + 1)]
        jobs = {}
        step = max(1, args.trays // max(1, args.jobs))
        for i in range(args.jobs):
            pair = trays[(i * step) % args.trays:(i * step) % args.trays + 2]
            seconds = args.job_s * (i + 1)
            out = on(env, "lab-r1-head", f"mkdir -p /root/bench; sbatch --parsable -N{len(pair)} -w {','.join(pair)} "
                                         f"-o /root/bench/%j.out --job-name=bench{i} --wrap 'sleep {seconds}; "
                                         "echo done'")
            jobs[out.strip().split(";")[0]] = {"trays": pair, "seconds": seconds}
        deadline = time.monotonic() + 120
        while "PD" in on(env, "lab-r1-head", "squeue -h -o %t") and time.monotonic() < deadline:
            time.sleep(1)
        result["jobs"] = jobs
        result["load_avg"] = round(os.getloadavg()[0], 1)
        result["up"] = rollout(env, IMAGE, args.rolling, 1800)
        result["load_avg_after"] = round(os.getloadavg()[0], 1)
        killed = []
        for job, j in jobs.items():
            said = on(env, j["trays"][0], f"cat /root/bench/{job}.out 2>/dev/null; true").strip()
            if said != "done":
                killed.append(job)
        result["jobs_not_ended_on_their_own"] = killed
        drivers = {t: on(env, t, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0]
                   for t in trays}
        result["drivers_after"] = sorted(set(drivers.values()))
        if args.back:
            result["load_avg_back"] = round(os.getloadavg()[0], 1)
            result["back"] = rollout(env, None, args.rolling, 60)
    finally:
        if not args.keep:
            subprocess.run([sys.executable, "-m", "mctl", "lab", "down"], env=env, capture_output=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.trays} trays, --rolling {args.rolling}, {len(result['jobs'])} jobs; prepared in "
              f"{result['prepare_s']} s (untimed); load {result['load_avg']} -> {result['load_avg_after']}")
        for name in ("up", "back"):
            r = result.get(name)
            if not r:
                continue
            print(f"{name}: {r['s']} s ({r['check_and_plan_s']} s the work check and check pass) in "
                  f"{len(r['batches'])} batches; median batch {r['median_batch_total_s']} s "
                  f"(its own work {r['median_batch_work_s']} s, the rest waiting for jobs)")
            for i, b in enumerate(r["batches"], start=1):
                print(f"  batch {i} {','.join(b['trays'])}: {b['total_s']} s (wait {b['wait_s']} s; {b['steps']})")
        print(f"jobs that did not end on their own: {result['jobs_not_ended_on_their_own'] or 'none'}; "
              f"drivers after: {result['drivers_after']}")
    return 0 if not result["jobs_not_ended_on_their_own"] and result["drivers_after"] == ["580.105.08"] else 1


if __name__ == "__main__":
    sys.exit(main())
