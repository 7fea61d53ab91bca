"""SSH fan-out to the site's hosts (asyncssh), host-key trust, typed per-host results.

Callers: resolve hosts with `resolve_hosts(site, expr)`, turn them into
`targets_for(site, hosts)`, then either `run_sync(SSHConfig.from_site(site), targets, cmd)`
from synchronous code or `async with SSHPool.from_site(site) as pool: await pool.run(...)`
for a pool that stays open (health watch).
"""

from mctl.transport import oqs

oqs.install()

from mctl.transport.results import HostKeyProblem, HostResult, HostStatus, OutputGroup, group_by_output
from mctl.transport.ssh import SSHConfig, SSHPool, run_in_pool, run_sync
from mctl.transport.targets import SSHTarget, resolve_hosts, site_groups, targets_for

__all__ = [
    "HostKeyProblem", "HostResult", "HostStatus", "OutputGroup", "group_by_output",
    "SSHConfig", "SSHPool", "run_in_pool", "run_sync",
    "SSHTarget", "resolve_hosts", "site_groups", "targets_for",
]
