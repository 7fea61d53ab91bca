"""IMEX on the trays over SSH: read what each tray holds and runs, push rendered files, restart the daemon.

The adapter half of imex.py. One SSH round trip per tray and purpose: the probe
prints the node list, config.cfg, `nvidia-imex-ctl -q` and `-N -j` between
markers with each exit code; the push writes files atomically (temp file + mv,
contents carried base64-encoded in the command) and restarts the daemon.
Parsing the probe's output is pure and tested on its own.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from mctl.facts import FactsParseError
from mctl.facts.imex import parse_domain_json, parse_query
from mctl.fabric.imex import CONFIG_FILE, ImexSettings, TrayImexReport

if TYPE_CHECKING:
    from mctl.model.site import Host, Site
    from mctl.transport.results import HostResult

MARK = "@@mctl-imex@@"
_SECTION = re.compile(re.escape(MARK) + r" (\w+)\n(.*?)\n" + re.escape(MARK) + r" rc (\d+)\n", re.S)


def probe_command(settings: ImexSettings) -> str:
    cfg = shlex.quote(CONFIG_FILE)
    nodes = shlex.quote(settings.node_config_file)
    return "\n".join([
        f"M={shlex.quote(MARK)}",
        "sect() { printf '%s %s\\n' \"$M\" \"$1\"; }",
        "end() { printf '\\n%s rc %s\\n' \"$M\" \"$1\"; }",
        f"sect nodes_config; cat {nodes} 2>&1; end $?",
        f"sect config; cat {cfg} 2>&1; end $?",
        f"sect query; nvidia-imex-ctl -c {cfg} -q 2>&1; end $?",
        f"sect domain; nvidia-imex-ctl -c {cfg} -N -j 2>&1; end $?",
    ]) + "\n"


@dataclass(frozen=True)
class Section:
    rc: int
    text: str


def parse_probe(stdout: str) -> dict[str, Section]:
    found = {m.group(1): Section(int(m.group(3)), m.group(2)) for m in _SECTION.finditer(stdout)}
    missing = [s for s in ("nodes_config", "config", "query", "domain") if s not in found]
    if missing:
        raise FactsParseError(f"IMEX probe output lacks {', '.join(missing)} (truncated?)")
    return found


def report_from(result: "HostResult") -> tuple[TrayImexReport, dict[str, str | None]]:
    """A tray's IMEX report and the files it holds now (None: absent), from one probe result."""
    if not result.status.reached:
        return TrayImexReport(result.host, reachable=False, error=result.summary()), {}
    try:
        sections = parse_probe(result.stdout)
    except FactsParseError as exc:
        return TrayImexReport(result.host, error=exc.message), {}
    nodes = sections["nodes_config"]
    config = sections["config"]
    query = sections["query"]
    domain = sections["domain"]
    errors = []
    state = None
    if query.rc == 0:
        try:
            state = parse_query(query.text)
        except FactsParseError as exc:
            errors.append(exc.message)
    else:
        errors.append(query.text.strip().splitlines()[-1] if query.text.strip() else f"exit {query.rc}")
    status = None
    if domain.rc == 0:
        try:
            status = parse_domain_json(domain.text)
        except FactsParseError as exc:
            errors.append(exc.message)
    report = TrayImexReport(result.host, nodes_config=nodes.text if nodes.rc == 0 else None, query=state,
                            status=status, error="; ".join(dict.fromkeys(errors)) or None)
    files = {"nodes_config": nodes.text if nodes.rc == 0 else None, CONFIG_FILE: config.text if config.rc == 0
             else None}
    return report, files


def collect(site: "Site", hosts: Sequence["Host"], settings: ImexSettings
            ) -> tuple[dict[str, TrayImexReport], dict[str, dict[str, str | None]]]:
    """Probe every tray: reports for assess_domain, and the files each holds (keyed by path)."""
    from mctl.transport import SSHConfig, run_sync, targets_for

    results = run_sync(SSHConfig.from_site(site), targets_for(site, hosts), probe_command(settings))
    reports: dict[str, TrayImexReport] = {}
    files: dict[str, dict[str, str | None]] = {}
    for r in results:
        report, held = report_from(r)
        reports[r.host] = report
        if held:
            files[r.host] = {settings.node_config_file: held["nodes_config"], CONFIG_FILE: held[CONFIG_FILE]}
    return reports, files


def push_command(files: Mapping[str, str], restart: str | None) -> str:
    """Write each file atomically on the tray, then (optionally) restart the daemon."""
    lines = ["set -e", "umask 022"]
    for path, content in files.items():
        q = shlex.quote(path)
        data = base64.b64encode(content.encode()).decode()
        lines += [f"mkdir -p \"$(dirname {q})\"",
                  f"t=$(mktemp {q}.XXXXXX)",
                  f"printf '%s' {data} | base64 -d > \"$t\"",
                  "chmod 644 \"$t\"",
                  f"mv -f \"$t\" {q}"]
    if restart:
        # The restart command runs without errexit: its own exit status is the result.
        lines += ["set +e", restart]
    return "\n".join(lines) + "\n"


def push(site: "Site", hosts: Sequence["Host"], files: Mapping[str, Mapping[str, str]], restart: str | None,
         ) -> list["HostResult"]:
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, hosts),
                    lambda t: push_command(files.get(t.name, {}), restart))
