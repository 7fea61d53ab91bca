"""Provisioning markers: what `mctl rack bring-up` leaves on a host it provisioned, read back over SSH.

    read_markers(site, hosts) -> MarkerRead
    write_markers(site, hosts, markers) -> {host: why it failed}
    clear_markers(site, hosts) -> {host: why it failed}

A marker (`/var/lib/mctl-bringup/provisioned.json` on the host) records the
digest of what provisioned it: the playbooks, its image and its inventory
entry. Bring-up provisions a host whose marker is missing or different, and
removes the marker before it provisions, so a run cut short (kill -9, a failed
task) leaves the host marked as not provisioned rather than as done.
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Host, Site
    from mctl.transport.results import HostResult

MARKER = "/var/lib/mctl-bringup/provisioned.json"


@dataclass(frozen=True)
class MarkerRead:
    markers: dict[str, dict | None]        # host -> its marker (None: none, or unreadable)
    failed: dict[str, str]                 # host -> why it could not be asked


def _run(site: "Site", hosts: Sequence["Host"], command) -> list["HostResult"]:
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, hosts), command)


def parse_marker(text: str) -> dict | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("digest"), str) else None


def read_markers(site: "Site", hosts: Sequence["Host"]) -> MarkerRead:
    results = _run(site, hosts, f"cat {MARKER} 2>/dev/null; true")
    markers: dict[str, dict | None] = {}
    failed: dict[str, str] = {}
    for r in results:
        if r.ok:
            markers[r.host] = parse_marker(r.stdout) if r.stdout.strip() else None
        else:
            failed[r.host] = r.summary()
    return MarkerRead(markers, failed)


def write_command(marker: Mapping) -> str:
    data = base64.b64encode((json.dumps(dict(marker), sort_keys=True) + "\n").encode()).decode()
    folder = shlex.quote(MARKER.rsplit("/", 1)[0])
    return (f"set -e; mkdir -p {folder}; t=$(mktemp {shlex.quote(MARKER)}.XXXXXX); "
            f"printf '%s' {data} | base64 -d > \"$t\"; chmod 644 \"$t\"; mv -f \"$t\" {shlex.quote(MARKER)}")


def write_markers(site: "Site", hosts: Sequence["Host"], markers: Mapping[str, Mapping]) -> dict[str, str]:
    """Write each host's marker atomically; hosts where it failed, with the reason."""
    results = _run(site, hosts, lambda t: write_command(markers[t.name]))
    return {r.host: r.summary() for r in results if not r.ok}


def clear_markers(site: "Site", hosts: Sequence["Host"]) -> dict[str, str]:
    results = _run(site, hosts, f"rm -f {MARKER}")
    return {r.host: r.summary() for r in results if not r.ok}
