"""Integration tests: every test here runs against the shared virtual lab (the `lab` fixture).

The fixture and its handle live in tests/lab_fixture.py and are registered in
tests/conftest.py, so tests/e2e uses the same lab (one start per session). See
that module for the handle's API. Every test under this folder is marked `lab`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab_fixture import TRAYS_ENV, LabHandle, _free_net, lab_skip_reason  # noqa: F401 - imported by tests


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)




@pytest.fixture(autouse=True)
def _kern_logs_as_found(request):
    """Every test on the shared lab leaves the trays' kernel logs as it found them: a test's XID lines would
    otherwise make slurmd's node check drain that tray under a later test's jobs."""
    if "lab" not in request.fixturenames:
        yield
        return
    lab = request.getfixturevalue("lab")
    sizes = lab.kern_log_sizes()
    yield
    lab.restore_kern_logs(sizes)
    # ... and the site's safety budget as the next test expects it: not tripped, no grant left of a tray back
    # in service (tests resume trays with plain scontrol, as an operator may)
    lab.clear_budget()

