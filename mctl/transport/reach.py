"""Can mctl use these hosts over SSH: one round trip each, new host keys trusted when asked.

    reach(site, hosts, trust=False, lock_path=None) -> Reach

A host that presents a key the inventory's known_hosts does not record yet is
reported as untrusted (with the key it presented); with trust=True its key is
fetched and recorded (`mctl ssh trust`'s rules: a changed key is never
replaced here) and the host is asked again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Host, Site
    from mctl.transport.results import HostResult


@dataclass(frozen=True)
class Reach:
    untrusted: dict[str, Any]              # host -> the new key it presents (not recorded yet)
    failed: dict[str, str]                 # host -> why it cannot be used (any other failure)
    trusted: list[str] | None = None       # hosts whose new key was recorded (None: none asked for)

    @property
    def ok(self) -> bool:
        return not self.untrusted and not self.failed


def _new_key(r: "HostResult") -> bool:
    from mctl.transport.results import HostStatus

    return r.status is HostStatus.HOST_KEY_MISMATCH and r.host_key is not None and not r.host_key.recorded


def reach(site: "Site", hosts: Sequence["Host"], *, trust: bool = False, lock_path: Path | None = None) -> Reach:
    """Run `true` on every host; with *trust*, record new host keys (under *lock_path*) and ask those again."""
    from mctl.transport import SSHConfig, run_sync, targets_for
    from mctl.transport.trust import trust_hosts

    config = SSHConfig.from_site(site)
    results = {r.host: r for r in run_sync(config, targets_for(site, list(hosts)), "true")}
    trusted: list[str] | None = None
    new = [h for h in hosts if _new_key(results[h.name])]
    if new and trust:
        outcomes = trust_hosts(config, targets_for(site, new), lock_path=lock_path)
        trusted = [o.host for o in outcomes if o.trusted]
        for r in run_sync(config, targets_for(site, [h for h in new if h.name in trusted]), "true"):
            results[r.host] = r
    untrusted: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for h in hosts:
        r = results[h.name]
        if r.ok:
            continue
        if _new_key(r):
            untrusted[h.name] = r.host_key.presented
        else:
            failed[h.name] = r.summary()
    return Reach(untrusted, failed, trusted)
