"""What a host's provisioning depends on, as one digest (compared with the host's marker).

A host is provisioned again when any input of the site playbook changes for it:
the playbooks themselves, its software image definition, its own inventory
entry (address, image, variables), the site variables, or the list of site
hosts (every tray's /etc/hosts names them all). Partitions are not an input:
the playbook does not read them, so recording partitions never re-provisions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mctl.model.site import Host, Site


def tree_digest(folder: Path) -> str:
    """Every file under *folder* (name and content), in a stable order."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def image_text(site: "Site", image: str | None) -> str:
    if not image or site.images_dir is None:
        return ""
    for suffix in (".yml", ".yaml"):
        path = Path(site.images_dir) / f"{image}{suffix}"
        if path.is_file():
            return path.read_text()
    return ""


def host_inputs(site: "Site", host: "Host", image: str | None) -> dict[str, Any]:
    """The host's part of the digest (pure given the image text)."""
    return {
        "host": {"name": host.name, "address": host.address, "role": host.role, "image": image,
                 "vars": host.vars or {}},
        "site_vars": site.vars or {},
        "ssh_user": site.ssh.user,
        "site_hosts": sorted((h.name, h.address) for h in site.hosts()),
    }


def provision_digest(site: "Site", host: "Host", image: str | None, playbooks: str) -> str:
    """*playbooks*: tree_digest of the playbooks folder (computed once per run)."""
    doc = {"playbooks": playbooks, "image": hashlib.sha256(image_text(site, image).encode()).hexdigest(),
           **host_inputs(site, host, image)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
