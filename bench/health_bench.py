#!/usr/bin/env python3
"""Benchmark the health watch on a lab rack: sweep time over open connections, fault-to-drain.

Targets (issue 8), on an 18-tray lab rack with real Slurm:
  - a sweep over open connections (probe on every tray + `scontrol show node -o` on the
    controller + the checks) takes <= 1 s, median over --sweeps sweeps after the first
    (which opens the connections);
  - fault-to-drain <= one interval + 2 s: the real `mctl health watch` runs with
    --interval; a fault (`--nvlink-down`, a lasting GPU fault) is injected at a random
    point of the interval, and the time until `scontrol` on the controller shows the tray
    drained with an `mctl:` reason is measured, for --faults trays one after the other.

    sudo python3 bench/health_bench.py                         # starts an 18-tray lab, deploys Slurm
    sudo python3 bench/health_bench.py --lab /var/lib/mctl/lab  # an existing lab with Slurm deployed
    sudo python3 bench/health_bench.py --interval 5 --faults 3 --json

Exit 0 when both targets are met, 1 when one is missed, 2 on a setup problem.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def mctl(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def start_lab(trays: int, workdir: Path, env: dict, *, racks: int = 1, slurm: bool = True) -> Path:
    from mctl.lab import control
    from mctl.lab.procs import listening_tcp

    used = {int(a.split(".")[1]) for a, _ in listening_tcp() if a.startswith("127.")}
    net = next(n for n in range(160, 255) if n not in used)
    result = control.up(workdir / "lab", racks=racks, trays=trays, net=net, os_only=False,
                        progress=lambda m: sys.stderr.write(f"[lab] {m}\n"))
    if not slurm:
        return result.dir
    sys.stderr.write("[bench] deploying Slurm (a few minutes) ...\n")
    proc = mctl("-i", str(result.dir), "deploy", "slurm", env=env)
    if proc.returncode != 0:
        raise SystemExit(f"deploy slurm failed:\n{proc.stderr[-2000:]}")
    return result.dir


def site_copy(lab_dir: Path, workdir: Path, interval: float, *, scheduler: bool = True) -> Path:
    import yaml

    doc = yaml.safe_load((lab_dir / "mctl.yml").read_text())
    if not scheduler:
        doc.pop("scheduler", None)      # a lab without Slurm deployed: no controller read beside the probes
    # the share is the rack's: one drain at a time here, never the breaker's business
    doc["health"] = {"interval": interval, "resume_after_healthy_sweeps": 1, "imex": "ignore",
                     "breaker": {"max_drained_share": 1.0, "window": "1h"}}
    folder = workdir / "site"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def cpu_table() -> dict[int, tuple[str, int, int]]:
    """pid -> (command name, own CPU ticks, ticks of the children it reaped) for every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        f = text[text.rindex(")") + 2:].split()
        out[int(entry.name)] = (comm, int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))
    return out


def busy_ticks() -> int:
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return sum(f) - f[3] - f[4]           # all but idle and iowait


def cpu_split(before: dict, after: dict, busy: int, sweeps: int, me: int) -> dict:
    """Where the machine's CPU went during the sweeps, per sweep in seconds: mctl itself, each long-lived
    process group by name (its own time and what its finished children used: on a tray the sshd session
    reaps the probe's shell and every command it ran), and the rest (processes that came and went)."""
    hz = os.sysconf("SC_CLK_TCK")
    groups: dict[str, list[int]] = {}
    for pid, (comm, own, kids) in after.items():
        if pid not in before or before[pid][0] != comm:
            continue
        name = "mctl (this process)" if pid == me else comm
        g = groups.setdefault(name, [0, 0])
        g[0] += own - before[pid][1]
        g[1] += kids - before[pid][2]
    known = sum(a + b for a, b in groups.values())
    per = lambda ticks: round(ticks / hz / sweeps, 3)
    table = {name: {"own_s": per(a), "children_s": per(b)} for name, (a, b) in
             sorted(groups.items(), key=lambda kv: -sum(kv[1])) if a + b > 0}
    return {"machine_busy_s": per(busy), "by_process": table, "unattributed_s": per(max(0, busy - known))}


def measure_sweeps(site_dir: Path, state: Path, sweeps: int) -> dict:
    from mctl.health.engine import Engine
    from mctl.health.site_view import resolve_scope, settings_of
    from mctl.inventory import load_site
    from mctl.transport import SSHConfig, SSHPool

    site = load_site(str(site_dir))

    async def main():
        async with SSHPool(SSHConfig.from_site(site)) as pool:
            engine = Engine(site, resolve_scope(site, None), settings_of(site), state, pool)
            first = await engine.sweep()
            times, cpu, results = [], [], []
            procs0, busy0 = cpu_table(), busy_ticks()
            for _ in range(sweeps):
                t0, c0 = time.perf_counter(), time.process_time()
                r = await engine.sweep()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                results.append(r)
            split = cpu_split(procs0, cpu_table(), busy_ticks() - busy0, sweeps, os.getpid())
            return first, times, cpu, results, split

    first, times, cpu, results, split = asyncio.run(main())
    bad = [v.host for r in results for v in r.verdicts if v.status not in ("ok", "warn")]
    return {"trays": len(first.verdicts), "first_sweep_s": round(first.elapsed, 3),
            "sweeps_s": [round(t, 3) for t in times], "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3), "mctl_cpu_per_sweep_s": round(statistics.median(cpu), 3),
            "unhealthy_trays_seen": sorted(set(bad)), "scheduler_error": results[-1].scheduler_error,
            "machine_cpu_per_sweep": split}


def tray_cpu(lab_dir: Path, tray: str, rounds: int = 5) -> dict:
    """CPU seconds (user+sys) one tray spends per sweep on the GPU emulator: what the lab's 2 cores
    must pay once per tray, and a real tray pays on its own cores."""
    from mctl.lab import control

    script = ("TIMEFORMAT='%U %S'; for i in $(seq " + str(rounds) + "); do "
              "{ time nvidia-smi -q -x >/dev/null; } 2>&1; { time nvidia-smi nvlink --status >/dev/null; } 2>&1; done")
    argv = control.ssh_argv(lab_dir, tray, [script], tty=False)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout.split()
    values = [float(x) for x in out]
    pairs = [values[i] + values[i + 1] for i in range(0, len(values), 2)]     # user + sys per call
    qx, nvl = pairs[0::2], pairs[1::2]
    return {"nvidia_smi_q_x_cpu_s": round(statistics.median(qx), 3),
            "nvidia_smi_nvlink_cpu_s": round(statistics.median(nvl), 3)}


def node_state(lab_dir: Path, head: str, tray: str) -> str:
    from mctl.lab import control

    argv = control.ssh_argv(lab_dir, head, [f"scontrol show node -o {tray}"], tty=False)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    return out


def measure_fault_to_drain(lab_dir: Path, site_dir: Path, state: Path, interval: float, faults: int,
                           env: dict) -> dict:
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest
    from mctl.inventory import load_site

    site = load_site(str(site_dir))
    rack = next(iter(site.racks.values()))
    head = rack.head.name
    trays = random.Random(8).sample([h.name for h in rack.compute], faults)
    watch = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(site_dir), "--state-dir", str(state),
                              "health", "watch", "--interval", f"{interval:g}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    samples = []
    try:
        first = watch.stdout.readline()
        if " SWEEP " not in first:
            raise SystemExit(f"the watch did not sweep: {first!r} {watch.stderr.read()[-2000:]}")
        for tray in trays:
            time.sleep(random.uniform(0, interval))
            t0 = time.monotonic()
            control.fault(lab_dir, tray, FaultRequest(nvlink_down="0:3"))
            while True:
                text = node_state(lab_dir, head, tray)
                if "DRAIN" in text.split(" State=")[1].split()[0] and "Reason=mctl:" in text:
                    samples.append(time.monotonic() - t0)
                    break
                if time.monotonic() - t0 > 10 * interval + 30:
                    raise SystemExit(f"{tray} was not drained within {10 * interval + 30:g}s")
                time.sleep(0.1)
            control.fault(lab_dir, tray, FaultRequest(clear=True))
        # resumes: clear and let the watch resume them (resume_after_healthy_sweeps 1)
        deadline = time.monotonic() + 5 * interval + 30
        while time.monotonic() < deadline:
            if all("DRAIN" not in node_state(lab_dir, head, t).split(" State=")[1].split()[0] for t in trays):
                break
            time.sleep(0.5)
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watch.kill()
        for tray in trays:
            control.fault(lab_dir, tray, FaultRequest(clear=True))
    return {"interval_s": interval, "samples_s": [round(s, 2) for s in samples],
            "median_s": round(statistics.median(samples), 2), "max_s": round(max(samples), 2),
            "target_s": interval + 2}


_SWEEP_LINE = re.compile(r" SWEEP   #(\d+): (.*) (\d+\.\d+)s$")


def measure_frozen_sweeps(lab_dir: Path, site_dir: Path, state: Path, *, interval: float, frozen: int,
                          seconds: float, env: dict) -> dict:
    """The sweep bound with trays frozen: the real `mctl health watch --interval I` over every tray of
    the lab while *frozen* trays (of different racks where there are several) are frozen
    (`lab fault host --freeze`: SIGSTOP, open connections stay open and nothing answers). Reports every
    sweep's duration from the watch's SWEEP lines and how many trays each sweep saw unreachable."""
    from mctl.inventory import load_site
    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    site = load_site(str(site_dir))
    racks = list(site.racks.values())
    # one frozen tray per rack first, the last tray of each (the slowest to be reached in order)
    victims = [r.compute[-1 - i // len(racks)].name for i, r in zip(range(frozen), racks * frozen)]
    watch = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(site_dir), "--state-dir", str(state),
                              "health", "watch", "--interval", f"{interval:g}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, int, str, float]] = []          # (monotonic, sweep, counts, seconds)
    frozen_at = None
    try:
        deadline = time.monotonic() + 3 * interval + 120       # the first sweep opens every connection
        while True:
            line = watch.stdout.readline()
            if not line:
                raise SystemExit(f"the watch ended: {watch.stderr.read()[-2000:]}")
            m = _SWEEP_LINE.search(line.rstrip())
            if m:
                lines.append((time.monotonic(), int(m.group(1)), m.group(2), float(m.group(3))))
                if frozen_at is None and len(lines) >= 2:
                    for v in victims:
                        control.fault(lab_dir, v, FaultRequest(unreachable=True))
                    frozen_at = time.monotonic()
                    sys.stderr.write(f"[bench] froze {', '.join(victims)}\n")
                elif frozen_at is not None and time.monotonic() - frozen_at >= seconds:
                    break
            if frozen_at is None and time.monotonic() > deadline:
                raise SystemExit("the watch did not sweep twice")
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watch.kill()
        for v in victims:
            control.fault(lab_dir, v, FaultRequest(clear=True))
    during = [(n, counts, t) for at, n, counts, t in lines if frozen_at is not None and at > frozen_at]
    times = sorted(t for _, _, t in during)
    bound = interval + 2
    p99 = times[min(len(times) - 1, max(0, math.ceil(0.99 * len(times)) - 1))] if times else None
    seen = [counts for _, counts, _ in during]
    return {"trays": sum(len(r.compute) for r in racks), "racks": len(racks), "frozen": victims,
            "interval_s": interval, "seconds": seconds, "sweeps": len(times),
            "max_s": max(times) if times else None, "p99_s": p99,
            "p50_s": round(statistics.median(times), 2) if times else None,
            "over_bound": sum(1 for t in times if t > bound), "bound_s": bound,
            "before_freeze_s": [t for at, _, _, t in lines if frozen_at is None or at <= frozen_at],
            "sweeps_reporting_the_frozen": sum(1 for c in seen if f"{len(victims)} unreachable" in c),
            "sweep_lines": [f"#{n}: {c} {t}s" for n, c, t in during]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", type=Path, help="an existing lab folder with Slurm deployed (else one is started)")
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--faults", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--frozen", type=int, default=0, metavar="N",
                    help="the sweep bound instead: freeze N trays and watch for --minutes (no Slurm needed)")
    ap.add_argument("--racks", type=int, default=1, help="racks of the lab it starts (with --frozen)")
    ap.add_argument("--minutes", type=float, default=3.0, help="how long the trays stay frozen (with --frozen)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("the lab needs root\n")
        return 2
    if args.frozen:
        return frozen_main(args)
    workdir = Path(tempfile.mkdtemp(prefix="mctl-health-bench-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(workdir / "state"), NO_COLOR="1")
    started = None
    try:
        lab_dir = args.lab.resolve() if args.lab else start_lab(args.trays, workdir, env)
        started = None if args.lab else lab_dir
        site_dir = site_copy(lab_dir, workdir, args.interval)
        sweep = measure_sweeps(site_dir, workdir / "state-sweeps", args.sweeps)
        emu = tray_cpu(lab_dir, "lab-r1-tray01")
        per_tray = emu["nvidia_smi_q_x_cpu_s"] + emu["nvidia_smi_nvlink_cpu_s"]
        emu["emulator_cpu_per_sweep_s"] = round(per_tray * sweep["trays"], 2)
        emu["floor_s"] = round((per_tray * sweep["trays"] + sweep["mctl_cpu_per_sweep_s"]) / (os.cpu_count() or 1), 2)
        sweep["cpu"] = emu
        drain = (measure_fault_to_drain(lab_dir, site_dir, workdir / "state-watch", args.interval, args.faults, env)
                 if args.faults > 0 else None)
    finally:
        if started is not None:
            from mctl.lab import control

            control.down(started)
    load = os.getloadavg()
    report = {"sweep": sweep, "fault_to_drain": drain, "cpus": os.cpu_count(),
              "loadavg": [round(x, 2) for x in load],
              "targets": {"sweep_median_le_1s": sweep["median_s"] <= 1.0,
                          "fault_to_drain_le_interval_plus_2s": None if drain is None else drain["max_s"] <= drain["target_s"]}}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"sweep over open connections, {sweep['trays']} trays: median {sweep['median_s']:.2f}s, "
              f"max {sweep['max_s']:.2f}s (first, connecting: {sweep['first_sweep_s']:.2f}s)")
        c = sweep["cpu"]
        print(f"  CPU per sweep: mctl {sweep['mctl_cpu_per_sweep_s']:.2f}s; GPU emulator {c['emulator_cpu_per_sweep_s']:.2f}s "
              f"({c['nvidia_smi_q_x_cpu_s']:.3f}s -q -x + {c['nvidia_smi_nvlink_cpu_s']:.3f}s nvlink per tray); "
              f"floor on {os.cpu_count()} CPUs {c['floor_s']:.2f}s")
        split = sweep["machine_cpu_per_sweep"]
        print(f"  the machine's CPU per sweep: {split['machine_busy_s']:.2f}s, of which (own + reaped children):")
        for name, v in list(split["by_process"].items())[:8]:
            print(f"    {name:24} {v['own_s']:.3f}s + {v['children_s']:.3f}s")
        print(f"    {'(not attributed)':24} {split['unattributed_s']:.3f}s")
        if drain is not None:
            print(f"fault-to-drain at --interval {drain['interval_s']:g}s: {drain['samples_s']} "
                  f"(max {drain['max_s']:.2f}s, target {drain['target_s']:g}s)")
        print(f"load average {report['loadavg']} on {report['cpus']} CPUs; targets: {report['targets']}")
    return 0 if all(v is not False for v in report["targets"].values()) else 1


def frozen_main(args) -> int:
    if args.frozen < 1 or args.minutes <= 0 or args.racks < 1:
        sys.stderr.write("--frozen >= 1, --minutes > 0, --racks >= 1\n")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="mctl-health-frozen-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(workdir / "state"), NO_COLOR="1")
    started = None
    t0 = time.monotonic()
    try:
        lab_dir = args.lab.resolve() if args.lab else start_lab(args.trays, workdir, env, racks=args.racks,
                                                                 slurm=False)
        started = None if args.lab else lab_dir
        up_s = round(time.monotonic() - t0, 1)
        site_dir = site_copy(lab_dir, workdir, args.interval, scheduler=bool(args.lab))
        load_before = [round(x, 2) for x in os.getloadavg()]
        report = measure_frozen_sweeps(lab_dir, site_dir, workdir / "state-watch", interval=args.interval,
                                       frozen=args.frozen, seconds=args.minutes * 60, env=env)
    finally:
        if started is not None:
            from mctl.lab import control

            control.down(started)
    report.update(lab_up_s=None if args.lab else up_s, cpus=os.cpu_count(), loadavg_before=load_before,
                  loadavg_end=[round(x, 2) for x in os.getloadavg()])
    report["target_met"] = report["over_bound"] == 0 and report["sweeps"] > 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['trays']} trays in {report['racks']} rack(s), {', '.join(report['frozen'])} frozen for "
              f"{args.minutes:g} min, --interval {args.interval:g}: {report['sweeps']} sweeps, max {report['max_s']}s, "
              f"p99 {report['p99_s']}s, p50 {report['p50_s']}s; {report['over_bound']} over {report['bound_s']:g}s; "
              f"{report['sweeps_reporting_the_frozen']} sweeps reported every frozen tray unreachable")
        print(f"load average {report['loadavg_before']} -> {report['loadavg_end']} on {report['cpus']} CPUs")
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
