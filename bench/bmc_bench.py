#!/usr/bin/env python3
"""Benchmark `mctl bmc inventory` on the lab's BMCs: before / after TLS session resumption and $expand.

Target (issue 20): `mctl bmc inventory` of an 18-tray rack <= 3 s.

Starts a lab (OS only, no rack services: only the trays and their BMCs matter here) on a free
loopback block, or uses one given with --lab, and reads every tray's BMC in-process with mctl's own
`mctl.bmc.inventory.collect`, the path `mctl bmc inventory` takes, alternating the two variants round
by round so both see the same machine load:

  before   a full TLS handshake on every connection and a GET per collection member (the client as
           it was: mctl.bmc.client.RESUME_TLS = USE_EXPAND = False)
  resume   TLS sessions resumed, a GET per member (RESUME_TLS only)
  after    TLS sessions resumed and collections read with $expand=.($levels=1) (the client now)

Reports per variant the median wall time, GETs, full and resumed handshakes, and mctl's CPU time;
and the after/before ratios. Every tray must be read in every round, else the run fails.

Usage: sudo python3 bench/bmc_bench.py [--trays 18] [--rounds 5] [--lab LABDIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_net() -> int:
    from mctl.lab.procs import listening_tcp

    used = {int(a.split(".")[1]) for a, _p in listening_tcp() if a.startswith("127.")}
    return random.choice([n for n in range(201, 255) if n not in used])


def bmc_cpu(lab_dir: Path) -> float:
    """CPU seconds (user + system) the lab's BMC processes used so far."""
    from mctl.lab import control

    total = 0
    for p in control.lab_processes(lab_dir):
        if "mctl.lab.bmc_emulator" in " ".join(p.cmdline):
            try:
                fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):
                pass
    return total / os.sysconf("SC_CLK_TCK")


def one_round(variant: str, hosts, settings, lab_dir: Path) -> dict:
    from mctl.bmc import client
    from mctl.bmc.inventory import collect

    client.RESUME_TLS = variant in ("resume", "after")
    client.USE_EXPAND = variant == "after"
    bmc0, cpu0, t0 = bmc_cpu(lab_dir), time.process_time(), time.monotonic()
    trays = collect(hosts, settings)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    bmc = bmc_cpu(lab_dir) - bmc0
    bad = [f"{t.host}: {t.error}" for t in trays if not t.ok]
    if bad:
        raise SystemExit(f"{variant}: not every BMC was read: {bad[:3]}")
    return {"wall_s": wall, "cpu_s": cpu, "bmc_cpu_s": bmc, "gets": sum(t.requests for t in trays),
            "full_handshakes": sum(t.tls_handshakes for t in trays),
            "resumed": sum(t.tls_resumed for t in trays)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lab", help="an existing lab folder (its inventory is used; nothing is started)")
    ap.add_argument("--deadline", type=float, default=300.0,
                    help="per-tray deadline in seconds (the lab's 60 s is too short for 'before' at load 40)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from mctl.bmc.inventory import settings_for
    from mctl.inventory import load_site
    from mctl.lab import control

    work = None
    lab_dir = Path(args.lab) if args.lab else None
    if lab_dir is None:
        work = Path(tempfile.mkdtemp(prefix="mctl-bmc-bench-"))
        t0 = time.monotonic()
        result = control.up(work / "lab", racks=1, trays=args.trays, net=free_net(), os_only=True,
                            rack_services=[], progress=lambda m: sys.stderr.write(f"[bench] {m}\n"))
        lab_dir = result.dir
        sys.stderr.write(f"[bench] lab up in {time.monotonic() - t0:.1f} s\n")
    try:
        site = load_site(lab_dir / "mctl.yml")
        hosts = [h for h in site.compute_trays()]
        from dataclasses import replace

        settings = replace(settings_for(site), deadline_s=args.deadline)
        one_round("after", hosts, settings, lab_dir)            # warm: imports, the BMCs' first answers
        variants = ("before", "resume", "after")
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for i in range(args.rounds):
            for variant in (variants if i % 2 == 0 else variants[::-1]):
                runs[variant].append(one_round(variant, hosts, settings, lab_dir))
        med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
        out = {"trays": len(hosts), "rounds": args.rounds, "load": os.getloadavg()[0], "median": med,
               "runs": runs,
               "ratios": {v: {k: med[v][k] / med["before"][k] for k in ("wall_s", "cpu_s", "bmc_cpu_s", "gets")}
                          for v in variants[1:]}}
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            print(f"{len(hosts)} trays, {args.rounds} rounds each, alternating (medians; load {out['load']:.1f})")
            for v in variants:
                m = med[v]
                print(f"  {v:6}  {m['wall_s']:6.2f} s wall  {m['cpu_s']:5.2f} s mctl CPU  {m['bmc_cpu_s']:5.2f} s BMC CPU"
                      f"  {m['gets']:5.0f} GETs  {m['full_handshakes']:4.0f} full / {m['resumed']:5.0f} resumed TLS "
                      "handshakes (counted with resumption on only)")
            for v, r in out["ratios"].items():
                print(f"  {v}/before: wall {r['wall_s']:.2f}, mctl CPU {r['cpu_s']:.2f}, "
                      f"BMC CPU {r['bmc_cpu_s']:.2f}, GETs {r['gets']:.2f}")
    finally:
        if work is not None:
            control.down(lab_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
