"""IMEX on the trays over SSH: read what each tray holds and runs, push rendered files, restart the daemon.

The adapter half of imex.py. One SSH round trip per tray and purpose: the probe
prints the node list, config.cfg, `nvidia-imex-ctl -q`, `-N -j` and the text
`-N` between markers with each exit code (both forms of `-N` are read: they
must agree, see imex.compare_views); the push keeps the previous file beside
each one it replaces (`<file>.mctl-bak`, see BACKUP_SUFFIX), writes files
atomically (temp file + mv, contents carried base64-encoded in the command)
and restarts the daemon.
Parsing the probe's output is pure and tested on its own.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from mctl.facts import FactsParseError
from mctl.facts.imex import parse_domain_json, parse_domain_text, parse_query
from mctl.fabric.imex import TrayImexReport
from mctl.model.imex import CONFIG_FILE, ImexSettings

if TYPE_CHECKING:
    from mctl.model.site import Host, Site
    from mctl.transport.results import HostResult

MARK = "@@mctl-imex@@"
BACKUP_SUFFIX = ".mctl-bak"     # the previous content of a file `mctl imex apply` replaced, beside it
_SECTIONS = ("nodes_config", "config", "query", "domain", "domain_text")
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
        f"sect domain_text; nvidia-imex-ctl -c {cfg} -N 2>&1; end $?",
    ]) + "\n"


@dataclass(frozen=True)
class Section:
    rc: int
    text: str


def parse_probe(stdout: str) -> dict[str, Section]:
    found = {m.group(1): Section(int(m.group(3)), m.group(2)) for m in _SECTION.finditer(stdout)}
    missing = [s for s in _SECTIONS if s not in found]
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
    text = sections["domain_text"]
    text_status = text_error = None
    if text.rc == 0:
        try:
            text_status = parse_domain_text(text.text)
        except FactsParseError as exc:
            text_error = exc.message
    else:
        text_error = _last_line(text.text, f"exit {text.rc}")
    report = TrayImexReport(result.host, nodes_config=nodes.text if nodes.rc == 0 else None, query=state,
                            status=status, error="; ".join(dict.fromkeys(errors)) or None,
                            text_status=text_status, text_error=text_error)
    files = {"nodes_config": nodes.text if nodes.rc == 0 else None, CONFIG_FILE: config.text if config.rc == 0
             else None}
    return report, files


def _last_line(text: str, fallback: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else fallback


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


def backup_path(path: str) -> str:
    """Where `mctl imex apply` keeps the previous content of *path* (one generation, beside it)."""
    return path + BACKUP_SUFFIX


def push_command(files: Mapping[str, str], restart: str | None) -> str:
    """Write each file atomically on the tray, then (optionally) restart the daemon.

    A file that is there and differs is first copied to `<file>.mctl-bak` (mode and
    times kept), so the previous node list or config can be put back by hand; a
    file that already holds the content is neither backed up nor rewritten.
    """
    lines = ["set -e", "umask 022"]
    for path, content in files.items():
        q = shlex.quote(path)
        bak = shlex.quote(backup_path(path))
        data = base64.b64encode(content.encode()).decode()
        lines += [f"mkdir -p \"$(dirname {q})\"",
                  f"t=$(mktemp {q}.XXXXXX)",
                  f"printf '%s' {data} | base64 -d > \"$t\"",
                  "chmod 644 \"$t\"",
                  f"if [ -f {q} ] && command -v cmp >/dev/null 2>&1 && cmp -s \"$t\" {q}; then rm -f \"$t\"; else",
                  f"  if [ -f {q} ]; then cp -p {q} {bak}; fi",
                  f"  mv -f \"$t\" {q}",
                  "fi"]
    if restart:
        # The restart command runs without errexit: its own exit status is the result.
        lines += ["set +e", restart]
    return "\n".join(lines) + "\n"


def push(site: "Site", hosts: Sequence["Host"], files: Mapping[str, Mapping[str, str]], restart: str | None,
         ) -> list["HostResult"]:
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, hosts),
                    lambda t: push_command(files.get(t.name, {}), restart))
