"""Software on a tray against its image: OS release, kernel, NVIDIA driver, CUDA, Slurm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mctl.images.drift import image_drift
from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.model.image import SoftwareImage

FAMILY = "versions"


def version_facts(os_version_id: str | None, kernel: str | None, driver: str | None, cuda: str | None,
                  slurm_version: str | None, *, slurm_expected: bool) -> dict[str, Any]:
    """The facts image_drift compares; Slurm only where the site runs slurmd on its trays."""
    facts: dict[str, Any] = {"os_version_id": os_version_id, "kernel": kernel, "driver_version": driver,
                             "cuda_version": cuda}
    if slurm_expected:
        facts["slurm_version"] = slurm_version
    return facts


def _compared(image: "SoftwareImage", facts: dict[str, Any]) -> list[tuple[str, str, str | None, str | None]]:
    """(check, label, wanted, reported) for every comparison image_drift makes with these facts."""
    comps = image.components
    out = [("image.os", "OS release", image.os.release, facts.get("os_version_id"))]
    if image.os.kernel and image.os.kernel != "host":
        out.append(("image.kernel", "kernel", image.os.kernel, facts.get("kernel")))
    if "nvidia_driver" in comps:
        out.append(("image.driver", "NVIDIA driver", comps["nvidia_driver"].version, facts.get("driver_version")))
    if "cuda" in comps:
        out.append(("image.cuda", "CUDA", comps["cuda"].version, facts.get("cuda_version")))
    if "slurm" in comps and "slurm_version" in facts:
        out.append(("image.slurm", "Slurm", comps["slurm"].version, facts.get("slurm_version")))
    if "imex" in comps and "imex_version" in facts:
        out.append(("image.imex", "IMEX", comps["imex"].version, facts.get("imex_version")))
    return out


def check_tray(host: str, image: "SoftwareImage", facts: dict[str, Any]) -> list[Finding]:
    """Drift findings from image_drift, and an OK finding for each component that matches."""
    drift = image_drift(image, host, facts)
    flagged = {f.check for f in drift}
    out = [Finding(f.severity, f.host, f.check, f.message, f.action, {**f.details, "image": image.name})
           for f in drift]
    for check, label, want, have in _compared(image, facts):
        if check not in flagged:
            out.append(Finding(Severity.OK, host, check, f"{label} {have}, as image {image.name} wants ({want})",
                               None, {"image": image.name}))
    return out
