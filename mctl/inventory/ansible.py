"""The Ansible view of a site: groups, hosts and variables.

Pure (apart from loading the inventory file) so the same view serves the
Ansible inventory plugin and mctl's own provisioning.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mctl.errors import InventoryError, UsageError
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
    check_vars_files(site.root)
    return site_view(site)


def check_vars_files(root: Path) -> None:
    """Ansible also reads group_vars/ and host_vars/ beside the inventory, and they outrank its host
    variables: the SSH and host-key variables the inventory may not set are refused there too. The files
    are read by the inventory's rules (no tags, duplicate keys or control characters; line breaks and tabs
    in values are text, as in the inventory's vars)."""
    from mctl.inventory.loader import REFUSED_VARS, refused_var
    from mctl.inventory.yamlsrc import read_yaml

    for folder in ("group_vars", "host_vars"):
        base = root / folder
        if not base.is_dir():
            continue
        for file in sorted(p for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")):
            doc = read_yaml(file, what="variables file")
            if doc.problems:
                raise doc.refusal("Ansible reads this file as variables for the inventory's hosts")
            data = doc.data
            for key in data if isinstance(data, dict) else ():
                if isinstance(key, str) and refused_var(key):
                    raise UsageError(f"{file}: {key} is not allowed beside an mctl inventory",
                                     hint=REFUSED_VARS.get(key, "mctl sets the SSH and host-key options itself"))


# What ssh would read specially in an option value: whitespace separates several files,
# quotes and backslashes are ssh's own quoting, '%' and '$' start tokens and variables it expands.
_SSH_UNSAFE = re.compile(r"[\s\"'\\%$#]|[\x00-\x1f\x7f]")


def ssh_common_args(site: Site) -> str:
    """The SSH options Ansible uses: the same trust as mctl's own SSH (the site's known_hosts only, strict).

    Ansible splits this string with shlex, so each option is one shlex-quoted word; a
    known_hosts path that ssh itself would split or expand is refused, not guessed at.
    """
    path = str(site.known_hosts)
    if _SSH_UNSAFE.search(path):
        raise UsageError(f"the known_hosts path {path!r} holds characters ssh would split or expand "
                         "(whitespace, quotes, '\\', '%', '$' or '#')",
                         hint="keep the inventory (and ssh.known_hosts) in a folder whose path has none of them")
    options = (f"UserKnownHostsFile={path}", "GlobalKnownHostsFile=/dev/null", "StrictHostKeyChecking=yes")
    return " ".join(f"-o {shlex.quote(o)}" for o in options)


def host_vars(site: Site, host: Host) -> dict[str, Any]:
    rack = site.racks[host.rack] if host.rack else None
    part = rack.partition_of(host.name) if rack else None
    ssh_args = ssh_common_args(site)
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
    # The inventory refuses host-key and SSH-argument variables (mctl.inventory.loader.REFUSED_VARS);
    # mctl's own SSH options are set last all the same, so nothing in vars can replace them.
    hv.update(host.vars)
    hv["ansible_ssh_common_args"] = ssh_args
    return hv


def site_view(site: Site) -> AnsibleView:
    view = AnsibleView()
    view.all_vars = {"mctl_site": site.name, **site.vars}
    ssh_common_args(site)       # refused before any host is listed
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
