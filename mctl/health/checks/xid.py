"""XIDs from the kernel log. Which codes drain is a setting (default: NVIDIA's fatal column).

An XID is an event, not a state: it counts while it is younger than the XID
window and from the current boot. Lasting effects (a GPU gone, a reset
required, ECC counters) are judged by their own checks, so a tray whose XID
aged out is healthy only if those agree.
"""

from __future__ import annotations

import re

from mctl.health.checks._base import finding, ok
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import pci_key
from mctl.model.xid import describe

CHECK = "gpu.xid"

# A few words per code for the drain reason (sinfo -R shows little).
SHORT = {46: "gpu timeout", 48: "dbe ecc", 63: "row remap", 64: "row remap fail", 74: "nvlink error",
         79: "fell off bus", 92: "sbe rate", 94: "contained ecc", 95: "uncontained ecc", 119: "gsp timeout",
         120: "gsp error", 136: "link training", 140: "ecc escape", 154: "recovery changed", 155: "nvlink sw error",
         158: "nvlink timeout", **{c: "nvlink5 error" for c in range(144, 151)}}


_LOST = re.compile(r"GPU(?P<index>\d+): (?P<pci>[0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")


def _gpu_name(pci: str, facts) -> str:
    """'gpu0' when the XID's PCI address is a GPU nvidia-smi listed (or named as lost), else the address."""
    try:
        key = pci_key(pci)
    except ValueError:
        return pci
    if facts.gpus is not None:
        for g in facts.gpus.gpus:
            try:
                if pci_key(g.pci_bus_id) == key:
                    return f"gpu{g.index}"
            except ValueError:
                continue
    for message in facts.gpu_messages:      # "Unable to determine the device handle for GPU0: 0000:29:00.0: ..."
        for m in _LOST.finditer(message):
            try:
                if pci_key(m["pci"]) == key:
                    return f"gpu{m['index']}"
            except ValueError:
                continue
    return pci


def check(facts, expect, settings) -> list[Finding]:
    if facts.xid_source is None and not facts.xids:
        return []
    window = settings.xid_window_s
    recent = [x for x in facts.xids if x.this_boot is not False and (x.age_s is None or x.age_s <= window)]
    if not recent:
        older = len(facts.xids)
        note = f" ({older} older or from an earlier boot)" if older else ""
        return [ok(facts.host, CHECK, f"no XID in the last {window:g}s{note}")]
    out = []
    seen: dict[tuple[int, str], list] = {}
    for x in recent:
        seen.setdefault((x.event.code, _gpu_name(x.event.pci, facts)), []).append(x)
    for (code, gpu), events in sorted(seen.items(), key=lambda kv: (kv[0][0] not in settings.drain_xids, kv[0])):
        info = describe(code)
        meaning = info.meaning if info else "not in mctl's catalogue"
        newest = min((e.age_s for e in events if e.age_s is not None), default=None)
        when = f", {newest:.0f}s ago" if newest is not None else ""
        count = f" x{len(events)}" if len(events) > 1 else ""
        drains = code in settings.drain_xids
        action = (f"NVIDIA's action: {info.bucket}" if info else "look the code up in NVIDIA's XID catalogue")
        said = events[-1].event.message.strip().rstrip(".")
        said = f" ({said})" if said and said.lower() != meaning.lower() else ""
        out.append(finding(Severity.CRITICAL if drains else Severity.WARN, facts.host, CHECK,
                           f"XID {code} on {gpu}{count}: {meaning}{when}{said}",
                           action + ("; the tray is drained until the XID ages out or it is resumed" if drains
                                     else ""),
                           short=f"xid {code} {gpu} ({SHORT.get(code, 'xid')})", code=code, gpu=gpu,
                           count=len(events), drains=drains))
    return out
