#!/usr/bin/env python3
"""Chaos soak: `mctl health watch --remediate` on a lab rack with real Slurm while a seeded schedule of faults runs.

The real watch (`mctl health watch --interval I --remediate`, a subprocess, plain log lines) runs
on an N-tray lab rack with Slurm deployed. A schedule drawn from --seed injects and clears the lab
faults (docs/lab.md "Faults") on several trays at once: GPU faults that must drain (XID 79, a GPU
fallen off the bus, an NVLink down), tray faults that must drain after the unreachable misses
(freeze, hang, nvidia-smi hang), faults that may drain (a flapping link, an XID storm, slurmd
down), faults that must never drain (slow commands below the deadline, sshd restarted, a reboot,
the IMEX daemon killed, a non-fatal XID), the scheduler (slurmctld killed and kept down), the
rack's NMX-M (500, timeout, slow) and a `kill -9` of the watch, restarted a few seconds later on
the same state directory. One tray is drained by "an operator" at the start (reason `ops: ...`).

Checked throughout and reported (JSON with --out, a summary on stdout):
  sweeps          duration of every sweep the watch printed (max, p99, over interval + 2 s)
  fault_to_drain  for every must-drain fault, injection to Slurm showing the tray drained with an
                  `mctl:` reason (p50, p99, max), GPU faults and unreachable faults apart. When Slurm
                  showed it is the earlier of two upper bounds: the end of the first poll that shows
                  the drain (polls are ~1 s apart), and the drain's reason time (`sinfo %H`, whole
                  seconds, so + 1 s); never earlier than the drain can have happened
  false_drains    mctl drains of trays that had no fault that may drain (nor its after-effects)
  flaps           drain/resume cycles per tray that had a flapping link
  breaker         trips, and the most trays drained within the window against the threshold
  lost_actions    every drain and resume Slurm showed, and every DRAIN/RESUME/SKIP the watch
                  printed, matched by an action-log line (state dir health/actions.jsonl, or
                  the tray's own node check's log, NODE_CHECK_LOG: Slurm's HealthCheckProgram
                  drains and resumes with mctl: reasons too), across the kill -9; a drain a
                  SIGKILLed slurmctld lost in its restart (it restores its last saved state) is
                  reported apart, and counts only where the watch logged that it noticed it;
                  so is a drain it brought back after mctl had resumed it (the watch logs "adopt")
  final           once every fault is cleared: each tray mctl drained is resumed, the operator
                  drain is untouched
  rss             the watch's VmRSS (/proc/PID/status) over the soak, per process

    sudo python3 bench/chaos.py                                   # 18 trays, 10 min, seed 1
    sudo python3 bench/chaos.py --trays 18 --minutes 30 --seed 7 --out chaos.json
    sudo python3 bench/chaos.py --lab /var/lib/mctl/lab           # a lab with Slurm deployed

Exit 0 when every invariant holds and the targets are met, 1 when one is missed, 2 on a setup
problem. The bench always clears its faults, stops the watch and takes down the lab it started.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_SWEEP = re.compile(r" SWEEP   #(\d+): .* (\d+\.\d+)s$")
_EVENT = re.compile(r"^\S+ \S+ (DRAIN|RESUME|SKIP)\s+(\S+) ")
OPERATOR_REASON = "ops: chaos operator drain"
# Where a tray's node check (mctl.health.node_check, run by slurmd) logs what it did
NODE_CHECK_LOG = "/var/lib/mctl-node-check/health/actions.jsonl"

# fault kind -> (class, FaultRequest fields given a GPU index)
#   drain: must drain within one sweep (confirm_sweeps 1); unreach: must drain after the misses;
#   may: may drain, must resume after; none: a drain is a false drain.
KINDS = {
    "xid79": ("drain", lambda g: {"xid": 79, "gpu": g}),
    "fell_off_bus": ("drain", lambda g: {"fell_off_bus": True, "gpu": g}),
    "nvlink_down": ("drain", lambda g: {"nvlink_down": f"{g}:{g + 2}"}),
    "freeze": ("unreach", lambda g: {"unreachable": True}),
    "hang": ("unreach", lambda g: {"hang": True}),
    "smi_hang": ("unreach", lambda g: {"smi_hang": True}),
    "nvlink_flap": ("may", lambda g: {"nvlink_flap": f"{g}:1"}),
    "xid_storm": ("may", lambda g: {"xid_storm": 145, "gpu": g, "nonfatal": True}),
    "slurmd_down": ("may", lambda g: {"slurmd_down": True}),
    "slow": ("none", lambda g: {"slow": 1.0}),
    "sshd_restart": ("none", lambda g: {"sshd_restart": True}),
    "reboot": ("none", lambda g: {"reboot": True}),
    "imex_crash": ("none", lambda g: {"imex_crash": True}),
    "xid_nonfatal": ("none", lambda g: {"xid": 145, "gpu": g, "nonfatal": True}),
}
EVENTS = {"sshd_restart", "reboot"}       # one-shot: nothing to clear


def chaos_health(interval: float, share: float, window: str) -> dict:
    """The `health:` block the soak's watch runs with (short, so a 10-minute soak sees many cycles)."""
    return {"interval": interval, "resume_after_healthy_sweeps": 1, "unreachable_sweeps_before_drain": 2,
            "xid_window": "20s", "imex": "ignore",
            "breaker": {"max_drained_share": share, "window": window},
            "hysteresis": {"clear_sweeps": 1, "window_sweeps": 4, "max_hold_sweeps": 8}}


def write_site(inventory: Path, folder: Path, health: dict) -> Path:
    import yaml

    doc = yaml.safe_load(Path(inventory).read_text())
    doc["health"] = health
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


@dataclass
class Fault:
    start: float                     # seconds from the soak's start
    end: float
    kind: str
    cls: str
    tray: str | None = None
    request: dict = field(default_factory=dict)
    injected: float | None = None    # monotonic, before the call
    cleared: float | None = None
    drained: float | None = None     # monotonic, first Slurm poll showing it drained by mctl
    overlaps: list[str] = field(default_factory=list)   # scheduler down / watch killed while it waited
    error: str | None = None
    deferred_s: float = 0.0          # how long its injection waited for room in the safety budget


DRAINABLE = ("drain", "unreach", "may")     # the fault classes that take (or may take) their tray out of service


COMMON_HOLD_SWEEPS = 3          # how long the common-mode fault stays on every tray, in intervals


def common_at(seconds: float, interval: float) -> float:
    """When the common-mode fault starts: after the single faults, early enough that its drains are resumed
    before the soak ends (the trays' XID window, then a healthy sweep)."""
    return seconds - 6 * interval


def schedule(rng: random.Random, trays: list[str], seconds: float, interval: float,
             max_concurrent: int, *, common: bool = False,
             bmc: bool = False) -> tuple[list[Fault], list[Fault]]:
    """(tray faults, global faults) for a soak of *seconds*: a new tray fault every ~1.5 intervals while
    fewer than *max_concurrent* run; each tray rests after a fault (its XID window, the hold) before the
    next. Globals: slurmctld down at 30 %, NMX-M faults at 15 % and 60 %, kill -9 of the watch at 45 %;
    with *bmc* a hung BMC at 20 % and a slow one at 55 % (6 intervals each, on trays drawn from the seed);
    with *common* the same critical fault on every tray at once, every tray's node check started at that
    instant (common_at(), COMMON_HOLD_SWEEPS), the single faults ending 2 intervals before it."""
    kinds = list(KINDS)
    weights = [3 if KINDS[k][0] == "drain" else 2 if KINDS[k][0] == "unreach" else 1 for k in kinds]
    rest = 20 + 10 * interval
    faults: list[Fault] = []
    busy_until = {t: 0.0 for t in trays}
    t = 2 * interval
    stop = seconds - 6 * interval            # the last faults end before the final clear
    if common:
        stop = common_at(seconds, interval) - 2 * interval
    # a BMC fault's tray has no other fault around it (its drain would hide the BMC's finding from the status
    # line): (tray, from, to) in which no tray fault of that tray may run, its rest included
    bmc_faults: list[Fault] = []
    if bmc:
        hung, slow = rng.sample(trays, 2) if len(trays) > 1 else (trays[0], trays[0])
        bmc_faults = [Fault(0.2 * seconds, 0.2 * seconds + 6 * interval, "bmc_hang", "bmc", hung, {"hang": True}),
                      Fault(0.55 * seconds, 0.55 * seconds + 6 * interval, "bmc_slow", "bmc", slow,
                            {"slow": 2 * interval})]
    blocked = [(f.tray, f.start - 2 * interval, f.end + 2 * interval) for f in bmc_faults]
    while t < stop:
        running = [f for f in faults if f.start <= t < f.end]
        free = [x for x in trays if busy_until[x] <= t
                and not any(x == b and t <= b1 and t + 8 * interval + rest >= b0 for b, b0, b1 in blocked)]
        if len(running) < max_concurrent and free:
            kind = rng.choices(kinds, weights)[0]
            cls = KINDS[kind][0]
            hold = 0.0 if kind in EVENTS else rng.uniform(4, 8) * interval
            tray = rng.choice(free)
            if t + hold > stop:              # never cut a fault short: an unreachable one needs its misses
                t += rng.uniform(1.0, 2.0) * interval
                continue
            end = t + hold
            faults.append(Fault(t, end, kind, cls, tray, KINDS[kind][1](rng.randrange(4))))
            busy_until[tray] = end + rest
        t += rng.uniform(1.0, 2.0) * interval
    globals_ = [Fault(0.3 * seconds, 0.3 * seconds + 4 * interval, "slurmctld_down", "sched"),
                Fault(0.15 * seconds, 0.15 * seconds + 6 * interval, "nmx", "nmx", request={"kind": "500"}),
                Fault(0.6 * seconds, 0.6 * seconds + 6 * interval, "nmx", "nmx",
                      request={"kind": rng.choice(["timeout", "slow"])}),
                Fault(0.45 * seconds, 0.45 * seconds + 3, "kill9", "kill")]
    globals_ += bmc_faults
    if common:
        at = common_at(seconds, interval)
        globals_.append(Fault(at, at + COMMON_HOLD_SWEEPS * interval, "common_xid79", "common",
                              request={"xid": 79, "gpu": 0}))
    return faults, globals_


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 3)


class WatchProc:
    """One `mctl health watch` process: its stdout lines (with arrival times) and VmRSS samples."""

    def __init__(self, argv: list[str], env: dict):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     stdin=subprocess.DEVNULL, bufsize=1)
        self.lines: list[tuple[float, str]] = []
        self.rss: list[tuple[float, int]] = []
        self.threads: dict[float, int] = {}          # at the same times: the process's thread count
        self.started = time.monotonic()
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._errs = threading.Thread(target=self._read_err, daemon=True)
        self._errs.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _read_err(self):
        self.stderr = self.proc.stderr.read()

    def sample_rss(self) -> None:
        try:
            now = time.monotonic()
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.rss.append((now, int(line.split()[1])))
                elif line.startswith("Threads:"):
                    self.threads[now] = int(line.split()[1])
        except OSError:
            pass

    def sweeps(self) -> list[float]:
        return [float(m[2]) for m in (_SWEEP.search(l) for _, l in self.lines) if m]

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        self._errs.join(timeout=10)


class Soak:
    """The soak on a running lab with Slurm deployed. `run()` returns the report; it always cleans up its
    faults, its watch and its operator drain (the lab itself is the caller's)."""

    def __init__(self, lab_dir: Path, inventory: Path, workdir: Path, *, seconds: float, seed: int,
                 interval: float = 5.0, share: float = 0.5, window: str = "1m", max_concurrent: int | None = None,
                 common: bool = True, bmc: bool = True, env: dict | None = None, log=None):
        from mctl.inventory import load_site

        self.lab_dir, self.workdir, self.seconds, self.seed, self.interval = lab_dir, workdir, seconds, seed, interval
        self.share, self.window = share, window
        self.health = chaos_health(interval, share, window)
        self.inventory = inventory
        self.site_dir = write_site(inventory, workdir / "chaos-site", self.health)
        self.state = workdir / "chaos-state"
        site = load_site(str(self.site_dir))
        rack = next(iter(site.racks.values()))
        self.rack, self.head = rack.name, rack.head.name
        self.trays = [h.name for h in rack.compute]
        self.operator_tray = self.trays[-1]
        self.faultable = [t for t in self.trays if t != self.operator_tray]
        # the site's safety budget: how many of the rack's trays mctl may hold out of service at once
        self.budget_limit = min(site.safety.budget.rack_limit(len(self.trays)),
                                site.safety.budget.site_limit(len(self.trays)))
        # the single faults stay inside it (a drain lingers a sweep or two after its fault is cleared): what
        # trips the budget is the common-mode fault, on purpose
        self.max_concurrent = max_concurrent or max(1, min(len(self.trays) // 4, self.budget_limit - 1))
        self.common, self.bmc = common, bmc
        self.common_span: tuple[float, float] | None = None     # monotonic: injected, cleared
        self.node_checks: dict[str, str] = {}                    # tray -> what its node check printed
        self.common_resets: list[str] = []
        # the person's part: every `mctl health breaker reset` the soak played, and why (the budget's trips)
        self.resets: list[dict] = []
        self.ledger = None                               # the budget's ledger at the last poll (a BudgetView)
        self._common_on = False                          # the common-mode fault injected (its trip is on purpose)
        self.tripped_seen: float | None = None           # monotonic: a trip outside the common-mode fault first seen
        self.trips_outside_common: list[dict] = []       # the budget's trips the single faults caused
        # the single faults end before the common-mode fault (as schedule() draws them); one whose injection
        # waited for room in the budget and would run past this is skipped, and reported
        self.single_stop = (common_at(seconds, interval) - 2 * interval) if common else seconds - 6 * interval
        # slurmd's HealthCheckInterval, after the common-mode fault: the node checks that drained a tray resume
        # it themselves on a later healthy run (the watch holds a node check's drain as someone else's)
        self.rechecks: list[dict[str, str]] = []     # per round: tray -> what its node check printed
        self.next_recheck: float | None = None
        self.env = dict(env or os.environ, NO_COLOR="1")
        self.log = log or (lambda m: sys.stderr.write(f"[chaos] {m}\n"))
        self.watches: list[WatchProc] = []
        self.loads: list[float] = []            # the machine's 1-minute load average, once a second
        self.polls: list[tuple[float, dict[str, tuple[str, str]]]] = []
        self.reason_at: dict[str, float] = {}        # per node, its current reason's time (monotonic clock)
        self.poll_errors = 0
        self._stop = threading.Event()
        self.t0 = 0.0
        self.sched_down: list[tuple[float, float]] = []
        self.kills: list[tuple[float, float]] = []
        self.operator_resumes: list[str] = []
        self.rebooted: dict[str, float] = {}
        self.node_check_lines: dict[str, int] = {}   # per tray: its node check's log length at the start

    # --- the lab -----------------------------------------------------------------------------------
    def ssh(self, host: str, cmd: str, timeout: float = 20) -> subprocess.CompletedProcess:
        from mctl.lab import control

        argv = control.ssh_argv(self.lab_dir, host, [cmd], tty=False)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def node_check_log(self, tray: str) -> list[dict] | None:
        """The action log of the tray's own node check (Slurm's HealthCheckProgram drains and resumes with
        the same mctl: reasons as the watch: a second actor whose actions are logged on the tray)."""
        try:
            out = self.ssh(tray, f"cat {NODE_CHECK_LOG} 2>/dev/null; true")
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        entries = []
        for line in out.stdout.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries

    def sinfo(self) -> dict[str, tuple[str, str]] | None:
        """Slurm's nodes (node -> (state, reason)); the safety budget's ledger, read in the same command, goes
        to self.ledger (its grants and its trip: mctl.sched.slurm.budget)."""
        from mctl.sched.slurm import budget

        try:
            out = self.ssh(self.head, "TZ=UTC sinfo -h -N -o '%N|%T|%H|%E' && "
                                      f"{{ echo {budget.RESERVATIONS_MARK}; {budget.SHOW_RESERVATIONS} 2>/dev/null; "
                                      "true; }", timeout=10)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        text, mark, ledger = out.stdout.partition(budget.RESERVATIONS_MARK + "\n")
        if mark:
            self.ledger = budget.parse_reservations(ledger)
        rows = [l.split("|", 3) for l in text.splitlines() if l.count("|") >= 3]
        offset = time.time() - time.monotonic()
        for n, _, stamp, _ in rows:
            try:     # the reason's time, in UTC (TZ above), whole seconds
                when = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc).timestamp()
                self.reason_at[n] = when - offset
            except ValueError:         # "Unknown": no reason
                self.reason_at.pop(n, None)
        return {n: (s, "" if r == "none" or not any(w in s for w in ("drain", "down", "fail")) else r)
                for n, s, _, r in rows}

    def fault(self, host: str, **request) -> None:
        from mctl.lab import control
        from mctl.lab.faults import FaultRequest

        control.fault(self.lab_dir, host, FaultRequest(**request))

    def nmx(self, kind: str) -> None:
        from mctl.lab import nmx_faults

        nmx_faults.apply(self.lab_dir, self.rack, kind)

    def clear_everything(self) -> None:
        for host in [self.head, *self.trays]:
            try:
                self.fault(host, clear=True)
            except Exception as exc:          # cleanup goes on with the next host
                self.log(f"clear {host}: {exc}")
        try:
            self.nmx("clear")
        except Exception as exc:
            self.log(f"nmx clear: {exc}")

    # --- threads -----------------------------------------------------------------------------------
    def _poller(self) -> None:
        while not self._stop.is_set():
            nodes = self.sinfo()
            if nodes is None:
                self.poll_errors += 1
            else:
                self.polls.append((time.monotonic(), nodes))
                self._operator_after_reboot(nodes)
            for w in self.watches[-1:]:
                w.sample_rss()
            self.loads.append(os.getloadavg()[0])
            self._stop.wait(1.0)

    def start_watch(self) -> WatchProc:
        argv = [sys.executable, "-m", "mctl", "-i", str(self.site_dir), "--state-dir", str(self.state),
                "health", "watch", "--interval", f"{self.interval:g}", "--remediate"]
        w = WatchProc(argv, self.env)
        self.watches.append(w)
        return w

    def wait(self, what: str, check, timeout: float, every: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(every)

    def mctl_drained(self, nodes: dict) -> set[str]:
        return {n for n, (s, r) in nodes.items() if "drain" in s and r.startswith("mctl:")}

    # --- the soak ----------------------------------------------------------------------------------
    def run(self) -> dict:
        rng = random.Random(self.seed)
        faults, globals_ = schedule(rng, self.faultable, self.seconds, self.interval, self.max_concurrent,
                                    common=self.common, bmc=self.bmc)
        self.log(f"{len(faults)} tray faults and {len(globals_)} others over {self.seconds:g}s, seed {self.seed}, "
                 f"{len(self.trays)} trays, at most {self.max_concurrent} at once")
        poller = threading.Thread(target=self._poller, daemon=True)
        final: dict = {}
        rolled = False
        try:
            nodes = self.wait("Slurm answering", self.sinfo, 60)
            held = self.mctl_drained(nodes)
            if held:
                raise SystemExit(f"trays already drained by mctl before the soak: {sorted(held)}")
            # The trays' own node check (Slurm's HealthCheckProgram) judges with the site's health settings, as
            # provisioned: roll the soak's out to it, as an operator's change of `health:` would be (else it keeps
            # the lab's 1-hour XID window, drains a tray the watch resumed and never lets it go).
            self.roll_out_node_check(self.site_dir)
            rolled = True
            out = self.ssh(self.head, f"scontrol update NodeName={self.operator_tray} State=DRAIN "
                                      f"Reason='{OPERATOR_REASON}'")
            if out.returncode != 0:
                raise SystemExit(f"operator drain failed: {out.stderr}")
            for t in self.trays:
                self.node_check_lines[t] = len(self.node_check_log(t) or [])
            poller.start()
            self.start_watch()
            self.wait("the watch's first sweep", lambda: self.watches[-1].sweeps(),
                      60 + 3 * self.interval, every=0.5)
            self.t0 = time.monotonic()
            self._play(faults, globals_)
            final = self._finish(faults)
        finally:
            self._stop.set()
            for w in self.watches:
                w.stop()
            for i, w in enumerate(self.watches):     # what each watch printed, for a look afterwards
                (self.workdir / f"watch-{i + 1}.log").write_text(
                    "".join(line + "\n" for _, line in w.lines) + w.stderr)
                (self.workdir / f"watch-{i + 1}.rss").write_text(      # seconds from the soak's start, VmRSS kB, threads
                    "".join(f"{at - self.t0:.1f}\t{kb}\t{w.threads.get(at, '')}\n" for at, kb in w.rss))
            self.clear_everything()
            if self.common:       # the lab as the soak found it: the budget not tripped
                subprocess.run([sys.executable, "-m", "mctl", "-i", str(self.site_dir), "--state-dir",
                                str(self.state), "health", "breaker", "reset"], capture_output=True, env=self.env,
                               timeout=120, stdin=subprocess.DEVNULL)
            if poller.is_alive():
                poller.join(timeout=30)
            self.ssh(self.head, f"scontrol update NodeName={self.operator_tray} State=RESUME", timeout=30)
            nodes = self.sinfo() or {}
            rebooted = {n for n, (st, r) in nodes.items() if "down" in st and "reboot" in r.lower()}
            for n in sorted(self.mctl_drained(nodes) | rebooted):       # the lab as the soak found it
                self.ssh(self.head, f"scontrol update NodeName={n} State=RESUME", timeout=30)
            if rolled:
                self.roll_out_node_check(self.inventory, check=False)
        return self.report(faults, globals_, final)

    def roll_out_node_check(self, inventory: Path, *, check: bool = True) -> None:
        """The trays' node-check configuration rendered from *inventory* (`mctl provision --tags health`)."""
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "mctl", "-i", str(inventory), "provision", self.rack,
                               "--tags", "health"], capture_output=True, text=True, env=self.env, timeout=900,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            msg = f"node-check roll-out from {inventory} failed ({proc.returncode}): {proc.stderr[-2000:]}"
            if check:
                raise SystemExit(msg)
            self.log(msg)
        else:
            self.log(f"node-check settings from {inventory} rolled out in {time.monotonic() - started:.1f}s")

    def _play(self, faults: list[Fault], globals_: list[Fault]) -> None:
        seq = itertools.count()
        steps: list[tuple[float, int, int, Fault]] = []
        for f in faults + globals_:
            steps.append((f.start, 0, next(seq), f))
            if f.kind not in EVENTS:
                steps.append((f.end, 1, next(seq), f))
        heapq.heapify(steps)
        while steps:
            at, is_clear, _, f = heapq.heappop(steps)
            if is_clear and f.end > at:              # its injection waited for the budget: so does its clear
                heapq.heappush(steps, (f.end, 1, next(seq), f))
                continue
            delay = self.t0 + at - time.monotonic()
            while delay > 0:
                self._check_drains(faults)
                self._health_check_interval()
                self._person_resets()
                time.sleep(min(delay, 0.5))
                delay = self.t0 + at - time.monotonic()
            if is_clear and f.cls not in ("kill", "nmx", "sched") and f.injected is None:
                continue                             # its injection was skipped or refused
            if not is_clear and f.cls in DRAINABLE:
                full = self._budget_full(f, faults)
                if full is not None:
                    # No room in the safety budget for the drain this fault needs (the trays still drained count,
                    # not only the faults active): wait for resumes, keeping the fault's hold.
                    step = 1.0
                    if f.end + step > self.single_stop:
                        f.error = f"skipped: waited {f.deferred_s:.0f}s for room in the safety budget ({full})"
                        self.log(f"{f.kind} on {f.tray}: {f.error}")
                        continue
                    f.start, f.end, f.deferred_s = f.start + step, f.end + step, f.deferred_s + step
                    heapq.heappush(steps, (f.start, 0, next(seq), f))
                    continue
            try:
                self._step(f, bool(is_clear))
            except Exception as exc:                # a fault the lab refused: reported, the soak goes on
                f.error = f"{'clear' if is_clear else 'inject'}: {exc}"
                self.log(f"{f.kind} on {f.tray}: {f.error}")
        deadline = self.t0 + self.seconds
        while time.monotonic() < deadline:
            self._check_drains(faults)
            self._health_check_interval()
            self._person_resets()
            time.sleep(0.5)

    def _budget_full(self, f: Fault, faults: list[Fault]) -> str | None:
        """Why *f* may not be injected now (None: it may): with it, more trays could be out of service by mctl's
        decision than the safety budget allows at once. Counted: the trays Slurm shows drained by mctl, those
        holding a grant in the budget's ledger, and those whose fault may still drain them (injected and not
        cleared, or cleared under 2 intervals ago and not drained); the fault's own tray must be back in service."""
        nodes = self.polls[-1][1] if self.polls else {}
        now = time.monotonic()
        busy = self.mctl_drained(nodes) | set(self.ledger.grants if self.ledger is not None else ())
        busy |= {g.tray for g in faults if g.cls in DRAINABLE and g.injected and g.tray and
                 (g.cleared is None or (g.drained is None and now - g.cleared < 2 * self.interval))}
        state = nodes.get(f.tray or "", ("", ""))[0]
        if f.tray in busy or any(w in state for w in ("drain", "down")):
            return f"{f.tray} is not back in service yet ({state or 'faulted'})"
        if len(busy) + 1 > self.budget_limit:
            return f"{len(busy)} trays out of service or faulted, the budget allows {self.budget_limit}"
        return None

    def _person_resets(self) -> None:
        """The person's part when the safety budget tripped outside the common-mode fault (the single faults
        should never trip it: each trip is recorded and reported): they look, then reset it, two intervals after
        the soak first saw the trip, so the later faults are judged."""
        if self.ledger is None or self.ledger.tripped is None or self.common_span is not None or self._common_on:
            self.tripped_seen = None
            return
        now = time.monotonic()
        if self.tripped_seen is None:
            self.tripped_seen = now
            self.trips_outside_common.append({"at_s": round(now - self.t0, 1), "tripped": self.ledger.tripped,
                                              "grants": sorted(self.ledger.grants)})
            self.log(f"{now - self.t0:7.1f}s the safety budget tripped outside the common-mode fault: "
                     f"{self.ledger.tripped}")
            return
        if now - self.tripped_seen >= 2 * self.interval:
            self._reset("the safety budget tripped outside the common-mode fault: " + self.ledger.tripped)
            self.tripped_seen = None
            self.ledger = None          # read again at the next poll

    def _reset(self, why: str) -> dict:
        """`mctl health breaker reset`, as a person runs it once they looked; recorded."""
        at = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "mctl", "-i", str(self.site_dir), "--state-dir",
                               str(self.state), "health", "breaker", "reset"], capture_output=True, text=True,
                              env=self.env, timeout=120, stdin=subprocess.DEVNULL)
        said = (proc.stdout + proc.stderr).strip()[-300:]
        entry = {"at_s": round(at - self.t0, 1), "why": why, "rc": proc.returncode, "said": said}
        self.resets.append(entry)
        self.log(f"{at - self.t0:7.1f}s the person's reset (rc {proc.returncode}): {said}")
        return entry

    def _step(self, f: Fault, clear: bool) -> None:
        now = time.monotonic()
        where = f.tray or self.head
        self.log(f"{now - self.t0:7.1f}s {'clear ' if clear else 'inject'} {f.kind} {f.tray or ''} "
                 f"{f.request if not clear else ''}")
        if f.cls == "kill":
            if not clear:
                self.watches[-1].kill9()
                f.injected = now
            else:
                self.start_watch()
                f.cleared = now
                self.kills.append((f.injected, now))
            return
        if f.cls == "bmc":
            from mctl.lab import bmc_faults

            bmc_faults.apply(self.lab_dir, f.tray, clear=True) if clear else \
                bmc_faults.apply(self.lab_dir, f.tray, **f.request)
            if clear:
                f.cleared = time.monotonic()
            else:
                f.injected = now
            return
        if f.cls == "common":
            self._common(f, clear)
            return
        if f.cls == "nmx":
            self.nmx("clear" if clear else f.request["kind"])
        elif f.cls == "sched":
            self.fault(where, **({"clear": True} if clear else {"slurmctld_down": True}))
        elif clear:
            self.fault(where, clear=True)
        else:
            last = self.polls[-1][1] if self.polls else {}
            st = last.get(f.tray, ("", ""))[0]
            if f.tray in self.mctl_drained(last) or any(w in st for w in ("drain", "down")):
                # a drain of an earlier fault still holds (its hold, its XID window): a fault now would
                # measure nothing; the schedule stays the seed's, this step is reported as skipped
                f.error = f"skipped: the tray is {st} in Slurm (an earlier fault's drain, a reboot)"
                return
            f.injected = now
            self.fault(where, **f.request)
            if f.kind == "reboot":
                f.end = time.monotonic() - self.t0
        if clear:
            f.cleared = time.monotonic()
            if f.cls == "sched":
                self.sched_down.append((f.injected or now, f.cleared))
        elif f.cls == "sched":
            f.injected = now
        if f.kind == "reboot" and not clear:
            # the operator's part after a reboot: slurmctld marks the node DOWN (unexpectedly rebooted)
            # some time after it registers again; the poller resumes it then (for 120 s)
            self.rebooted[f.tray] = time.monotonic() + 120

    def _common(self, f: Fault, clear: bool) -> None:
        """The common-mode fault: the same critical fault on every faultable tray at one instant (a bad driver
        push, an IMEX configuration, a bug in a check), then every tray's node check started together, as
        slurmd runs HealthCheckProgram; the watch sees it at its next sweep. Cleared: the faults lifted, then
        the person's part, `mctl health breaker reset` (a tripped budget stays tripped until a person looks)."""
        trays = self.faultable

        def each(fn, items):
            threads = [threading.Thread(target=fn, args=(x,)) for x in items]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=120)

        if clear:
            each(lambda t: self.fault(t, clear=True), trays)
            f.cleared = time.monotonic()
            self.common_span = (f.injected or f.cleared, f.cleared)
            tripped = self.ledger.tripped if self.ledger is not None else None
            r = self._reset(f"after the common-mode fault, cleared; the budget "
                            f"{'tripped: ' + tripped if tripped else 'was not seen tripped at the last poll'}")
            self.common_resets.append(f"rc {r['rc']}: {r['said']}")
            self.next_recheck = time.monotonic() + 2 * self.interval
            return
        self._common_on = True
        f.injected = time.monotonic()
        each(lambda t: self.fault(t, **f.request), trays)
        start = threading.Barrier(len(self.trays))

        def check(tray: str) -> None:
            try:
                start.wait(timeout=60)
                self.node_checks[tray] = self.ssh(tray, "/usr/local/sbin/mctl-node-check; echo rc=$?",
                                                  timeout=120).stdout
            except (subprocess.TimeoutExpired, threading.BrokenBarrierError) as exc:
                self.node_checks[tray] = f"not run: {exc!r}"

        each(check, self.trays)

    def _health_check_interval(self) -> None:
        """As slurmd runs HealthCheckProgram every HealthCheckInterval: once the common-mode fault is cleared, every
        tray's node check runs again every two intervals (together, as slurmd's do), so the drains the node checks
        made are resumed by them once healthy (resume_after_healthy_sweeps runs; the XID window passed)."""
        if self.next_recheck is None or time.monotonic() < self.next_recheck:
            return
        said: dict[str, str] = {}

        def check(tray: str) -> None:
            try:
                said[tray] = self.ssh(tray, "/usr/local/sbin/mctl-node-check; echo rc=$?", timeout=90).stdout
            except subprocess.TimeoutExpired as exc:
                said[tray] = f"not run: {exc!r}"

        threads = [threading.Thread(target=check, args=(t,)) for t in self.trays]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        self.rechecks.append(said)
        self.next_recheck = time.monotonic() + 2 * self.interval

    def _operator_after_reboot(self, nodes: dict) -> None:
        for tray, until in list(self.rebooted.items()):
            s, r = nodes.get(tray, ("", ""))
            if "down" in s and "reboot" in r.lower():
                self.ssh(self.head, f"scontrol update NodeName={tray} State=RESUME", timeout=30)
                self.operator_resumes.append(tray)
                del self.rebooted[tray]
            elif time.monotonic() > until:
                del self.rebooted[tray]

    def _check_drains(self, faults: list[Fault]) -> None:
        if not self.polls:
            return
        at, nodes = self.polls[-1]
        drained = self.mctl_drained(nodes)
        for f in faults:
            if f.cls in ("drain", "unreach") and f.injected and f.drained is None and f.tray in drained:
                # the first poll after the injection that shows it
                first = next((t for t, n in self.polls if t >= f.injected and f.tray in self.mctl_drained(n)), at)
                stamped = self.reason_at.get(f.tray)      # seen in this poll, so this drain's (whole seconds)
                if stamped is not None and f.injected <= stamped + 1.0 < first and first == at:
                    first = stamped + 1.0
                f.drained = first

    def _finish(self, faults: list[Fault]) -> dict:
        """Clear everything, then wait (with a deadline) for every mctl drain to be resumed."""
        self.clear_everything()
        cleared = time.monotonic()
        for f in faults:
            if f.cleared is None and f.kind not in EVENTS:
                f.cleared = cleared
        limit = 20 + (8 + 4) * self.interval + 60
        ok, err = True, None
        try:
            def resumed() -> bool:
                self._health_check_interval()
                return bool(self.polls and self.polls[-1][0] > cleared and not self.mctl_drained(self.polls[-1][1]))

            self.wait("every mctl drain resumed", resumed, limit)
        except TimeoutError as exc:
            ok, err = False, str(exc)
        time.sleep(2 * self.interval)            # one more sweep, so a late action shows
        nodes = self.polls[-1][1] if self.polls else {}
        op = nodes.get(self.operator_tray, ("", ""))
        return {"all_resumed": ok, "error": err, "seconds_to_resume_all": round(time.monotonic() - cleared, 1),
                "still_drained_by_mctl": sorted(self.mctl_drained(nodes)),
                "operator_drain": {"tray": self.operator_tray, "state": op[0], "reason": op[1],
                                   "untouched": "drain" in op[0] and op[1] == OPERATOR_REASON}}

    # --- the figures -------------------------------------------------------------------------------
    def transitions(self) -> dict[str, list[tuple[float, str]]]:
        """Per tray, the drains and resumes by mctl Slurm showed: (time, 'drain'|'resume')."""
        out: dict[str, list[tuple[float, str]]] = {t: [] for t in self.trays}
        prev: set[str] = set()
        for at, nodes in self.polls:
            now = self.mctl_drained(nodes)
            for t in sorted(now - prev):
                out.setdefault(t, []).append((at, "drain"))
            for t in sorted(prev - now):
                out.setdefault(t, []).append((at, "resume"))
            prev = now
        return out

    def across_outages(self) -> tuple[dict[str, int], dict[str, list[float]]]:
        """mctl drains that changed across a slurmctld outage, from the last poll before it to the first after:
        (per tray, how many vanished; per tray, the times of those that appeared). A SIGKILLed slurmctld
        comes back from its last saved state: it can lose a drain it had accepted seconds before (nobody
        resumed those trays), or bring back a drain mctl had resumed since that save (D56)."""
        dropped: dict[str, int] = {}
        back: dict[str, list[float]] = {}
        prev_at, prev = None, set()
        for at, nodes in self.polls:
            now = self.mctl_drained(nodes)
            if prev_at is not None and any(prev_at <= b and at >= a for a, b in self.sched_down):
                for t in prev - now:
                    dropped[t] = dropped.get(t, 0) + 1
                for t in now - prev:
                    back.setdefault(t, []).append(at)
            prev_at, prev = at, now
        return dropped, back

    def report(self, faults: list[Fault], globals_: list[Fault], final: dict) -> dict:
        from mctl.health import store

        from mctl.model.settings import parse_duration

        entries = [e.to_dict() for e in store.read_actions(self.state, damaged=[])]
        ok = [e for e in entries if e.get("result") == "ok"]
        logged = {t: {"drain": 0, "resume": 0, "skip": 0} for t in self.trays}
        logged_any = {t: {"drain": 0, "resume": 0, "skip": 0} for t in self.trays}   # any result: what was printed
        for e in entries:
            if e.get("tray") in logged_any and e.get("action") in ("drain", "resume", "skip"):
                logged_any[e["tray"]][e["action"]] += 1
            if e.get("tray") in logged and e.get("action") in ("drain", "resume") and e.get("result") == "ok":
                logged[e["tray"]][e["action"]] += 1
            if e.get("tray") in logged and e.get("action") == "skip":
                logged[e["tray"]]["skip"] += 1
        by_node_check = {t: {"drain": 0, "resume": 0} for t in self.trays}
        for t in self.trays:
            for e in (self.node_check_log(t) or [])[self.node_check_lines.get(t, 0):]:
                if e.get("tray") == t and e.get("action") in ("drain", "resume") and e.get("result") == "ok":
                    logged[t][e["action"]] += 1
                    by_node_check[t][e["action"]] += 1
        seen = self.transitions()
        printed = {t: {"drain": 0, "resume": 0, "skip": 0} for t in self.trays}
        for w in self.watches:
            for _, line in w.lines:
                m = _EVENT.match(line)
                if m and m[2] in printed:
                    printed[m[2]][m[1].lower()] += 1
        # A drain lifted by someone else than mctl (slurmctld losing it across its own SIGKILL and restart is
        # the one such actor in the soak) is matched by the watch's own action-log line for it: "forget ...
        # resumed outside mctl", logged when its drain was gone without its resume. Each forget accounts for
        # one resume transition of its tray; a resume with neither a resume nor a forget line is lost.
        # The drains that vanished across a polled outage are reported apart (dropped_by_slurmctld_restart).
        forgets = {t: sum(1 for e in entries if e.get("tray") == t and e.get("action") == "forget")
                   for t in self.trays}
        vanished, back = self.across_outages()
        dropped = {t: min(n, forgets.get(t, 0)) for t, n in vanished.items()}
        # The other way round: a resume the restarted slurmctld lost brings back the drain mctl had lifted
        # (D56). The watch logs "adopt" when it sees its own drain back; each adopt accounts for one drain
        # transition of its tray that has no drain line (reported apart: restored_by_slurmctld_restart).
        adopts = {t: sum(1 for e in entries if e.get("tray") == t and e.get("action") == "adopt")
                  for t in self.trays}
        restored: dict[str, int] = {}
        lost = []
        for t in self.trays:
            for action in ("drain", "resume"):
                n_slurm = sum(1 for _, a in seen[t] if a == action)
                if action == "resume":
                    n_slurm -= min(forgets.get(t, 0), max(0, n_slurm - logged[t][action]))   # only the excess
                else:
                    restored[t] = min(adopts.get(t, 0), len(back.get(t, [])), max(0, n_slurm - logged[t][action]))
                    n_slurm -= restored[t]
                if n_slurm != logged[t][action]:
                    lost.append(f"{t}: Slurm showed {n_slurm} {action}(s) by mctl, the action log has "
                                f"{logged[t][action]}")
            for action in ("drain", "resume", "skip"):
                if printed[t][action] > logged_any[t][action]:
                    lost.append(f"{t}: the watch printed {printed[t][action]} {action}(s), the action log has "
                                f"{logged_any[t][action]}")
        # false drains: a drain of a tray with no fault that may drain, nor its after-effects, at that time
        grace = 20 + (8 + 3) * self.interval
        false = []
        for t, events in seen.items():
            for at, action in events:
                if action != "drain" or (restored.get(t) and at in back.get(t, [])):
                    continue            # a drain slurmctld's restart brought back is not a new one
                cause = [f for f in faults if f.tray == t and f.cls in ("drain", "unreach", "may") and f.injected
                         and f.injected - 2 <= at <= (f.cleared or at) + grace]
                common = self.common_span and t in self.faultable and \
                    self.common_span[0] - 2 <= at <= self.common_span[1] + grace
                if not cause and not common:
                    false.append({"tray": t, "at_s": round(at - self.t0, 1),
                                  "faults": [f"{f.kind}@{f.start:.0f}s" for f in faults if f.tray == t]})
        # fault-to-drain
        def ftd(cls: str) -> dict:
            done = [f for f in faults if f.cls == cls and f.injected and not f.error]
            clean = [f.drained - f.injected for f in done if f.drained and not self._overlap(f)]
            disturbed = [f.drained - f.injected for f in done if f.drained and self._overlap(f)]
            missed = [f"{f.kind} {f.tray} @{f.start:.0f}s" for f in done if f.drained is None and not self._overlap(f)]
            # a fault that lasted no longer than a scheduler outage or a watch restart may end before its drain
            excused = [f"{f.kind} {f.tray} @{f.start:.0f}s" for f in done if f.drained is None and self._overlap(f)]
            return {"faults": len(done), "drained": len(clean) + len(disturbed), "missed": missed,
                    "not_drained_during_outage": excused,
                    "p50_s": pct(clean, 0.5), "p99_s": pct(clean, 0.99), "max_s": pct(clean, 1.0),
                    "samples_s": [round(x, 2) for x in sorted(clean)],
                    "by_fault": [f"{f.kind} {f.tray} @{f.start:.0f}s: "
                                 f"{'%.2fs' % (f.drained - f.injected) if f.drained else 'not drained'}"
                                 f"{' (outage/kill)' if self._overlap(f) else ''}" for f in done],
                    "during_scheduler_outage_or_watch_kill_s": [round(x, 2) for x in sorted(disturbed)]}
        # flaps
        flaps = {}
        for f in faults:
            if f.kind == "nvlink_flap" and f.injected:
                ev = [a for at, a in seen[f.tray] if f.injected - 2 <= at <= (f.cleared or at) + grace]
                flaps[f"{f.tray}@{f.start:.0f}s"] = {"drains": ev.count("drain"), "resumes": ev.count("resume"),
                                                     "held_s": round((f.cleared or 0) - f.injected, 1)}
        # breaker
        window_s = parse_duration(self.window)
        allowed = math.floor(self.share * len(self.trays) + 1e-9)
        drains = sorted((e["time"], e["tray"]) for e in ok if e.get("action") == "drain")

        ts = [(datetime.fromisoformat(t).timestamp(), h) for t, h in drains]
        most = max((len({h for t2, h in ts if t - window_s <= t2 <= t}) for t, _ in ts), default=0)
        trips = [e for e in entries if e.get("action") == "breaker-trip"]
        # sweeps and memory
        durations = [d for w in self.watches for d in w.sweeps()]
        bound = self.interval + 2
        rss = []
        for i, w in enumerate(self.watches):
            samples = [kb for at, kb in w.rss if at - w.started > 3 * self.interval]
            if samples:
                rss.append({"process": i + 1, "samples": len(samples), "first_mib": round(samples[0] / 1024, 1),
                            "max_mib": round(max(samples) / 1024, 1), "last_mib": round(samples[-1] / 1024, 1),
                            "growth_mib": round((samples[-1] - samples[0]) / 1024, 1),
                            "minutes": round((w.rss[-1][0] - w.started) / 60, 1)})
        growth = max((r["growth_mib"] for r in rss), default=None)
        # the safety budget: the most trays of the rack out of service by mctl's decision at any poll (Slurm
        # showing them drained with an mctl: reason), against its limit; and during the common-mode fault
        out_of_service = [(at, len(self.mctl_drained(nodes))) for at, nodes in self.polls]
        most_at = max(out_of_service, key=lambda x: x[1], default=(self.t0, 0))
        span = self.common_span
        during = [n for at, n in out_of_service if span and span[0] <= at <= span[1] + grace]
        refused = sorted(t for t, said in self.node_checks.items() if "held back by the safety budget" in said)
        budget_trips = [e for e in entries if e.get("action") == "budget-trip"]
        budget = {"rack_limit": self.budget_limit, "most_out_of_service_by_mctl": most_at[1],
                  "most_at_s": round(most_at[0] - self.t0, 1),
                  "trips_by_the_single_faults": self.trips_outside_common,
                  "resets_by_the_person": self.resets,
                  "single_faults_deferred_for_room": sum(1 for f in faults if f.deferred_s > 0),
                  "single_faults_skipped_for_room": [f"{f.kind} {f.tray}" for f in faults
                                                     if f.error and "room in the safety budget" in f.error],
                  "common_mode": None if not self.common else {
                      "trays_faulted": len(self.faultable), "node_checks_started": len(self.node_checks),
                      "most_out_of_service_by_mctl": max(during, default=None),
                      "node_checks_refused_by_the_budget": refused,
                      "node_checks_not_run": sorted(t for t, said in self.node_checks.items()
                                                    if said.startswith("not run")),
                      "budget_trip_lines_in_the_watch_log": len(budget_trips),
                      "reset_by_the_person": self.common_resets,
                      "budget_tripped_at_its_reset": any("budget tripped" in r["why"] for r in self.resets
                                                         if r["why"].startswith("after the common-mode")),
                      "node_check_rounds_after_clearing": len(self.rechecks)}}
        # BMC faults: every sweep during them within the bound, the tray's view named stale by the watch
        bmc_faults_ = []
        for f in globals_:
            if f.cls != "bmc" or not f.injected:
                continue
            end = f.cleared or time.monotonic()
            during_sweeps = [float(m[2]) for w in self.watches for at, line in w.lines
                             if f.injected <= at <= end and (m := _SWEEP.search(line))]
            stale = any(f.injected <= at <= end + 2 * self.interval and "bmc.stale" in line and f.tray in line
                        for w in self.watches for at, line in w.lines)
            bmc_faults_.append({"fault": f.kind, "tray": f.tray, "seconds": round(end - f.injected, 1),
                                "sweeps": len(during_sweeps), "max_sweep_s": max(during_sweeps, default=None),
                                "named_stale": stale})
        gpu, unreach = ftd("drain"), ftd("unreach")
        result = {
            "conditions": {"trays": len(self.trays), "seconds": self.seconds, "seed": self.seed,
                           "interval_s": self.interval, "health": self.health, "cpus": os.cpu_count(),
                           "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                           "loadavg_1m_during": {"min": pct(self.loads, 0.0), "p50": pct(self.loads, 0.5),
                                                 "max": pct(self.loads, 1.0)},
                           "max_concurrent_tray_faults": self.max_concurrent,
                           "faults_by_kind": {k: sum(f.kind == k for f in faults) for k in KINDS},
                           "fault_errors": [f"{f.kind} {f.tray}: {f.error}" for f in faults + globals_ if f.error],
                           "operator_resumes_after_reboot": self.operator_resumes,
                           "slurm_polls": len(self.polls), "slurm_poll_failures": self.poll_errors},
            "sweeps": {"count": len(durations), "max_s": pct(durations, 1.0), "p99_s": pct(durations, 0.99),
                       "p50_s": pct(durations, 0.5), "bound_s": bound,
                       "over_bound": sum(d > bound for d in durations)},
            "fault_to_drain": {"gpu": gpu, "unreachable": unreach,
                               "target_gpu_s": self.interval + 2,
                               "target_unreachable_s": 2 * self.interval + self.interval + 2},
            "false_drains": false,
            "flaps": flaps,
            "breaker": {"trips": len(trips), "allowed_trays_in_window": allowed, "window": self.window,
                        "most_trays_drained_in_window": most,
                        "consistent": (most <= allowed) and (bool(trips) <= (most >= allowed))},
            "actions": {"logged": len(entries), "by_action": {a: sum(e.get("action") == a for e in entries)
                                                              for a in ("drain", "resume", "skip", "queue", "forget", "adopt",
                                                                        "breaker-trip")},
                        "lost": lost, "by_node_check": {t: n for t, n in by_node_check.items() if any(n.values())},
                        "dropped_by_slurmctld_restart": {t: n for t, n in dropped.items() if n},
                        "restored_by_slurmctld_restart": {t: n for t, n in restored.items() if n},
                        "watch_processes": len(self.watches),
                        "kill9_at_s": [round(a - self.t0, 1) for a, _ in self.kills]},
            "final": final,
            "rss": {"per_process": rss, "max_growth_mib": growth},
            "budget": budget,
            "bmc_faults": bmc_faults_,
        }
        result["invariants"] = {
            "sweep_max_le_interval_plus_2s": not durations or max(durations) <= bound,
            "fault_to_drain_p99_le_interval_plus_2s": gpu["p99_s"] is None or gpu["p99_s"] <= self.interval + 2,
            "every_must_drain_fault_drained": not gpu["missed"] and not unreach["missed"],
            "no_false_drains": not false,
            "no_lost_actions": not lost,
            "breaker_consistent": result["breaker"]["consistent"],
            "all_mctl_drains_resumed": bool(final.get("all_resumed")),
            "operator_drain_untouched": bool(final.get("operator_drain", {}).get("untouched")),
            "rss_growth_lt_10mib": growth is None or growth < 10,
            "never_past_the_safety_budget": most_at[1] <= self.budget_limit,
            # the single faults are played inside the budget: only the deliberate common-mode fault trips it
            "single_faults_never_trip_the_budget": not self.trips_outside_common,
            "bmc_faults_never_stretch_a_sweep": all(b["max_sweep_s"] is None or b["max_sweep_s"] <= bound
                                                    for b in bmc_faults_),
        }
        result["workdir"] = str(self.workdir)
        return result

    def _overlap(self, f: Fault) -> bool:
        end = f.drained or f.cleared or time.monotonic()
        spans = self.sched_down + self.kills
        return any(a <= end and b >= f.injected for a, b in spans)


def summary(r: dict) -> str:
    c, s, ftd = r["conditions"], r["sweeps"], r["fault_to_drain"]
    lines = [f"chaos soak: {c['trays']} trays, {c['seconds'] / 60:.1f} min, seed {c['seed']}, interval "
             f"{c['interval_s']:g}s, {sum(c['faults_by_kind'].values())} tray faults "
             f"(at most {c['max_concurrent_tray_faults']} at once), load {c['loadavg_end']} on {c['cpus']} CPUs "
             f"(1-min load during: {c['loadavg_1m_during']}); files in {r.get('workdir')}",
             f"  sweeps: {s['count']}, max {s['max_s']}s, p99 {s['p99_s']}s, p50 {s['p50_s']}s; "
             f"{s['over_bound']} over {s['bound_s']:g}s"]
    for name in ("gpu", "unreachable"):
        d = ftd[name]
        lines.append(f"  fault-to-drain ({name}): {d['drained']}/{d['faults']} drained, p50 {d['p50_s']}s, "
                     f"p99 {d['p99_s']}s, max {d['max_s']}s; missed {d['missed'] or 'none'}; "
                     f"during an outage/kill {d['during_scheduler_outage_or_watch_kill_s']}")
    lines.append(f"  false drains: {len(r['false_drains'])} {r['false_drains'] or ''}")
    lines.append(f"  flapping trays (drains/resumes): "
                 f"{ {k: (v['drains'], v['resumes']) for k, v in r['flaps'].items()} or 'none'}")
    b = r["breaker"]
    lines.append(f"  breaker: {b['trips']} trips; at most {b['most_trays_drained_in_window']} trays drained within "
                 f"{b['window']}, threshold {b['allowed_trays_in_window']}")
    a = r["actions"]
    lines.append(f"  actions logged: {a['by_action']} (and by the trays' node checks: {a.get('by_node_check') or 'none'}; "
                 f"drains slurmctld lost in its restart, seen by the watch: {a.get('dropped_by_slurmctld_restart') or 'none'}; "
                 f"drains it brought back, adopted by the watch: {a.get('restored_by_slurmctld_restart') or 'none'}); "
                 f"lost: {len(a['lost'])} {a['lost'] or ''}; "
                 f"{a['watch_processes']} watch processes (kill -9 at {a['kill9_at_s']}s)")
    f = r["final"]
    lines.append(f"  after clearing: all mctl drains resumed: {f.get('all_resumed')} "
                 f"({f.get('seconds_to_resume_all')}s); operator drain untouched: "
                 f"{f.get('operator_drain', {}).get('untouched')}")
    lines.append(f"  watch VmRSS: {r['rss']['per_process']}")
    bud = r["budget"]
    lines.append(f"  safety budget: at most {bud['most_out_of_service_by_mctl']} trays out of service by mctl "
                 f"(at {bud['most_at_s']}s), limit {bud['rack_limit']}; single faults that waited for room "
                 f"{bud['single_faults_deferred_for_room']}, skipped for want of it "
                 f"{bud['single_faults_skipped_for_room'] or 'none'}; trips by the single faults "
                 f"{bud['trips_by_the_single_faults'] or 'none'}; the person's resets "
                 f"{[(r['at_s'], r['rc']) for r in bud['resets_by_the_person']]}")
    cm = bud.get("common_mode")
    if cm:
        lines.append(f"  common-mode fault on {cm['trays_faulted']} trays, {cm['node_checks_started']} node checks "
                     f"at once: at most {cm['most_out_of_service_by_mctl']} out of service; refused by the budget: "
                     f"{len(cm['node_checks_refused_by_the_budget'])}; budget-trip lines {cm['budget_trip_lines_in_the_watch_log']}"
                     f"; not run: {cm['node_checks_not_run'] or 'none'}; node-check rounds after clearing "
                     f"(slurmd's HealthCheckInterval): {cm['node_check_rounds_after_clearing']}")
    for b in r["bmc_faults"]:
        lines.append(f"  {b['fault']} on {b['tray']} for {b['seconds']}s: {b['sweeps']} sweeps, max {b['max_sweep_s']}s, "
                     f"named bmc.stale: {b['named_stale']}")
    lines.append("  invariants: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in r["invariants"].items()))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", type=Path, help="an existing lab folder with Slurm deployed (else one is started)")
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("the lab needs root\n")
        return 2
    if args.trays < 3 or args.minutes <= 0 or args.interval < 1:
        sys.stderr.write("--trays >= 3, --minutes > 0, --interval >= 1\n")
        return 2
    from bench.health_bench import start_lab

    workdir = Path(tempfile.mkdtemp(prefix="mctl-chaos-"))
    env = dict(os.environ, MCTL_STATE_DIR=str(workdir / "state"), NO_COLOR="1")
    started = None
    try:
        if args.lab:
            lab_dir = args.lab.resolve()
        else:
            lab_dir = started = start_lab(args.trays, workdir, env)
        soak = Soak(lab_dir, lab_dir / "mctl.yml", workdir, seconds=args.minutes * 60, seed=args.seed,
                    interval=args.interval, env=env)
        report = soak.run()
    finally:
        if started is not None:
            from mctl.lab import control

            control.down(started)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))
    return 0 if all(report["invariants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
