"""Fixtures more than one unit module uses (builders without fixtures are in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    """An ed25519 client key for SSH pools against tests.helpers.FakeTray servers."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id_ed25519"
    key.write_private_key(str(path))
    path.chmod(0o600)           # like ssh-keygen: mctl refuses a private key others can read
    return path
