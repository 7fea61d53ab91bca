"""What this machine must offer before a lab can start.

Checked up front so an operator gets one message naming everything that is
missing (exit 2) instead of a half-started lab and a traceback.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mctl.errors import EnvironmentProblem

# program -> Debian package that provides it
HOST_PROGRAMS = {
    "unshare": "util-linux",
    "chroot": "coreutils",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    # the lab's apt repository (mctl/lab/aptrepo.py)
    "dpkg-deb": "dpkg",
    "dpkg-scanpackages": "dpkg-dev",
    "gpg": "gpg",
    "gpgconf": "gpgconf",
    "gpg-agent": "gpg-agent",            # gpg signs through its agent
}
BUILD_PROGRAMS = {"debootstrap": "debootstrap"}


def _overlay_available() -> bool:
    try:
        text = Path("/proc/filesystems").read_text()
    except OSError:
        return False
    if any(line.split()[-1] == "overlay" for line in text.splitlines() if line.strip()):
        return True
    # Built as a module that is not loaded yet: present on disk means mount will load it.
    release = os.uname().release
    return any(Path(f"/lib/modules/{release}/kernel/fs/overlayfs").glob("overlay.ko*"))


def missing(need_build: bool) -> list[str]:
    """Human-readable list of what is missing; empty when the lab can run."""
    out: list[str] = []
    if os.geteuid() != 0:
        out.append("root (the lab mounts overlays and creates namespaces; run with sudo)")
    programs = dict(HOST_PROGRAMS)
    if need_build:
        programs.update(BUILD_PROGRAMS)
    for prog, pkg in programs.items():
        if shutil.which(prog) is None:
            out.append(f"'{prog}' (Debian package {pkg})")
    if not _overlay_available():
        out.append("the overlay filesystem (kernel module 'overlay')")
    return out


def require(need_build: bool) -> None:
    gaps = missing(need_build)
    if gaps:
        raise EnvironmentProblem(
            "the virtual lab cannot run here: missing " + "; ".join(gaps),
            hint="install the packages named (apt-get install debootstrap util-linux openssh-client), "
                 "run as root, and load overlay (modprobe overlay)",
        )
