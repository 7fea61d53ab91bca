#!/usr/bin/env python3
"""Benchmark burn-in and evidence on a lab rack: bring-up's burn-in phase at each level, and `mctl health evidence`.

Each run is the real CLI in a subprocess on a copy of the lab's inventory without a scheduler (so the
phase takes every tray, as on a rack before Slurm): `mctl --json rack bring-up lab-r1 --from burn-in
--until burn-in --burn-in LEVEL` for quick and medium, then `mctl --json health evidence lab-r1`. One
tray carries an uncorrectable ECC, so the phase exits 1 naming it (the others pass): the run is the
full judging path, not a skip. Timed wall and CPU (user + system of the CLI and its descendants).

    sudo python3 bench/burnin_bench.py --trays 18        # a fresh lab on a free 127.N block
    sudo python3 bench/burnin_bench.py --lab /var/lib/mctl/lab --json

Exit 0 when every run judged every tray (the faulted one failed, the others passed), 1 otherwise, 2 on
a setup problem. No target is set by the issue for these; the numbers are in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bringup_bench import free_net, timed_cli  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--lab", type=Path, help="use this running lab instead of starting one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("burnin_bench: run as root (the lab needs namespaces)", file=sys.stderr)
        return 2
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    started_lab = None
    if args.lab:
        lab_dir = args.lab.resolve()
    else:
        lab_dir = Path(tempfile.mkdtemp(prefix="mctl-burnin-bench-")) / "lab"
        net = free_net()
        t0 = time.monotonic()
        started_lab = control.up(lab_dir, racks=1, trays=args.trays, net=net)
        print(f"lab up: {args.trays} trays on 127.{net}.1.x in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    layout = control.layout_of(control.load_record(lab_dir))
    trays = [h.name for h in layout.hosts() if h.kind == "tray"]
    work = Path(tempfile.mkdtemp(prefix="mctl-burnin-bench-site-"))
    doc = yaml.safe_load((lab_dir / "mctl.yml").read_text())
    doc.pop("scheduler", None)
    (work / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, MCTL_STATE_DIR=str(work / "state"), MCTL_INVENTORY=str(work), NO_COLOR="1")
    faulted = trays[1]
    runs = {}
    try:
        control.fault(lab_dir, faulted, FaultRequest(ecc_uncorrectable=2, gpu=1))
        for level in ("quick", "medium"):
            runs[level] = timed_cli(["--json", "rack", "bring-up", "lab-r1", "--from", "burn-in", "--until", "burn-in",
                                     "--burn-in", level], env)
            print(f"burn-in {level}: rc {runs[level]['rc']}, {runs[level]['wall_s']}s wall", file=sys.stderr)
        runs["evidence"] = timed_cli(["--json", "health", "evidence", "lab-r1"], env)
        print(f"evidence: rc {runs['evidence']['rc']}, {runs['evidence']['wall_s']}s wall", file=sys.stderr)
    finally:
        control.fault(lab_dir, faulted, FaultRequest(clear=True))
        if started_lab is not None:
            control.down(lab_dir)
    ok = all(runs[level]["rc"] == 1 and (runs[level]["data"] or {}).get("failed_phase") == "burn-in"
             for level in ("quick", "medium")) and runs["evidence"]["rc"] == 0
    bundles = (runs["evidence"]["data"] or {}).get("bundles") or []
    report = {"trays": len(trays), "cores": os.cpu_count(), "faulted": faulted, "judged_all": ok,
              "runs": {k: {kk: vv for kk, vv in v.items() if kk not in ("data", "stderr")} for k, v in runs.items()},
              "evidence_bytes": sum(b.get("bytes", 0) for b in bundles), "evidence_bundles": len(bundles)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'run':<10} {'rc':>3} {'wall s':>8} {'CPU s':>7} {'load':>12}")
        for name, res in runs.items():
            print(f"{name:<10} {res['rc']:>3} {res['wall_s']:>8} {res['cpu_s']:>7} "
                  f"{str(res['load'][0]) + '->' + str(res['load'][1]):>12}")
        print(f"evidence: {report['evidence_bundles']} bundles, {report['evidence_bytes']} bytes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
