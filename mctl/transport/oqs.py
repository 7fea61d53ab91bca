"""Spare asyncssh's start-up search for liboqs when the library is not installed.

asyncssh looks for liboqs (post-quantum key exchange) when it is imported, with
ctypes.util.find_library, which on Linux runs ldconfig, then gcc and ld: about
0.3 s of CPU before the first SSH packet, paid by every mctl command that uses
SSH. The dynamic linker's cache answers the same question by reading one file.
When the cache and LD_LIBRARY_PATH hold no liboqs, find_library's answer for it
is None anyway, so we give that answer directly; otherwise the real search runs.
"""

from __future__ import annotations

import ctypes.util
import glob
import os

_NAMES = ("oqs", "liboqs")
_installed = False


def liboqs_present(cache: str = "/etc/ld.so.cache") -> bool:
    try:
        with open(cache, "rb") as fh:
            if b"liboqs" in fh.read():
                return True
    except OSError:
        return True   # no cache to consult: let the real search decide
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        if glob.glob(os.path.join(folder, "liboqs.so*")):
            return True
    return False


def install() -> None:
    """Answer find_library('oqs'/'liboqs') from the linker cache; idempotent."""
    global _installed
    if _installed or liboqs_present():
        _installed = True
        return
    real = ctypes.util.find_library

    def find_library(name: str):
        if name in _NAMES:
            return None
        return real(name)

    ctypes.util.find_library = find_library
    _installed = True
