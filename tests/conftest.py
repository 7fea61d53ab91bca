"""Shared test settings: pinned terminal width so rich output is stable; the session's lab; e2e last."""

import os
from pathlib import Path

os.environ.setdefault("COLUMNS", "160")
os.environ.setdefault("NO_COLOR", "1")

from tests.lab_fixture import lab  # noqa: E402,F401 - one session lab for tests/integration and tests/e2e
from tests.kube_apiserver import kube_apiserver  # noqa: E402,F401 - one real kube-apiserver per session (k8s tests)

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    """End-to-end tests run after the integration tests: they bring the shared lab's rack fully up, which no
    integration test expects; the chaos run goes last of all (it faults the shared lab at random)."""
    def is_e2e(item) -> bool:
        return E2E in Path(str(item.fspath)).resolve().parents

    def is_chaos(item) -> bool:
        return Path(str(item.fspath)).name == "test_chaos.py"

    items[:] = sorted(items, key=lambda i: 2 if is_chaos(i) else 1 if is_e2e(i) else 0)   # stable: order kept
