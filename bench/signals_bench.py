#!/usr/bin/env python3
"""What issue 30's signals cost a health sweep: the probe with and without `nvidia-smi nvlink -e`.

Target (issue 30): the sweep's cost per tray rises by at most 20 % with the new signals, measured
before/after on 72 lab trays. The clock-event reasons come in the `-q -x` every sweep already reads
(no new command); the NVLink error counters are one more nvidia-smi call per tray and sweep, and a
parse of its ~5,600 lines. "Before" is the same code with the probe's `nvlink-errors` section taken
out (the bench patches `mctl.facts.probe._GPU_STEPS` in its own process; nothing else differs), so
the difference is exactly that section, its parse and the engine's memory of it. The variants
alternate (before, after, before, after) to spread the machine's load over both.

    python3 bench/signals_bench.py                        # 4 racks x 18 trays, 8 sweeps a round, 2 rounds
    python3 bench/signals_bench.py --racks 1 --trays 18 --sweeps 10 --json
    python3 bench/signals_bench.py --signal dcgm         # issue 30.3: before = health.dcgm off, after = auto
    python3 bench/signals_bench.py --signal switch-side  # issue 30.4: before = no NMX-M read, after = one per rack

Reports per variant: the median sweep over open connections, mctl's own CPU per sweep, and the
machine's busy CPU per sweep (/proc/stat: every tray's sshd session, shell and nvidia-smi included),
divided by the trays. Exit 1 when the per-tray machine CPU rises by more than 20 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import health_bench  # noqa: E402  (bench/health_bench.py: the lab start, the site copy, the sweep measure)


def variant(name: str, signal: str = "nvlink-errors") -> None:
    from mctl.facts import probe

    if signal == "dcgm":            # the variants differ by their sites (health.dcgm), not by the probe's code
        return
    if signal == "switch-side":     # issue 30.4: before = no NMX-M read beside the sweep (as a site without one)
        from mctl.health import nmx_watch

        if not hasattr(nmx_watch, "_real_watch_for"):
            nmx_watch._real_watch_for = nmx_watch.watch_for
        nmx_watch.watch_for = nmx_watch._real_watch_for if name == "after" else (lambda *a, **k: None)
        return

    if not hasattr(probe, "_ALL_GPU_STEPS"):
        probe._ALL_GPU_STEPS = probe._GPU_STEPS
    steps = probe._ALL_GPU_STEPS
    probe._GPU_STEPS = steps if name == "after" else tuple(s for s in steps if s.section != "nvlink-errors")


def dcgm_off(site: Path, folder: Path) -> Path:
    """The bench's site with health.dcgm off: the probe runs no dcgmi."""
    import yaml

    doc = yaml.safe_load((site / "mctl.yml").read_text())
    doc["health"]["dcgm"] = "off"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--racks", type=int, default=4)
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--sweeps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--signal", choices=("nvlink-errors", "dcgm", "switch-side"), default="nvlink-errors",
                    help="what 'before' leaves out: the nvlink -e section, DCGM health (health.dcgm off), or the "
                         "switch side (each rack's NMX-M read beside the sweep, and the fabric marks it leads to)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mctl-signals-bench-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(workdir / "state"), NO_COLOR="1")
    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    lab_dir = health_bench.start_lab(args.trays, workdir, env, racks=args.racks, slurm=False)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        site = health_bench.site_copy(lab_dir, workdir, 5.0, scheduler=False)
        sites = {"before": site, "after": site}
        if args.signal == "dcgm":
            sites["before"] = dcgm_off(site, workdir / "site-dcgm-off")
        for r in range(args.rounds):
            for name in ("before", "after"):
                variant(name, args.signal)
                m = health_bench.measure_sweeps(sites[name], workdir / f"state-{name}-{r}", args.sweeps)
                runs[name].append(m)
                sys.stderr.write(f"[bench] round {r + 1} {name}: median {m['median_s']} s, machine "
                                 f"{m['machine_cpu_per_sweep']['machine_busy_s']} CPU-s per sweep\n")
        uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    finally:
        health_bench.mctl("lab", "down", "--dir", str(lab_dir), env=env, timeout=300)
    trays = runs["after"][0]["trays"]
    summary = {}
    for name, ms in runs.items():
        summary[name] = {
            "median_sweep_s": round(statistics.median(t for m in ms for t in m["sweeps_s"]), 3),
            "mctl_cpu_per_sweep_s": round(statistics.median(m["mctl_cpu_per_sweep_s"] for m in ms), 3),
            "machine_cpu_per_tray_ms": round(1000 * statistics.mean(
                m["machine_cpu_per_sweep"]["machine_busy_s"] for m in ms) / trays, 1),
        }
    rise = summary["after"]["machine_cpu_per_tray_ms"] / summary["before"]["machine_cpu_per_tray_ms"] - 1
    doc = {"signal": args.signal, "trays": trays, "racks": args.racks, "sweeps_per_round": args.sweeps, "rounds": args.rounds,
           "uptime": uptime, "summary": summary, "machine_cpu_per_tray_rise_pct": round(100 * rise, 1),
           "target": "<= 20 %", "met": rise <= 0.20, "runs": runs}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for name, s in summary.items():
            print(f"{name:6}  median sweep {s['median_sweep_s']:.3f} s  mctl CPU {s['mctl_cpu_per_sweep_s']:.3f} s  "
                  f"machine CPU per tray {s['machine_cpu_per_tray_ms']:.1f} ms")
        print(f"per-tray machine CPU rise: {100 * rise:+.1f} % (target <= 20 %: {'met' if doc['met'] else 'NOT met'})")
        print("load:", " | ".join(uptime))
    return 0 if doc["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
