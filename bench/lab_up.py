#!/usr/bin/env python3
"""Benchmark `mctl lab up` / `down`: wall time and memory for one rack and four racks.

Targets (issue 3, warm image cache, 2 cores): 1 rack (18 trays + head) up in <= 60 s;
4 racks (72 trays) up in <= 180 s and <= 6 GiB of memory.

Runs the real CLI in a subprocess, in a temporary lab folder on free loopback
addresses, then checks every host over real SSH (in parallel), and measures:
  up_s        wall time of `mctl lab up`
  ssh_all_s   time for `hostname` over SSH on every host (8 at a time)
  pss_mib     proportional set size summed over every lab process (/proc/*/smaps_rollup)
  avail_mib   drop of MemAvailable while the lab is up (includes kernel memory: namespaces,
              tmpfs, overlay, page tables; noisy when other work runs on the machine)
  down_s      wall time of `mctl lab down`, then checks that nothing is left

Usage: sudo python3 bench/lab_up.py [--shapes 1x18,4x18] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mctl.lab import control, image, procs  # noqa: E402
from mctl.lab.site import IMAGE_NAME, REPO_IMAGES  # noqa: E402

TARGETS = {"1x18": {"up_s": 60}, "4x18": {"up_s": 180, "mem_mib": 6 * 1024}}


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable")


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def free_net() -> int:
    used = {int(a.split(".")[1]) for a, _p in procs.listening_tcp() if a.startswith("127.")}
    return next(n for n in range(150, 255) if n not in used)


def mctl(*args: str, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env)
    return time.monotonic() - started, proc


def run_shape(shape: str) -> dict:
    racks, trays = (int(x) for x in shape.split("x"))
    with tempfile.TemporaryDirectory(prefix="mctl-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        env = dict(os.environ, MCTL_STATE_DIR=tmp, NO_COLOR="1")
        before = mem_available_mib()
        up_s, proc = mctl("lab", "up", "--racks", str(racks), "--compute-trays", str(trays), "--dir", str(lab_dir),
                          "--net", str(free_net()), "--json", env=env)
        if proc.returncode != 0:
            raise SystemExit(f"lab up failed: {proc.stderr}")
        info = json.loads(proc.stdout)
        time.sleep(1.0)                 # let freshly started processes settle
        lab_pids = [p.pid for p in control.lab_processes(lab_dir)]
        pss = pss_mib(lab_pids)
        avail = before - mem_available_mib()

        def check(host: str) -> bool:
            argv = control.ssh_argv(lab_dir, host, ["hostname"], tty=False)
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return out.returncode == 0 and out.stdout.strip() == host

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            ok = list(pool.map(check, [h["name"] for h in info["hosts"]]))
        ssh_all_s = time.monotonic() - started
        down_s, down = mctl("lab", "down", "--dir", str(lab_dir), "--json", env=env)
        if down.returncode != 0:
            raise SystemExit(f"lab down failed: {down.stderr}")
        leftovers = [p.pid for p in control.lab_processes(lab_dir)] + procs.mounts_mentioning(str(lab_dir))
    result = {"shape": shape, "hosts": len(info["hosts"]), "up_s": round(up_s, 2),
              "up_inside_s": info["seconds"], "ssh_ok": sum(ok), "ssh_all_s": round(ssh_all_s, 2),
              "processes": len(lab_pids), "pss_mib": round(pss, 1), "avail_mib": round(avail, 1),
              "down_s": round(down_s, 2), "leftovers": len(leftovers)}
    target = TARGETS.get(shape, {})
    result["meets_targets"] = (result["up_s"] <= target.get("up_s", float("inf"))
                               and max(pss, avail) <= target.get("mem_mib", float("inf"))
                               and result["ssh_ok"] == result["hosts"] and not leftovers)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x18,4x18", help="RACKSxTRAYS list (default 1x18,4x18)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec = image.load_spec(REPO_IMAGES / f"{IMAGE_NAME}.yml")
    warm = image.is_built(spec)
    if not warm:
        started = time.monotonic()
        image.build(spec, progress=lambda m: print(m, file=sys.stderr))
        print(f"image built (cold cache) in {time.monotonic() - started:.0f} s", file=sys.stderr)
    results = [run_shape(s) for s in args.shapes.split(",")]
    meta = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "image_warm": warm,
            "mem_total_mib": round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024)}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2))
    else:
        print(f"cpus {meta['cpus']}, load {meta['load_avg'][0]:.1f}, memory {meta['mem_total_mib']} MiB")
        print(f"{'shape':<6} {'hosts':>5} {'up s':>6} {'ssh all s':>9} {'procs':>6} {'PSS MiB':>8} "
              f"{'avail MiB':>9} {'down s':>6} {'left':>4} targets")
        for r in results:
            print(f"{r['shape']:<6} {r['hosts']:>5} {r['up_s']:>6} {r['ssh_all_s']:>9} {r['processes']:>6} "
                  f"{r['pss_mib']:>8} {r['avail_mib']:>9} {r['down_s']:>6} {r['leftovers']:>4} "
                  f"{'met' if r['meets_targets'] else 'MISSED'}")
    return 0 if all(r["meets_targets"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
