"""Fixtures the integration modules share: the health site and its per-test runner, the Slurm site.

The labs themselves (`lab`, `own_lab`, `slurm_lab`) live in tests/lab_fixture.py and are registered in
tests/conftest.py, so tests/e2e uses the same shared lab (one start per session); a test's tier comes
from the fixtures it uses (tests/conftest.py), not from this folder. Plain helpers (wait_for, Slurm
views, the watch, BMC reads) are in tests/helpers.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import HEALTH, sinfo, wait_for, write_health_site


@pytest.fixture(autouse=True)
def _kern_logs_as_found(request):
    """Every test on the shared lab leaves the trays' kernel logs as it found them (a test's XID lines would
    otherwise make slurmd's node check drain that tray under a later test's jobs) and their clocks synchronised."""
    if "lab" not in request.fixturenames:
        yield
        return
    lab = request.getfixturevalue("lab")
    sizes, marks = lab.kern_log_sizes(), lab.host_marks()
    yield
    lab.restore_kern_logs(sizes)
    # ... time synchronised on a host the test froze (its chronyd lost its source: the next provisioning would
    # wait 60 s for it and fail)
    lab.resync_clocks(marks)
    # ... and the site's safety budget as the next test expects it: not tripped, no grant left of a tray back
    # in service (tests resume trays with plain scontrol, as an operator may)
    lab.clear_budget()


@pytest.fixture(scope="module")
def slurm_site(slurm_lab) -> Path:
    """The inventory folder Slurm was deployed from on the shared lab (p0 = trays 1-2, p1 = trays 3-4)."""
    return slurm_lab.site


@pytest.fixture(scope="module")
def health_site(slurm_lab, tmp_path_factory) -> Path:
    """The lab's inventory with short health settings (tests.helpers.HEALTH), on the Slurm-deployed lab."""
    return write_health_site(slurm_lab.lab, tmp_path_factory.mktemp("health-site"), HEALTH)


@pytest.fixture
def health(lab, health_site, tmp_path):
    """Run mctl against the health site with this test's own state directory; clean up the lab after."""
    state = tmp_path / "state"

    def mctl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return lab.mctl("-i", str(health_site), "--state-dir", str(state), *args, timeout=timeout)

    mctl.state = state
    sizes = lab.kern_log_sizes()
    try:
        yield mctl
    finally:
        lab.clear_faults()
        lab.restore_kern_logs(sizes)     # XID lines a test wrote must not count in the next test's sweeps
        for node, (st, reason) in sinfo(lab).items():
            if ("drain" in st and reason.startswith(("mctl:", "ops:"))) or st.startswith("down"):
                # a tray frozen during the test is DOWN (not responding) in Slurm: the next test starts clean
                lab.run(lab.head, f"scontrol update NodeName={node} State=RESUME", check=False)
        wait_for("every tray idle or allocated again after the test",
                 lambda: all(st.rstrip("*") in ("idle", "allocated", "mixed", "completing") and not st.endswith("*")
                             for st, _ in sinfo(lab).values()), 60, every=0.5)


@pytest.fixture
def switch_trays(lab):
    """The shared lab with 2 switch trays (BMCs only, as `mctl lab up --switch-trays 2` starts them) for
    one test; none again after it."""
    from mctl.lab import control

    layout = control.set_switch_trays(lab.dir, 2)
    try:
        yield [sw.name for sw in layout.switches_of(lab.rack)]
    finally:
        control.set_switch_trays(lab.dir, 0)
