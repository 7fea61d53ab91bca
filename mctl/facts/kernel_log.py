"""XID events from kernel log text (kern.log, dmesg, journalctl -k).

Only `NVRM: Xid` lines are read; every other line is ignored, so a log of any
size and mix can be passed in whole.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from mctl.model.gpu import pci_key
from mctl.model.xid import XidInfo, describe

# rsyslog traditional `Nov 29 19:18:17 host kernel: `, RFC 3339 `2025-11-29T19:18:17.123456+00:00 host kernel: `
_SYSLOG = re.compile(
    r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" (?P<host>\S+) kernel: ?"
)
_DMESG = re.compile(r"^\[\s*(?P<uptime>\d+\.\d+)\] ?")
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
                  r"(?P<code>\d+), (?P<rest>.*)$")
_PID = re.compile(r"^pid=(?P<pid>'?<?[^,]*?>?'?), name=(?P<name>[^,]*), (?P<message>.*)$")


@dataclass(frozen=True)
class XidEvent:
    pci: str                          # as the kernel printed it, e.g. "0008:01:00"
    code: int
    message: str
    timestamp: str | None = None      # the syslog timestamp text, when the line had one
    uptime: float | None = None       # seconds since boot from the `[  123.456]` prefix
    host: str | None = None
    pid: int | None = None
    process_name: str | None = None

    @property
    def info(self) -> XidInfo | None:
        return describe(self.code)

    def on_gpu(self, pci_bus_id: str) -> bool:
        """Whether this event is about the GPU nvidia-smi lists at `pci_bus_id` (00000008:01:00.0)."""
        try:
            return pci_key(self.pci) == pci_key(pci_bus_id)
        except ValueError:
            return False

    def to_dict(self) -> dict:
        data = asdict(self)
        info = self.info
        data["info"] = info.to_dict() if info else None
        return data


def _pid(text: str) -> int | None:
    text = text.strip("'")
    return int(text) if text.isdigit() else None


def parse_xid_line(line: str) -> XidEvent | None:
    """One log line -> XidEvent, or None when the line is not an XID report."""
    line = line.rstrip("\r\n")
    xid = _XID.search(line)
    if not xid:
        return None
    prefix = line[: xid.start()]
    timestamp = host = None
    uptime = None
    syslog = _SYSLOG.match(prefix)
    if syslog:
        timestamp, host = syslog["ts"], syslog["host"]
        prefix = prefix[syslog.end():]
    dmesg = _DMESG.match(prefix.lstrip())
    if dmesg:
        uptime = float(dmesg["uptime"])
    rest = xid["rest"].strip()
    pid = name = None
    owner = _PID.match(rest)
    if owner:
        pid = _pid(owner["pid"])
        name = owner["name"].strip()
        name = None if name in ("", "<unknown>") else name
        rest = owner["message"].strip()
    return XidEvent(pci=xid["pci"].lower(), code=int(xid["code"]), message=rest, timestamp=timestamp,
                    uptime=uptime, host=host, pid=pid, process_name=name)


def parse_xid_events(text: str) -> list[XidEvent]:
    """Every XID event in a kernel log, in log order."""
    return [event for event in map(parse_xid_line, text.splitlines()) if event is not None]
