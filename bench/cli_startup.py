#!/usr/bin/env python3
"""How long `mctl --help` takes to start (target: <= 300 ms).

Runs the installed console script N times and reports the median and p90 wall
time, next to a bare `python -c pass` for the interpreter's own start cost.
Usage: bench/cli_startup.py [--runs 30] [--mctl PATH]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def timed(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mctl", default=shutil.which("mctl") or "mctl")
    args = ap.parse_args()
    python = open(args.mctl).readline().removeprefix("#!").strip()
    rows = [("python -c pass", [python, "-c", "pass"]),
            ("mctl --help", [args.mctl, "--help"]),
            ("mctl --version", [args.mctl, "--version"])]
    print(f"{'command':<18} {'median ms':>10} {'p90 ms':>8}")
    for name, argv in rows:
        samples = sorted(timed(argv, args.runs))
        p90 = samples[int(len(samples) * 0.9) - 1]
        print(f"{name:<18} {statistics.median(samples) * 1000:>10.0f} {p90 * 1000:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
