"""Ansible inventory plugin that reads an mctl site file (mctl.yml).

It makes the mctl inventory the Ansible inventory, so there is one host list.
Enabled by the repository's ansible.cfg, or by mctl itself through
ANSIBLE_INVENTORY_PLUGINS / ANSIBLE_INVENTORY_ENABLED when it runs ansible-runner.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: mctl
plugin_type: inventory
short_description: mctl site inventory (racks, trays, partitions)
description:
  - Reads an mctl.yml site file and exposes its hosts and groups to Ansible.
  - Groups are racks (rack_<name>), roles (compute, switches, head), per-rack roles
    (<rack>_compute), NVLink partitions (partition_<rack>_<name>) and scheduler roles
    (slurm_controller, slurm_nodes, k8s_nodes).
options:
  plugin:
    description: Marks the file as an mctl site file.
    required: true
    choices: ['mctl']
"""

import os

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin


class InventoryModule(BaseInventoryPlugin):
    NAME = "mctl"

    def verify_file(self, path):
        name = os.path.basename(path)
        return super().verify_file(path) and (name in ("mctl.yml", "mctl.yaml") or name.endswith(".mctl.yml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        from mctl.inventory.ansible import ansible_view

        try:
            view = ansible_view(path)
        except Exception as exc:  # the inventory's own message, shown by ansible
            raise AnsibleParserError(str(exc)) from exc
        for group, parent in view.groups:
            self.inventory.add_group(group)
            if parent:
                self.inventory.add_group(parent)
                self.inventory.add_child(parent, group)
        for name, groups, hostvars in view.hosts:
            for group in groups:
                self.inventory.add_host(name, group=group)
            for key, value in hostvars.items():
                self.inventory.set_variable(name, key, value)
        for key, value in view.all_vars.items():
            self.inventory.set_variable("all", key, value)
