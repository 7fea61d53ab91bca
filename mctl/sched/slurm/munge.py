"""The site's MUNGE key: made once, kept under the state directory, never printed.

Every Slurm host of a site must hold the same key; whoever holds it can forge
any user's credentials, so it lives in a 0700 folder as a 0600 file, travels to
the hosts only through Ansible with no_log, and mctl only ever shows whether a
host's copy matches (by digest), never the key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from mctl.errors import EnvironmentProblem
from mctl.state import atomic_write, ensure_dir

KEY_BYTES = 1024          # what mungekey makes by default


def site_dir(state_dir: Path, site: str) -> Path:
    return Path(state_dir) / "slurm" / site


def key_path(state_dir: Path, site: str) -> Path:
    return site_dir(state_dir, site) / "munge.key"


def ensure_key(path: Path) -> bool:
    """Create the key if there is none (True when created); tighten loose permissions on an old one."""
    ensure_dir(path.parent, mode=0o700)
    os.chmod(path.parent, 0o700)
    if path.exists():
        if path.stat().st_size < 32:
            raise EnvironmentProblem(f"the MUNGE key {path} is shorter than 32 bytes",
                                     hint="remove it and run 'mctl deploy slurm' again: a new key is made and "
                                          "distributed to every Slurm host")
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        return False
    atomic_write(path, secrets.token_bytes(KEY_BYTES), mode=0o600)
    return True


def digest(path: Path) -> str | None:
    """sha256 of the key, to compare with `sha256sum` on the hosts; None when there is no key yet."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
