"""Watches per shard and the failover pair on the full lab with real Slurm and real etcd (issue 29.6, 29.7).

Its own lab (the slow tier): 2 racks of 2 trays, Slurm deployed from an inventory with two shards (one rack
each) and a safety budget whose site cap (2 of 4 trays) is below the two racks' caps together (2 + 2).

- Two watches, one per shard, each with its own state directory (two head nodes), every tray failing at
  once: together they never hold more trays out of service than the site's cap (slurmctld grants the
  budget's licenses atomically, whoever asks), and `health drains` of either sees the whole site.
- A failover pair on one shard sharing its state directory, the lease in etcd: one watch drains the failing
  tray; the leader killed with SIGKILL, the standby takes over within two intervals and resumes the tray once
  healthy (it continues the leader's records); each act once, from the action log.
- The leader paused with SIGSTOP: the standby takes over and acts; the old leader, resumed, stands by and
  never acts again.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.failover.etcd import Etcd, etcd_binary
from tests.helpers import HEALTH, Watch, actions, deploy_slurm, fault, sinfo, wait_for

RACKS, TRAYS = 2, 2
SHARDS = {"s1": ["lab-r1"], "s2": ["lab-r2"]}
BUDGET = {"rack_share": 1.0, "allow_whole_rack": True, "site_share": 0.5}      # racks 2 each, the site 2


@pytest.fixture(scope="module")
def sharded(own_lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("mctl-shards")
    with own_lab(root / "state", trays=TRAYS, racks=RACKS, label="shards lab") as lab:
        doc = yaml.safe_load(lab.inventory.read_text())
        doc["health"] = {**HEALTH, "breaker": {"max_drained_share": 1.0, "window": "1h"}, "shards": SHARDS}
        doc["safety"] = {"budget": BUDGET}
        # no node check (scheduler.slurm.node_check): it would drain the failing trays too (within the same
        # budget), and a drain it marks again with its own reason is no longer the watch's to resume
        doc["scheduler"].setdefault("slurm", {})["node_check"] = False
        site = root / "site"
        site.mkdir()
        (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        proc, _ = deploy_slurm(lab, site)
        assert proc.returncode == 0, f"deploy slurm failed: {proc.stderr[-3000:]}\n{proc.stdout[-3000:]}"
        lab.settle_slurm()
        lab.site = site
        lab.all_trays = sorted(n for n in lab.addresses if "-tray" in n)
        lab.trays = lab.all_trays              # the kernel logs of every rack's trays put back after each test
        yield lab


def mctl_drained(lab) -> list[str]:
    return sorted(t for t, (st, reason) in sinfo(lab).items() if "drain" in st and reason.startswith("mctl:"))


def raw_log(state: Path) -> list[dict]:
    """The action log as it is now (a watch may be between an intent and its result)."""
    path = state / "health" / "actions.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def logged(state: Path, action: str, tray: str) -> bool:
    return any(e["action"] == action and e["tray"] == tray and e["result"] == "ok" for e in raw_log(state))


def drained_in(state: Path, tray: str) -> bool:
    from mctl.health import store

    rec = store.load_state(state).records.get(tray)
    return bool(rec is not None and rec.drained)


def grants(lab) -> list[str]:
    out = lab.run(lab.head, "scontrol show reservation -o 2>/dev/null", check=False).stdout
    return sorted(w.split("=", 1)[1] for w in out.split() if w.startswith("ReservationName=mctl_budget_")
                  and w != "ReservationName=mctl_budget_tripped")


@pytest.fixture
def kern_logs(sharded):
    """Each test leaves the trays' kernel logs as it found them: its XID lines would drain a tray again in the
    next test's sweeps (within health.xid_window)."""
    sizes = sharded.kern_log_sizes()
    yield
    sharded.restore_kern_logs(sizes)


def back_in_service(lab) -> None:
    for t in lab.all_trays:
        fault(lab, t, clear=True)
    lab.run(lab.head, f"scontrol update NodeName={','.join(lab.all_trays)} State=RESUME", check=False)
    lab.run(lab.head, "for r in $(scontrol show reservation -o | grep -o 'ReservationName=mctl_budget_[^ ]*' | "
                      "cut -d= -f2); do scontrol delete reservation=$r; done; true", check=False)
    wait_for("every tray back in service", lambda: mctl_drained(lab) == [], 90, every=1)


def test_two_shard_watches_never_exceed_the_site_cap_together(sharded, kern_logs, tmp_path):
    lab = sharded
    cap = 2
    watches = [Watch(lab, lab.site, tmp_path / f"state-{s}", "--shard", s, "--interval", "1") for s in SHARDS]
    seen_max = 0
    try:
        wait_for("both watches swept", lambda: all(w.sweeps() >= 1 for w in watches), 120, every=0.5)
        for t in lab.all_trays:
            fault(lab, t, xid=79, gpu=0)

        def settled() -> bool:
            nonlocal seen_max
            drained = mctl_drained(lab)
            seen_max = max(seen_max, len(drained), len(grants(lab)))
            held = set()
            for s in SHARDS:
                held |= {e["tray"] for e in raw_log(tmp_path / f"state-{s}")
                         if e["action"] in ("skip", "drain") and "safety budget" in (e.get("why", "") +
                                                                                      e.get("result", ""))}
            return len(drained) == cap and set(lab.all_trays) - set(drained) <= held

        wait_for("the site's cap drained, every other tray held back by the budget", settled, 180, every=0.3)
        for _ in range(10):                        # a few more sweeps of both: still within the cap
            settled()
            time.sleep(0.5)
        assert seen_max <= cap, f"{seen_max} trays out of service by mctl at once, the site's cap is {cap}"
        drained = mctl_drained(lab)
        # both shards asked: each watch's log has its own trays only
        for s in SHARDS:
            trays = {e["tray"] for e in raw_log(tmp_path / f"state-{s}") if e.get("tray")}
            assert trays and all(t.startswith(SHARDS[s][0] + "-") for t in trays), (s, trays)
        # health drains, from either state directory, sees the whole site: every mctl drain in Slurm, the budget
        doc = json.loads(lab.mctl("-i", str(lab.site), "--state-dir", str(tmp_path / "state-s1"), "--json",
                                  "health", "drains").stdout)
        assert sorted(r["host"] for r in doc["drains"]) == drained, doc
        assert doc["budget"]["tripped"] and sorted(doc["budget"]["site"]["held"]) == drained, doc["budget"]
        assert doc["budget"]["site"]["limit"] == cap, doc["budget"]
    finally:
        for w in watches:
            w.stop()
        back_in_service(lab)


@pytest.fixture
def etcd(processes, sockets, tmp_path):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (scripts/install builds one; or MCTL_ETCD, or apt-get install etcd-server)")
    server = Etcd(binary, tmp_path)
    yield server
    server.stop()


def pair_site(lab, etcd, tmp_path, prefix: str) -> Path:
    """The lab's sharded site with the leader lease in *etcd* (interval 2 s, TTL 2 s)."""
    doc = yaml.safe_load((lab.site / "mctl.yml").read_text())
    doc["health"]["failover"] = {"etcd": [etcd.url], "ttl": "2s", "key_prefix": prefix}
    doc["health"]["interval"] = 2
    site = tmp_path / "site"
    site.mkdir()
    (site / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return site


def start_pair(lab, site: Path, state: Path, started: list) -> tuple[Watch, Watch]:
    """Two watches of shard s1 on one state directory: the first leads (it swept), the second is the standby.
    Each is appended to *started* as it starts (the caller stops them)."""
    first = Watch(lab, site, state, "--shard", "s1")
    started.append(first)
    wait_for("the first watch leads and sweeps", lambda: first.sweeps() >= 1, 120, every=0.3)
    second = Watch(lab, site, state, "--shard", "s1")
    started.append(second)
    wait_for("the second is the standby", lambda: any("standby" in x for x in second.read()), 60, every=0.3)
    return first, second


def show(*watches) -> None:
    for name, w in watches:
        if w is not None:
            w.stop()
            print(f"--- {name} watch (pid {w.proc.pid}):", *w.lines, w.proc.stderr.read()[-3000:], sep="\n")


def test_failover_pair_takes_over_within_two_intervals_and_acts_once(sharded, kern_logs, etcd, tmp_path):
    lab = sharded
    state = tmp_path / "state"                       # shared by the pair (shared storage between head nodes)
    tray = "lab-r1-tray01"
    pair: list[Watch] = []
    try:
        first, second = start_pair(lab, pair_site(lab, etcd, tmp_path, "/mctl-test-kill"), state, pair)
        assert second.sweeps() == 0
        fault(lab, tray, xid=79, gpu=0)
        # killed once the drain is in the log *and* the state (a kill between the two leaves a drain the state
        # does not know, for a restarted watch as for a standby: held as another's, not resumed)
        wait_for("the leader drains the tray and saves it", lambda: logged(state, "drain", tray) and drained_in(
            state, tray), 120, every=0.2)
        first.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        wait_for("the standby leads", lambda: any("LEASE" in x and "leading" in x for x in second.read()), 60,
                 every=0.1)
        took = time.time() - killed
        assert took <= 2 * 2 + 1, f"the standby led {took:.1f}s after the leader was killed"   # 2 intervals + poll
        fault(lab, tray, clear=True)
        wait_for("the new leader resumes the tray (its result logged)", lambda: logged(state, "resume", tray), 120,
                 every=0.5)
        assert tray not in mctl_drained(lab)
        log = actions(state)
        drains = [e for e in log if e["action"] == "drain" and e["tray"] == tray and e["result"] == "ok"]
        resumes = [e for e in log if e["action"] == "resume" and e["tray"] == tray and e["result"] == "ok"]
        assert len(drains) == 1 and len(resumes) == 1, log
        assert f"pid {first.proc.pid}" in drains[0]["who"] and f"pid {second.proc.pid}" in resumes[0]["who"], log
        assert drains[0]["fence"] < resumes[0]["fence"], log       # each under its own token, the newer later
    finally:
        show(*zip(("first", "second"), pair))
        back_in_service(lab)


def test_a_paused_leader_resumed_stands_by_and_never_acts_twice(sharded, kern_logs, etcd, tmp_path):
    """SIGSTOP of the leader: the standby takes over and drains the tray that fails meanwhile; the old leader,
    resumed, finds its lease gone (its renewal or its fence) and stands by; each act once, by the new leader."""
    lab = sharded
    state = tmp_path / "state"
    tray = "lab-r1-tray02"
    pair: list[Watch] = []
    try:
        first, second = start_pair(lab, pair_site(lab, etcd, tmp_path, "/mctl-test-stop"), state, pair)
        first.proc.send_signal(signal.SIGSTOP)
        stopped = time.time()
        wait_for("the standby leads", lambda: any("LEASE" in x and "leading" in x for x in second.read()), 60,
                 every=0.1)
        took = time.time() - stopped
        assert took <= 2 * 2 + 1, f"the standby led {took:.1f}s after the leader was paused"
        fault(lab, tray, xid=79, gpu=0)
        wait_for("the new leader drains the tray", lambda: tray in mctl_drained(lab), 120, every=0.3)
        seen = len(first.read())
        first.proc.send_signal(signal.SIGCONT)
        wait_for("the old leader, resumed, stands by", lambda: any(
            ("LEASE" in x and ("lost the lease" in x or "standby" in x)) or "FENCED" in x
            for x in first.read()[seen:]), 60, every=0.2)
        fault(lab, tray, clear=True)
        wait_for("the new leader resumes the tray (its result logged)", lambda: logged(state, "resume", tray), 120,
                 every=0.5)
        assert tray not in mctl_drained(lab)
        log = actions(state)
        acts = [e for e in log if e["tray"] == tray and e["action"] in ("drain", "resume") and e["result"] == "ok"]
        assert [e["action"] for e in acts] == ["drain", "resume"], log
        assert all(f"pid {second.proc.pid}" in e["who"] for e in acts), log
        late = [e for e in log if f"pid {first.proc.pid}" in e.get("who", "") and e["action"] != "fenced"
                and e["time"] > acts[0]["time"]]
        assert not late, late                    # the old leader did nothing after it was paused, but be fenced
    finally:
        show(*zip(("first", "second"), pair))
        back_in_service(lab)
