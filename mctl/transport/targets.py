"""Turn an operator's host expression into the hosts of the Site.

Accepted, in ClusterShell syntax with its operators (`,` union, `!` minus,
`&` intersection, `^` symmetric difference):
  - host names and node sets: `lab-r1-tray[01-04]`, `lab-r1-head`
  - a rack name or `@RACK`: that rack's compute trays
  - `@all` (or `@*`): every host; `@compute`, `@head`, `@switch`: every host of that role
Anything that does not name a host of the inventory is a usage error that lists
what is known, so a typo never silently shrinks a fan-out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from mctl.errors import UsageError
from mctl.model.names import MAX_NODESET, nodeset_too_big

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

ROLE_GROUPS = {"compute": "compute", "head": "head", "switch": "switch", "switches": "switch"}
_GROUP_WORD = re.compile(r"@([^,!&^\[\]\s]+)")


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to open the SSH session for one host."""

    name: str
    address: str
    port: int
    user: str

    @classmethod
    def for_host(cls, host: "Host", *, port: int, user: str) -> "SSHTarget":
        # Per-host Ansible variables win, so one inventory drives both mctl and playbooks.
        # The inventory checked these (mctl.inventory.loader._check_vars); a Host built elsewhere with a
        # word for a port is still a usage error, not a traceback.
        hv = host.vars or {}
        try:
            chosen = int(hv.get("ansible_port") or port)
        except (TypeError, ValueError):
            raise UsageError(f"{host.name}: ansible_port {hv.get('ansible_port')!r} is not a TCP port") from None
        return cls(host.name, str(hv.get("ansible_host") or host.address), chosen,
                   str(hv.get("ansible_user") or user))


def site_groups(site: "Site") -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"all": [h.name for h in site.hosts()]}
    for word, role in ROLE_GROUPS.items():
        groups[word] = [h.name for h in site.hosts() if h.role == role]
    for rack in site.racks.values():
        groups[rack.name] = [h.name for h in rack.compute]
    return groups


def _split_top_level(expr: str) -> list[str]:
    """Split on node-set operators outside brackets, keeping the operators."""
    parts, depth, word = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if depth == 0 and ch in ",!&^":
            parts.append(word)
            parts.append(ch)
            word = ""
        else:
            word += ch
    parts.append(word)
    return parts


def resolve_hosts(site: "Site", expr: str, *, roles: Iterable[str] | None = None) -> list["Host"]:
    """Hosts named by *expr*, in inventory order; UsageError on anything unknown."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSetParseError
    from ClusterShell.NodeUtils import GroupResolver, GroupSource

    text = expr.strip()
    if not text:
        raise UsageError("empty host expression", hint=_known_hint(site))
    groups = site_groups(site)
    # A bare rack name means its trays; rewrite it as the group before parsing.
    tokens = [("@" + t.strip()) if t.strip() in site.racks else t for t in _split_top_level(text)]
    text = "".join(tokens)
    for word in _GROUP_WORD.findall(text):
        if word != "*" and word not in groups:
            raise UsageError(f"unknown group @{word}", hint=_known_hint(site))
    # Sized before ClusterShell expands it: tray[1-10000000] would build ten million names first.
    # Groups stand for at most every host of the site, so the limit is the larger of the two.
    limit = max(MAX_NODESET, len(groups["all"]))
    big = nodeset_too_big(_GROUP_WORD.sub("x", text), limit)
    if big:
        raise UsageError(big, hint=_known_hint(site))
    source = GroupSource("mctl", {k: ",".join(v) for k, v in groups.items() if v})
    try:
        nodes = NodeSet(text, resolver=GroupResolver(source))
    except (NodeSetParseError, RangeSetParseError) as exc:
        raise UsageError(f"bad node set {expr!r}: {exc}",
                         hint="use ClusterShell syntax, e.g. rack-a-tray[01-04] or @all!rack-a-head") from None
    by_name = {h.name: h for h in site.hosts()}
    unknown = [n for n in nodes if n not in by_name]
    if unknown:
        shown = str(NodeSet.fromlist(unknown))
        raise UsageError(f"unknown host{'s' if len(unknown) > 1 else ''} {shown}", hint=_known_hint(site))
    wanted = set(nodes)
    hosts = [h for h in site.hosts() if h.name in wanted]
    if roles is not None:
        allowed = set(roles)
        hosts = [h for h in hosts if h.role in allowed]
    if not hosts:
        raise UsageError(f"{expr!r} names no hosts", hint=_known_hint(site))
    return hosts


def _known_hint(site: "Site") -> str:
    racks = ", ".join(site.racks) or "none"
    example = next((r.compute[0].name for r in site.racks.values() if r.compute), "HOST")
    return f"known racks: {racks}; groups: @all, @compute, @head, @switch, @RACK; or host names such as {example}"


def targets_for(site: "Site", hosts: Iterable["Host"]) -> list[SSHTarget]:
    return [SSHTarget.for_host(h, port=site.ssh.port, user=site.ssh.user) for h in hosts]
