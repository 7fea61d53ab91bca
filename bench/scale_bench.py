#!/usr/bin/env python3
"""Benchmark mctl at site scale in fleet mode (`mctl lab up --fleet`, docs/lab.md "Fleet mode"): issue 29.2.

For each size (racks of 18 compute trays), in a temporary folder on a free 127.N block, with the real CLI:
  inventory    `mctl rack inventory --all --json` (--runs times), beside pdsh and clush running
               `nvidia-smi -q -x` on every tray with the same fan-out (64) in the same run, in a rotating order;
               wall and CPU of each, the trays each reached, the ratios mctl/pdsh (wall) and mctl/clush (CPU)
  health       `mctl health check --json`: wall, CPU, trays reached
  audit        `mctl audit run --all --format json`: wall, CPU, trays reached
  watch        `mctl health watch --interval I --sweeps K` (BMC reads on their cadence, as the watch does):
               each sweep's wall and trays not reached (its SWEEP lines), the process's CPU per sweep and per
               tray per sweep, VmRSS sampled every second (first after sweep 1, last, growth over the run)
  slurm        `mctl deploy slurm --dry-run --json` (fleet mode has no Slurm: the plan's render only)
  partition    `mctl partition create lab-r1 --template 2x9 --dry-run --json` (a partition plan)
CPU is mctl's process's own (user + sys from os.wait4: the process and its children, never the trays', which
are other processes); pdsh's and clush's include their ssh client processes. The 1-minute load average is
recorded at the start and end of every size.

Usage: sudo .venv/bin/python bench/scale_bench.py [--racks 1,4,16] [--quick] [--runs 3] [--watch-seconds 300]
       [--json] [--out FILE]
pdsh and clush: `apt-get install pdsh clustershell` (Debian's packages); without them their columns are empty.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inventory_bench import CMD, ssh_options  # noqa: E402
from lab_up import free_net  # noqa: E402

TRAYS = 18
SWEEP = re.compile(r"SWEEP\s+#(\d+): (\d+) trays: (.*?); .*?([0-9.]+)s$")


def reap(proc: subprocess.Popen, until: float, every: float = 0.05, tick=None):
    """(exit status, rusage) of *proc* (os.wait4: its own and its children's CPU), killed at *until*
    (time.monotonic()); *tick* runs every *every* seconds while it lives."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        if time.monotonic() > until:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return status, usage
        if tick is not None:
            tick()
        time.sleep(every)


def run(argv: list[str], env: dict, timeout: float) -> dict:
    """wall, cpu (os.wait4 of the process: its own and its children's) and exit of *argv*; stdout kept."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        status, usage = reap(proc, start + timeout)
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return {"wall": round(wall, 2), "cpu": round(usage.ru_utime + usage.ru_stime, 2),
                "exit": os.waitstatus_to_exitcode(status), "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")[-800:]}


def slim(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in ("stdout", "stderr")}


def _json(r: dict) -> dict:
    try:
        return json.loads(r["stdout"]) if r["stdout"].strip() else {}
    except json.JSONDecodeError:
        return {}


def vmrss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def watch(mctl: list[str], env: dict, interval: float, seconds: float) -> dict:
    """One `mctl health watch` for about *seconds* (sweeps = seconds / interval): sweeps, CPU, memory."""
    sweeps = max(2, int(seconds / interval))
    with tempfile.TemporaryFile() as out:
        start, start_epoch = time.monotonic(), time.time()
        proc = subprocess.Popen(mctl + ["health", "watch", "--interval", str(interval), "--sweeps", str(sweeps)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        rss: list[tuple[float, float]] = []

        def sample() -> None:
            m = vmrss_mib(proc.pid)
            if m is not None:
                rss.append((time.monotonic() - start, m))

        status, usage = reap(proc, start + sweeps * interval * 4 + 300, every=1.0, tick=sample)
        wall = time.monotonic() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
    rows = []
    for line in text.splitlines():
        m = SWEEP.search(line)
        if m:
            counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (unreachable|critical|warn|healthy)", m.group(3)))
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) if line[:4].isdigit() else None
            rows.append({"sweep": int(m.group(1)), "wall": float(m.group(4)),
                         "unreachable": counts.get("unreachable", 0),
                         "at": stamp - start_epoch if stamp is not None else None})
    cpu = usage.ru_utime + usage.ru_stime
    trays = int(SWEEP.search(text).group(2)) if SWEEP.search(text) else 0
    first_sweep_at = 0.0
    if rows:           # RSS from the end of the first sweep on (imports and the first connects are start-up)
        first_sweep_at = rows[0]["at"] + 1.0 if rows[0]["at"] is not None else rows[0]["wall"] + 5.0
    steady = [m for t, m in rss if t >= first_sweep_at] or [m for _, m in rss]
    walls = [r["wall"] for r in rows]
    return {"interval": interval, "sweeps": len(rows), "run_s": round(wall, 1), "exit": os.waitstatus_to_exitcode(status),
            "sweep_wall_median": round(statistics.median(walls), 2) if walls else None,
            "sweep_wall_max": round(max(walls), 2) if walls else None,
            "unreachable_per_sweep": [r["unreachable"] for r in rows],
            "cpu_s": round(cpu, 2), "cpu_per_sweep_s": round(cpu / max(1, len(rows)), 3),
            "cpu_per_tray_per_sweep_ms": round(1000 * cpu / max(1, len(rows)) / max(1, trays), 2),
            "rss_mib_first": round(steady[0], 1) if steady else None,
            "rss_mib_last": round(steady[-1], 1) if steady else None,
            "rss_mib_max": round(max(steady), 1) if steady else None,
            "rss_growth_mib": round(steady[-1] - steady[0], 1) if steady else None,
            "rss_window_s": round(wall - first_sweep_at, 1),
            "tail": "" if rows else text[-800:]}


def fanout(tools: dict, runs: int, n_trays: int) -> dict:
    """pdsh, clush and mctl's inventory in a rotating order, *runs* rounds; medians and what each reached."""
    samples: dict[str, list[dict]] = {t: [] for t in tools}
    order = list(tools)
    for rnd in range(runs):
        for tool in order[rnd % len(order):] + order[:rnd % len(order)]:
            argv, env = tools[tool]
            r = run(argv, env, 900)
            if tool == "mctl":
                summary = _json(r).get("summary", {})
                r["reached"] = summary.get("trays", 0) - summary.get("unreached", 0) if summary else 0
            else:
                r["reached"] = r["stdout"].count("</nvidia_smi_log>")
            samples[tool].append(slim(r))
    med = {t: {"wall": statistics.median(s["wall"] for s in v), "cpu": statistics.median(s["cpu"] for s in v),
               "reached": [s["reached"] for s in v], "exit": [s["exit"] for s in v]}
           for t, v in samples.items()}
    out = {"runs": runs, "trays": n_trays, "median": med}
    if "pdsh" in med and med["pdsh"]["wall"]:
        out["wall_ratio_mctl_over_pdsh"] = round(med["mctl"]["wall"] / med["pdsh"]["wall"], 3)
    if "clush" in med and med["clush"]["cpu"]:
        out["cpu_ratio_mctl_over_clush"] = round(med["mctl"]["cpu"] / med["clush"]["cpu"], 3)
    return out


def one(racks: int, args) -> dict:
    mctl = [sys.executable, "-m", "mctl"]
    n = racks * TRAYS
    with tempfile.TemporaryDirectory(prefix="mctl-scale-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        env = dict(os.environ, MCTL_STATE_DIR=tmp, MCTL_INVENTORY=str(lab_dir), NO_COLOR="1")
        net = free_net()
        row: dict = {"racks": racks, "trays": n, "net": net, "load_start": round(os.getloadavg()[0], 1),
                     "started": time.strftime("%H:%M:%S", time.gmtime())}
        try:
            up = run(mctl + ["lab", "up", "--fleet", "--racks", str(racks), "--net", str(net), "--dir", str(lab_dir),
                             "--start-timeout", "900", "--json"], env, 1200)
            if up["exit"] != 0:
                raise RuntimeError(f"lab up failed ({up['exit']}): {up['stderr']}")
            row["up_s"] = up["wall"]
            from mctl.inventory import load_site

            site = load_site(str(lab_dir))
            addresses = [h.address for r in site.racks.values() for h in r.compute]
            tools: dict = {"mctl": (mctl + ["rack", "inventory", "--all", "--json"], env)}
            if shutil.which("pdsh") and shutil.which("clush"):
                from ClusterShell.NodeSet import NodeSet

                folded = str(NodeSet.fromlist(addresses))
                opts = ssh_options(lab_dir)
                pdsh_env = dict(env, PDSH_RCMD_TYPE="ssh", PDSH_SSH_ARGS=" ".join(opts + ["-l%u", "%h"]))
                tools["pdsh"] = (["pdsh", "-R", "ssh", "-f", "64", "-l", "root", "-w", folded, CMD], pdsh_env)
                tools["clush"] = (["clush", "-f", "64", "-l", "root", "-o", " ".join(opts), "-w", folded, CMD], env)
            row["inventory"] = fanout(tools, args.runs, n)

            h = run(mctl + ["health", "check", "--json"], env, 1800)
            doc = _json(h)
            row["health"] = {**slim(h), "reached": sum(1 for t in doc.get("trays", []) if t.get("reach") == "ok")}

            a = run(mctl + ["audit", "run", "--all", "--format", "json"], env, 1800)
            doc = _json(a)
            row["audit"] = {**slim(a), "reached": _audit_reached(doc, n)}

            s = run(mctl + ["deploy", "slurm", "--dry-run", "--json"], env, 600)
            row["slurm_dry_run"] = {**slim(s), "note": s["stderr"].strip()[-300:] if s["exit"] else ""}
            p = run(mctl + ["partition", "create", "lab-r1", "--template", "2x9", "--dry-run", "--json"], env, 600)
            row["partition_plan"] = {**slim(p), "note": p["stderr"].strip()[-300:] if p["exit"] else ""}

            row["watch"] = watch(mctl, env, args.interval, args.watch_seconds)
        finally:
            down = run(mctl + ["lab", "down", "--dir", str(lab_dir)], env, 600)
            row["down_ok"] = down["exit"] == 0
            row["load_end"] = round(os.getloadavg()[0], 1)
    return row


def _audit_reached(doc: dict, n: int) -> int | None:
    """Trays the audit reached: every tray less those it could not check (a gap naming the tray, or a failed
    tray.reachable finding)."""
    if not doc:
        return None
    missed = {f.get("host") for f in doc.get("findings", [])
              if f.get("check") == "tray.reachable" and f.get("severity") in ("critical", "warn")}
    missed |= {h for g in doc.get("gaps", []) for h in g.get("hosts", []) if "-tray" in h}
    return n - len(missed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--racks", default="1,4,16", help="comma-separated rack counts (18 trays each)")
    ap.add_argument("--runs", type=int, default=3, help="inventory rounds (pdsh, clush, mctl) per size")
    ap.add_argument("--interval", type=float, default=15.0, help="the watch's --interval")
    ap.add_argument("--watch-seconds", type=float, default=300.0, help="how long the watch runs (memory growth)")
    ap.add_argument("--quick", action="store_true", help="1 inventory round, a 60 s watch")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the rows (JSON) here, after each size")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.watch_seconds = 1, 60.0
    rows = []
    for r in [int(x) for x in args.racks.split(",") if x.strip()]:
        row = one(r, args)
        rows.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=2))
        if not args.json:
            print(json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["down_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
