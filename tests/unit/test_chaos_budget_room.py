"""bench/chaos.py plays its single-tray faults inside the site's safety budget (pure: the soak's bookkeeping)."""

from __future__ import annotations

from bench.chaos import Fault, Soak
from mctl.model.budget import BudgetView, Grant


def soak(limit: int, nodes: dict, grants=(), now: float = 1000.0) -> Soak:
    s = Soak.__new__(Soak)          # the bookkeeping only: no lab, no site
    s.budget_limit, s.interval = limit, 5.0
    s.polls = [(now, nodes)]
    s.ledger = BudgetView({t: Grant(t) for t in grants})
    return s


def drained(reason: str = "mctl: xid 79 gpu0") -> tuple[str, str]:
    return ("drained", reason)


def test_a_fault_waits_while_drains_linger_past_their_faults(monkeypatch):
    """Two faults cleared whose trays are still drained, one tray holding a grant with its drain lifted, one
    fault on: with a budget of 4 the next fault that may drain waits; once a tray is resumed it may go."""
    monkeypatch.setattr("time.monotonic", lambda: 1000.0)
    nodes = {"t1": drained(), "t2": drained(), "t3": ("idle", ""), "t4": ("idle", ""), "t5": ("idle", "")}
    faults = [Fault(0, 10, "xid79", "drain", "t1", injected=1.0, cleared=11.0, drained=2.0),
              Fault(0, 10, "xid79", "drain", "t2", injected=1.0, cleared=11.0, drained=2.0),
              Fault(900, 1100, "hang", "unreach", "t4", injected=900.0)]
    new = Fault(1000, 1030, "xid79", "drain", "t5")
    s = soak(4, nodes, grants=["t1", "t2", "t3"])
    why = s._budget_full(new, faults)
    assert why is not None and "4 trays" in why and "allows 4" in why
    s = soak(4, {**nodes, "t2": ("idle", "")}, grants=["t1", "t3"])        # t2 resumed, its grant back
    assert s._budget_full(new, faults) is None


def test_a_fault_waits_for_its_own_tray_and_counts_a_fault_just_cleared(monkeypatch):
    monkeypatch.setattr("time.monotonic", lambda: 1000.0)
    s = soak(4, {"t1": drained(), "t2": ("idle", ""), "t3": ("down", "Not responding")})
    assert "t1 is not back in service" in s._budget_full(Fault(1000, 1010, "xid79", "drain", "t1"), [])
    assert "t3 is not back in service" in s._budget_full(Fault(1000, 1010, "hang", "unreach", "t3"), [])
    # a may-drain fault cleared 4 s ago without a drain may still drain its tray: it counts
    just = [Fault(0, 990, "xid_storm", "may", "t2", injected=900.0, cleared=996.0)]
    s = soak(2, {"t1": drained(), "t2": ("idle", ""), "t4": ("idle", "")})
    assert s._budget_full(Fault(1000, 1010, "xid79", "drain", "t4"), just) is not None
    monkeypatch.setattr("time.monotonic", lambda: 1010.0)              # 14 s later (2 intervals passed)
    assert s._budget_full(Fault(1000, 1010, "xid79", "drain", "t4"), just) is None
