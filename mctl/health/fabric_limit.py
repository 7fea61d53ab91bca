"""Which trays carry the degraded-fabric mark (pure): the decision behind `nvl_degraded` (docs/health.md).

A partition's NVLink fabric is degraded when, in this sweep,
  - its NMX-M health is not HEALTHY/NEW (mctl.checks.switch_fabric.partition_level: DEGRADED,
    DEGRADED_BANDWIDTH, UNHEALTHY, UNKNOWN), or
  - a switch tray serving its GPUs is UNHEALTHY or MISSING_NVLINK (NVIDIA: "a loss of a switch"
    makes a partition UNHEALTHY, "not considered operational"), or
  - one of its trays reports a GPU fabric health flag (fabric.health: nvidia-smi's fabric healthMask).
Every tray of a degraded partition is marked at once; a marked tray is cleared only after
`clear_sweeps` sweeps in a row in which it is in no degraded partition (hysteresis: a flapping
switch must not mark and clear the block every sweep). A rack whose switch side was not read
this sweep changes nothing: neither mark nor clear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from mctl.checks.switch_fabric import degraded
from mctl.model.findings import Finding, Severity

FABRIC_HEALTH = "fabric.health"
STATE_NAME = "fabric-limit.json"          # under <state>/health: the clear hysteresis' counts (the marks are Slurm's)


def degraded_partitions(view, findings: Iterable[Finding]) -> dict[str, str]:
    """partition name -> why, for one rack's SwitchSideView and the sweep's findings."""
    flagged = {f.host for f in findings if f.check == FABRIC_HEALTH and f.severity is not Severity.OK}
    out: dict[str, str] = {}
    for p in view.partitions:
        whys = []
        if degraded(p.health):
            whys.append(f"NMX-M {p.health}")
        whys += [f"switch tray {f.switch} {f.state}" for f in view.faults
                 if f.kind == "switch" and p.name in f.partitions]
        whys += [f"fabric health flag on {t}" for t in p.trays if t in flagged]
        if whys:
            out[p.name] = "; ".join(whys)
    return out


def wanted_marks(views: Mapping[str, object], findings: Iterable[Finding]) -> tuple[dict[str, str], set[str]]:
    """({tray: why} of the trays in a degraded partition, the racks whose view was read this sweep)."""
    findings = list(findings)
    want: dict[str, str] = {}
    read: set[str] = set()
    for rack, view in views.items():
        if view.error or view.read_at is None:
            continue
        read.add(rack)
        for p in view.partitions:
            why = degraded_partitions(view, findings).get(p.name)
            if why:
                for t in p.trays:
                    want.setdefault(t, f"partition {p.name}: {why}")
    return want, read


@dataclass
class Limits:
    """The clear hysteresis: per marked tray, how many sweeps in a row it was in no degraded partition."""

    clear_sweeps: int = 2
    healthy: dict[str, int] = field(default_factory=dict)

    def decide(self, trays: Mapping[str, tuple[str | None, bool]], want: Mapping[str, str], read: set[str]
               ) -> list[tuple[str, bool, str]]:
        """(tray, mark, why) to act on, from {tray: (its rack, marked now in the scheduler)}."""
        out: list[tuple[str, bool, str]] = []
        for tray, (rack, marked) in trays.items():
            if rack not in read:
                continue
            if tray in want:
                self.healthy.pop(tray, None)
                if not marked:
                    out.append((tray, True, want[tray]))
                continue
            if not marked:
                self.healthy.pop(tray, None)
                continue
            n = self.healthy.get(tray, 0) + 1
            if n >= self.clear_sweeps:
                self.healthy.pop(tray, None)
                out.append((tray, False, f"its partitions' fabric healthy for {n} sweeps"))
            else:
                self.healthy[tray] = n
        return out


def load(state_dir: Path, clear_sweeps: int) -> Limits:
    """The counts the last sweep left (a damaged or missing file starts them again: a later clear, never an
    early one)."""
    from mctl.errors import MctlError
    from mctl.state.files import read_json

    path = Path(state_dir) / "health" / STATE_NAME
    try:
        doc = read_json(path, expect=dict) if path.exists() else {}
    except MctlError:
        doc = {}
    counts = doc.get("healthy_sweeps") if isinstance(doc.get("healthy_sweeps"), dict) else {}
    return Limits(clear_sweeps, {str(k): int(v) for k, v in counts.items()
                                 if isinstance(v, int) and not isinstance(v, bool) and v > 0})


def save(state_dir: Path, limits: Limits) -> None:
    from mctl.state.files import write_json

    path = Path(state_dir) / "health" / STATE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"healthy_sweeps": dict(sorted(limits.healthy.items()))})
