"""A watch's acting side, run as its own process by tests/integration/test_failover.py: the real leader lease
(mctl.health.failover.Elector on real etcd) and the real actuator (mctl.health.actuator.Actuator, fence and
action log), acting every interval on a shared resource file that stands for the site (one line per act,
with the acting watch's name and fencing token). Only the effect is a stand-in: the tests look at who
acted when, not at Slurm.

python -m tests.failover.actor --etcd URL --key KEY --who NAME --state DIR --effects FILE --interval S --ttl N
Prints one JSON line per lease change and per act (flushed), for the test to wait on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from mctl.health.actuator import Act, Actuator, Done
from mctl.health.failover import Elector, Fenced
from mctl.health import store
from mctl.model.drain import DRAIN, Decision
from mctl.state.etcd import EtcdClient


def say(**data) -> None:
    print(json.dumps({"t": time.time(), **data}), flush=True)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--etcd", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--who", required=True)
    p.add_argument("--state", required=True, type=Path)
    p.add_argument("--effects", required=True, type=Path)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--ttl", type=int, default=2)
    a = p.parse_args()
    elector = Elector(EtcdClient([a.etcd], timeout=1.0), a.key, a.who, a.ttl,
                      on_change=lambda text: say(event="lease", text=text))
    actuator = Actuator(a.state, a.who, fence=elector.fence)
    n = 0
    while True:
        t0 = time.monotonic()
        if await asyncio.to_thread(elector.campaign):
            n += 1
            token = elector.token

            async def effect(go, n=n, token=token) -> Done:
                with a.effects.open("a") as f:       # the site's side: one line per act that reached it
                    f.write(json.dumps({"who": a.who, "token": token, "n": n, "t": time.time()}) + "\n")
                return Done("ok")

            act = Act(Decision(f"tray{n % 4}", DRAIN, "failover test", reason="mctl: test", at=time.time()),
                      run=effect)
            try:
                await actuator.run(store.load_state(a.state), [act])
                say(event="acted", token=token, n=n)
            except Fenced as exc:
                say(event="fenced", token=exc.token, text=exc.message)
        await asyncio.sleep(max(0.0, (a.interval if elector.leading else elector.poll) - (time.monotonic() - t0)))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
