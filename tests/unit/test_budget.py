"""The safety budget's pure parts: its caps as licenses, what slurmctld says it enforces, and drift."""

from __future__ import annotations

from mctl.model.budget import BudgetView
from mctl.sched.slurm import budget

# `scontrol show license -o` from the lab's slurmctld (slurm-wlm 24.11.5, Debian 13), a 4-tray rack deployed
# with the default budget
SHOWN = """\
LicenseName=mctl_budget_rack_lab-r1 Total=1 Used=0 Free=1 Reserved=0 Remote=no
LicenseName=mctl_budget_site Total=1 Used=0 Free=1 Reserved=0 Remote=no
LicenseName=mctl_budget_trip Total=1 Used=0 Free=1 Reserved=0 Remote=no
"""


def test_caps_render_as_one_licenses_value():
    assert budget.licenses({"r1": 4, "r0": 1}, 5) == \
        "mctl_budget_site:5,mctl_budget_rack_r0:1,mctl_budget_rack_r1:4,mctl_budget_trip:1"
    assert budget.caps({"r1": -2}, -1) == {"mctl_budget_site": 0, "mctl_budget_rack_r1": 0, "mctl_budget_trip": 1}


def test_the_licenses_slurmctld_shows_are_the_caps_it_enforces():
    assert budget.parse_licenses(SHOWN + "LicenseName=matlab Total=20 Used=3\nNo licenses configured in Slurm.\n") == \
        {"mctl_budget_rack_lab-r1": 1, "mctl_budget_site": 1, "mctl_budget_trip": 1}
    assert budget.parse_licenses("No licenses configured in Slurm.\n") == {}


def test_one_read_splits_into_nodes_grants_caps_and_clock():
    printed = ("NodeName=t1 State=IDLE\n" + budget.RESERVATIONS_MARK + "\n"
               "ReservationName=mctl_budget_t1 StartTime=2026-12-02T10:00:00 EndTime=2027-12-02T10:00:00 "
               "Licenses=mctl_budget_site:1,mctl_budget_rack_lab-r1:1 Comment=mctl watch: xid 79\n"
               + budget.LICENSES_MARK + "\n" + SHOWN + budget.NOW_MARK + "2026-12-02T10:00:12\n")
    nodes, view = budget.split_reservations(printed)
    assert nodes == "NodeName=t1 State=IDLE\n"
    assert sorted(view.grants) == ["t1"] and view.grants["t1"].comment == "mctl watch: xid 79"
    assert view.limits["mctl_budget_rack_lab-r1"] == 1 and view.age("t1") == 12.0


def test_drift_names_each_cap_the_scheduler_holds_otherwise():
    view = BudgetView(limits=budget.parse_licenses(SHOWN))
    assert view.drift({"mctl_budget_site": 1, "mctl_budget_rack_lab-r1": 1, "mctl_budget_trip": 1}) == []
    assert view.drift({"mctl_budget_site": 2, "mctl_budget_rack_lab-r1": 2, "mctl_budget_rack_lab-r2": 4,
                       "mctl_budget_trip": 1}) == [
        "mctl_budget_rack_lab-r1: the inventory says 2, the scheduler enforces 1",
        "mctl_budget_rack_lab-r2: the inventory says 4, the scheduler enforces none",
        "mctl_budget_site: the inventory says 2, the scheduler enforces 1"]
    assert BudgetView().drift({"mctl_budget_site": 2}) == []          # caps not read: nothing is claimed
