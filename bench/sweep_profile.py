#!/usr/bin/env python3
"""Where a health sweep's and a rack inventory's CPU goes, per thread and per module (issue 26's rule).

Runs in the tree it is started from (its mctl, its bench/health_bench.py lab helpers), so the same script
copied into an older checkout measures that checkout's code the same way (bench/compare_trees.sh copies it):

  sweep      --sweeps N sweeps of the health engine in this process over open connections (as
             bench/health_bench.py), after one warm-up sweep, measured without the profiler, then N more
             under it (cProfile's cost is per call: its figures say where, not how much), with
               - the CPU of every thread of the process (/proc/self/task/*/stat), by thread name, and
                 the CPU of threads that ended during the run (process CPU less the live threads');
               - cProfile of the event-loop thread, timed by that thread's CPU clock (time.thread_time, so
                 a loaded machine does not inflate it): the probes' SSH channels, parsing, the checks, the
                 decisions; own time summed per module group (mctl.<package>, asyncssh, ...), and the
                 functions with the most own time;
  inventory  `rack inventory` run in this process --rounds times under cProfile (the same tables).
  watch      (--watch-interval S) the watch's way: an engine whose BMC reads run beside the sweeps
             (BmcWatch: one kept client per BMC, the reads on their cadence), --watch-sweeps sweeps paced
             at S seconds as `health watch --interval S` paces them, after every BMC has answered once:
             process CPU per sweep and per tray, by thread; the TLS handshakes and TCP connections the BMC
             clients opened, per sweep; the process's VmRSS at each sweep (first, last, max).
  In every part the BMC clients' connections are counted (RedfishClient._opened, which the trees since
  issue 29.3 have): TLS handshakes per sweep.

    sudo python3 bench/sweep_profile.py --lab DIR --parts watch --watch-interval 1 --watch-sweeps 300  # memory

    sudo python3 bench/sweep_profile.py --trays 18 --sweeps 10 --rounds 5 --json   # starts an 18-tray lab
    sudo python3 bench/sweep_profile.py --lab DIR ...                              # a lab with Slurm deployed

Figures are CPU seconds per sweep (or per inventory), on this machine, at the load printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HZ = os.sysconf("SC_CLK_TCK")


def thread_ticks() -> dict[int, int]:
    out = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{entry.name}/stat").read_text()
        except OSError:
            continue
        f = text[text.rindex(")") + 2:].split()
        out[int(entry.name)] = int(f[11]) + int(f[12])
    return out


def group_of(filename: str) -> str:
    """A profile entry's file -> its group: mctl.<package>, a third-party package, or the standard library."""
    path = filename.replace("\\", "/")
    if "/mctl/" in path and "site-packages" not in path:
        rest = path.rsplit("/mctl/", 1)[1].split("/")
        return "mctl." + (rest[0].removesuffix(".py") if len(rest) > 1 or rest[0] != "__init__.py" else "")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/")[0].removesuffix(".py")
    if path.startswith("~") or path.startswith("<"):
        return "builtins"
    return "stdlib:" + Path(path).stem if "/lib/python" in path else "other"


def profile_tables(prof: cProfile.Profile, per: int, top: int = 20) -> dict:
    stats = pstats.Stats(prof)
    groups: dict[str, float] = {}
    rows = []
    for (filename, line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        g = group_of(filename)
        if g.startswith("stdlib:"):
            g = "stdlib"
        groups[g] = groups.get(g, 0.0) + tottime
        rows.append((tottime, f"{Path(filename).name}:{line} {func}", group_of(filename)))
    total = sum(groups.values()) or 1.0
    return {"own_time_by_group_s": {g: round(t / per, 4) for g, t in sorted(groups.items(), key=lambda kv: -kv[1])
                                    if t / total >= 0.005},
            "top_functions": [{"own_s": round(t / per, 4), "function": f, "group": g}
                              for t, f, g in sorted(rows, reverse=True)[:top]],
            "profiled_s": round(total / per, 4)}


class Opened:
    """Every connection a BMC client opens in this process, and its TLS handshakes (full or resumed)."""

    def __init__(self):
        from mctl.bmc import client as client_mod

        self.connections = self.handshakes = 0
        real = client_mod.RedfishClient._opened
        me = self

        def opened(client, sock):
            me.connections += 1
            me.handshakes += hasattr(sock, "version")         # an ssl.SSLSocket
            return real(client, sock)

        client_mod.RedfishClient._opened = opened

    def mark(self) -> tuple[int, int]:
        return self.connections, self.handshakes


def vmrss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def by_thread_table(t0: dict, t1: dict, names: dict, cpu: float, sweeps: int) -> dict:
    by_thread: dict[str, float] = {}
    live = 0
    for tid, ticks in t1.items():
        used = ticks - t0.get(tid, 0)
        live += used
        name = names.get(tid, f"thread {tid}")
        name = "event loop (main)" if tid == os.getpid() else name.rstrip("0123456789-_ ") or name
        by_thread[name] = by_thread.get(name, 0.0) + used / HZ
    ended = max(0.0, cpu - live / HZ)
    table = {k: round(v / sweeps, 4) for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v > 0}
    table["threads that ended during the run"] = round(ended / sweeps, 4)
    return table


def watch_profile(site_dir: Path, state: Path, sweeps: int, interval: float, opened: Opened) -> dict:
    """The watch's sweeps: BMC reads beside them on their cadence, the sweeps paced at *interval*."""
    from mctl.bmc import client as client_mod
    from mctl.health.engine import Engine
    from mctl.health.site_view import resolve_scope, settings_of
    from mctl.inventory import load_site
    from mctl.transport import SSHConfig, SSHPool

    site = load_site(str(site_dir))
    unreached: list[int] = []                       # trays not reached, per sweep

    async def main():
        async with SSHPool(SSHConfig.from_site(site)) as pool:
            engine = Engine(site, resolve_scope(site, None), settings_of(site), state, pool, interval=interval,
                            bmc_watch=True)
            try:
                bmcs = len(engine.bmc_hosts) if engine.bmc_watch is not None else 0
                until = time.monotonic() + 120
                while engine.bmc_watch is not None and time.monotonic() < until:      # every BMC answered once
                    views = engine.bmc_watch.views()
                    if all(v.answered for v in views.values()):
                        break
                    await asyncio.sleep(0.5)
                await engine.sweep()
                await asyncio.sleep(interval)
                names0 = {t.native_id: t.name for t in threading.enumerate()}
                reads0 = engine.bmc_watch.reads if engine.bmc_watch is not None else 0
                conn0 = opened.mark()
                ticks0, cpu0, wall0 = thread_ticks(), time.process_time(), time.monotonic()
                walls, rss = [], [vmrss_mib()]
                for i in range(sweeps):
                    t0 = time.monotonic()
                    res = await engine.sweep()
                    walls.append(time.monotonic() - t0)
                    unreached.append(sum(1 for f in res.facts.values() if not f.reached))
                    rss.append(vmrss_mib())
                    await asyncio.sleep(max(0.0, wall0 + (i + 1) * interval - time.monotonic()))
                ticks1, cpu1, wall1 = thread_ticks(), time.process_time(), time.monotonic()
                names = {**names0, **{t.native_id: t.name for t in threading.enumerate()}}
                conn1 = opened.mark()
                reads = (engine.bmc_watch.reads if engine.bmc_watch is not None else 0) - reads0
                held = sum(1 for s in engine.bmc_watch.reader.slots.values() if s.client is not None) \
                    if engine.bmc_watch is not None else 0
                subscribed = sum(1 for s in engine.bmc_watch.reader.slots.values()
                                 if getattr(s, "sub", None) is not None) if engine.bmc_watch is not None else 0
            finally:
                engine.close()
            return (walls, ticks0, ticks1, names, cpu1 - cpu0, wall1 - wall0, rss, conn1[0] - conn0[0],
                    conn1[1] - conn0[1], reads, bmcs, held, subscribed)

    walls, t0, t1, names, cpu, wall, rss, conns, shakes, reads, bmcs, held, subscribed = asyncio.run(main())
    trays = len(resolve_scope(site, None).hosts)
    return {"sweeps": sweeps, "interval_s": interval, "window_s": round(wall, 1), "trays": trays, "bmcs": bmcs,
            "median_wall_s": round(statistics.median(walls), 3), "max_wall_s": round(max(walls), 3),
            "cpu_per_sweep_s": round(cpu / sweeps, 4),
            "cpu_per_tray_per_sweep_ms": round(1000 * cpu / sweeps / max(1, trays), 3),
            "cpu_by_thread_per_sweep_s": by_thread_table(t0, t1, names, cpu, sweeps),
            "trays_unreached_per_sweep": unreached,
            "bmc_reads_per_sweep": round(reads / sweeps, 2),
            "bmc_connections_opened": conns, "tls_handshakes": shakes,
            "tls_handshakes_per_sweep": round(shakes / sweeps, 3), "bmc_clients_held_at_end": held,
            "bmc_subscriptions": subscribed,
            "ssl_contexts": len(getattr(client_mod, "_CONTEXTS", {})),
            "vmrss_mib": {"first": round(rss[0], 1), "last": round(rss[-1], 1), "max": round(max(rss), 1),
                          "at_quarter": round(rss[len(rss) // 4], 1)}}


def sweep_profile(site_dir: Path, state: Path, sweeps: int, opened: Opened | None = None) -> dict:
    from mctl.health.engine import Engine
    from mctl.health.site_view import resolve_scope, settings_of
    from mctl.inventory import load_site
    from mctl.transport import SSHConfig, SSHPool

    site = load_site(str(site_dir))
    prof = cProfile.Profile(time.thread_time)       # the event loop's own CPU, not wall time (a loaded machine)

    async def main():
        async with SSHPool(SSHConfig.from_site(site)) as pool:
            engine = Engine(site, resolve_scope(site, None), settings_of(site), state, pool)
            await engine.sweep()
            names0 = {t.native_id: t.name for t in threading.enumerate()}
            conn0 = opened.mark() if opened is not None else (0, 0)
            ticks0, cpu0, wall0 = thread_ticks(), time.process_time(), time.perf_counter()
            walls = []
            for _ in range(sweeps):               # measured without the profiler (its cost is per call)
                t0 = time.perf_counter()
                await engine.sweep()
                walls.append(time.perf_counter() - t0)
            ticks1, cpu1 = thread_ticks(), time.process_time()
            conn1 = opened.mark() if opened is not None else (0, 0)
            names = {**names0, **{t.native_id: t.name for t in threading.enumerate()}}
            for _ in range(sweeps):               # then the same number again under the profiler, for where
                prof.enable()
                await engine.sweep()
                prof.disable()
            return (walls, ticks0, ticks1, names, cpu1 - cpu0, time.perf_counter() - wall0,
                    conn1[1] - conn0[1])

    walls, t0, t1, names, cpu, _wall, shakes = asyncio.run(main())
    trays = len(resolve_scope(site, None).hosts)
    return {"sweeps": sweeps, "median_wall_s": round(statistics.median(walls), 3),
            "cpu_per_sweep_s": round(cpu / sweeps, 4),
            "cpu_per_tray_per_sweep_ms": round(1000 * cpu / sweeps / max(1, trays), 3),
            "tls_handshakes_per_sweep": round(shakes / sweeps, 3),
            "cpu_by_thread_per_sweep_s": by_thread_table(t0, t1, names, cpu, sweeps),
            "event_loop_profile": profile_tables(prof, sweeps)}


def inventory_profile(site_dir: Path, state: Path, rounds: int) -> dict:
    from mctl.cli.main import main as cli_main

    rack = next(iter(__import__("yaml").safe_load((site_dir / "mctl.yml").read_text())["racks"]))
    argv = ["-i", str(site_dir), "--state-dir", str(state), "--json", "rack", "inventory", rack]
    prof = cProfile.Profile(time.thread_time)       # the main thread's CPU (the CLI runs its event loop there)
    cpus = []
    import contextlib
    import io

    for i in range(2 * rounds + 1):             # a warm-up, *rounds* measured, *rounds* under the profiler
        c0 = time.process_time()
        if i > rounds:
            prof.enable()
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli_main(argv)
        if rc not in (0, 1):            # 1: findings; anything else is not a measurement
            raise SystemExit(f"rack inventory exited {rc}: {err.getvalue()[-1000:]}")
        if i > rounds:
            prof.disable()
        elif i:
            cpus.append(time.process_time() - c0)
    return {"rounds": rounds, "median_cpu_s": round(statistics.median(cpus), 4),
            "profile": profile_tables(prof, rounds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", type=Path, help="a lab folder with Slurm deployed (else an 18-tray one is started)")
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parts", default="sweep,inventory",
                    help="comma-separated: sweep (health check's way), inventory, watch (the watch's way)")
    ap.add_argument("--watch-interval", type=float, default=5.0, help="the watch part's interval (seconds)")
    ap.add_argument("--watch-sweeps", type=int, default=24)
    ap.add_argument("--bmc-events", action="store_true",
                    help="the watch part with health.bmc_events on (receiver on 127.0.0.1): subscribed BMCs are "
                         "polled at the BMC health cadence, their leak events read at once")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("the lab needs root\n")
        return 2
    from bench.health_bench import site_copy, start_lab

    workdir = Path(tempfile.mkdtemp(prefix="mctl-profile-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(workdir / "state"), NO_COLOR="1")
    started = None
    load = [os.getloadavg()[0]]
    try:
        lab_dir = args.lab.resolve() if args.lab else None
        if lab_dir is None:
            lab_dir = started = start_lab(args.trays, workdir, env)
        site_dir = site_copy(lab_dir, workdir, 5.0)
        load.append(os.getloadavg()[0])
        parts = set(args.parts.split(","))
        opened = Opened()
        report = {"tree": str(REPO), "trays": args.trays}
        if "sweep" in parts:
            report["sweep"] = sweep_profile(site_dir, workdir / "state", args.sweeps, opened)
        if "inventory" in parts:
            report["inventory"] = inventory_profile(site_dir, workdir / "state-inv", args.rounds)
        if "watch" in parts:
            watch_site = site_copy(lab_dir, workdir / "w", args.watch_interval)
            if args.bmc_events:                 # issue 29.3: the BMCs push leak events; their poll is the fallback
                import yaml

                doc = yaml.safe_load((watch_site / "mctl.yml").read_text())
                doc["health"]["bmc_events"] = {"listen": "127.0.0.1"}
                (watch_site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
            report["watch"] = watch_profile(watch_site, workdir / "state-watch", args.watch_sweeps,
                                            args.watch_interval, opened)
        load.append(os.getloadavg()[0])
        report["loadavg_1m"] = {"lab_ready": load[1], "end": load[2]}
    finally:
        if started is not None:
            from mctl.lab import control

            control.down(started)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        if "sweep" in report:
            s = report["sweep"]
            print(f"sweep: {s['cpu_per_sweep_s']} s CPU ({s['cpu_per_tray_per_sweep_ms']} ms a tray), median wall "
                  f"{s['median_wall_s']} s, {s['tls_handshakes_per_sweep']} TLS handshakes; by thread: "
                  f"{s['cpu_by_thread_per_sweep_s']}")
            print(f"  event loop by group: {s['event_loop_profile']['own_time_by_group_s']}")
        if "inventory" in report:
            i = report["inventory"]
            print(f"inventory: {i['median_cpu_s']} s CPU; by group: {i['profile']['own_time_by_group_s']}")
        if "watch" in report:
            w = report["watch"]
            print(f"watch: {w['cpu_per_sweep_s']} s CPU a sweep ({w['cpu_per_tray_per_sweep_ms']} ms a tray), "
                  f"{w['tls_handshakes_per_sweep']} TLS handshakes a sweep, {w['bmc_reads_per_sweep']} BMC reads; "
                  f"VmRSS {w['vmrss_mib']}; by thread: {w['cpu_by_thread_per_sweep_s']}")
        print(f"load {report['loadavg_1m']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
