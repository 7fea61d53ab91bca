"""Software on a tray against its image: OS release, kernel, NVIDIA driver, CUDA, Slurm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mctl.images.drift import MATCH, compare, image_drift
from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.model.image import SoftwareImage

FAMILY = "versions"


def check_tray(host: str, image: "SoftwareImage", facts: dict[str, Any]) -> list[Finding]:
    """Drift findings from image_drift, and an OK finding for each component that matches."""
    drift = image_drift(image, host, facts)
    flagged = {f.check for f in drift}
    out = [Finding(f.severity, f.host, f.check, f.message, f.action, {**f.details, "image": image.name})
           for f in drift]
    for c in compare(image, facts):
        if c.status == MATCH and c.check not in flagged:
            out.append(Finding(Severity.OK, host, c.check, f"{c.label} {c.found}, as image {image.name} wants "
                               f"({c.wanted})", None, {"image": image.name}))
    return out
