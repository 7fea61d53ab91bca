"""The lab's inventory: an ordinary mctl.yml, so every command treats the lab as a site.

Pure rendering; the caller writes the file. The lab has no switch-tray hosts: a
lab switch tray (`mctl lab up --switch-trays N`) is its BMC only, listed under the
rack's `switches` with its NVOS address (nothing answers there) and its BMC. Each
rack declares its shape; paths are absolute so the inventory can be used from any
working directory.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from mctl.lab.layout import BMC_RACK_OFFSET, LabLayout

IMAGE_NAME = "lab-debian13"
REPO_IMAGES = Path(__file__).resolve().parents[2] / "images"


# What lab hosts lack compared with a real tray, said as ordinary Slurm settings (docs/scheduler.md):
# no cgroup filesystem, no NVIDIA driver to make /dev/nvidia*, one network stack shared by every host
# (slurmctld binds the head's address only, so labs on other --net blocks can run their own).
LAB_SLURM = {
    "cgroup_plugin": "disabled",
    "proctrack_type": "proctrack/linuxproc",
    "task_plugin": "task/none",
    "jobacct_gather_type": "jobacct_gather/linux",
    "gpu_device_nodes": "create",
    "communication_parameters": "NoCtldInAddrAny",
    # The product's default: longer than slurmctld's ping cycle (SlurmdTimeout/3, 100 s by default), which is how
    # Slurm itself brings back a slurmd whose registration was lost; a shorter wait fails a deploy Slurm heals.
    "verify_timeout": 120,
}
SLURMD_PORT_BASE = 9000
SLURMD_PORTS_PER_NET = 90       # 5 racks of 18 trays; a larger lab overlaps the next --net's ports


def slurmd_ports(layout: LabLayout, rack_index: int) -> str | int:
    """Per-tray slurmd ports, unique across labs on one machine (they bind 0.0.0.0), as a node-ordered range."""
    first = SLURMD_PORT_BASE + layout.net * SLURMD_PORTS_PER_NET + (rack_index - 1) * layout.trays
    return f"[{first}-{first + layout.trays - 1}]" if layout.trays > 1 else first


def switch_section(layout: LabLayout, rack: str, *, bmc: bool = True) -> dict:
    """The rack's `switches` group: names, NVOS addresses and BMC addresses of its lab switch trays."""
    sws = layout.switches_of(rack)
    if not sws:
        return {}
    first, last = sws[0], sws[-1]
    fold = lambda a, b: a if len(sws) == 1 else f"{a.rsplit('.', 1)[0]}.[{a.rsplit('.', 1)[1]}-{b.rsplit('.', 1)[1]}]"  # noqa: E731
    out = {"nodes": first.name if len(sws) == 1 else f"{first.name[:-2]}[{first.index:02d}-{last.index:02d}]",
           "addresses": fold(first.address, last.address)}
    if bmc:
        out["bmc"] = fold(layout.switch_bmc_address(first), layout.switch_bmc_address(last))
    return out


def set_switch_trays(text: str, layout: LabLayout) -> str:
    """The lab inventory *text* with each rack's switch trays as in *layout* (shape and `switches`), the
    rest as it was (a test may have added to it)."""
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    doc = yaml.safe_load(text)
    for rack, spec in (doc.get("racks") or {}).items():
        spec.setdefault("shape", {})["switch_trays"] = layout.switch_trays
        if layout.switch_trays:
            spec["switches"] = switch_section(layout, rack, bmc="bmc" in doc)
        else:
            spec.pop("switches", None)
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)


def inventory(layout: LabLayout, *, identity_file: Path, known_hosts: Path, images_dir: Path = REPO_IMAGES,
              rack_extra: dict[str, dict] | None = None, bmc: dict | None = None) -> str:
    racks: dict[str, dict] = {}
    for r, rack in enumerate(layout.rack_names(), start=1):
        trays = layout.trays_of(rack)
        head = next(h for h in layout.hosts() if h.rack == rack and h.kind == "head")
        spec: dict = {
            "model": "nvl72",
            "shape": {"compute_trays": layout.trays, "switch_trays": layout.switch_trays},
            "nvlink_domain": layout.nvlink_domain(rack),
            "head": {"name": head.name, "address": head.address},
            "compute": {
                "nodes": f"{rack}-tray[01-{layout.trays:02d}]" if layout.trays > 1 else trays[0].name,
                "addresses": (f"127.{layout.net}.{r}.[1-{layout.trays}]" if layout.trays > 1 else trays[0].address),
                "image": IMAGE_NAME,
                **({"bmc": (f"127.{layout.net}.{BMC_RACK_OFFSET + r}.[1-{layout.trays}]" if layout.trays > 1
                            else layout.bmc_address(trays[0]))} if bmc else {}),
                # Every lab host shares the machine's network stack, so each slurmd needs its own port.
                "vars": {"slurmd_port": slurmd_ports(layout, r)},
            },
        }
        if layout.switch_trays:
            spec["switches"] = switch_section(layout, rack, bmc=bool(bmc))
        extra = dict((rack_extra or {}).get(rack, {}))
        spec["compute"]["vars"].update(extra.pop("compute_vars", {}))    # e.g. the lab's apt repositories
        spec.update(extra)
        racks[rack] = spec
    doc = {
        "plugin": "mctl",
        "site": layout.name,
        "images_dir": str(images_dir),
        "ssh": {"user": "root", "port": 22, "identity_file": str(identity_file), "known_hosts": str(known_hosts),
                "connect_timeout": 5, "command_timeout": 60},
        "racks": racks,
        **({"bmc": bmc} if bmc else {}),
        "scheduler": {"type": "slurm", "cluster_name": layout.name, "controller": f"{layout.rack_names()[0]}-head",
                      "slurm": LAB_SLURM},
    }
    header = ("# mctl site inventory of the virtual lab, written by `mctl lab up` (removed by `mctl lab down`).\n"
              "# Use it like any site: mctl -i <this folder> inventory show\n")
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
