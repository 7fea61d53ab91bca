"""The XID catalogue mctl acts on (NVIDIA's action buckets as NVSentinel maps them).

Sources disagree on some codes (63, 92), so the set that drains a tray is policy;
DEFAULT_DRAIN_XIDS follows NVIDIA's fatal column and policy may override it.

Two kinds of XID carry their own verdict on the line, and `judge` reads it:
- NVLink5 XIDs 144-150 (GB200/B200) name the unit and say `Fatal` or `Nonfatal`
  (`145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 ...)`). In NVIDIA's XID catalogue
  every Non-fatal row's immediate action is IGNORE (a few RLW_REMAP/RLW_SRC_TRACK rows:
  follow the XID 154 that comes with them) and every Fatal row's is RESET_GPU, except
  XID 149 subcodes 38 and 40 (NETIR_LINK_EVT), whose action is IGNORE. The subcode is
  bits 20-25 of the first hex word (the catalogue's intrinfo pattern).
- XID 154 says which recovery the driver now wants (`... to 0x4 (Drain and Reset)`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

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


NVLINK5_XIDS = frozenset(range(144, 151))
# (XID, subcode) pairs NVIDIA's catalogue marks Fatal but whose immediate action is IGNORE.
DEFAULT_NVLINK5_NO_DRAIN: frozenset[tuple[int, int]] = frozenset({(149, 38), (149, 40)})
NVLINK5_MODES = ("fatal", "all")          # fatal: judge by the line's word (default); all: every 144-150 drains

# NVML's nvmlGpuRecoveryAction_t, as XID 154 and <gpu_recovery_action> spell it.
RECOVERY_ACTIONS = {0: "None", 1: "GPU Reset Required", 2: "Node Reboot Required", 3: "Drain P2P",
                    4: "Drain and Reset"}

_NVLINK5 = re.compile(r"^(?P<unit>[A-Z][A-Z0-9_/]*) (?P<severity>Fatal|Nonfatal|Non-fatal) XC(?P<xc>\d+) i(?P<i>\d+) "
                      r"Link (?P<link>-?\d+)(?: \((?P<words>0x[0-9a-fA-F]+(?: 0x[0-9a-fA-F]+)*)\))?", re.I)
_RECOVERY = re.compile(r"recovery action changed from (?P<old>0x[0-9a-fA-F]+)(?: \((?P<old_name>[^)]*)\))? "
                       r"to (?P<new>0x[0-9a-fA-F]+)(?: \((?P<new_name>[^)]*)\))?", re.I)


@dataclass(frozen=True)
class NvLink5Detail:
    """What an NVLink5 XID line (144-150) says about itself."""

    unit: str                         # RLW_RXPIPE, NETIR_LINK_EVT, ...
    fatal: bool                       # the line's Fatal / Nonfatal word
    link: int | None                  # -1 on the line: not one link
    subcode: int | None               # bits 20-25 of the first hex word
    words: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"unit": self.unit, "fatal": self.fatal, "link": self.link, "subcode": self.subcode,
                "words": [f"{w:#010x}" for w in self.words]}


@dataclass(frozen=True)
class RecoveryChange:
    """XID 154: the recovery action the driver asks for now."""

    old: int
    new: int
    new_name: str                      # the driver's words, else NVML's name for the number

    @property
    def needs_action(self) -> bool:
        return self.new != 0

    def to_dict(self) -> dict:
        return {"old": self.old, "new": self.new, "new_name": self.new_name}


def nvlink5_detail(code: int, message: str) -> NvLink5Detail | None:
    """The unit, severity word, link and subcode of an NVLink5 XID's message; None if it has none."""
    if code not in NVLINK5_XIDS:
        return None
    match = _NVLINK5.match(message.strip())
    if not match:
        return None
    words = tuple(int(w, 16) for w in (match["words"] or "").split())
    link = int(match["link"])
    return NvLink5Detail(unit=match["unit"], fatal=match["severity"].lower() == "fatal",
                         link=None if link < 0 else link, subcode=(words[0] >> 20) & 0x3F if words else None,
                         words=words)


def recovery_change(code: int, message: str) -> RecoveryChange | None:
    """XID 154's `GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)`."""
    if code != 154:
        return None
    match = _RECOVERY.search(message)
    if not match:
        return None
    new = int(match["new"], 16)
    name = (match["new_name"] or "").strip() or RECOVERY_ACTIONS.get(new, f"action {new:#x}")
    return RecoveryChange(old=int(match["old"], 16), new=new, new_name=name)


@dataclass(frozen=True)
class XidVerdict:
    drains: bool
    why: str                           # a few words on what decided it (for the finding)


def judge(code: int, message: str, drain_xids: Iterable[int], *, nvlink5_mode: str = "fatal",
          nvlink5_no_drain: Iterable[tuple[int, int]] = DEFAULT_NVLINK5_NO_DRAIN) -> XidVerdict:
    """Whether one XID line drains the tray, reading the verdict the line itself carries.

    XID 154 drains when the new recovery action it names is anything but None, whatever
    drain_xids says: it is the driver stating the GPU's state, as <gpu_recovery_action> does
    (the gpu.recovery check), not an event to weigh; a 154 line without the action follows
    drain_xids. Any other code outside drain_xids never drains. NVLink5 lines (144-150) drain
    on `Fatal` unless (code, subcode) is in nvlink5_no_drain; `Nonfatal` never drains. A
    144-150 line without the word (older drivers) is judged by drain_xids alone.
    """
    drain = frozenset(drain_xids)
    if code == 154:
        change = recovery_change(code, message)
        if change is None:
            return XidVerdict(code in drain, "recovery action not on the line")
        return XidVerdict(change.needs_action, f"driver asks for: {change.new_name}")
    if code not in drain:
        return XidVerdict(False, "not in drain_xids")
    detail = nvlink5_detail(code, message)
    if detail is None or nvlink5_mode == "all":
        return XidVerdict(True, "in drain_xids")
    if not detail.fatal:
        return XidVerdict(False, f"{detail.unit} Nonfatal (NVIDIA: ignore)")
    if detail.subcode is not None and (code, detail.subcode) in frozenset(nvlink5_no_drain):
        return XidVerdict(False, f"{detail.unit} Fatal, subcode {detail.subcode} (NVIDIA: ignore)")
    return XidVerdict(True, f"{detail.unit} Fatal")
