"""How many GPUs each tray gives Slurm: the trays' facts, not the rack model alone (pure).

The facts are the last `mctl rack inventory` snapshot of each rack
(<state>/snapshots/inventory/<rack>/, mctl/state/snapshots.py): the GPUs
nvidia-smi listed on each tray, with their device minor numbers. A tray that
lost a GPU is configured as it is (`Gres=gpu:3`, gres.conf naming the device
files of the GPUs that are there), so slurmd registers instead of going
INVALID, and the plan warns about it. Where a rack has no snapshot, or a tray
gave no GPU facts in it, the rack model's count is used and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mctl.model.site import Site, fold


@dataclass(frozen=True)
class TrayGpus:
    count: int
    minors: tuple[int, ...]          # /dev/nvidia<minor> of each GPU, ascending
    source: str                      # "facts" (rack inventory) or "model"

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "minors": list(self.minors), "source": self.source}


def _from_facts(tray: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The minors of the GPUs one snapshot tray reported; None when it reported no GPU facts."""
    if tray.get("reach") != "ok" or not isinstance(tray.get("nvidia_smi"), Mapping):
        return None
    gpus = tray["nvidia_smi"].get("gpus")
    if not isinstance(gpus, list):
        return None
    minors = []
    for g in gpus:
        m = g.get("minor_number") if isinstance(g, Mapping) else None
        if m is None:
            m = g.get("index") if isinstance(g, Mapping) else None
        if not isinstance(m, int) or isinstance(m, bool) or not 0 <= m < 256:
            return None
        minors.append(m)
    if len(set(minors)) != len(minors):
        return None
    return tuple(sorted(minors))


def tray_gpus(site: Site, snapshots: Mapping[str, Mapping[str, Any] | None],
              taken: Mapping[str, str] | None = None) -> tuple[dict[str, TrayGpus], list[str]]:
    """Each compute tray's GPUs, from *snapshots* (rack name -> snapshot data, None: no snapshot)
    where they say, else from the rack model; and the warnings the plan shows."""
    out: dict[str, TrayGpus] = {}
    warnings: list[str] = []
    for rack in site.racks.values():
        if not rack.compute:
            continue
        model = rack.gpus_per_tray
        data = snapshots.get(rack.name)
        when = (taken or {}).get(rack.name) or (data or {}).get("taken_at") or "unknown time"
        by_host = {t.get("host"): t for t in (data or {}).get("trays", []) if isinstance(t, Mapping)}
        no_facts: list[str] = []
        for h in rack.compute:
            minors = _from_facts(by_host[h.name]) if h.name in by_host else None
            if minors is None:
                out[h.name] = TrayGpus(model, tuple(range(model)), "model")
                no_facts.append(h.name)
                continue
            out[h.name] = TrayGpus(len(minors), minors, "facts")
            if len(minors) != model:
                warnings.append(f"{h.name} reported {len(minors)} GPU{'s' if len(minors) != 1 else ''} in the rack "
                                f"inventory of {when} (the {rack.model} model has {model}): configured with "
                                f"Gres=gpu:{len(minors)}; replace the GPU, then 'mctl rack inventory {rack.name}' "
                                "and 'mctl deploy slurm'")
        if data is None:
            warnings.append(f"no rack inventory of {rack.name} (mctl rack inventory {rack.name}): Gres from the "
                            f"rack model, {model} GPUs per tray")
        elif no_facts:
            warnings.append(f"no GPU facts for {fold(no_facts)} in the rack inventory of {when}: Gres from the rack "
                            f"model, {model} GPUs per tray")
    return out, warnings
