"""Slurm for NVL72 racks: render slurm.conf/gres.conf/cgroup.conf/topology.conf, deploy, verify.

Public API (what other parts of mctl call):
    plan_slurm(site, state_dir, topology_only=False) -> SlurmPlan   facts over SSH + rendered files
    dry_run(plan) -> DryRun                                         rendered vs. the hosts' files
    apply(plan, on_event=None, verify=True) -> DeployResult         playbook + verification
    render(site, version, hardware, topology_only=False) -> SlurmConfig   pure
    blocks_for(site) / block_sizes(blocks) / render_topology(...)       pure
    parse_version / parse_slurmd_c / parse_show_nodes / parse_show_topology   pure parsers
"""

from mctl.sched.slurm.deploy import DeployResult, DryRun, SlurmPlan, apply, check_scheduler, dry_run, plan_slurm
from mctl.sched.slurm.facts import (NodeHardware, NodeState, TopologyEntry, parse_show_nodes, parse_show_topology,
                                    parse_slurmd_c)
from mctl.sched.slurm.render import SlurmConfig, controller_of, render
from mctl.sched.slurm.topology import Block, block_sizes, blocks_for, render_topology
from mctl.facts.slurm_version import SlurmVersion, parse_version

__all__ = [
    "DeployResult", "DryRun", "SlurmPlan", "apply", "check_scheduler", "dry_run", "plan_slurm",
    "NodeHardware", "NodeState", "TopologyEntry", "parse_show_nodes", "parse_show_topology", "parse_slurmd_c",
    "SlurmConfig", "controller_of", "render",
    "Block", "block_sizes", "blocks_for", "render_topology",
    "SlurmVersion", "parse_version",
]
