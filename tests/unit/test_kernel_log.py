"""XID lines in the forms rsyslog, dmesg and journalctl write them."""

from __future__ import annotations

from mctl.facts.kernel_log import parse_xid_events, parse_xid_line
from mctl.model.xid import DEFAULT_DRAIN_XIDS, XID_CATALOGUE, describe

LOG = """\
Nov 29 19:18:10 lab-r1-tray03 kernel: [  120.000] nvidia-nvlink: Nvlink Core is being initialized
Nov 29 19:18:17 lab-r1-tray03 kernel: [  123.456] NVRM: Xid (PCI:0008:01:00): 79, pid=1234, name=python, GPU has fallen off the bus.
[  130.5] NVRM: Xid (PCI:0000:29:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.
NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
2025-11-29T19:18:17.123456+00:00 lab-r1-tray04 kernel: NVRM: Xid (PCI:0000:3B:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
Nov 29 19:18:20 lab-r1-tray03 sshd[99]: Accepted publickey for root
"""


def test_every_prefix_form():
    events = parse_xid_events(LOG)
    assert [(e.pci, e.code) for e in events] == [("0008:01:00", 79), ("0000:29:00", 48),
                                                 ("0009:01:00", 154), ("0000:3b:00", 13)]
    rsyslog, dmesg, bare, iso = events
    assert (rsyslog.timestamp, rsyslog.host, rsyslog.uptime) == ("Nov 29 19:18:17", "lab-r1-tray03", 123.456)
    assert (rsyslog.pid, rsyslog.process_name, rsyslog.message) == (1234, "python", "GPU has fallen off the bus.")
    assert (dmesg.timestamp, dmesg.host, dmesg.uptime) == (None, None, 130.5)
    assert dmesg.pid is None and dmesg.process_name is None
    assert dmesg.message.startswith("An uncorrectable double bit error")
    assert (bare.timestamp, bare.uptime, bare.pid) == (None, None, None)
    assert bare.message == "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    assert (iso.timestamp, iso.host) == ("2025-11-29T19:18:17.123456+00:00", "lab-r1-tray04")
    assert iso.message.startswith("Graphics SM Warp Exception")


def test_event_matches_gpu_by_bus_id():
    event = parse_xid_line("NVRM: Xid (PCI:0008:01:00): 79, pid=1, name=x, GPU has fallen off the bus.")
    assert event.on_gpu("00000008:01:00.0")
    assert not event.on_gpu("00000009:01:00.0")
    assert event.info.bucket == "reboot host" and event.info.fatal


def test_non_xid_lines_are_ignored():
    assert parse_xid_line("Nov 29 19:18:10 h kernel: NVRM: loading NVIDIA UNIX Open Kernel Module") is None
    assert parse_xid_events("") == []
    assert parse_xid_events("NVRM: Xid (PCI:zz): 79, truncated") == []


def test_catalogue_follows_health_signals():
    assert describe(79).meaning == "GPU has fallen off the bus"
    assert describe(63).fatal is False and describe(63).azure_nhc is True
    assert describe(92).bucket == "ignore"
    assert describe(74).bucket == "NVLink workflow"
    assert all(describe(c).bucket == "NVLink workflow" for c in range(144, 151))
    assert describe(154).bucket == "follow the linked XID" and not describe(154).fatal
    assert describe(13) is None
    assert {63, 92, 94, 154}.isdisjoint(DEFAULT_DRAIN_XIDS)
    assert {46, 48, 64, 74, 79, 95, 119, 120, 136, 140, 155, 158} <= DEFAULT_DRAIN_XIDS
    assert list(XID_CATALOGUE) == sorted(XID_CATALOGUE)
