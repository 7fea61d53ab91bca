"""The SSH identity file is a secret: checked like the NMX-M credentials before any use.

OpenSSH refuses a private key that its group or others can read ("UNPROTECTED PRIVATE KEY FILE");
asyncssh, which mctl's own transport uses, does not. mctl refuses it for both paths, before a
connection is made or a playbook starts, with the fix in the hint.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mctl.errors import UsageError


def check_identity_file(path: str | Path | None, *, must_exist: bool = True) -> Path | None:
    """*path* is a regular file only its owner can read or write; else UsageError (exit 2) naming it.
    With must_exist False (a dry run that opens no connection) a missing file passes."""
    if path is None:
        return None
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if not must_exist:
            return None
        raise UsageError(f"SSH identity file {p} does not exist",
                         hint="set ssh.identity_file in the inventory to your private key") from None
    except OSError as exc:
        raise UsageError(f"cannot read SSH identity file {p}: {exc.strerror or exc}",
                         hint="set ssh.identity_file in the inventory to a readable private key") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"SSH identity file {p} is not a regular file",
                         hint="set ssh.identity_file in the inventory to your private key")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UsageError(f"SSH identity file {p} is readable or writable by others (mode {mode:04o}); "
                         "a private key must be private", hint=f"chmod 600 {p}")
    return p
