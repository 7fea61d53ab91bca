#!/usr/bin/env python3
"""The health watch's BMC side over many sweeps (issues 27.5, 29.3): memory, CPU and connections.

Runs `mctl health watch --interval I --no-remediate` against a lab (its own inventory, a fresh state
directory) for M minutes and samples, every S seconds, from /proc:

  - the watch's VmRSS (flat: no native memory per connection or per read, docs/bmc.md);
  - its CPU time (user + system), and the lab's BMC processes' CPU, per sweep;
  - the TCP connections the watch holds to the BMCs' port (one per BMC when they are kept);

and reads the watch's SWEEP lines for the number of sweeps and their durations. With `--tree PATH` the
watch runs from another checkout of mctl (PYTHONPATH=PATH; e.g. the tree before the change, for a
before/after in the same hour); with `--bmc-off` on a copy of the lab's inventory with
`health.bmc_checks: off` (the watch's CPU without any BMC read: what the BMC reads add is the difference).

Usage: sudo python3 bench/bmc_watch_bench.py --lab LABDIR [--minutes 8] [--interval 1] [--every 10]
                                            [--tree PATH] [--bmc-off] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SWEEP = re.compile(r" SWEEP   #(\d+): .* (\d+\.\d+)s$")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bmc_cpu(lab_dir: Path) -> float:
    from mctl.lab import control

    total = 0.0
    for p in control.lab_processes(lab_dir):
        if "mctl.lab.bmc_emulator" in " ".join(p.cmdline):
            try:
                total += cpu_s(p.pid)
            except (OSError, IndexError, ValueError):
                pass
    return total


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections of *pid* to remote *port* (IPv4)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        remote, state, inode = cols[2], cols[3], cols[9]
        if state == "01" and inode in inodes and int(remote.split(":")[1], 16) == port:
            n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True, help="a lab folder (its mctl.yml is the site)")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--tree", help="run the watch from this checkout of mctl (PYTHONPATH)")
    ap.add_argument("--bmc-off", action="store_true", help="the watch with health.bmc_checks: off")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import yaml

    from mctl.lab.bmcs import PORT

    lab = Path(args.lab).resolve()
    state = Path(tempfile.mkdtemp(prefix="mctl-bmc-watch-bench-"))
    site = lab
    if args.bmc_off:
        doc = yaml.safe_load((lab / "mctl.yml").read_text())
        doc.setdefault("health", {})["bmc_checks"] = "off"
        site = state / "site"
        site.mkdir()
        (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, NO_COLOR="1")
    if args.tree:
        env["PYTHONPATH"] = str(Path(args.tree).resolve())
    proc = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(site), "--state-dir", str(state), "health",
                             "watch", "--interval", f"{args.interval:g}", "--no-remediate"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    os.set_blocking(proc.stdout.fileno(), False)
    lines: list[str] = []
    samples = []
    t0 = time.monotonic()
    bmc0 = bmc_cpu(lab)
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(args.every)
            while True:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line.rstrip("\n"))
            if proc.poll() is not None:
                raise SystemExit(f"the watch ended: {proc.stderr.read()[-2000:]}")
            sweeps = sum(1 for l in lines if SWEEP.search(l))
            samples.append({"t": round(time.monotonic() - t0, 1), "rss_mib": round(rss_mib(proc.pid), 1),
                            "cpu_s": cpu_s(proc.pid), "bmc_cpu_s": round(bmc_cpu(lab) - bmc0, 2),
                            "bmc_connections": connections_to(proc.pid, PORT), "sweeps": sweeps})
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _err = proc.communicate(timeout=60)
            lines += out.splitlines()
        except subprocess.TimeoutExpired:
            proc.kill()
    durations = [float(m[2]) for m in (SWEEP.search(l) for l in lines) if m]
    warm = samples[min(2, len(samples) - 1)]          # after the first reads and imports
    last = samples[-1]
    per_sweep = (last["cpu_s"] - warm["cpu_s"]) / max(1, last["sweeps"] - warm["sweeps"])
    bmc_per_sweep = (last["bmc_cpu_s"] - warm["bmc_cpu_s"]) / max(1, last["sweeps"] - warm["sweeps"])
    out = {"tree": args.tree or "this", "bmc_checks": "off" if args.bmc_off else "auto", "interval": args.interval, "minutes": args.minutes, "sweeps": len(durations),
           "load": os.getloadavg(), "rss_first_mib": samples[0]["rss_mib"], "rss_warm_mib": warm["rss_mib"],
           "rss_last_mib": last["rss_mib"], "rss_growth_after_warm_mib": round(last["rss_mib"] - warm["rss_mib"], 1),
           "watch_cpu_per_sweep_ms": round(per_sweep * 1000, 1), "bmc_cpu_per_sweep_ms": round(bmc_per_sweep * 1000, 1),
           "bmc_connections_median": statistics.median(s["bmc_connections"] for s in samples),
           "sweep_p50_s": statistics.median(durations) if durations else None,
           "sweep_max_s": max(durations) if durations else None, "samples": samples}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['sweeps']} sweeps in {args.minutes:g} min at --interval {args.interval:g} ({out['tree']}); "
              f"load {out['load'][0]:.1f}")
        print(f"  watch VmRSS {out['rss_first_mib']} -> {out['rss_warm_mib']} (warm) -> {out['rss_last_mib']} MiB: "
              f"{out['rss_growth_after_warm_mib']:+} MiB after warm-up")
        print(f"  CPU per sweep: watch {out['watch_cpu_per_sweep_ms']} ms, BMCs {out['bmc_cpu_per_sweep_ms']} ms; "
              f"connections to the BMCs (median) {out['bmc_connections_median']}")
        print(f"  sweep p50 {out['sweep_p50_s']:.2f} s, max {out['sweep_max_s']:.2f} s")
        print("  rss by sample: " + " ".join(f"{s['rss_mib']:.1f}" for s in samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
