"""A software image's firmware baseline against what a tray's BMC lists (pure).

The image names FirmwareInventory items by their Redfish ids (images/*.yml `firmware:`, by kind);
the BMC's `UpdateService/FirmwareInventory` says each item's Version (mctl.bmc.inventory.read_firmware).
Versions are compared exactly (after trimming spaces): a firmware version has no "24.11 means
24.11.x" rule. `mctl audit` (mctl.audit.rules.firmware) and `mctl image diff` are both built on
`compare`, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from mctl.images.drift import DRIFT, MATCH, UNREPORTED, Comparison
from mctl.model.findings import Severity
from mctl.model.image import FIRMWARE_LABELS

if TYPE_CHECKING:
    from mctl.model.image import SoftwareImage

CHECK = "firmware.version"
RACK_CHECK = "firmware.rack"
SEVERITY = Severity.WARN


def same(want: str, have: str | None) -> bool:
    return have is not None and have.strip() == want.strip()


@dataclass(frozen=True)
class FirmwareComparison(Comparison):
    """One firmware item of an image against what one tray's BMC listed (found None: not listed,
    or listed without a Version)."""

    firmware_id: str = ""
    kind: str = ""

    @property
    def status(self) -> str:
        if self.found is None or not self.found.strip():
            return UNREPORTED
        return MATCH if same(self.wanted, self.found) else DRIFT

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "firmware_id": self.firmware_id, "kind": self.kind}


def compare(image: "SoftwareImage", listed: Mapping[str, str | None]) -> list[FirmwareComparison]:
    """Every firmware item of *image* against *listed* (FirmwareInventory id -> Version)."""
    return [FirmwareComparison(CHECK, f"firmware:{fid}", f"{FIRMWARE_LABELS[kind]} firmware {fid}", version,
                               listed.get(fid), SEVERITY, firmware_id=fid, kind=kind)
            for kind, fid, version in image.firmware_items()]


def rack_spread(listed: Mapping[str, Mapping[str, str | None]], ids: list[str]) -> dict[str, dict[str, list[str]]]:
    """For each of *ids* on which the trays of one rack differ: version -> the trays reporting it
    (trays that do not list the item are left out: that is the tray check's finding)."""
    out: dict[str, dict[str, list[str]]] = {}
    for fid in ids:
        by_version: dict[str, list[str]] = {}
        for host, items in listed.items():
            v = items.get(fid)
            if v is not None and v.strip():
                by_version.setdefault(v.strip(), []).append(host)
        if len(by_version) > 1:
            out[fid] = {v: sorted(hosts) for v, hosts in sorted(by_version.items())}
    return out


__all__ = ["CHECK", "RACK_CHECK", "FirmwareComparison", "compare", "rack_spread", "same", "DRIFT", "MATCH",
           "UNREPORTED"]
