"""End-to-end tests: `mctl rack bring-up` on the session's shared lab (tests/lab_fixture.py).

The `lab` fixture comes from tests/conftest.py, the same one tests/integration
uses, so a full run starts one lab; tests/conftest.py orders these tests last.
Every test here is marked `lab`.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)
