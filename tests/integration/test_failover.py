"""Failover of the watch on real etcd v3 (issue 29.7; mctl/health/failover.py, docs/health.md "Failover").

Two watch processes (tests/failover/actor.py: the real Elector and Actuator, one act per interval on a
shared effects file) campaign for one key of a real etcd on 127.0.0.1. The leader is killed with SIGKILL,
paused with SIGSTOP, or cut off from etcd (a relay in front of etcd closed); the standby takes over within
two intervals, and the effects file shows zero double actions: no act of an older token after one of a
newer, and none by the old leader once it lost the lease. Interval 2 s, lease TTL 2 s (etcd's shortest);
every wait is for a state, under a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mctl.health.actuator import Act, Actuator, Done
from mctl.health.failover import FENCED, Elector, Fenced
from mctl.health import store
from mctl.model.drain import DRAIN, Decision
from mctl.state.etcd import EtcdClient
from tests.failover.etcd import Etcd, Relay, end, etcd_binary
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
INTERVAL, TTL = 2.0, 2


@pytest.fixture(scope="module")
def etcd(processes, sockets, tmp_path_factory):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (scripts/install builds one into /var/cache/mctl/kube-apiserver; or set "
                    "MCTL_ETCD, or apt-get install etcd-server)")
    server = Etcd(binary, tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


class Watch:
    """One actor process and what it said."""

    def __init__(self, who: str, url: str, key: str, tmp: Path, effects: Path):
        self.who, self.lines = who, []
        self.state = tmp / f"state-{who}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.failover.actor", "--etcd", url, "--key", key, "--who", who,
             "--state", str(self.state), "--effects", str(effects), "--interval", str(INTERVAL), "--ttl", str(TTL)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"t": time.time(), "event": "output", "text": line.rstrip()})

    def said(self, event: str, text: str = "") -> list[dict]:
        return [x for x in self.lines if x.get("event") == event and text in x.get("text", "")]

    def log(self) -> list[dict]:
        return [e.to_dict() for e in store.read_actions(self.state)] if self.state.exists() else []

    def stop(self) -> None:
        end(self.proc)


@pytest.fixture
def pair(etcd, tmp_path, request):
    effects = tmp_path / "effects.jsonl"
    key = f"/mctl-test/{request.node.name}/watch/site"
    started: list[Watch] = []

    def start(who: str, url: str | None = None) -> Watch:
        w = Watch(who, url or etcd.url, key, tmp_path, effects)
        started.append(w)
        return w

    start.effects = effects
    yield start
    for w in started:
        w.stop()
    print("\n".join(f"{w.who}: {x}" for w in started for x in w.lines))


def effects(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def assert_no_double_actions(path: Path) -> list[dict]:
    """Every act on the site came from one leader at a time: tokens never go back, one watch per token."""
    acts = effects(path)
    tokens = [a["token"] for a in acts]
    assert tokens == sorted(tokens), f"an older token acted after a newer one: {acts}"
    owners: dict[int, str] = {}
    for a in acts:
        assert owners.setdefault(a["token"], a["who"]) == a["who"], f"two watches under token {a['token']}: {acts}"
    return acts


def leading(w: Watch) -> bool:
    return bool(w.said("lease", "leading"))


def test_kill_9_of_the_leader_the_standby_takes_over_within_two_intervals(pair):
    a = pair("a")
    wait_for("a leads and acts", lambda: any(e["who"] == "a" for e in effects(pair.effects)), 30, every=0.1)
    b = pair("b")
    wait_for("b is the standby", lambda: b.said("lease", "standby"), 30, every=0.1)
    assert not leading(b)
    a.proc.kill()
    killed = time.time()
    wait_for("b leads", lambda: leading(b), 30, every=0.05)
    took = b.said("lease", "leading")[0]["t"] - killed
    assert took <= 2 * INTERVAL, f"b took over {took:.2f}s after a was killed (more than two intervals)"
    wait_for("b acts", lambda: any(e["who"] == "b" for e in effects(pair.effects)), 30, every=0.1)
    acts = assert_no_double_actions(pair.effects)
    assert {e["who"] for e in acts} == {"a", "b"}
    # the action log of each carries the token on its intent and result lines
    for w in (a, b):
        lines = [e for e in w.log() if e["action"] in ("intent", DRAIN)]
        assert lines and all(isinstance(e.get("fence"), int) for e in lines), lines


def test_a_paused_leader_never_acts_after_the_standby_took_over(pair):
    a = pair("a")
    wait_for("a leads and acts", lambda: any(e["who"] == "a" for e in effects(pair.effects)), 30, every=0.1)
    b = pair("b")
    wait_for("b is the standby", lambda: b.said("lease", "standby"), 30, every=0.1)
    os.kill(a.proc.pid, signal.SIGSTOP)
    wait_for("b leads and acts", lambda: any(e["who"] == "b" for e in effects(pair.effects)), 30, every=0.1)
    took_over = min(e["t"] for e in effects(pair.effects) if e["who"] == "b")
    seen = len(a.lines)
    os.kill(a.proc.pid, signal.SIGCONT)
    # a, resumed, finds out it lost the lease: by its fence (refused and logged) or its renewal
    wait_for("a, resumed, gives up the lease", lambda: any(
        x.get("event") == "fenced" or "lost the lease" in x.get("text", "") for x in a.lines[seen:]), 30, every=0.1)
    wait_for("b acts again after a resumed", lambda: sum(e["who"] == "b" for e in effects(pair.effects)) >= 3,
             30, every=0.1)
    acts = assert_no_double_actions(pair.effects)
    assert not [e for e in acts if e["who"] == "a" and e["t"] > took_over], acts
    assert leading(b) and b.proc.poll() is None
    fenced = [e for e in a.log() if e["action"] == FENCED]
    if a.said("fenced"):                  # refused at the fence: logged, with the token it had (none, when its
        # renewal had already found the lease lost: the line then has no fence field)
        assert fenced and fenced[-1]["result"].startswith("refused:") and fenced[-1].get("fence") == \
            a.said("fenced")[-1]["token"], fenced


def test_a_leader_cut_off_from_etcd_stops_acting_and_the_standby_takes_over(pair, etcd):
    relay = Relay(etcd.client)
    a = pair("a", relay.url)
    wait_for("a leads and acts", lambda: any(e["who"] == "a" for e in effects(pair.effects)), 30, every=0.1)
    b = pair("b")
    wait_for("b is the standby", lambda: b.said("lease", "standby"), 30, every=0.1)
    relay.cut()
    wait_for("b leads", lambda: leading(b), 30, every=0.05)
    took = b.said("lease", "leading")[0]["t"] - relay.cut_at
    assert took <= 2 * INTERVAL, f"b took over {took:.2f}s after a lost etcd"
    wait_for("a stops: its fence or its renewal refuses", lambda: a.said("fenced") or a.said("lease", "lost"),
             30, every=0.1)
    wait_for("b acts twice", lambda: sum(e["who"] == "b" for e in effects(pair.effects)) >= 2, 30, every=0.1)
    acts = assert_no_double_actions(pair.effects)
    # a's last act was let through by a fence etcd answered before the cut (it may land a little later on a
    # loaded machine: the window D122 names), and none after b leads
    last_a = max(e["t"] for e in acts if e["who"] == "a")
    took_over = b.said("lease", "leading")[0]["t"]
    assert last_a < took_over, f"a acted {last_a - took_over:.2f}s after b took over"
    cut_off = [e for e in a.log() if e["action"] in ("intent", DRAIN) and e["time"] > _iso(took_over)]
    assert not cut_off, cut_off
    assert a.proc.poll() is None and not leading_now(a)


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def leading_now(w: Watch) -> bool:
    changes = [x for x in w.lines if x.get("event") == "lease"]
    return bool(changes) and "leading" in changes[-1]["text"]


def test_the_fence_refuses_a_leader_whose_lease_expired_and_logs_it(etcd, tmp_path):
    """The SIGSTOP case made deterministic: a leader that stopped renewing (as a paused process does) still
    believes it leads; once another watch holds the key, the actuator's fence refuses its acts before any
    intent is written, one `fenced` line each, and nothing runs."""
    key = "/mctl-test/fence/watch/site"
    old = Elector(EtcdClient([etcd.url]), key, "old", TTL)
    assert old.campaign()
    old._stop.set()                                 # paused: no renewal from now on
    new = Elector(EtcdClient([etcd.url]), key, "new", TTL)
    wait_for("the new watch leads once the old lease expired", new.campaign, 30, every=0.2)
    assert old.leading and old.token != new.token   # the old one has not noticed
    ran: list[str] = []

    async def effect(go) -> Done:
        ran.append("old")
        return Done("ok")

    state = tmp_path / "state"
    act = Act(Decision("tray1", DRAIN, "test", reason="mctl: test", at=time.time()), run=effect)
    import asyncio
    with pytest.raises(Fenced) as exc:
        asyncio.run(Actuator(state, "old", fence=old.fence).run(store.HealthState(), [act]))
    assert not ran and not old.leading
    log = [e.to_dict() for e in store.read_actions(state)]
    assert [e["action"] for e in log] == [FENCED], log
    assert log[0]["fence"] == exc.value.token and log[0]["result"].startswith("refused:") and \
        "another watch leads" in log[0]["result"]
    # the new leader's acts go through, with its token
    new_ran: list[int] = []

    async def effect_new(go) -> Done:
        new_ran.append(1)
        return Done("ok")

    state2 = tmp_path / "state2"
    asyncio.run(Actuator(state2, "new", fence=new.fence).run(
        store.HealthState(), [Act(Decision("tray1", DRAIN, "test", reason="mctl: test", at=time.time()),
                                  run=effect_new)]))
    assert new_ran == [1]
    assert {e.to_dict()["fence"] for e in store.read_actions(state2)} == {new.token}
    new.resign()
    assert EtcdClient([etcd.url]).get(key) is None  # a clean stop hands the key over at once


def test_endpoints_are_tried_in_turn_and_none_answering_is_no_leadership(etcd):
    from tests.failover.etcd import free_port

    dead = f"http://127.0.0.1:{free_port()}"             # nothing listens there
    client = EtcdClient([dead, etcd.url], timeout=1.0)
    lease = client.grant(2)
    assert client.keepalive(lease) == 2 and client.endpoints[client._first] == etcd.url
    client.revoke(lease)
    said: list[str] = []
    alone = Elector(EtcdClient([dead], timeout=0.5), "/mctl-test/none/watch/site", "x", TTL, on_change=said.append)
    assert not alone.campaign() and not alone.leading
    assert said and said[0].startswith("standby: etcd out of reach"), said
    with pytest.raises(Fenced):
        alone.fence()
