"""XID events from kernel log text (kern.log, dmesg, journalctl -k).

Only `NVRM: Xid` lines and the driver's "fallen off the bus" lines are read; every
other line is ignored, so a log of any size and mix can be passed in whole.

Time stamps: every form a kernel log line comes with is read, and `stamp_age` turns
it into an age on the tray's clock (observe_xid, below):
- rsyslog traditional `Nov 29 19:18:17 host kernel:` (no year: the latest year that
  is not in the future) and journalctl's `short-precise` `Nov 29 19:18:17.123456`;
- ISO 8601 with a host (`2025-11-29T19:18:17.123456+00:00 host kernel:`, rsyslog
  high precision, journalctl `short-iso`) and without one (`dmesg --time-format=iso`,
  `2025-01-21T04:41:44,285060+00:00`, comma before the fraction, also after
  `dmesg --decode`'s `kern  :warn  : `);
- `dmesg -T` / `--ctime` `[Tue Mar  5 10:11:12 2024]` (local time, with a year);
- raw `[12345.678901]` seconds since boot (dmesg default) and /dev/kmsg's
  `6,3964,206764307,-;` microseconds since boot: an age only with the tray's uptime,
  which the health probe reads in the same run (Clock.uptime).
"""

from __future__ import annotations

import re
from datetime import datetime

from mctl.model.gpu import pci_key
from mctl.model.tray import STAMP_CTIME, STAMP_ISO, STAMP_SYSLOG, Clock, XidEvent, XidObservation, BOOT_TOLERANCE_S
from mctl.model.xid import nvlink5_detail, recovery_change

_ISO_TEXT = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
# rsyslog traditional / journalctl short(-precise), or ISO 8601, then the host and `kernel:`
_SYSLOG = re.compile(
    r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?|" + _ISO_TEXT + r")"
    r" (?P<host>\S+) kernel: ?"
)
# dmesg --time-format=iso (no host), optionally after dmesg --decode's facility/level columns
_DMESG_ISO = re.compile(r"^(?:[a-z]+ *:[a-z]+ *: )?(?P<ts>" + _ISO_TEXT + r") ")
_DMESG_CTIME = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\] ?")
_DMESG = re.compile(r"^\[\s*(?P<uptime>\d+\.\d+)\] ?")
_KMSG = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;")
_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>" + _PCI + r")\): (?P<code>\d+), (?P<rest>.*)$")
_PID = re.compile(r"^pid=(?P<pid>'?<?[^,]*?>?'?), name=(?P<name>[^,]*), (?P<message>.*)$")
# The driver's own words for a GPU gone from the bus, with or without an Xid 79 line:
#   NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus ...
#   NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.
# The first form is often split over two or three lines, each continuation starting "NVRM:" (real dmesg,
# NVIDIA/NVSentinel issue 155):
#   [ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
#                  NVRM: (PCI ID: 10de:26b5) installed in this system has
#                  NVRM: fallen off the bus and is not responding to commands.
_FELL = re.compile(r"NVRM: (?:The NVIDIA GPU (?P<pci1>" + _PCI + r")\b.*?has fallen off the bus|"
                   r"GPU (?:at PCI:)?(?P<pci2>" + _PCI + r"):? GPU has fallen off the bus)")
_FELL_HEAD = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>" + _PCI + r")\b")
_FELL_TAIL = re.compile(r"NVRM:.*fallen off the bus")
FELL_CONTINUATION_LINES = 3       # the message runs over at most this many lines after its first
FELL_OFF_BUS_CODE = 79


def _pid(text: str) -> int | None:
    text = text.strip("'")
    return int(text) if text.isdigit() else None


def _stamps(prefix: str) -> tuple[str | None, str | None, float | None, str | None]:
    """(timestamp text, its kind, uptime seconds, host) from the text before `NVRM:`."""
    timestamp = kind = host = None
    uptime = None
    syslog = _SYSLOG.match(prefix)
    if syslog:
        timestamp, host = syslog["ts"], syslog["host"]
        kind = STAMP_ISO if timestamp[:4].isdigit() else STAMP_SYSLOG
        prefix = prefix[syslog.end():]
    else:
        kmsg = _KMSG.match(prefix)
        if kmsg:
            return None, None, int(kmsg["usec"]) / 1e6, None
        iso = _DMESG_ISO.match(prefix)
        if iso:
            timestamp, kind = iso["ts"], STAMP_ISO
            prefix = prefix[iso.end():]
    prefix = prefix.lstrip()
    ctime = _DMESG_CTIME.match(prefix)
    if ctime:
        if timestamp is None:
            timestamp, kind = ctime["ts"], STAMP_CTIME
        prefix = prefix[ctime.end():].lstrip()
    dmesg = _DMESG.match(prefix)
    if dmesg:
        uptime = float(dmesg["uptime"])
    return timestamp, kind, uptime, host


def parse_xid_line(line: str) -> XidEvent | None:
    """One log line -> XidEvent, or None when the line is not an XID report (nor a fallen-off-the-bus one)."""
    line = line.rstrip("\r\n")
    xid = _XID.search(line)
    if not xid:
        fell = _FELL.search(line)
        if not fell:
            return None
        timestamp, kind, uptime, host = _stamps(line[: fell.start()])
        return XidEvent(pci=(fell["pci1"] or fell["pci2"]).lower(), code=FELL_OFF_BUS_CODE,
                        message="GPU has fallen off the bus (the driver logged no Xid for it)",
                        timestamp=timestamp, uptime=uptime, host=host, stamp_kind=kind, form="fell-off-bus")
    timestamp, kind, uptime, host = _stamps(line[: xid.start()])
    rest = xid["rest"].strip()
    pid = name = None
    owner = _PID.match(rest)
    if owner:
        pid = _pid(owner["pid"])
        name = owner["name"].strip()
        name = None if name in ("", "<unknown>") else name
        rest = owner["message"].strip()
    code = int(xid["code"])
    return XidEvent(pci=xid["pci"].lower(), code=code, message=rest, timestamp=timestamp,
                    uptime=uptime, host=host, pid=pid, process_name=name, stamp_kind=kind,
                    nvlink5=nvlink5_detail(code, rest), recovery=recovery_change(code, rest))


def _pci(text: str):
    try:
        return pci_key(text)
    except ValueError:
        return text


def parse_xid_events(text: str) -> list[XidEvent]:
    """Every XID event in a kernel log, in log order.

    A GPU that fell off the bus counts once: the driver's "fallen off the bus" lines
    become one XID 79 event per GPU and uninterrupted run of such lines, and none when the log has an
    `Xid ... 79` line for that GPU (that line is the event).
    """
    lines = text.splitlines()
    events: list[XidEvent] = []
    xid79 = set()
    for n, line in enumerate(lines):
        event = parse_xid_line(line)
        if event is None:
            head = _FELL_HEAD.search(line)
            if head and any(_FELL_TAIL.search(nxt) and not _FELL_HEAD.search(nxt)
                            for nxt in lines[n + 1: n + 1 + FELL_CONTINUATION_LINES]):
                event = parse_xid_line(line[: head.end()] + " has fallen off the bus")
            if event is None:
                continue
        if event.form == "fell-off-bus":
            # one event for a run of such lines about the same GPU (the driver repeats itself)
            previous = events[-1] if events else None
            if previous is not None and previous.form == "fell-off-bus" and _pci(previous.pci) == _pci(event.pci):
                continue
        elif event.code == FELL_OFF_BUS_CODE:
            xid79.add(_pci(event.pci))
        events.append(event)
    if xid79:
        events = [e for e in events if not (e.form == "fell-off-bus" and _pci(e.pci) in xid79)]
    return events


_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                        "Dec"), start=1)}
# A stamp slightly ahead of the tray's clock is skew, not next year.
FUTURE_TOLERANCE_S = 300.0


def stamp_age(stamp: str, kind: str | None, now_local: datetime, now_epoch: float) -> float | None:
    """Seconds between a log line's wall-clock stamp and the tray's clock; None when unreadable.

    now_local is the tray's naive local time (syslog, dmesg -T and offset-less ISO stamps are
    local); now_epoch its epoch (stamps with an offset). Never negative.
    """
    if kind is None:
        kind = STAMP_ISO if stamp[:4].isdigit() else STAMP_SYSLOG
    try:
        if kind == STAMP_ISO:
            text = stamp.replace(",", ".").replace(" ", "T", 1)
            if text.endswith("Z"):
                text = text[:-1] + "+00:00"
            when = datetime.fromisoformat(text)
            if when.tzinfo is None:
                return max((now_local - when).total_seconds(), 0.0)
            return max(now_epoch - when.timestamp(), 0.0)
        if kind == STAMP_CTIME:
            when = datetime.strptime(" ".join(stamp.split()), "%a %b %d %H:%M:%S %Y")
            return max((now_local - when).total_seconds(), 0.0)
        month = _MONTHS[stamp[:3]]
        day = int(stamp[4:6])
        hh, mm, ss = (int(x) for x in stamp[7:15].split(":"))
    except (KeyError, ValueError, OverflowError):
        return None
    for year in (now_local.year, now_local.year - 1):
        try:
            when = datetime(year, month, day, hh, mm, ss)
        except ValueError:
            continue
        age = (now_local - when).total_seconds()
        if age >= -FUTURE_TOLERANCE_S:
            return max(age, 0.0)
    return None


def observe_xid(event: "XidEvent", clock: Clock | None) -> XidObservation:
    """Date an XID line. The uptime prefix is exact within one boot; the wall-clock stamp
    tells whether the line belongs to this boot at all (kern.log outlives reboots)."""
    if clock is None:
        return XidObservation(event, None, None)
    age = None
    if event.timestamp:
        # every wall-clock form the kernel log comes in (syslog, ISO, dmesg -T)
        age = stamp_age(event.timestamp, getattr(event, "stamp_kind", None), clock.local, clock.epoch)
    if event.uptime is not None:
        uptime_age = clock.uptime - event.uptime
        if uptime_age < -1.0:
            return XidObservation(event, age, False)
        if age is not None and age > clock.uptime + BOOT_TOLERANCE_S:
            return XidObservation(event, age, False)
        return XidObservation(event, max(uptime_age, 0.0), True)
    if age is not None:
        return XidObservation(event, age, age <= clock.uptime + BOOT_TOLERANCE_S)
    return XidObservation(event, None, None)
