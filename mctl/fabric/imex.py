"""IMEX domains derived from NVLink partitions: the files each tray needs, and whether a domain is UP.

Pure. A domain is one partition's trays (the whole rack when the inventory
declares none, i.e. everything is in the default partition). Every tray of a
domain gets the same nodes_config.cfg (the trays' addresses sorted by tray
name: same entries, same order, or IMEX reports a node map mismatch) and its
own config.cfg, which binds the daemon and its command service to the tray's
address so that nvidia-imex-ctl on the tray (which reads config.cfg) finds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mctl.errors import UsageError
from mctl.facts import FactsParseError
from mctl.facts.imex import parse_nodes_config
from mctl.model.names import has_control, is_host_name, path_problem
from mctl.model.fabric import (LINK_WORDS, ImexDomain, ImexDomainHealth, ImexDomainStatus, ImexMember, ImexReason)

if TYPE_CHECKING:
    from mctl.model.site import Rack

CONFIG_DIR = "/etc/nvidia-imex"
CONFIG_FILE = f"{CONFIG_DIR}/config.cfg"
NODES_CONFIG_FILE = f"{CONFIG_DIR}/nodes_config.cfg"
QUORUM_MODES = ("NONE", "RECOVERY", "FULL")
_VAR_TYPES: dict[str, type] = {"server_port": int, "cmd_port": int, "cmd_enabled": bool, "log_level": int,
                               "log_file": str, "daemonize": bool, "wait_for_quorum": str,
                               "disconnected_grace_time": int, "node_config_file": str, "bind_tray_address": bool,
                               "restart_command": str}


@dataclass(frozen=True)
class ImexTLS:
    """SSL_TLS authentication and encryption between daemons; paths are as seen on the trays."""

    server_key: str
    server_cert: str
    server_cert_auth: str
    client_key: str
    client_cert: str
    client_cert_auth: str
    target_override: str | None = None


@dataclass(frozen=True)
class ImexSettings:
    """What mctl writes into config.cfg (documented keys only). From the inventory's `vars.imex`."""

    server_port: int = 50000
    cmd_port: int = 50005
    cmd_enabled: bool = True
    log_level: int = 4
    log_file: str = "/var/log/nvidia-imex.log"
    daemonize: bool = True
    wait_for_quorum: str = "RECOVERY"
    disconnected_grace_time: int | None = None
    node_config_file: str = NODES_CONFIG_FILE
    bind_tray_address: bool = True
    restart_command: str = "systemctl restart nvidia-imex"   # how `mctl imex apply` restarts the daemon
    tls: ImexTLS | None = None

    @classmethod
    def from_vars(cls, data: Any) -> "ImexSettings":
        """Read `vars: {imex: {...}}`; unknown keys and bad values are usage errors naming the key."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise UsageError("vars.imex must be a mapping", hint="e.g. vars: {imex: {server_port: 50000}}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown key vars.imex.{unknown[0]}", hint=f"known keys: {', '.join(sorted(known))}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key == "tls":
                if value is None:
                    continue
                if not isinstance(value, dict):
                    raise UsageError("vars.imex.tls must be a mapping of file paths")
                try:
                    kwargs["tls"] = ImexTLS(**value)
                except TypeError as exc:
                    raise UsageError(f"vars.imex.tls: {exc}",
                                     hint="give server_key, server_cert, server_cert_auth, client_key, client_cert, "
                                          "client_cert_auth (and optionally target_override)") from None
                continue
            expected = _VAR_TYPES[key]
            if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
                raise UsageError(f"vars.imex.{key} must be a {expected.__name__} (got {value!r})")
            kwargs[key] = value
        settings = cls(**kwargs)
        files = [("log_file", settings.log_file), ("node_config_file", settings.node_config_file)]
        if settings.tls:
            files += [(f"tls.{k}", v) for k, v in vars(settings.tls).items() if v is not None and k != "target_override"]
        for name, value in files:
            why = path_problem(value, absolute=True, parent_ok=False)
            if why:
                raise UsageError(f"vars.imex.{name}: {value!r} {why}", hint="a path on the trays, e.g. /etc/nvidia-imex/...")
        for name in ("restart_command", "wait_for_quorum"):
            if has_control(getattr(settings, name)):
                raise UsageError(f"vars.imex.{name} may not hold control characters (newline, tab, ...)")
        if settings.tls and settings.tls.target_override is not None and (
                has_control(str(settings.tls.target_override)) or " " in str(settings.tls.target_override)):
            raise UsageError("vars.imex.tls.target_override may not hold whitespace or control characters")
        for name, port in (("server_port", settings.server_port), ("cmd_port", settings.cmd_port)):
            if not 1 <= port <= 65535:
                raise UsageError(f"vars.imex.{name} must be a TCP port (1-65535), got {port}")
        if settings.wait_for_quorum not in QUORUM_MODES:
            raise UsageError(f"vars.imex.wait_for_quorum must be one of {', '.join(QUORUM_MODES)}")
        if not 0 <= settings.log_level <= 4:
            raise UsageError("vars.imex.log_level must be 0-4")
        return settings


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


def render_config(settings: ImexSettings, member: ImexMember, domain: ImexDomain) -> str:
    bind = member.address if settings.bind_tray_address else ""
    cmd_bind = member.address if settings.bind_tray_address else "127.0.0.1"
    lines = [
        f"# nvidia-imex configuration for {member.tray}, IMEX domain {domain.name} of rack {domain.rack}.",
        "# Rendered by mctl from the inventory ('mctl imex render'); edits are overwritten by 'mctl imex apply'.",
        f"LOG_LEVEL={settings.log_level}",
        f"LOG_FILE_NAME={settings.log_file}",
        "LOG_APPEND_TO_LOG=1",
        "LOG_USE_SYSLOG=0",
        f"DAEMONIZE={int(settings.daemonize)}",
        f"BIND_INTERFACE_IP={bind}",
        f"SERVER_PORT={settings.server_port}",
        f"IMEX_NODE_CONFIG_FILE={settings.node_config_file}",
        f"IMEX_WAIT_FOR_QUORUM={settings.wait_for_quorum}",
    ]
    if settings.disconnected_grace_time is not None:
        lines.append(f"IMEX_NODE_DISCONNECTED_GRACE_TIME={settings.disconnected_grace_time}")
    lines += [
        f"IMEX_CMD_ENABLED={int(settings.cmd_enabled)}",
        f"IMEX_CMD_BIND_INTERFACE_IP={cmd_bind}",
        f"IMEX_CMD_PORT={settings.cmd_port}",
    ]
    tls = settings.tls
    if tls is None:
        lines.append("IMEX_ENABLE_AUTH_ENCRYPTION=0")
    else:
        lines += [
            "IMEX_ENABLE_AUTH_ENCRYPTION=1",
            "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
            "IMEX_AUTH_SOURCE=FILE",
            f"IMEX_SERVER_KEY={tls.server_key}",
            f"IMEX_SERVER_CERT={tls.server_cert}",
            f"IMEX_SERVER_CERT_AUTH={tls.server_cert_auth}",
            f"IMEX_CLIENT_KEY={tls.client_key}",
            f"IMEX_CLIENT_CERT={tls.client_cert}",
            f"IMEX_CLIENT_CERT_AUTH={tls.client_cert_auth}",
        ]
        if tls.target_override:
            lines.append(f"IMEX_SECURITY_TARGET_OVERRIDE={tls.target_override}")
    return "\n".join(lines) + "\n"


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
