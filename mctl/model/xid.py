"""The XID catalogue mctl acts on (NVIDIA's action buckets as NVSentinel maps them).

Sources disagree on some codes (63, 92), so the set that drains a tray is policy;
DEFAULT_DRAIN_XIDS follows NVIDIA's fatal column and policy may override it.
"""

from __future__ import annotations

from dataclasses import dataclass

RESET_GPU = "reset GPU"
ECC_WORKFLOW = "ECC workflow"
NVLINK_WORKFLOW = "NVLink workflow"
REBOOT_HOST = "reboot host"
RESTART_APP = "restart app"
IGNORE = "ignore"
FOLLOW_LINKED = "follow the linked XID"
BUCKETS = (RESET_GPU, ECC_WORKFLOW, NVLINK_WORKFLOW, REBOOT_HOST, RESTART_APP, IGNORE, FOLLOW_LINKED)


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    bucket: str
    fatal: bool
    azure_nhc: bool = False       # Azure's node health checks fail on it

    def to_dict(self) -> dict:
        return {"code": self.code, "meaning": self.meaning, "bucket": self.bucket,
                "fatal": self.fatal, "azure_nhc": self.azure_nhc}


def _rows() -> list[XidInfo]:
    rows = [
        XidInfo(46, "GPU timeout", RESET_GPU, True),
        XidInfo(48, "double-bit ECC error", ECC_WORKFLOW, True, azure_nhc=True),
        XidInfo(63, "row remap / page retirement event", IGNORE, False, azure_nhc=True),
        XidInfo(64, "row remap / page retirement failure", RESET_GPU, True, azure_nhc=True),
        XidInfo(74, "NVLink error", NVLINK_WORKFLOW, True, azure_nhc=True),
        XidInfo(79, "GPU has fallen off the bus", REBOOT_HOST, True, azure_nhc=True),
        XidInfo(92, "excessive single-bit ECC errors", IGNORE, False, azure_nhc=True),
        XidInfo(94, "contained ECC error", RESTART_APP, False),
        XidInfo(95, "uncontained ECC error", RESET_GPU, True),
        XidInfo(119, "GSP RPC timeout", RESET_GPU, True, azure_nhc=True),
        XidInfo(120, "GSP error", RESET_GPU, True, azure_nhc=True),
        XidInfo(136, "link training failure", RESET_GPU, True),
        XidInfo(140, "unrecoverable ECC escape", RESET_GPU, True),
        XidInfo(154, "GPU recovery action changed", FOLLOW_LINKED, False),
        XidInfo(155, "NVLink SW-defined error", RESET_GPU, True),
        XidInfo(158, "NVLink fatal timeout", RESET_GPU, True),
    ]
    rows += [XidInfo(code, "NVLink5 error", NVLINK_WORKFLOW, True) for code in range(144, 151)]
    return sorted(rows, key=lambda r: r.code)


XID_CATALOGUE: dict[int, XidInfo] = {row.code: row for row in _rows()}
DEFAULT_DRAIN_XIDS: frozenset[int] = frozenset(code for code, row in XID_CATALOGUE.items() if row.fatal)


def describe(code: int) -> XidInfo | None:
    """The catalogue row, or None for codes mctl has no action for."""
    return XID_CATALOGUE.get(code)
