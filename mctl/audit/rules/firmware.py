"""Firmware on a tray against its image (the BMC's FirmwareInventory), and every tray of a rack alike.

Per tray: each item the image names (images/*.yml `firmware:`) must be listed by the tray's BMC at
that Version (`firmware.version`; subject: the FirmwareInventory id). Per rack: every tray of the rack
whose BMC was read reports the same Version of each item the rack's images name (`firmware.rack`;
host: the rack). A tray whose BMC could not be read is a gap of this family (the audit is
incomplete), never a pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from mctl.images.firmware import CHECK, DRIFT, MATCH, RACK_CHECK, SEVERITY, UNREPORTED, compare, rack_spread
from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.model.image import SoftwareImage

FAMILY = "firmware"


def check_tray(host: str, image: "SoftwareImage", listed: Mapping[str, str | None]) -> list[Finding]:
    out: list[Finding] = []
    for c in compare(image, listed):
        details = {"subject": c.firmware_id, "image": image.name, "kind": c.kind, "wanted": c.wanted,
                   "found": c.found}
        if c.status == MATCH:
            out.append(Finding(Severity.OK, host, CHECK, f"{c.label} {c.found}, as image {image.name} wants",
                               None, details))
        elif c.status == UNREPORTED:
            why = "does not list it" if c.firmware_id not in listed else "lists it without a version"
            out.append(Finding(SEVERITY, host, CHECK, f"{c.label}: image wants {c.wanted}, the BMC {why}",
                               "check the firmware id in the image against the BMC's FirmwareInventory", details))
        elif c.status == DRIFT:
            out.append(Finding(SEVERITY, host, CHECK, f"{c.label}: image wants {c.wanted}, the BMC reports "
                               f"{c.found}", f"update the firmware of {host} or the image {image.name}", details))
    return out


def check_rack(rack: str, listed: Mapping[str, Mapping[str, str | None]], ids: list[str]) -> list[Finding]:
    """One finding per firmware item of *ids*: OK when every read tray of *rack* reports one version."""
    from mctl.model.site import fold

    spread = rack_spread(listed, ids)
    out: list[Finding] = []
    for fid in ids:
        if fid in spread:
            versions = spread[fid]
            said = "; ".join(f"{v} on {fold(hosts)}" for v, hosts in versions.items())
            out.append(Finding(SEVERITY, rack, RACK_CHECK, f"{fid}: the rack's trays differ: {said}",
                               "bring every tray of the rack to one firmware version",
                               {"subject": fid, "versions": versions}))
        elif any(fid in items for items in listed.values()):
            out.append(Finding(Severity.OK, rack, RACK_CHECK, f"{fid}: one version on every tray read", None,
                               {"subject": fid}))
    return out
