"""The Ansible view of a site: groups, hosts and variables.

Pure (apart from loading the inventory file) so the same view serves the
Ansible inventory plugin and mctl's own provisioning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mctl.errors import InventoryError
from mctl.model.site import Host, Site


def group_name(*parts: str) -> str:
    """Ansible group names may not contain dashes or dots."""
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))


@dataclass
class AnsibleView:
    groups: list[tuple[str, str | None]] = field(default_factory=list)  # (group, parent)
    hosts: list[tuple[str, list[str], dict[str, Any]]] = field(default_factory=list)
    all_vars: dict[str, Any] = field(default_factory=dict)


def ansible_view(path: str | Path) -> AnsibleView:
    from mctl.inventory.loader import validate_inventory

    site, problems = validate_inventory(path)
    if problems or site is None:
        raise InventoryError(problems, str(path))
    return site_view(site)


def host_vars(site: Site, host: Host) -> dict[str, Any]:
    rack = site.racks[host.rack] if host.rack else None
    part = rack.partition_of(host.name) if rack else None
    ssh_args = f"-o UserKnownHostsFile={site.known_hosts} -o StrictHostKeyChecking=yes"
    hv: dict[str, Any] = {
        "ansible_host": host.address,
        "ansible_port": site.ssh.port,
        "ansible_user": site.ssh.user,
        "ansible_ssh_common_args": ssh_args,
        "mctl_role": host.role,
        "mctl_rack": host.rack,
    }
    if site.identity_file:
        hv["ansible_ssh_private_key_file"] = str(site.identity_file)
    if host.bmc:
        hv["mctl_bmc"] = host.bmc
    if host.image:
        hv["mctl_image"] = host.image
    if part:
        hv["mctl_partition"] = part.name
    hv.update(host.vars)
    return hv


def site_view(site: Site) -> AnsibleView:
    view = AnsibleView()
    view.all_vars = {"mctl_site": site.name, **site.vars}
    if site.images_dir:
        view.all_vars["mctl_images_dir"] = str(site.images_dir)
    if site.scheduler:
        view.all_vars["mctl_scheduler"] = site.scheduler.type
    sched = site.scheduler
    for role_group in ("compute", "switches", "head"):
        view.groups.append((role_group, None))
    if sched:
        view.groups.append(("slurm_controller" if sched.type == "slurm" else "k8s_control_plane", None))
        view.groups.append(("slurm_nodes" if sched.type == "slurm" else "k8s_nodes", None))
    for rack in site.racks.values():
        rg = group_name(rack.name)
        view.groups.append((rg, None))
        view.groups.append((group_name(rack.name, "compute"), rg))
        for part in rack.partitions:
            view.groups.append((group_name("partition", rack.name, part.name), rg))
        for host in rack.hosts:
            groups = [rg]
            if host.role == "compute":
                groups += ["compute", group_name(rack.name, "compute")]
                part = rack.partition_of(host.name)
                if part:
                    groups.append(group_name("partition", rack.name, part.name))
                if sched:
                    groups.append("slurm_nodes" if sched.type == "slurm" else "k8s_nodes")
            elif host.role == "switch":
                groups.append("switches")
            else:
                groups.append("head")
            if sched and sched.controller == host.name:
                groups.append("slurm_controller" if sched.type == "slurm" else "k8s_control_plane")
            view.hosts.append((host.name, groups, host_vars(site, host)))
    return view
