"""mctl's side of Ansible: the inventory plugin Ansible loads (inventory_plugins/mctl.py) and the
adapter that starts ansible-runner (runner.py). Layer 1: it imports the inventory and the state
directory only, and every service that runs a playbook imports it."""
