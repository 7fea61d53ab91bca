"""Which Slurm features a version has, so the renderer never writes what the daemons cannot read.

Version gates follow Slurm's release notes: topology/block arrived in 23.11,
BlockSizes (replacing BlockLevels), --segment and switch/nvidia_imex in 24.05.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mctl.errors import UsageError

MIN_SUPPORTED = (22, 5)          # Debian 12's Slurm: cons_tres, cgroup.conf's CgroupPlugin
BLOCK_TOPOLOGY = (23, 11)
BLOCK_SIZES = (24, 5)
NVIDIA_IMEX = (24, 5)
SEGMENT = (24, 5)

_VERSION = re.compile(r"(?<![\d.])(\d{2})\.(\d{1,2})(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"

    @property
    def release(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def at_least(self, release: tuple[int, int]) -> bool:
        return self.release >= release

    @property
    def block_topology(self) -> bool:
        return self.at_least(BLOCK_TOPOLOGY)

    @property
    def block_sizes(self) -> bool:
        return self.at_least(BLOCK_SIZES)

    @property
    def nvidia_imex(self) -> bool:
        return self.at_least(NVIDIA_IMEX)

    @property
    def segment(self) -> bool:
        return self.at_least(SEGMENT)


def parse_version(text: str) -> SlurmVersion:
    """Read `slurmctld -V` / `sinfo -V` output ("slurm 24.11.5", Debian's "slurm-wlm 24.11.5")."""
    for line in text.splitlines():
        if "slurm" not in line.lower():
            continue
        m = _VERSION.search(line)
        if m:
            return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    raise ValueError(f"no Slurm version in {text.strip()[:120]!r}")


def release_name(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]:02d}"


def require_supported(version: SlurmVersion, host: str) -> None:
    if not version.at_least(MIN_SUPPORTED):
        raise UsageError(f"Slurm {version} on {host} is too old: mctl deploys Slurm {release_name(MIN_SUPPORTED)} "
                         f"or newer (NVLink blocks need {release_name(BLOCK_TOPOLOGY)}, "
                         f"switch/nvidia_imex needs {release_name(NVIDIA_IMEX)})",
                         hint="upgrade Slurm on the head node and the trays (the image's slurm component), "
                              "then run 'mctl deploy slurm' again; nothing was changed")
