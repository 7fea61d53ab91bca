"""A tray's IMEX files against the partition plan: nodes_config.cfg and config.cfg as mctl renders them;
on a Kubernetes site, the host IMEX service that must not run beside the DRA driver's.

Compared by meaning, not bytes: the node list as the ordered addresses IMEX
reads (order matters to IMEX), config.cfg as its KEY=VALUE settings, so a
changed comment is not drift and a changed port is.

Where the NVIDIA DRA driver's ComputeDomains manage IMEX (`scheduler.type: k8s`: mctl deploys one
ComputeDomain per NVLink partition), the driver starts its own IMEX daemon per domain in a pod on
the node. A host `nvidia-imex` service that runs, or is enabled and comes back at the next boot,
holds the same command port and IMEX channels, and the ComputeDomain's daemons fail beside it
(the DRA driver's documentation: the host service must be stopped and disabled).
"""

from __future__ import annotations

from typing import Mapping

from mctl.facts import FactsParseError
from mctl.facts.imex import parse_config, parse_nodes_config
from mctl.model.findings import Finding, Severity

FAMILY = "imex"
NODES = "imex.nodes_config"
CONFIG = "imex.config"
HOST_SERVICE = "imex.host_service"
HOST_SERVICE_FIX = ("systemctl disable --now nvidia-imex.service && systemctl mask nvidia-imex.service on the "
                    "tray (the DRA driver's ComputeDomain daemons run IMEX there); `mctl provision TRAY` with "
                    "scheduler.type k8s stops and disables it")

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


def check_host_service(tray: str, service) -> list[Finding]:
    """imex.host_service on a tray of a site whose IMEX the DRA driver's ComputeDomains manage: *service* is the
    tray's nvidia-imex unit as its probe read it (mctl.model.tray.ServiceState; None: the probe could not say).
    Running (active, activating, reloading) or enabled to start at boot is the conflict; a unit that is not
    installed, or is stopped and disabled, static or masked, is not."""
    details = {"subject": "nvidia-imex.service"}
    if service is None:
        return [Finding(Severity.WARN, tray, HOST_SERVICE, "the host nvidia-imex service's state could not be read",
                        "rerun the audit; systemctl show nvidia-imex.service on the tray", details)]
    if not service.installed:
        return [Finding(Severity.OK, tray, HOST_SERVICE, "no host nvidia-imex service (the DRA driver runs IMEX)",
                        None, details)]
    running = service.active in ("active", "activating", "reloading")
    enabled = (service.enabled or "") in ("enabled", "enabled-runtime", "alias", "linked", "linked-runtime")
    state = {**details, "active": service.active, "enabled": service.enabled}
    if not running and not enabled:
        said = f"{service.active or 'not running'} and {service.enabled or 'not enabled'}"
        return [Finding(Severity.OK, tray, HOST_SERVICE, f"the host nvidia-imex service is {said} "
                        "(the DRA driver runs IMEX)", None, state)]
    what = " and ".join(x for x in ("running" if running else "", "enabled at boot" if enabled else "") if x)
    return [Finding(Severity.CRITICAL, tray, HOST_SERVICE,
                    f"the host nvidia-imex service is {what} while the DRA driver's ComputeDomains manage IMEX: "
                    "their IMEX daemons conflict with it", HOST_SERVICE_FIX, state)]
