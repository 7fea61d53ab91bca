"""The lab's inventory: an ordinary mctl.yml, so every command treats the lab as a site.

Pure rendering; the caller writes the file. The lab has no switch-tray hosts, so
each rack declares its shape; paths are absolute so the inventory can be used
from any working directory.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from mctl.lab.layout import LabLayout

IMAGE_NAME = "lab-debian13"
REPO_IMAGES = Path(__file__).resolve().parents[2] / "images"


def inventory(layout: LabLayout, *, identity_file: Path, known_hosts: Path, images_dir: Path = REPO_IMAGES,
              rack_extra: dict[str, dict] | None = None) -> str:
    racks: dict[str, dict] = {}
    for r, rack in enumerate(layout.rack_names(), start=1):
        trays = layout.trays_of(rack)
        head = next(h for h in layout.hosts() if h.rack == rack and h.kind == "head")
        spec: dict = {
            "model": "nvl72",
            "shape": {"compute_trays": layout.trays, "switch_trays": 0},
            "nvlink_domain": layout.nvlink_domain(rack),
            "head": {"name": head.name, "address": head.address},
            "compute": {
                "nodes": f"{rack}-tray[01-{layout.trays:02d}]" if layout.trays > 1 else trays[0].name,
                "addresses": (f"127.{layout.net}.{r}.[1-{layout.trays}]" if layout.trays > 1 else trays[0].address),
                "image": IMAGE_NAME,
            },
        }
        spec.update((rack_extra or {}).get(rack, {}))
        racks[rack] = spec
    doc = {
        "plugin": "mctl",
        "site": layout.name,
        "images_dir": str(images_dir),
        "ssh": {"user": "root", "port": 22, "identity_file": str(identity_file), "known_hosts": str(known_hosts),
                "connect_timeout": 5, "command_timeout": 60},
        "racks": racks,
        "scheduler": {"type": "slurm", "cluster_name": layout.name, "controller": f"{layout.rack_names()[0]}-head"},
    }
    header = ("# mctl site inventory of the virtual lab, written by `mctl lab up` (removed by `mctl lab down`).\n"
              "# Use it like any site: mctl -i <this folder> inventory show\n")
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
