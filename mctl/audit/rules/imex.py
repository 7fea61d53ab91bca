"""A tray's IMEX files against the partition plan: nodes_config.cfg and config.cfg as mctl renders them.

Compared by meaning, not bytes: the node list as the ordered addresses IMEX
reads (order matters to IMEX), config.cfg as its KEY=VALUE settings, so a
changed comment is not drift and a changed port is.
"""

from __future__ import annotations

from typing import Mapping

from mctl.facts import FactsParseError
from mctl.facts.imex import parse_config, parse_nodes_config
from mctl.model.findings import Finding, Severity

FAMILY = "imex"
NODES = "imex.nodes_config"
CONFIG = "imex.config"

# Settings whose drift breaks the domain (daemons cannot reach or trust each other);
# the rest (log level, log file) only changes how it is observed.
_BREAKING = frozenset({"BIND_INTERFACE_IP", "SERVER_PORT", "IMEX_NODE_CONFIG_FILE", "IMEX_CMD_PORT",
                       "IMEX_CMD_BIND_INTERFACE_IP", "IMEX_CMD_ENABLED", "IMEX_ENABLE_AUTH_ENCRYPTION",
                       "IMEX_AUTH_ENCRYPTION_MODE", "IMEX_AUTH_SOURCE", "IMEX_SERVER_KEY", "IMEX_SERVER_CERT",
                       "IMEX_SERVER_CERT_AUTH", "IMEX_CLIENT_KEY", "IMEX_CLIENT_CERT", "IMEX_CLIENT_CERT_AUTH",
                       "IMEX_SECURITY_TARGET_OVERRIDE"})


def _fix(rack: str) -> str:
    return f"run 'mctl imex apply {rack}' (it rewrites the tray's files and restarts its daemon)"


def check_nodes_config(tray: str, rack: str, domain: str, path: str, want: str, have: str | None,
                       error: str | None = None) -> list[Finding]:
    details = {"subject": path, "domain": domain}
    if error is not None:
        return [Finding(Severity.CRITICAL, tray, NODES, f"{path} could not be read: {error}", _fix(rack), details)]
    if have is None:
        return [Finding(Severity.CRITICAL, tray, NODES, f"{path} is missing; IMEX domain {domain} needs it",
                        _fix(rack), details)]
    expected = parse_nodes_config(want)
    try:
        listed = parse_nodes_config(have)
    except FactsParseError as exc:
        return [Finding(Severity.CRITICAL, tray, NODES, f"{path} is not a node list: {exc.message}", _fix(rack),
                        details)]
    if listed == expected:
        return [Finding(Severity.OK, tray, NODES, f"{path} lists the {len(expected)} trays of IMEX domain {domain}",
                        None, details)]
    if set(listed) == set(expected):
        what = "the same addresses in another order (IMEX reports a node map mismatch)"
    else:
        missing = [a for a in expected if a not in listed]
        extra = [a for a in listed if a not in expected]
        what = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                     f"extra {', '.join(extra)}" if extra else "") if x)
    return [Finding(Severity.CRITICAL, tray, NODES,
                    f"{path} differs from IMEX domain {domain} (partition plan): {what}", _fix(rack),
                    {**details, "expected": list(expected), "found": list(listed)})]


def check_config(tray: str, rack: str, domain: str, path: str, want: str, have: str | None,
                 error: str | None = None) -> list[Finding]:
    details = {"subject": path, "domain": domain}
    if error is not None:
        return [Finding(Severity.CRITICAL, tray, CONFIG, f"{path} could not be read: {error}", _fix(rack), details)]
    if have is None:
        return [Finding(Severity.CRITICAL, tray, CONFIG, f"{path} is missing", _fix(rack), details)]
    expected = parse_config(want)
    try:
        found = parse_config(have)
    except FactsParseError as exc:
        return [Finding(Severity.CRITICAL, tray, CONFIG, f"{path}: {exc.message}", _fix(rack), details)]
    differing = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
    if not differing:
        return [Finding(Severity.OK, tray, CONFIG, f"{path} holds the rendered settings", None, details)]
    shown = ", ".join(f"{k}={found[k] if k in found else '(unset)'} (want "
                      f"{expected[k] if k in expected else 'unset'})" for k in differing[:4])
    more = f" and {len(differing) - 4} more" if len(differing) > 4 else ""
    severity = Severity.CRITICAL if any(k in _BREAKING for k in differing) else Severity.WARN
    return [Finding(severity, tray, CONFIG, f"{path} differs from the rendered settings: {shown}{more}", _fix(rack),
                    {**details, "keys": differing})]


def check_tray(tray: str, rack: str, domain: str, expected: Mapping[str, str], held: Mapping[str, str | None],
               errors: Mapping[str, str], *, nodes_path: str, config_path: str) -> list[Finding]:
    """Both files of one tray; *expected* is mctl.fabric.imex.expected_files(...)[tray]."""
    return (check_nodes_config(tray, rack, domain, nodes_path, expected[nodes_path], held.get(nodes_path),
                               errors.get(nodes_path))
            + check_config(tray, rack, domain, config_path, expected[config_path], held.get(config_path),
                           errors.get(config_path)))
