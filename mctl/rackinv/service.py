"""The rack inventory service: discover (SSH facts), decide (shape rules), remember (snapshots).

The CLI calls run_inventory() and only renders the report it gets back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from mctl.errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, UsageError
from mctl.model.findings import Finding, Severity, sort_findings, worst
from mctl.model.inventory_snapshot import SNAPSHOT_SCHEMA, Change, diff_snapshots
from mctl.model.tray import TrayFacts
from mctl.state.snapshots import RACK_INVENTORY as SNAPSHOT_KIND

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site



@dataclass
class RackReport:
    rack: "Rack"
    trays: list[TrayFacts]
    findings: list[Finding]
    taken_at: datetime
    snapshot: dict
    snapshot_path: Path | None = None
    previous_path: Path | None = None
    previous_taken_at: datetime | None = None
    changes: list[Change] | None = None          # None: no diff asked for, or nothing to compare with

    @property
    def unreached(self) -> list[TrayFacts]:
        return [t for t in self.trays if not t.reached]

    def to_dict(self) -> dict:
        out = dict(self.snapshot)
        out["snapshot_path"] = str(self.snapshot_path) if self.snapshot_path else None
        if self.changes is not None or self.previous_path is not None:
            out["diff"] = {"since": self.previous_taken_at.isoformat() if self.previous_taken_at else None,
                           "previous_snapshot": str(self.previous_path) if self.previous_path else None,
                           "changes": [c.to_dict() for c in (self.changes or [])]}
        return out


@dataclass
class InventoryReport:
    site: str
    racks: list[RackReport]
    elapsed: float
    cross_rack: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return sort_findings([f for r in self.racks for f in r.findings] + self.cross_rack)

    @property
    def exit_code(self) -> int:
        """3 when some tray gave no answer, else 1 on a critical finding, else 0."""
        if any(r.unreached for r in self.racks):
            return EXIT_PARTIAL
        if worst(self.findings) is Severity.CRITICAL:
            return EXIT_FINDINGS
        return EXIT_OK

    def to_dict(self) -> dict:
        findings = self.findings
        return {"site": self.site, "elapsed": round(self.elapsed, 3), "exit_code": self.exit_code,
                "summary": {"racks": len(self.racks), "trays": sum(len(r.trays) for r in self.racks),
                            "unreached": sum(len(r.unreached) for r in self.racks),
                            "critical": sum(f.severity is Severity.CRITICAL for f in findings),
                            "warn": sum(f.severity is Severity.WARN for f in findings)},
                "racks": [r.to_dict() for r in self.racks],
                "findings": [f.to_dict() for f in findings]}


def select_racks(site: "Site", names: Sequence[str], all_racks: bool) -> list["Rack"]:
    if all_racks and names:
        raise UsageError("give rack names or --all, not both")
    if all_racks:
        return list(site.racks.values())
    if not names:
        raise UsageError("no rack given", hint=f"name a rack or pass --all; known racks: {', '.join(site.racks)}")
    unknown = [n for n in names if n not in site.racks]
    if unknown:
        raise UsageError(f"unknown rack{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                         hint=f"known racks: {', '.join(site.racks) or 'none'}")
    return [site.racks[n] for n in dict.fromkeys(names)]


def _snapshot(site: "Site", rack: "Rack", trays: list[TrayFacts], findings: list[Finding],
              taken_at: datetime) -> dict:
    return {
        "schema": SNAPSHOT_SCHEMA, "kind": "rack-inventory", "site": site.name, "rack": rack.name,
        "taken_at": taken_at.isoformat(timespec="seconds"),
        "expected": {"model": rack.model, "compute_trays": rack.compute_trays, "gpus_per_tray": rack.gpus_per_tray,
                     "nvlink_domain": rack.nvlink_domain},
        "trays": [t.snapshot_dict() for t in trays],
        "findings": [f.to_dict() for f in sort_findings(findings)],
    }


def _known_domains(site: "Site", state_dir: Path, racks: Sequence["Rack"]) -> dict[str, str]:
    """Cluster UUIDs other racks are known by: declared in the inventory or seen in their last snapshot."""
    from mctl.state import latest_snapshot

    wanted = {r.name for r in racks}
    out: dict[str, str] = {}
    for other in site.racks.values():
        if other.name in wanted:
            continue
        if other.nvlink_domain:
            out.setdefault(other.nvlink_domain, other.name)
        snap = _latest(state_dir, other.name)
        for tray in (snap.data.get("trays", []) if snap and isinstance(snap.data, dict) else []):
            for u in ((tray.get("nvidia_smi") or {}).get("cluster_uuids") or []):
                out.setdefault(u, other.name)
    return out


def _latest(state_dir: Path, rack: str):
    """The rack's newest inventory snapshot, its shape checked (a damaged one is named, exit 2)."""
    from mctl.state import check_shape, latest_snapshot

    snap = latest_snapshot(state_dir, SNAPSHOT_KIND, rack)
    if snap is None:
        return None
    trays = check_shape(snap.path, snap.data.get("trays", []), list, "trays")
    for i, tray in enumerate(trays):
        check_shape(snap.path, tray, dict, f"trays[{i}]")
        check_shape(snap.path, tray.get("host"), str, f"trays[{i}].host")
        check_shape(snap.path, tray.get("nvidia_smi"), (dict, type(None)), f"trays[{i}].nvidia_smi")
        uuids = (tray.get("nvidia_smi") or {}).get("cluster_uuids")
        check_shape(snap.path, uuids, (list, type(None)), f"trays[{i}].nvidia_smi.cluster_uuids")
        if any(not isinstance(u, str) for u in uuids or ()):
            check_shape(snap.path, next(u for u in uuids if not isinstance(u, str)), str,
                        f"trays[{i}].nvidia_smi.cluster_uuids[]")
    findings = check_shape(snap.path, snap.data.get("findings", []), list, "findings")
    for i, f in enumerate(findings):
        check_shape(snap.path, f, dict, f"findings[{i}]")
        check_shape(snap.path, f.get("severity"), str, f"findings[{i}].severity")
        check_shape(snap.path, f.get("message"), str, f"findings[{i}].message")
    return snap


def run_inventory(site: "Site", racks: Sequence["Rack"], *, state_dir: Path, timeout: float | None = None,
                  save: bool = True, diff: bool = False) -> InventoryReport:
    from mctl.rackinv.collect import collect_facts
    from mctl.checks.inventory import rack_domains, validate_rack
    from mctl.state import ensure_dir, latest_snapshot, save_snapshot
    from mctl.transport import SSHConfig, SSHPool, targets_for

    if save:
        ensure_dir(Path(state_dir) / "snapshots" / SNAPSHOT_KIND)   # fail before touching any host
    start = time.monotonic()
    per_rack_targets = [(rack, targets_for(site, rack.compute)) for rack in racks]
    all_targets = [t for _, ts in per_rack_targets for t in ts]

    from mctl.transport.ssh import per_tray_deadline

    # One bound per tray for all of its work (connect, session, the script, its output): a hung
    # or frozen tray costs this, never the whole ssh.command_timeout plus an unbounded session open.
    deadline = per_tray_deadline(configured=site.health.tray_deadline, command_timeout=site.ssh.command_timeout,
                                 override=timeout)

    async def gather() -> list[TrayFacts]:
        # waves: each tray's deadline from its slot, the fan-out's per wave of ssh.concurrency (D124)
        async with SSHPool(SSHConfig.from_site(site), waves=True) as pool:
            return await collect_facts(pool, all_targets, deadline=deadline)

    # Earlier snapshots are read (and a damaged one named) before any host is touched.
    known = _known_domains(site, Path(state_dir), racks)
    settings = site.health       # the shared rules' severities (fabric flags, driver); converted by the loader
    earlier = {rack.name: _latest(state_dir, rack.name) for rack in racks} if diff else {}
    facts = asyncio.run(gather())
    taken_at = datetime.now(timezone.utc)
    by_host = {f.host: f for f in facts}
    this_run = {r.name: rack_domains(by_host[t.name] for t in ts) for r, ts in per_rack_targets}
    reports = []
    for rack, targets in per_rack_targets:
        trays = [by_host[t.name] for t in targets]
        others = dict(known)
        for other_name, domains in this_run.items():
            if other_name != rack.name:
                for u in domains:
                    others.setdefault(u, other_name)
        findings = sort_findings(validate_rack(rack, trays, other_domains=others, settings=settings))
        snapshot = _snapshot(site, rack, trays, findings, taken_at)
        previous = earlier.get(rack.name)
        report = RackReport(rack, trays, findings, taken_at, snapshot)
        if previous is not None:
            report.previous_path, report.previous_taken_at = previous.path, previous.taken_at
            try:
                report.changes = diff_snapshots(previous.data, snapshot)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                from mctl.state import DamagedState
                raise DamagedState(previous.path, f"unexpected content ({type(exc).__name__}: {exc})") from None
        elif diff:
            report.changes = None
        if save:
            report.snapshot_path = save_snapshot(state_dir, SNAPSHOT_KIND, rack.name, snapshot, taken_at=taken_at)
        reports.append(report)
    return InventoryReport(site.name, reports, time.monotonic() - start)
