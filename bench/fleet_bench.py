#!/usr/bin/env python3
"""Benchmark fleet mode (`mctl lab up --fleet`, docs/lab.md "Fleet mode"): start time, memory per tray and
`mctl rack inventory --all` at several sizes.

For each size (racks of 18 compute trays), in a temporary folder on a free 127.N block, with the real CLI:
  up_s          wall time of `mctl lab up --fleet --racks R` (Python start-up included) until every address's
                sshd and BMC listen
  processes     every live process of the lab (rack hosts, sshd, BMC processes, rack services)
  pss_mib       PSS summed over them (/proc/*/smaps_rollup); per_tray_mib = pss_mib / trays
  avail_mib     drop of MemAvailable while the lab is up (kernel memory too; noisy on a shared machine)
  inventory     `mctl rack inventory --all --json`, --runs times: wall and CPU (user+sys of the mctl
                process, from the children's rusage: mctl's own CPU, not the trays'), median; the trays
                not reached in each run are reported (inventory_unreached), not hidden
  down_s        wall time of `mctl lab down`; then nothing of the lab may be left

Usage: sudo .venv/bin/python bench/fleet_bench.py [--racks 1,4,16] [--runs 3] [--json]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab_up import free_net, mem_available_mib, pss_mib  # noqa: E402

from mctl.lab import control, procs  # noqa: E402

TRAYS = 18


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    """(wall s, the result); the process's CPU is read as the change of cpu_children() around it."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return time.monotonic() - started, subprocess.CompletedProcess(argv, proc.returncode, out, err)


def cpu_children() -> float:
    """User + system CPU of every child this process has waited for (the mctl commands it ran)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def parts(lab_dir: Path) -> dict[str, list[int]]:
    """The lab's processes by part: the rack hosts (init, sshd, sessions), the BMC processes, the other rack
    services (NMX-M, apt, time), each found through its launcher (`unshare`) and what it started."""
    table = procs.scan()
    out: dict[str, list[int]] = {"rack_hosts": [], "bmc": [], "rack_services": []}
    for launcher in control.lab_launchers(lab_dir, table):
        service = next((a.split("=", 1)[1] for a in launcher.cmdline if a.startswith("MCTL_LAB_SERVICE=")), None)
        part = "rack_hosts" if service is None else "bmc" if service.endswith("/bmc") else "rack_services"
        pids = {launcher.pid}
        for child in procs.children(table, launcher.pid):
            pids.add(child.pid)
            if child.pidns == launcher.pidns:       # a BMC process: no PID namespace of its own
                pids |= {p.pid for p in procs.descendants(table, child)}
            else:
                pids |= {p.pid for p in procs.in_namespace(table, child)}
        out[part] += sorted(pids)
    return out


def one(racks: int, runs: int, timeout: float) -> dict:
    mctl = [sys.executable, "-m", "mctl"]
    with tempfile.TemporaryDirectory(prefix="mctl-fleet-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        env = dict(os.environ, MCTL_STATE_DIR=tmp, MCTL_INVENTORY=str(lab_dir), NO_COLOR="1")
        net = free_net()
        avail_before = mem_available_mib()
        load_start = os.getloadavg()[0]
        row: dict = {"racks": racks, "trays": racks * TRAYS, "net": net, "load_start": round(load_start, 1)}
        try:
            wall, up = timed(mctl + ["lab", "up", "--fleet", "--racks", str(racks), "--net", str(net),
                                           "--dir", str(lab_dir), "--start-timeout", str(timeout), "--json"],
                                   env, timeout + 120)
            if up.returncode != 0:
                raise RuntimeError(f"lab up failed ({up.returncode}): {up.stderr.strip()[-800:]}")
            row["up_s"] = round(wall, 1)
            time.sleep(2)                       # let the BMC processes finish importing before reading memory
            pids = [p.pid for p in control.lab_processes(lab_dir)]
            row["pss_mib_by_part"] = {part: round(pss_mib(ps), 1) for part, ps in parts(lab_dir).items()}
            row["processes"] = len(pids)
            row["pss_mib"] = round(pss_mib(pids), 1)
            row["per_tray_mib"] = round(row["pss_mib"] / (racks * TRAYS), 2)
            row["avail_mib"] = round(avail_before - mem_available_mib(), 1)
            walls, cpus, unreached = [], [], []
            for _ in range(runs):
                before = cpu_children()
                wall, inv = timed(mctl + ["rack", "inventory", "--all", "--json"], env, 600)
                cpus.append(cpu_children() - before)
                walls.append(wall)
                doc = json.loads(inv.stdout) if inv.stdout.strip() else {}
                summary = doc.get("summary", {})
                if summary.get("trays") != racks * TRAYS:
                    raise RuntimeError(f"rack inventory --all: exit {inv.returncode}, {summary}, "
                                       f"{inv.stderr.strip()[-400:]}")
                # a tray not reached is reported, not hidden (issue 29.5: trays lost to a connection storm)
                unreached.append(summary.get("unreached", 0))
                if inv.returncode != 0:
                    row.setdefault("inventory_errors", []).append(inv.stderr.strip()[-400:])
            row["inventory_wall_s"] = round(statistics.median(walls), 2)
            row["inventory_cpu_s"] = round(statistics.median(cpus), 2)
            row["inventory_runs"] = [[round(w, 2), round(c, 2), u] for w, c, u in zip(walls, cpus, unreached)]
            row["inventory_unreached"] = unreached
        finally:
            started = time.monotonic()
            down = subprocess.run(mctl + ["lab", "down", "--dir", str(lab_dir)], env=env, capture_output=True,
                                  text=True, timeout=300)
            row["down_s"] = round(time.monotonic() - started, 1)
            row["down_ok"] = down.returncode == 0
            row["left_behind"] = len(control.lab_processes(lab_dir)) + len(procs.mounts_mentioning(str(lab_dir)))
            row["load_end"] = round(os.getloadavg()[0], 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--racks", default="1,4,16", help="comma-separated rack counts (18 trays each)")
    ap.add_argument("--runs", type=int, default=3, help="rack inventory runs per size (median reported)")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for r in [int(x) for x in args.racks.split(",") if x.strip()]:
        row = one(r, args.runs, args.start_timeout)
        rows.append(row)
        if not args.json:
            print(json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["down_ok"] and r["left_behind"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
