"""Compare a software image with the facts a tray reports (pure)."""

from __future__ import annotations

from typing import Any

from mctl.model.findings import Finding, Severity
from mctl.model.image import SoftwareImage


def _same_version(want: str, have: str | None) -> bool:
    """'24.11' matches '24.11.5'; '570.148.08' must match exactly."""
    if have is None:
        return False
    return have == want or have.startswith(want + ".")


def image_drift(image: SoftwareImage, host: str, facts: dict[str, Any]) -> list[Finding]:
    """Findings where *facts* (keys: os_id, os_version_id, kernel, driver_version,
    cuda_version, slurm_version, imex_version) disagree with *image*.

    A fact that is None was not reported (tool missing, host without GPUs) and is
    a warning, never a silent pass.
    """
    out: list[Finding] = []

    def compare(check: str, label: str, want: str | None, have: str | None, severity: Severity) -> None:
        if want is None:
            return
        if have is None:
            out.append(Finding(Severity.WARN, host, check, f"{label}: image wants {want}, tray did not report one",
                               "check that the component is installed and reporting"))
        elif not _same_version(want, have):
            out.append(Finding(severity, host, check, f"{label}: image wants {want}, tray has {have}",
                               f"re-provision with 'mctl provision {host}' or update the image"))

    compare("image.os", "OS release", image.os.release, facts.get("os_version_id"), Severity.WARN)
    if image.os.kernel and image.os.kernel != "host":
        compare("image.kernel", "kernel", image.os.kernel, facts.get("kernel"), Severity.WARN)
    comps = image.components
    if "nvidia_driver" in comps:
        compare("image.driver", "NVIDIA driver", comps["nvidia_driver"].version, facts.get("driver_version"),
                Severity.CRITICAL)
    if "cuda" in comps:
        compare("image.cuda", "CUDA", comps["cuda"].version, facts.get("cuda_version"), Severity.WARN)
    if "slurm" in comps and "slurm_version" in facts:
        compare("image.slurm", "Slurm", comps["slurm"].version, facts.get("slurm_version"), Severity.WARN)
    if "imex" in comps and "imex_version" in facts:
        compare("image.imex", "IMEX", comps["imex"].version, facts.get("imex_version"), Severity.WARN)
    return out
