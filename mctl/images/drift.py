"""Compare a software image with the facts a tray reports (pure).

`compare` is the one place that decides, component by component, what the
image wants and what the tray has; `image_drift` (the audit, the bring-up) and
`mctl image diff` are both built on it, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mctl.model.findings import Finding, Severity
from mctl.model.image import SoftwareImage

# status of one comparison
MATCH = "match"
DRIFT = "drift"
UNREPORTED = "unreported"     # the image wants it, the tray reported no version (missing, or its tool failed)
NOT_CHECKED = "not-checked"   # mctl reads no version of this component from a tray (diff only; never a pass)


def _same_version(want: str, have: str | None) -> bool:
    """'24.11' matches '24.11.5'; '570.148.08' must match exactly."""
    if have is None:
        return False
    return have == want or have.startswith(want + ".")


@dataclass(frozen=True)
class Comparison:
    """One component of an image against what one tray reported."""

    check: str                 # the audit's check name (image.driver ...)
    component: str             # os, kernel, or the image's component key (nvidia_driver, cuda, ...)
    label: str
    wanted: str
    found: str | None
    severity: Severity         # what a difference is worth
    note: str | None = None    # why found is None, or which package differs from its pin

    @property
    def status(self) -> str:
        if self.found is None:
            return UNREPORTED
        return MATCH if _same_version(self.wanted, self.found) else DRIFT

    def to_dict(self) -> dict[str, Any]:
        out = {"component": self.component, "check": self.check, "label": self.label, "wanted": self.wanted,
               "found": self.found, "status": self.status, "severity": self.severity.value}
        if self.note:
            out["note"] = self.note
        return out


# labels of the components read from dpkg's database (the others have theirs in compare)
LABELS = {"imex": "IMEX", "dcgm": "DCGM", "doca_ofed": "DOCA-OFED", "slurm": "Slurm", "munge": "MUNGE",
          "enroot": "enroot", "pyxis": "pyxis", "nvidia_driver": "NVIDIA driver", "cuda": "CUDA"}


def package_names(image: SoftwareImage) -> list[str]:
    """Every Debian package the image's components name, in file order, once each (what dpkg-query is asked)."""
    from mctl.facts.packages import split_pin

    return list(dict.fromkeys(split_pin(p)[0] for c in image.components.values() for p in c.packages))


def packaged_version(packages: list[str], installed: dict[str, str | None],
                     why: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """A component's version from its packages' installed versions: (found, note).

    Every package must be installed (else found is None, the note names them), at its pin where the
    image pins one (else found is the differing package's Debian version, so it cannot match); then
    found is the first package's upstream version ('1:4.3.1-1' -> '4.3.1')."""
    from mctl.facts.packages import split_pin, upstream

    pins = [split_pin(p) for p in packages]
    missing = [n for n, _ in pins if installed.get(n) is None]
    if missing:
        return None, "; ".join(f"{n}: {(why or {}).get(n, 'not installed')}" for n in missing)
    for name, pin in pins:
        have = installed[name]
        if pin is not None and have != pin:
            return have, f"{name} {have} installed, the image pins {pin}"
    first = installed[pins[0][0]]
    return upstream(first) if first else None, None


def version_facts(os_version_id: str | None, kernel: str | None, driver: str | None, cuda: str | None,
                  slurm_version: str | None, *, slurm_expected: bool,
                  packages: dict[str, str | None] | None = None,
                  package_notes: dict[str, str] | None = None) -> dict[str, Any]:
    """The facts image_drift compares; Slurm's slurmd -V only where the site runs slurmd on its trays;
    *packages* (dpkg-query's answer) for the components no tool reports."""
    facts: dict[str, Any] = {"os_version_id": os_version_id, "kernel": kernel, "driver_version": driver,
                             "cuda_version": cuda}
    if slurm_expected:
        facts["slurm_version"] = slurm_version
    if packages is not None:
        facts["packages"] = packages
        facts["package_notes"] = dict(package_notes or {})
    return facts


def compare(image: SoftwareImage, facts: dict[str, Any]) -> list[Comparison]:
    """Every comparison of *image* with *facts* (keys: os_version_id, kernel, driver_version,
    cuda_version, slurm_version, packages, package_notes). Slurm is compared by `slurmd -V` when
    its key is present in *facts* (the caller says whether the site runs it on its trays); every
    other component the image names packages for, by the packages' installed versions when
    *facts* has them (`packages`: one dpkg-query's answer, name -> version or None)."""
    comps = image.components
    out = [Comparison("image.os", "os", "OS release", image.os.release, facts.get("os_version_id"), Severity.WARN)]
    if image.os.kernel and image.os.kernel != "host":
        out.append(Comparison("image.kernel", "kernel", "kernel", image.os.kernel, facts.get("kernel"),
                              Severity.WARN))
    if "nvidia_driver" in comps:
        out.append(Comparison("image.driver", "nvidia_driver", "NVIDIA driver", comps["nvidia_driver"].version,
                              facts.get("driver_version"), Severity.CRITICAL))
    if "cuda" in comps:
        out.append(Comparison("image.cuda", "cuda", "CUDA", comps["cuda"].version, facts.get("cuda_version"),
                              Severity.WARN))
    if "slurm" in comps and "slurm_version" in facts:
        out.append(Comparison("image.slurm", "slurm", "Slurm", comps["slurm"].version, facts.get("slurm_version"),
                              Severity.WARN))
    installed = facts.get("packages")
    if installed is not None:
        done = {c.component for c in out}
        for name, comp in comps.items():
            if name in done or not comp.packages:
                continue
            found, note = packaged_version(comp.packages, installed, facts.get("package_notes"))
            out.append(Comparison(f"image.{name}", name, LABELS.get(name, name), comp.version, found, Severity.WARN,
                                  note))
    return out


def not_compared(image: SoftwareImage, compared: list[Comparison]) -> list[str]:
    """The image's components that *compared* says nothing about (no package named, or no dpkg-query answer)."""
    seen = {c.component for c in compared}
    return [name for name in image.components if name not in seen]


def image_drift(image: SoftwareImage, host: str, facts: dict[str, Any]) -> list[Finding]:
    """Findings where *facts* disagree with *image* (see `compare`).

    A fact that is None was not reported (tool missing, host without GPUs) and is
    a warning, never a silent pass.
    """
    out: list[Finding] = []
    for c in compare(image, facts):
        if c.status == UNREPORTED:
            out.append(Finding(Severity.WARN, host, c.check, f"{c.label}: image wants {c.wanted}, tray did not "
                               "report one" + (f" ({c.note})" if c.note else ""),
                               "check that the component is installed and reporting"))
        elif c.status == DRIFT:
            out.append(Finding(c.severity, host, c.check, f"{c.label}: image wants {c.wanted}, tray has {c.found}"
                               + (f" ({c.note})" if c.note else ""),
                               f"re-provision with 'mctl provision {host}' or update the image"))
    return out
