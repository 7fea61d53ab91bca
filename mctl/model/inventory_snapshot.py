"""What one inventory run saw on a rack, and what changed since the last run.

A tray's facts are mctl.model.tray.TrayFacts. Snapshots are stored as plain
JSON (TrayFacts.snapshot_dict) and compared as JSON, so a snapshot written by an older
mctl still diffs against a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

SNAPSHOT_SCHEMA = 1


# --- comparing two snapshots (JSON form) --------------------------------------------------------

@dataclass(frozen=True)
class Change:
    host: str
    kind: str            # reach, gpu-swap, gpu-missing, gpu-added, clique, cluster-uuid, fabric, driver, os, kernel, finding-new, finding-resolved
    message: str
    before: Any = None
    after: Any = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "kind": self.kind, "message": self.message, "before": self.before,
                "after": self.after, **({"details": self.details} if self.details else {})}


def _gpus(tray: dict) -> list[dict]:
    smi = tray.get("nvidia_smi") or {}
    return list(smi.get("gpus") or [])


def _slot(gpu: dict) -> tuple:
    """Where a GPU sits in its tray: the module position survives a swap, the UUID does not."""
    if gpu.get("module_id") is not None:
        return ("module", gpu["module_id"])
    if gpu.get("pci_bus_id"):
        return ("pci", gpu["pci_bus_id"].lower())
    return ("index", gpu.get("index"))


def _slot_name(slot: tuple, gpu: dict) -> str:
    kind, value = slot
    idx = gpu.get("index")
    if kind == "module":
        return f"GPU {idx} (module {value})"
    return f"GPU {idx} ({kind} {value})"


def _tray_value(tray: dict, key: str) -> Any:
    smi = tray.get("nvidia_smi") or {}
    if key == "clique":
        return smi.get("clique_ids") or None
    if key == "cluster":
        return smi.get("cluster_uuids") or None
    if key == "driver":
        return smi.get("driver_version")
    if key == "fabric":
        states = sorted({f"{(g.get('fabric') or {}).get('state')}/{(g.get('fabric') or {}).get('status')}"
                         for g in _gpus(tray)})
        return states or None
    if key == "os":
        return (tray.get("os") or {}).get("pretty_name")
    if key == "kernel":
        return tray.get("kernel")
    raise KeyError(key)


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) if value else "none"
    return "none" if value is None else str(value)


def _gpu_changes(host: str, old: dict, new: dict) -> list[Change]:
    out: list[Change] = []
    before = {_slot(g): g for g in _gpus(old)}
    after = {_slot(g): g for g in _gpus(new)}
    for slot in sorted(set(before) | set(after), key=lambda s: (s[0], str(s[1]))):
        a, b = before.get(slot), after.get(slot)
        if a and not b:
            out.append(Change(host, "gpu-missing", f"{_slot_name(slot, a)} is gone (was serial {a.get('serial')}, "
                                                   f"{a.get('uuid')})", a.get("serial"), None))
        elif b and not a:
            out.append(Change(host, "gpu-added", f"{_slot_name(slot, b)} appeared (serial {b.get('serial')})",
                              None, b.get("serial")))
        elif a and b and (a.get("serial") != b.get("serial") or a.get("uuid") != b.get("uuid")):
            out.append(Change(host, "gpu-swap",
                              f"{_slot_name(slot, b)} serial {a.get('serial')} -> {b.get('serial')}: "
                              f"hardware swap", a.get("serial"), b.get("serial"),
                              {"uuid_before": a.get("uuid"), "uuid_after": b.get("uuid")}))
    return out


_TRAY_KEYS = (
    ("clique", "clique", "clique {before} -> {after}: partition change"),
    ("cluster", "cluster-uuid", "NVLink domain {before} -> {after}"),
    ("fabric", "fabric", "fabric {before} -> {after}"),
    ("driver", "driver", "driver {before} -> {after}"),
    ("os", "os", "OS {before} -> {after}"),
    ("kernel", "kernel", "kernel {before} -> {after}"),
)
_GPU_KEYS = frozenset({"clique", "cluster", "fabric", "driver"})


def _finding_key(f: dict) -> tuple:
    return (f.get("host"), f.get("check"), f.get("message"))


def diff_snapshots(old: dict, new: dict) -> list[Change]:
    """Changes from snapshot *old* to *new* (both the JSON form of one rack's inventory).

    Facts are compared only where both runs reached the tray; a tray that went
    dark shows as a reach change, not as every GPU going missing.
    """
    changes: list[Change] = []
    old_trays = {t["host"]: t for t in old.get("trays", [])}
    new_trays = {t["host"]: t for t in new.get("trays", [])}
    for host in sorted(set(old_trays) | set(new_trays)):
        a, b = old_trays.get(host), new_trays.get(host)
        if a is None or b is None:
            changes.append(Change(host, "tray", "tray added to the inventory" if a is None
                                  else "tray removed from the inventory", None if a is None else "present",
                                  "present" if a is None else None))
            continue
        if a.get("reach") != b.get("reach"):
            changes.append(Change(host, "reach", f"was {a.get('reach')}, now {b.get('reach')}"
                                  + (f" ({b.get('error')})" if b.get("error") else ""), a.get("reach"), b.get("reach")))
        if a.get("reach") != "ok" or b.get("reach") != "ok":
            continue
        if a.get("address") != b.get("address"):
            changes.append(Change(host, "address", f"address {a.get('address')} -> {b.get('address')}",
                                  a.get("address"), b.get("address")))
        if (a.get("nvidia_smi") is None) != (b.get("nvidia_smi") is None):
            changes.append(Change(host, "gpu-facts", "GPU facts " + ("lost: " + str(b.get("gpu_error"))
                                                                     if b.get("nvidia_smi") is None else "readable again"),
                                  a.get("gpu_error"), b.get("gpu_error")))
        both_gpu_facts = a.get("nvidia_smi") is not None and b.get("nvidia_smi") is not None
        if both_gpu_facts:
            changes.extend(_gpu_changes(host, a, b))
        for key, kind, text in _TRAY_KEYS:
            if key in _GPU_KEYS and not both_gpu_facts:
                continue  # unreadable GPU facts are reported once above, not as every GPU value changing
            va, vb = _tray_value(a, key), _tray_value(b, key)
            if va != vb:
                changes.append(Change(host, kind, text.format(before=_fmt(va), after=_fmt(vb)), va, vb))
    changes.extend(_finding_changes(old.get("findings", []), new.get("findings", [])))
    return changes


def _finding_changes(old: Iterable[dict], new: Iterable[dict]) -> list[Change]:
    before = {_finding_key(f): f for f in old if f.get("severity") != "ok"}
    after = {_finding_key(f): f for f in new if f.get("severity") != "ok"}
    out = []
    for key in sorted(set(after) - set(before), key=str):
        f = after[key]
        out.append(Change(f.get("host") or "-", "finding-new", f"new {f['severity']}: {f['message']}",
                          None, f.get("check")))
    for key in sorted(set(before) - set(after), key=str):
        f = before[key]
        out.append(Change(f.get("host") or "-", "finding-resolved", f"resolved: {f['message']}",
                          f.get("check"), None))
    return out
