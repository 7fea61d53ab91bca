"""The IMEX daemon's configuration on a tray (pure): the settings mctl writes into it, where its
files live, and the text of its config.cfg.

Two subsystems configure the same daemon: fabric's static domains (one per NVLink partition,
`mctl imex apply`, mctl.fabric.imex) and the Slurm prolog of the per-job scope
(mctl.sched.slurm.imex_job). Both write this config.cfg from the same `vars.imex`, so its
settings and its text are defined once, here, below both (docs/decisions.md D60). Which trays
form a domain, and the node list that names them, stay fabric's.

`vars.imex` is free-form in the inventory (Site.vars), not a section the loader converts
(mctl.inventory.convert): `ImexSettings.from_vars` reads and checks it when a command needs it,
and a bad value is a usage error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mctl.errors import UsageError
from mctl.model.fabric import ImexDomain, ImexMember
from mctl.model.names import has_control, path_problem

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
