"""Software image definitions (images/<name>.yml): what a tray should run.

Each component says how it reaches a tray: `repository` (the playbooks install
it at provisioning time) or `image` (already inside the OS image, as on
BCM-managed trays and in the lab; the playbooks verify it and report drift).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

COMPONENTS = ("nvidia_driver", "cuda", "imex", "dcgm", "doca_ofed", "slurm", "munge", "enroot", "pyxis")


class Component(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    delivery: Literal["repository", "image"] = "repository"
    branch: str | None = None
    # Debian packages at their exact versions, as apt takes them: "name=version".
    packages: list[str] = Field(default_factory=list)
    # delivery: repository: the site repository (inventory `apt_repositories.<name>`) they come from.
    repository: str | None = None
    hold: bool = False                # apt-mark hold (an upgrade would break the tray: driver, IMEX)


# What an operator asks for, by the BMC's FirmwareInventory ids (the real GB200 captures,
# shared/reference/redfish.md "UpdateService and FirmwareInventory"): bmc FW_BMC_0, bios UEFI,
# hmc HGX_FW_BMC_0, gpu HGX_FW_GPU_n, cx CX7_n, nic NIC_n; the rest for the other items a BMC lists.
FIRMWARE_KINDS = ("bmc", "bios", "hmc", "gpu", "cx", "nic", "cpld", "erot", "fpga", "cpu", "nvswitch", "other")
FIRMWARE_LABELS = {"bmc": "BMC", "bios": "BIOS/UEFI", "hmc": "HMC", "gpu": "GPU", "cx": "ConnectX", "nic": "NIC",
                   "cpld": "CPLD", "erot": "ERoT", "fpga": "FPGA", "cpu": "CPU", "nvswitch": "NVSwitch",
                   "other": "other"}
_FIRMWARE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class OSSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    distribution: str
    release: str
    kernel: str | None = None   # "host" in the lab: trays share the machine's kernel


class SoftwareImage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    os: OSSpec
    components: dict[str, Component] = Field(default_factory=dict)
    packages: list[str] = Field(default_factory=list)
    sysctls: dict[str, Any] = Field(default_factory=dict)
    kernel_parameters: list[str] = Field(default_factory=list)
    # kind -> {FirmwareInventory id: the Version the tray's BMC must report} (mctl audit, mctl image diff)
    firmware: dict[Literal[FIRMWARE_KINDS], dict[str, StrictStr]] = Field(default_factory=dict)  # type: ignore[valid-type]
    build: dict[str, Any] | None = None   # how the lab's image builder makes it; ignored elsewhere

    @field_validator("firmware")
    @classmethod
    def _firmware_ids(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        seen: dict[str, str] = {}
        for kind, items in value.items():
            for fid, version in items.items():
                if not _FIRMWARE_ID.match(fid):
                    raise ValueError(f"{kind}: {fid!r} is not a FirmwareInventory id (letters, digits, _ . -)")
                if fid in seen:
                    raise ValueError(f"{fid} is listed under both {seen[fid]} and {kind}")
                if not version.strip() or any(not c.isprintable() for c in version):
                    raise ValueError(f"{kind}: {fid}: the version must be printable text, not empty")
                seen[fid] = kind
        return value

    def firmware_items(self) -> list[tuple[str, str, str]]:
        """(kind, FirmwareInventory id, version) of every firmware item the image names, in file order."""
        return [(kind, fid, version) for kind, items in self.firmware.items() for fid, version in items.items()]

    def ansible_vars(self) -> dict[str, Any]:
        """The image as the playbooks see it (variable `mctl_image_spec`)."""
        return self.model_dump(mode="json", exclude={"build", "firmware"})   # firmware: the BMC's, not the playbooks'
