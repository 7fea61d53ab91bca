"""Pure parsers and probe builders: text a host printed -> model objects (mctl.model.tray). No I/O here.

A parser that cannot trust its input raises FactsParseError; the caller turns it
into a finding for that host instead of guessing or crashing.
"""

from __future__ import annotations

from mctl.errors import MctlError


class FactsParseError(MctlError):
    """A host's output was garbled, truncated or not what the command prints."""

    def __init__(self, message: str, hint: str | None = None, *, source: str | None = None):
        super().__init__(message, hint)
        self.source = source


class DriverUnavailable(FactsParseError):
    """nvidia-smi ran but could not reach the NVIDIA driver (no GPUs to read)."""


__all__ = ["FactsParseError", "DriverUnavailable"]
