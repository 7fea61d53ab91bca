"""Failover of the watch's leader lease on real etcd (issue 29.7): how long the standby takes to lead after the
leader is killed (SIGKILL) or paused (SIGSTOP), over many rounds, and whether any act ever came twice.

Two processes of tests/failover/actor.py (the real Elector and Actuator: one act per interval on a shared
effects file, each act fenced) against one etcd on 127.0.0.1 (the one scripts/install builds, or MCTL_ETCD).
Each round: the leader is killed or paused, the time until the standby says it leads is taken, then the old
leader is ended and a new standby started. Printed: min / median / max takeover, the bound (ttl + ttl/4), the
acts and whether their tokens ever went back (a double action), the load average before and after.

python bench/failover_bench.py --rounds 10 --interval 2 --ttl 2 [--mode kill|stop]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.failover.etcd import Etcd, end, etcd_binary          # noqa: E402
from tests.helpers import wait_for                              # noqa: E402
import tests.integration.test_failover as tf                     # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--ttl", type=int, default=2)
    p.add_argument("--mode", choices=("kill", "stop"), default="kill")
    a = p.parse_args()
    binary = etcd_binary()
    if binary is None:
        print("no etcd binary (scripts/install, or MCTL_ETCD)", file=sys.stderr)
        return 2
    tf.INTERVAL, tf.TTL = a.interval, a.ttl
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mctl-failover-bench-") as tmp:
        root = Path(tmp)
        (root / "etcd").mkdir()
        etcd = Etcd(binary, root / "etcd")
        effects = root / "effects.jsonl"
        takeovers: list[float] = []
        watches: list[tf.Watch] = []
        try:
            leader = tf.Watch("w0", etcd.url, "/bench/watch/site", root, effects)
            watches.append(leader)
            wait_for("w0 leads", lambda: tf.leading(leader), 30, every=0.05)
            for n in range(1, a.rounds + 1):
                standby = tf.Watch(f"w{n}", etcd.url, "/bench/watch/site", root, effects)
                watches.append(standby)
                wait_for(f"w{n} is the standby", lambda: standby.said("lease", "standby"), 30, every=0.05)
                os.kill(leader.proc.pid, signal.SIGKILL if a.mode == "kill" else signal.SIGSTOP)
                t0 = time.time()
                wait_for(f"w{n} leads", lambda: tf.leading(standby), 60, every=0.02)
                takeovers.append(standby.said("lease", "leading")[0]["t"] - t0)
                wait_for(f"w{n} acts", lambda: any(e["who"] == standby.who for e in tf.effects(effects)), 30,
                         every=0.05)
                end(leader.proc)
                leader = standby
            acts = tf.assert_no_double_actions(effects)
        finally:
            for w in watches:
                end(w.proc)
            etcd.stop()
    load1 = os.getloadavg()[0]
    bound = a.ttl + a.ttl / 4
    print(f"mode {a.mode}, {a.rounds} rounds, interval {a.interval:g}s, ttl {a.ttl}s (bound ttl + ttl/4 = {bound:g}s, "
          f"two intervals = {2 * a.interval:g}s)")
    print(f"takeover: min {min(takeovers):.2f}s, median {statistics.median(takeovers):.2f}s, "
          f"max {max(takeovers):.2f}s")
    print(f"acts {len(acts)}, tokens never went back, one watch per token: zero double actions")
    print(f"load average (1 min): {load0:.1f} -> {load1:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
