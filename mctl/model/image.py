"""Software image definitions (images/<name>.yml): what a tray should run.

Each component says how it reaches a tray: `repository` (the playbooks install
it at provisioning time) or `image` (already inside the OS image, as on
BCM-managed trays and in the lab; the playbooks verify it and report drift).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    build: dict[str, Any] | None = None   # how the lab's image builder makes it; ignored elsewhere

    def ansible_vars(self) -> dict[str, Any]:
        """The image as the playbooks see it (variable `mctl_image_spec`)."""
        return self.model_dump(mode="json", exclude={"build"})
