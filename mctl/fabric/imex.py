"""IMEX domains derived from NVLink partitions: the files each tray needs, and whether a domain is UP.

Pure. A domain is one partition's trays (the whole rack when the inventory
declares none, i.e. everything is in the default partition). Every tray of a
domain gets the same nodes_config.cfg (the trays' addresses sorted by tray
name: same entries, same order, or IMEX reports a node map mismatch) and its
own config.cfg, which binds the daemon and its command service to the tray's
address so that nvidia-imex-ctl on the tray (which reads config.cfg) finds it.
That file's settings and text are the daemon's own (mctl.model.imex), shared with
the Slurm prolog of the per-job scope.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mctl.errors import UsageError
from mctl.facts import FactsParseError
from mctl.facts.imex import parse_nodes_config
from mctl.model.fabric import (LINK_WORDS, ImexDomain, ImexDomainHealth, ImexDomainStatus, ImexMember, ImexReason)
from mctl.model.imex import CONFIG_FILE, NODES_CONFIG_FILE, ImexSettings, render_config
from mctl.model.names import is_host_name

if TYPE_CHECKING:
    from mctl.model.site import Rack


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def imex_domains(rack: "Rack") -> tuple[ImexDomain, ...]:
    """One IMEX domain per partition; the whole rack when no partition is declared."""
    address = {h.name: h.address for h in rack.compute}
    groups = [(p.name, p.trays) for p in rack.partitions] or [("default", tuple(address))]
    out = []
    for name, trays in groups:
        members = tuple(ImexMember(t, address[t]) for t in sorted(trays, key=_natural))
        out.append(ImexDomain(name, rack.name, members))
    return tuple(out)


def domain_of(rack: "Rack", tray: str) -> ImexDomain | None:
    return next((d for d in imex_domains(rack) if tray in d.trays), None)


def render_nodes_config(domain: ImexDomain) -> str:
    """One address per line, nothing else (IMEX reads the file as a plain list)."""
    return "".join(f"{a}\n" for a in domain.addresses)


@dataclass(frozen=True)
class TrayFiles:
    tray: str
    address: str
    domain: str
    files: tuple[tuple[str, str], ...]      # (path on the tray, content)


def local_path(out: Path, tray: str, path: str) -> Path:
    """Where `imex render --out` writes *path* of *tray*: inside *out*, whatever the names say."""
    if not is_host_name(tray):
        raise UsageError(f"refusing to write IMEX files for {tray!r}: not a valid host name")
    rel = PurePosixPath(path.lstrip("/"))
    if not rel.parts or any(part in ("", ".", "..") for part in rel.parts):
        raise UsageError(f"refusing to write IMEX file {path!r} for {tray}: it would leave {out}")
    return out / tray / Path(*rel.parts)


def render_rack(rack: "Rack", settings: ImexSettings) -> tuple[TrayFiles, ...]:
    """Every tray's config.cfg and nodes_config.cfg, in rack order."""
    out = []
    for domain in imex_domains(rack):
        nodes = render_nodes_config(domain)
        for member in domain.members:
            out.append(TrayFiles(member.tray, member.address, domain.name,
                                 ((CONFIG_FILE, render_config(settings, member, domain)),
                                  (settings.node_config_file, nodes))))
    order = {h.name: i for i, h in enumerate(rack.compute)}
    return tuple(sorted(out, key=lambda t: order.get(t.tray, 0)))


# ------------------------------------------------------------------ status

@dataclass(frozen=True)
class TrayImexReport:
    """What one tray said when asked (over SSH) about IMEX."""

    tray: str
    reachable: bool = True
    error: str | None = None
    nodes_config: str | None = None          # file content; None when absent
    query: str | None = None                 # `nvidia-imex-ctl -q` state
    status: ImexDomainStatus | None = None   # parsed `nvidia-imex-ctl -N -j`
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    text_status: ImexDomainStatus | None = None   # parsed text `nvidia-imex-ctl -N`
    text_error: str | None = None                 # why the text `-N` could not be read


def compare_views(json_view: ImexDomainStatus | None, text_view: ImexDomainStatus | None, *,
                  json_error: str | None = None, text_error: str | None = None) -> list[str]:
    """Where `nvidia-imex-ctl -N -j` and the text `-N` of one daemon disagree (empty: they agree).

    Compared field by field: the domain state, the node list (index, address,
    daemon state, version where both print one) and every connectivity letter.
    Time stamps are not compared (two calls, two instants); host names only
    appear in the text form with -H. One side missing while the other answered
    is a disagreement too.
    """
    if json_view is None and text_view is None:
        return []
    if json_view is None:
        return [f"-N -j could not be read ({json_error or 'no answer'}) while -N says {text_view.state}"]
    if text_view is None:
        return [f"-N could not be read ({text_error or 'no answer'}) while -N -j says {json_view.state}"]
    out: list[str] = []
    if json_view.state != text_view.state:
        out.append(f"domain state {json_view.state} (-N -j) vs {text_view.state} (-N)")
    j_nodes = {n.index: n for n in json_view.nodes}
    t_nodes = {n.index: n for n in text_view.nodes}
    if sorted(j_nodes) != sorted(t_nodes):
        out.append(f"{len(j_nodes)} nodes (-N -j) vs {len(t_nodes)} nodes (-N)")
        return out
    for i in sorted(j_nodes):
        a, b = j_nodes[i], t_nodes[i]
        for what, x, y in (("address", a.address, b.address), ("state", a.state, b.state)):
            if x != y:
                out.append(f"node {i} {what} {x} (-N -j) vs {y} (-N)")
        if a.version and b.version and a.version != b.version:
            out.append(f"node {i} version {a.version} (-N -j) vs {b.version} (-N)")
        if a.links != b.links:
            diff = [f"{j}: {x}/{y}" for j, (x, y) in enumerate(zip(a.links, b.links)) if x != y]
            if len(a.links) != len(b.links):
                diff.append(f"{len(a.links)} vs {len(b.links)} links")
            out.append(f"node {i} links (-N -j/-N) {', '.join(diff)}")
    return out


def assess_domain(domain: ImexDomain, reports: Mapping[str, TrayImexReport]) -> ImexDomainHealth:
    """UP only when every tray holds the rendered node list, runs READY and sees every link connected."""
    expected = domain.addresses
    tray_of = {m.address: m.tray for m in domain.members}
    reasons: list[ImexReason] = []
    seen: set[str] = set()

    def add(message: str, tray: str | None) -> None:
        if message not in seen:
            seen.add(message)
            reasons.append(ImexReason(message, tray))

    ready = 0
    reached = 0
    per_tray: list[tuple[str, str]] = []
    states: list[str] = []
    for tray in domain.trays:
        r = reports.get(tray)
        if r is None or not r.reachable:
            add(f"tray {tray} unreachable{': ' + r.error if r and r.error else ''}", tray)
            per_tray.append((tray, "UNREACHABLE"))
            continue
        reached += 1
        if r.nodes_config is None:
            add(f"node map mismatch on tray {tray}: {NODES_CONFIG_FILE} is missing", tray)
        else:
            try:
                listed = parse_nodes_config(r.nodes_config)
            except FactsParseError as exc:
                listed = None
                add(f"node map mismatch on tray {tray}: {exc.message}", tray)
            if listed is not None and listed != expected:
                if set(listed) == set(expected):
                    add(f"node map mismatch on tray {tray}: same addresses in another order", tray)
                else:
                    missing = [a for a in expected if a not in listed]
                    extra = [a for a in listed if a not in expected]
                    detail = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                                   f"extra {', '.join(extra)}" if extra else "") if x)
                    add(f"node map mismatch on tray {tray}: nodes_config.cfg differs from the partition ({detail})",
                        tray)
        state = r.query or (r.error and "UNAVAILABLE") or "UNKNOWN"
        per_tray.append((tray, state))
        if r.query == "READY":
            ready += 1
        elif r.query:
            add(f"IMEX daemon on tray {tray} is {r.query}", tray)
        else:
            add(f"IMEX daemon on tray {tray} did not answer{': ' + r.error if r.error else ''}", tray)
        if r.status is not None:
            states.append(r.status.state)
            _link_reasons(r.status, tray_of, add)
        if r.query and (r.text_status is not None or r.text_error is not None):     # both forms were asked
            disagree = compare_views(r.status, r.text_status, json_error=r.error, text_error=r.text_error)
            if disagree:
                add(f"nvidia-imex-ctl -N -j and -N disagree on tray {tray}: {'; '.join(disagree)}", tray)
    if reached == 0:
        state = "UNKNOWN"
    elif not reasons and ready == len(domain.members) and states and all(s == "UP" for s in states):
        state = "UP"
    elif ready <= 1 and len(domain.members) > 1 or ready == 0:
        state = "DOWN"
    else:
        state = "DEGRADED"
    if state != "UP" and not reasons:
        add("IMEX reports the domain " + (", ".join(sorted(set(states))) or "without a status"), None)
    return ImexDomainHealth(domain, state, tuple(reasons), tuple(per_tray))


def _link_reasons(status: ImexDomainStatus, tray_of: Mapping[str, str], add) -> None:
    names = {n.index: tray_of.get(n.address, n.address) for n in status.nodes}
    for node in status.nodes:
        for j, letter in enumerate(node.links):
            if letter == "C" or j == node.index or j not in names:
                continue
            src, dst = names[node.index], names[j]
            if letter == "!M!":
                add(f"node map mismatch between tray {src} and tray {dst}", dst)
            elif letter == "!V!":
                add(f"IMEX version mismatch between tray {src} and tray {dst}", dst)
            elif letter == "I":
                continue            # the row of an unreachable node: reported by its own state
            else:
                add(f"tray {src} is not connected to tray {dst} ({LINK_WORDS[letter].lower().replace('_', ' ')})",
                    dst)


def assess_rack(rack: "Rack", reports: Mapping[str, TrayImexReport]) -> tuple[ImexDomainHealth, ...]:
    return tuple(assess_domain(d, reports) for d in imex_domains(rack))


def expected_files(rack: "Rack", settings: ImexSettings) -> dict[str, dict[str, str]]:
    return {t.tray: dict(t.files) for t in render_rack(rack, settings)}


def trays_needing(expected: Mapping[str, Mapping[str, str]],
                  current: Mapping[str, Mapping[str, str | None]]) -> dict[str, list[str]]:
    """Which files differ per tray (the plan of `mctl imex apply`)."""
    out: dict[str, list[str]] = {}
    for tray, files in expected.items():
        have = current.get(tray, {})
        changed = [path for path, content in files.items() if have.get(path) != content]
        if changed:
            out[tray] = changed
    return out


def trays_not_running(reports: Mapping[str, TrayImexReport], expected: Mapping[str, object]) -> list[str]:
    """Reachable trays of an IMEX domain whose daemon did not answer `nvidia-imex-ctl -q`: their files may be
    right, but the domain is not there until the daemon runs, so `imex apply` (re)starts it."""
    return sorted(t for t, rep in reports.items() if t in expected and rep.reachable and rep.query is None)


def plan_domains(domains: Sequence[ImexDomain], plan: Mapping[str, Sequence[str]], unreachable: Sequence[str], *,
                 restart: bool = False) -> tuple[set[str], dict[str, list[str]]]:
    """Which trays `imex apply` touches, and the domains it must leave alone.

    A domain is touched as a whole or not at all: when one of its trays cannot be
    reached, writing the others' files and restarting their daemons would split it
    (the unreachable tray keeps the old node list), so none of its trays is touched.
    Returns (trays to write/restart, {domain: its unreachable trays}); a domain with
    nothing to do is in neither.
    """
    down = set(unreachable)
    touched: set[str] = set()
    blocked: dict[str, list[str]] = {}
    for d in domains:
        wanted = [t for t in d.trays if t not in down and (t in plan or restart)]
        lost = [t for t in d.trays if t in down]
        if not wanted:
            continue
        if lost:
            blocked[d.name] = lost
            continue
        touched.update(wanted)
    return touched, blocked


def domains_summary(domains: Sequence[ImexDomain]) -> list[dict[str, Any]]:
    return [{"domain": d.name, "rack": d.rack, "trays": list(d.trays), "addresses": list(d.addresses)}
            for d in domains]
