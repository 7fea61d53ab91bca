#!/usr/bin/env python3
"""Provisioning on an 18-tray lab rack: mctl's overhead over plain ansible-playbook.

Target (issue 5): `mctl provision` wall time <= 1.10 x a plain `ansible-playbook` run of
the same playbook on the same trays. Both use the same inventory (mctl.yml through
mctl's inventory plugin) and the same Ansible settings (mctl.ansible.runner.ansible_env:
pipelining, SSH control persistence, forks), so the difference is what mctl adds:
planning, ansible-runner's event stream, the run folder and the recap.

Also reports the first provisioning of a fresh rack and the idempotent re-run.
Rounds alternate which tool goes first; medians are reported.

Usage: sudo python3 bench/provision_bench.py [--trays 18] [--rounds 5] [--json]
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
from mctl.ansible.runner import ansible_env  # noqa: E402


def free_net() -> int:
    used = {int(a.split(".")[1]) for a, _p in procs.listening_tcp() if a.startswith("127.")}
    return next(n for n in range(150, 200) if n not in used)


def timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    return time.perf_counter() - t0, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mctl-provbench-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(work), MCTL_INVENTORY=str(work / "lab"))
    mctl = [sys.executable, "-m", "mctl"]
    net = free_net()
    subprocess.run(mctl + ["lab", "up", "--compute-trays", str(args.trays), "--net", str(net)], env=env, check=True,
                   capture_output=True)
    try:
        first_s, proc = timed(mctl + ["provision", "lab-r1"], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        aenv = dict(env, **ansible_env(5))
        ansible = ["ansible-playbook", "-i", str(work / "lab" / "mctl.yml"), str(REPO / "playbooks" / "site.yml"),
                   "--limit", "lab_r1_compute", "--forks", str(max(5, args.trays))]
        samples: dict[str, list[float]] = {"mctl": [], "ansible-playbook": []}
        for r in range(args.rounds):
            order = ["mctl", "ansible-playbook"] if r % 2 == 0 else ["ansible-playbook", "mctl"]
            for tool in order:
                argv = mctl + ["provision", "lab-r1"] if tool == "mctl" else ansible
                secs, proc = timed(argv, env if tool == "mctl" else aenv)
                assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
                if tool == "ansible-playbook":
                    assert "changed=0" in proc.stdout and "failed=0" in proc.stdout
                samples[tool].append(secs)
        result = {
            "trays": args.trays, "rounds": args.rounds, "first_run_s": round(first_s, 1),
            "rerun_mctl_median_s": round(statistics.median(samples["mctl"]), 1),
            "rerun_ansible_median_s": round(statistics.median(samples["ansible-playbook"]), 1),
            "samples": {k: [round(x, 2) for x in v] for k, v in samples.items()},
            "load_avg": os.getloadavg()[0],
        }
        result["overhead_ratio"] = round(result["rerun_mctl_median_s"] / result["rerun_ansible_median_s"], 3)
        result["target_met"] = result["overhead_ratio"] <= 1.10
    finally:
        subprocess.run(mctl + ["lab", "down"], env=env, capture_output=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.trays} trays: first provisioning {result['first_run_s']} s; idempotent re-run: "
              f"mctl {result['rerun_mctl_median_s']} s, ansible-playbook {result['rerun_ansible_median_s']} s, "
              f"ratio {result['overhead_ratio']} (target <= 1.10: {'met' if result['target_met'] else 'missed'})")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
