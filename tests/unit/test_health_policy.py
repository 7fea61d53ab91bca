"""The drain policy and circuit breaker: pure decisions over records, verdicts and the scheduler's view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mctl.health import breaker as breakerlib
from mctl.health.breaker import BreakerState
from mctl.health.policy import decide, settle
from mctl.health.record import TrayRecord, TrayVerdict
from mctl.model.drain import ADOPT, DRAIN, FORGET, QUEUE, RESUME, SKIP, ActResult, Decision, NodeView, PendingAction
from mctl.model.settings import HealthSettings
from mctl.model.findings import Finding, Severity
from mctl.sched.slurm.facts import parse_show_nodes
from tests.helpers import POLICY_NOW, PolicySite

S = HealthSettings()
NOW = POLICY_NOW
XID = Finding(Severity.CRITICAL, None, "gpu.xid", "XID 79 on gpu0: GPU has fallen off the bus", None,
              {"short": "xid 79 gpu0 (fell off bus)"})


def trays(n: int, rack: str = "r1") -> list[str]:
    return [f"{rack}-tray{i:02d}" for i in range(1, n + 1)]


def ok(host, rack="r1"):
    return TrayVerdict(host, rack, "ok", Severity.OK)


def warn(host, rack="r1"):
    return TrayVerdict(host, rack, "ok", Severity.WARN, (Finding(Severity.WARN, host, "fabric.health", "route"),))


def bad(host, rack="r1"):
    return TrayVerdict(host, rack, "ok", Severity.CRITICAL, (replace(XID, host=host),))


def dark(host, rack="r1", reach="unreachable"):
    return TrayVerdict(host, rack, reach, Severity.CRITICAL,
                       (Finding(Severity.CRITICAL, host, "tray.reachable", "unreachable: no SSH answer"),))


def idle(*hosts):
    return {h: NodeView(h, state="IDLE") for h in hosts}


def actions(out):
    return [(d.action, d.host) for d in out.actions]


# --- drain and resume ------------------------------------------------------------------------------

def test_critical_tray_is_drained_on_the_first_sweep_with_an_mctl_reason():
    site = PolicySite(trays(4))
    out = site.sweep([ok("r1-tray01"), bad("r1-tray02"), ok("r1-tray03"), ok("r1-tray04")])
    (d,) = out.actions
    assert (d.action, d.host, d.reason) == (DRAIN, "r1-tray02", "mctl: xid 79 gpu0 (fell off bus)")
    assert "gpu.xid: XID 79" in d.full
    rec = site.records["r1-tray02"]
    assert rec.drained and rec.reason == d.reason and rec.drained_at == site.now
    # still critical: nothing more to do, and no repeated decision
    out = site.sweep([ok("r1-tray01"), bad("r1-tray02"), ok("r1-tray03"), ok("r1-tray04")])
    assert out.actions == []


def test_confirm_sweeps_waits_for_a_second_critical_sweep():
    site = PolicySite(trays(4), replace(S, confirm_sweeps=2))
    assert site.sweep([bad("r1-tray01")]).actions == []
    assert actions(site.sweep([bad("r1-tray01")])) == [(DRAIN, "r1-tray01")]
    assert "critical for 2 sweeps" in site.records["r1-tray01"].full_reason


def test_resume_after_n_healthy_sweeps_only():
    site = PolicySite(trays(4))
    site.sweep([bad("r1-tray01")])
    for n in range(S.resume_after_healthy_sweeps - 1):
        assert site.sweep([ok("r1-tray01") if n % 2 else warn("r1-tray01")]).actions == []   # warn is healthy
    out = site.sweep([ok("r1-tray01")])
    (d,) = out.actions
    assert (d.action, d.host, d.reason) == (RESUME, "r1-tray01", "mctl: xid 79 gpu0 (fell off bus)")
    assert not site.records["r1-tray01"].drained and site.nodes["r1-tray01"].drained is False


def test_a_relapse_restarts_the_healthy_count():
    # without hysteresis (a relapse within hysteresis_window_sweeps is a flap: tests/unit/test_health_hysteresis.py)
    site = PolicySite(trays(4), replace(S, hysteresis_checks=()))
    site.sweep([bad("r1-tray01")])
    site.sweep([ok("r1-tray01")])
    site.sweep([ok("r1-tray01")])
    site.sweep([bad("r1-tray01")])
    for _ in range(S.resume_after_healthy_sweeps - 1):
        assert site.sweep([ok("r1-tray01")]).actions == []
    assert actions(site.sweep([ok("r1-tray01")])) == [(RESUME, "r1-tray01")]


# --- unreachable trays --------------------------------------------------------------------------------

def test_unreachable_tray_is_drained_only_after_k_misses():
    site = PolicySite(trays(4))
    k = S.unreachable_sweeps_before_drain
    for _ in range(k - 1):
        assert site.sweep([dark("r1-tray03")]).actions == []
    (d,) = site.sweep([dark("r1-tray03")]).actions
    assert d.action == DRAIN and d.reason == f"mctl: unreachable {k} sweeps"
    assert "consecutive sweeps" in d.full


def test_a_tray_that_answers_again_resets_its_misses():
    site = PolicySite(trays(4))
    site.sweep([dark("r1-tray03")])
    site.sweep([dark("r1-tray03")])
    site.sweep([ok("r1-tray03")])
    assert site.records["r1-tray03"].misses == 0
    assert site.sweep([dark("r1-tray03")]).actions == []


def test_hung_tray_counts_as_a_miss_and_says_so():
    site = PolicySite(trays(4), replace(S, unreachable_sweeps_before_drain=1))
    (d,) = site.sweep([dark("r1-tray02", reach="timeout")]).actions
    assert d.reason == "mctl: hung 1 sweeps"


# --- guards -----------------------------------------------------------------------------------------------

def test_operator_drain_is_never_overwritten_and_noted_once():
    site = PolicySite(trays(4))
    site.nodes["r1-tray02"] = NodeView("r1-tray02", drained=True, reason="ops: replacing PSU", state="IDLE+DRAIN")
    out = site.sweep([bad("r1-tray02")])
    assert out.actions == []
    (d,) = out.decisions
    assert d.action == SKIP and "operator" in d.why and "ops: replacing PSU" in d.why
    assert [n.action for n in out.notes] == [SKIP]
    out = site.sweep([bad("r1-tray02")])
    assert out.notes == []                  # the same skip is not logged every sweep
    # and a healthy tray drained by an operator is never resumed by mctl
    for _ in range(5):
        assert site.sweep([ok("r1-tray02")]).actions == []


def test_down_node_is_never_touched():
    site = PolicySite(trays(4))
    site.nodes["r1-tray01"] = NodeView("r1-tray01", down=True, state="DOWN*")
    (d,) = site.sweep([bad("r1-tray01")]).decisions
    assert d.action == SKIP and "down nodes" in d.why
    # our own drain on a node that went down is not resumed while it is down
    site = PolicySite(trays(4))
    site.sweep([bad("r1-tray01")])
    site.nodes["r1-tray01"] = replace(site.nodes["r1-tray01"], down=True, state="DOWN+DRAIN")
    for _ in range(S.resume_after_healthy_sweeps + 1):
        assert site.sweep([ok("r1-tray01")]).actions == []


def test_reason_taken_over_by_an_operator_is_forgotten():
    site = PolicySite(trays(4))
    site.sweep([bad("r1-tray01")])
    site.nodes["r1-tray01"] = replace(site.nodes["r1-tray01"], reason="ops: keep it out, RMA")
    out = site.sweep([ok("r1-tray01")])
    assert [(d.action, d.host) for d in out.decisions] == [(FORGET, "r1-tray01")]
    assert not site.records["r1-tray01"].drained
    for _ in range(5):
        assert site.sweep([ok("r1-tray01")]).actions == []


def test_resumed_outside_mctl_is_forgotten_then_drained_again_if_still_critical():
    site = PolicySite(trays(4))
    site.sweep([bad("r1-tray01")])
    site.nodes["r1-tray01"] = NodeView("r1-tray01", state="IDLE")        # an operator resumed it
    out = site.sweep([bad("r1-tray01")])
    assert [d.action for d in out.decisions] == [FORGET, DRAIN]


def test_other_mctl_drain_is_left_alone():
    site = PolicySite(trays(4))
    site.nodes["r1-tray01"] = NodeView("r1-tray01", drained=True, reason="mctl: nvlink gpu1 link5 down",
                                       state="IDLE+DRAIN")
    (d,) = site.sweep([bad("r1-tray01")]).decisions
    assert d.action == SKIP and "mctl elsewhere" in d.why


def test_tray_unknown_to_the_scheduler_is_skipped():
    site = PolicySite(trays(4))
    del site.nodes["r1-tray04"]
    (d,) = site.sweep([bad("r1-tray04")]).decisions
    assert d.action == SKIP and "not a node" in d.why


# --- the scheduler away -------------------------------------------------------------------------------

def test_actions_queue_while_the_scheduler_is_unreachable_then_happen():
    site = PolicySite(trays(4))
    out = site.sweep([bad("r1-tray01")], scheduler_up=False)
    assert out.actions == [] and [(d.action, d.host) for d in out.notes] == [(QUEUE, "r1-tray01")]
    assert site.records["r1-tray01"].pending.action == DRAIN
    since = site.records["r1-tray01"].pending.since
    out = site.sweep([bad("r1-tray01")], scheduler_up=False)
    assert out.notes == [] and site.records["r1-tray01"].pending.since == since
    assert actions(site.sweep([bad("r1-tray01")])) == [(DRAIN, "r1-tray01")]
    assert site.records["r1-tray01"].pending is None


def test_queued_drain_is_dropped_when_the_tray_recovers_first():
    site = PolicySite(trays(4))
    site.sweep([bad("r1-tray01")], scheduler_up=False)
    out = site.sweep([ok("r1-tray01")])
    assert out.actions == [] and site.records["r1-tray01"].pending is None


def test_settle_failures():
    site = PolicySite(trays(4))
    out = decide({}, [bad("r1-tray01")], idle("r1-tray01"), S, BreakerState(), {"r1": 4}, now=NOW)
    (d,) = out.actions
    settle(out, ActResult(d, False, "slurmctld: Unable to contact slurm controller", unreachable=True))
    rec = out.records["r1-tray01"]
    assert not rec.drained and rec.pending.action == DRAIN and out.breaker.drains == ()
    out = decide({}, [bad("r1-tray01")], idle("r1-tray01"), S, BreakerState(), {"r1": 4}, now=NOW)
    settle(out, ActResult(out.actions[0], False, "Invalid node name"))
    assert out.records["r1-tray01"].pending is None and "Invalid node name" in out.records["r1-tray01"].note
    del site


# --- circuit breaker ------------------------------------------------------------------------------------

def test_six_faults_on_18_trays_trip_the_breaker_at_its_threshold():
    hosts = trays(18)
    site = PolicySite(hosts)
    faulty = set(hosts[2:8])
    verdicts = [bad(h) if h in faulty else ok(h) for h in hosts]
    out = site.sweep(verdicts)
    drained = [d.host for d in out.actions]
    assert drained == sorted(faulty)[:4]                 # 4/18 = 22% <= 25%; the 5th would be 28%
    assert site.breaker.tripped and "5 of 18 trays of rack r1" in site.breaker.reason
    skipped = [d for d in out.decisions if d.action == SKIP]
    assert [d.host for d in skipped] == sorted(faulty)[4:]
    assert all("circuit breaker" in d.why or "would make" in d.why for d in skipped)
    # it stays tripped, even when a new fault shows up later
    out = site.sweep([bad(h) if h in faulty | {hosts[15]} else ok(h) for h in hosts])
    assert out.actions == [] and site.breaker.tripped
    assert all("mctl health breaker reset" in d.why for d in out.decisions if d.action == SKIP)
    # resumes still happen while it is tripped
    for _ in range(S.resume_after_healthy_sweeps):
        out = site.sweep([ok(h) for h in hosts])
    assert sorted(d.host for d in out.actions if d.action == RESUME) == sorted(faulty)[:4]
    # an operator resets it: drains go on, counting afresh
    site.breaker = breakerlib.reset(site.breaker)
    out = site.sweep([bad(h) if h == hosts[15] else ok(h) for h in hosts])
    assert actions(out) == [(DRAIN, hosts[15])]


def test_breaker_counts_per_rack_or_per_site():
    hosts = trays(4, "a") + trays(4, "b")
    verdicts = [bad(h, h[:1]) if h in ("a-tray01", "b-tray01") else ok(h, h[:1]) for h in hosts]
    site = PolicySite(hosts, replace(S, breaker_max_share=0.25), sizes={"a": 4, "b": 4})
    assert len(site.sweep(verdicts).actions) == 2           # one per rack: 25% of each
    site = PolicySite(hosts, replace(S, breaker_max_share=0.2, breaker_scope="site"), sizes={"a": 4, "b": 4})
    out = site.sweep(verdicts)
    assert len(out.actions) == 1 and site.breaker.tripped and "of the site" in site.breaker.reason


def test_breaker_window_forgets_old_drains():
    state = BreakerState(drains=((NOW - 7200, "r1-tray01", "r1"),))
    adm = breakerlib.admit(state, "r1-tray02", "r1", {"r1": 4}, max_share=0.25, window_s=3600, scope="rack", now=NOW)
    assert adm.allowed and [d[1] for d in adm.state.drains] == ["r1-tray02"]
    adm2 = breakerlib.admit(adm.state, "r1-tray03", "r1", {"r1": 4}, max_share=0.25, window_s=3600, scope="rack",
                            now=NOW + 1)
    assert not adm2.allowed and adm2.tripped_now and adm2.state.tripped


def test_a_tray_drained_twice_in_the_window_counts_once():
    state = BreakerState(drains=((NOW - 60, "r1-tray01", "r1"),))
    adm = breakerlib.admit(state, "r1-tray01", "r1", {"r1": 4}, max_share=0.25, window_s=3600, scope="rack", now=NOW)
    assert adm.allowed and "1 of 4 trays" in adm.why


def test_breaker_state_round_trips_and_discard():
    state = BreakerState(True, NOW, "why", ((NOW, "h1", "r1"), (NOW + 1, "h2", None)))
    assert BreakerState.from_dict(state.to_dict()) == state
    assert BreakerState.from_dict(None) == BreakerState()
    assert breakerlib.discard(state, "h1", NOW).drains == ((NOW + 1, "h2", None),)
    assert breakerlib.reset(state) == BreakerState()


def test_breaker_refuses_an_unknown_rack_size():
    adm = breakerlib.admit(BreakerState(), "x", "nowhere", {}, max_share=0.5, window_s=60, scope="rack", now=NOW)
    assert not adm.allowed and "no tray count" in adm.why


# --- records and the scheduler's view --------------------------------------------------------------------

def test_node_view_from_real_scontrol_output():
    text = ("NodeName=lab-r1-tray04 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 Gres=gpu:4 NodeAddr=127.150.1.4 "
            "Port=22503 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu  ResumeAfterTime=None AllocTRES= "
            "CurrentWatts=0 AveWatts=0  Reason=mctl: xid 79 gpu0 (fell off bus) [root@2026-11-29T20:25:10]\n"
            "NodeName=lab-r1-tray01 Arch=x86_64 State=DOWN* ThreadsPerCore=1 Reason=Not responding "
            "[slurm@2026-11-29T20:30:00]\n")
    a, b = (n.view() for n in parse_show_nodes(text))
    assert (a.drained, a.down, a.reason, a.mctl_drain) == (True, False, "mctl: xid 79 gpu0 (fell off bus)", True)
    assert (b.drained, b.down, b.reason, b.mctl_drain) == (False, True, "Not responding", False)


def test_record_round_trip_ignores_unknown_keys():
    rec = TrayRecord("h", "r", drained=True, reason="mctl: x", pending=PendingAction(DRAIN, None, None))
    data = rec.to_dict() | {"added_in_a_later_mctl": 1}
    assert TrayRecord.from_dict(data) == rec


def test_decision_to_dict():
    d = Decision("h", DRAIN, "why", reason="mctl: x", at=NOW)
    assert d.to_dict()["action"] == "drain" and d.to_dict()["at"] == NOW


@pytest.mark.parametrize("status, expected", [(Severity.OK, "ok"), (Severity.WARN, "warn")])
def test_verdict_status(status, expected):
    assert TrayVerdict("h", None, "ok", status).status == expected
    assert TrayVerdict("h", None, "timeout", status).status == "unreachable"


# --- a resume the controller lost (D56) ---------------------------------------------------------------

STAMP = "root@2026-12-01T23:59:40"


def _drained_with_stamp(site, host, stamp=STAMP):
    node = site.nodes[host]
    site.nodes[host] = replace(node, stamp=stamp)


def _resumed_then_drained_again(stamp):
    """A site whose r1-tray01 mctl drained and resumed, then drained again with the same reason and *stamp*."""
    site = PolicySite(trays(4), replace(S, resume_after_healthy_sweeps=1))
    site.sweep([bad("r1-tray01")])
    _drained_with_stamp(site, "r1-tray01")
    site.sweep([ok("r1-tray01")])
    reason = site.records["r1-tray01"].resumed.reason
    site.nodes["r1-tray01"] = NodeView("r1-tray01", drained=True, reason=reason, state="IDLE+DRAIN", stamp=stamp)
    return site


def test_a_drain_the_controller_restored_after_the_resume_is_adopted_and_resumed_again():
    site = PolicySite(trays(4), replace(S, resume_after_healthy_sweeps=2))
    site.sweep([bad("r1-tray01")])
    _drained_with_stamp(site, "r1-tray01")
    site.sweep([ok("r1-tray01")])
    assert site.records["r1-tray01"].drain_stamp == STAMP
    out = site.sweep([ok("r1-tray01")])
    assert actions(out) == [(RESUME, "r1-tray01")]
    last = site.records["r1-tray01"].resumed
    assert last.stamp == STAMP and last.reason.startswith("mctl: xid 79") and last.at == site.now
    # slurmctld restarts from a state saved before the resume: the same drain, the same stamp
    site.nodes["r1-tray01"] = NodeView("r1-tray01", drained=True, reason=last.reason, state="IDLE+DRAIN",
                                       stamp=STAMP)
    out = site.sweep([ok("r1-tray01")])
    assert [d.action for d in out.decisions] == [ADOPT, RESUME]
    assert [d.action for d in out.notes] == [ADOPT] and "restored a state saved before that resume" in out.notes[0].why
    assert site.records["r1-tray01"].resumed is not None and not site.records["r1-tray01"].drained


def test_a_restored_drain_of_a_tray_still_failing_stays_and_is_mctls_again():
    site = _resumed_then_drained_again(STAMP)
    out = site.sweep([dark("r1-tray01")])            # not healthy now: the drain stays, mctl's again
    assert [d.action for d in out.decisions] == [ADOPT] and site.records["r1-tray01"].drained
    assert actions(site.sweep([ok("r1-tray01")])) == [(RESUME, "r1-tray01")]


@pytest.mark.parametrize("stamp", ["root@2026-12-02T00:00:10", None])
def test_the_same_reason_with_a_new_stamp_or_none_is_someone_elses_drain(stamp):
    # the node check drains with the same words later: a new stamp (or a scheduler without stamps)
    site = _resumed_then_drained_again(stamp)
    out = site.sweep([bad("r1-tray01")])
    (d,) = out.decisions
    assert d.action == SKIP and "mctl elsewhere" in d.why and not site.records["r1-tray01"].drained


def test_the_resume_memory_survives_the_state_file():
    rec = TrayRecord("t", drained=True, reason="mctl: x", full_reason="x", drain_stamp=STAMP)
    back = TrayRecord.from_dict(rec.resumed_by_mctl(NOW).to_dict())
    assert back.resumed.to_dict() == {"reason": "mctl: x", "full": "x", "stamp": STAMP, "at": NOW} and back.drain_stamp is None
    assert TrayRecord.from_dict({"host": "t"}).resumed is None          # an older state file


def test_no_resume_before_a_restarted_controller_heard_from_the_node():
    # Seen in the lab: slurmctld restored from a saved state shows UNKNOWN+DRAIN until slurmd registers;
    # RESUME then lifts the drain and answers "Invalid node state specified". The resume waits.
    site = PolicySite(trays(4), replace(S, resume_after_healthy_sweeps=1))
    site.sweep([bad("r1-tray01")])
    reason = site.records["r1-tray01"].reason
    site.nodes["r1-tray01"] = NodeView("r1-tray01", drained=True, reason=reason, state="UNKNOWN+DRAIN",
                                       unregistered=True)
    (d,) = site.sweep([ok("r1-tray01")]).decisions
    assert d.action == SKIP and "has not heard from the node" in d.why
    site.nodes["r1-tray01"] = replace(site.nodes["r1-tray01"], state="IDLE+DRAIN", unregistered=False)
    assert actions(site.sweep([ok("r1-tray01")])) == [(RESUME, "r1-tray01")]


def test_the_breaker_counts_only_the_drains_the_safety_budget_granted():
    """Issue 27: 17 of 18 trays critical at once, the breaker's share 50 % (9 trays), the site's budget 4:
    the breaker asks 9 drains, the budget grants 4 and refuses 5 (and trips). The breaker then counts the
    4 that happened, as Slurm shows them, and does not trip on the drains the budget refused; the trays
    the budget refused are held back by it on the next sweep, never counted as drains."""
    from mctl.model.budget import BudgetView, Grant

    hosts = trays(18)
    faulty = hosts[1:]
    site = PolicySite(hosts, replace(S, breaker_max_share=0.5, breaker_window_s=60))
    asked = faulty[:9]                                  # the breaker's share: 9 of 18
    granted, refused = asked[:4], asked[4:]
    out = site.sweep([bad(h) if h in faulty else ok(h) for h in hosts], refuse=set(refused))
    assert [d.host for d in out.actions] == asked
    drained_in_slurm = sorted(h for h, n in site.nodes.items() if n.drained)
    assert drained_in_slurm == granted
    assert not site.breaker.tripped, site.breaker.reason
    assert sorted(d[1] for d in site.breaker.drains) == drained_in_slurm          # the count is Slurm's
    assert not any(site.records[h].drained for h in refused)
    waited = {d.host: d.why for d in out.decisions if d.action == SKIP}
    assert sorted(waited) == faulty[9:] and all("not drained this sweep" in w for w in waited.values())
    # the budget tripped on its first refusal: the next sweep holds every other tray back, counted nowhere
    budget = BudgetView({h: Grant(h) for h in granted}, tripped=f"refused {refused[0]}: rack r1 at 4 of 4")
    out = site.sweep([bad(h) if h in faulty else ok(h) for h in hosts], budget=budget)
    assert out.actions == [] and not site.breaker.tripped
    held = [d for d in out.decisions if d.action == SKIP]
    assert sorted(d.host for d in held) == sorted(set(faulty) - set(granted))
    assert all(d.why.startswith("held back by the safety budget") for d in held)
    assert sorted(d[1] for d in site.breaker.drains) == granted


def test_the_breaker_trips_on_the_drains_that_happened_not_on_those_asked():
    """A tray that passes the share only with drains asked in the same pass and not answered yet waits (no
    trip, no drain); one that passes it with the drains done trips it, and the trip names those."""
    state = BreakerState(drains=((NOW - 5, "r1-tray01", "r1"), (NOW, "r1-tray02", "r1")))
    kw = dict(max_share=0.25, window_s=60, scope="rack", now=NOW)
    adm = breakerlib.admit(state, "r1-tray03", "r1", {"r1": 8}, asked={"r1-tray02"}, **kw)
    assert adm.waits and not adm.allowed and not adm.state.tripped and adm.state == state
    assert "1 drain(s) asked" in adm.why
    adm = breakerlib.admit(state, "r1-tray03", "r1", {"r1": 8}, **kw)        # tray02's drain happened
    assert adm.tripped_now and "3 of 8 trays" in adm.state.reason
    adm = breakerlib.admit(state, "r1-tray03", "r1", {"r1": 4}, asked={"r1-tray02"}, **kw)
    assert adm.tripped_now and "2 of 4 trays" in adm.state.reason       # tray01 + tray03 pass 25 % alone
