"""XIDs from the kernel log. Which codes drain is a setting (default: NVIDIA's fatal column).

An XID is an event, not a state: it counts while it is younger than the XID
window and from the current boot. Lasting effects (a GPU gone, a reset
required, ECC counters) are judged by their own checks, so a tray whose XID
aged out is healthy only if those agree.

Some lines carry their own verdict (mctl.model.xid.judge): NVLink5 XIDs 144-150 say
Fatal or Nonfatal, XID 154 names the recovery action the driver wants. A GPU that fell
off the bus with no Xid line is read as XID 79 (kernel_log).
"""

from __future__ import annotations

import re

from mctl.checks._base import finding, ok
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import pci_key
from mctl.model.xid import DEFAULT_NVLINK5_NO_DRAIN, describe, judge

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
    seen: dict[tuple[int, str, bool], list] = {}
    verdicts = {}
    for x in recent:
        v = judge(x.event.code, x.event.message, settings.drain_xids,
                  nvlink5_mode=getattr(settings, "nvlink5_drain", "fatal"),
                  nvlink5_no_drain=getattr(settings, "nvlink5_no_drain", DEFAULT_NVLINK5_NO_DRAIN))
        key = (x.event.code, _gpu_name(x.event.pci, facts), v.drains)
        seen.setdefault(key, []).append(x)
        verdicts.setdefault(key, v)
    for (code, gpu, drains), events in sorted(seen.items(), key=lambda kv: (not kv[0][2], kv[0][:2])):
        info = describe(code)
        meaning = info.meaning if info else "not in mctl's catalogue"
        newest = min((e.age_s for e in events if e.age_s is not None), default=None)
        when = f", {newest:.0f}s ago" if newest is not None else ""
        count = f" x{len(events)}" if len(events) > 1 else ""
        last = events[-1].event
        action = (f"NVIDIA's action: {info.bucket}" if info else "look the code up in NVIDIA's XID catalogue")
        if last.recovery is not None and last.recovery.needs_action:
            action = f"the driver asks for: {last.recovery.new_name}"
        elif last.nvlink5 is not None and not drains:
            action = (f"NVIDIA's catalogue: ignore ({verdicts[(code, gpu, drains)].why}); the NVLink check judges "
                      "the links themselves")
        said = last.message.strip().rstrip(".")
        said = f" ({said})" if said and said.lower() != meaning.lower() else ""
        no_xid = " (no Xid line: the driver's fallen-off-the-bus message)" if last.form == "fell-off-bus" else ""
        if last.form == "fell-off-bus":
            short = f"{gpu} fell off bus (no xid)"
        else:
            word = " fatal" if drains and last.nvlink5 is not None and last.nvlink5.fatal else ""
            short = f"xid {code}{word} {gpu} ({SHORT.get(code, 'xid')})"
        out.append(finding(Severity.CRITICAL if drains else Severity.WARN, facts.host, CHECK,
                           f"XID {code} on {gpu}{count}: {meaning}{when}{said}{no_xid}",
                           action + ("; the tray is drained until the XID ages out or it is resumed" if drains
                                     else ""),
                           short=short, code=code, gpu=gpu, count=len(events), drains=drains,
                           why=verdicts[(code, gpu, drains)].why))
    return out
