"""Collect a compute tray's facts over SSH in one round trip.

One POSIX sh script per tray runs every probe and frames each output (stdout
and stderr alike) between marker lines carrying a per-run nonce, so a tray
costs one SSH command however many facts there are, and no file content can
fake a section boundary. The framing is split apart and handed to the pure
parsers; a missing, truncated or unreadable section becomes a problem on that
tray, never an exception.

The script is built from mctl.facts.shell's function library, which the health
and audit probes share; it forks as little as it can (shell builtins read
/proc), because on a rack every extra process is paid once per tray.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mctl.facts import DriverUnavailable, FactsParseError, shell
from mctl.model.tray import TrayFacts, smi_timeout_for

if TYPE_CHECKING:
    from mctl.model.tray import XidEvent
    from mctl.transport import HostResult, SSHPool, SSHTarget


# imexsum: the IMEX config files' checksums ("absent": no /etc/nvidia-imex at all)
_LOCAL = r"""
imexsum() {
  [ -d /etc/nvidia-imex ] || { echo absent; return 0; }
  set -- /etc/nvidia-imex/*.cfg
  [ -e "$1" ] || return 0
  sha256sum "$@"
}
"""
_STEPS = (shell.sec("hostname"), shell.sec("os-release"), shell.sec("kernel"), shell.sec("nvidia-smi"),
          shell.sec("services"), shell.sec("imex-config", "imexsum"), shell.sec("xid"))


def facts_script(nonce: str, *, smi_timeout: float) -> str:
    """The command sent to a tray: the probe script under /bin/sh whatever the login shell is."""
    return shell.command(shell.script(nonce, _STEPS, local=_LOCAL, smi_timeout=smi_timeout))


@dataclass(frozen=True)
class Section:
    name: str
    text: str
    rc: int | None          # None: the end marker never came (output cut off)

    @property
    def complete(self) -> bool:
        return self.rc is not None


def split_sections(output: str, nonce: str) -> dict[str, Section]:
    """Cut the script's output at its marker lines. Text outside sections is ignored.

    Works with str.find over the whole text rather than line by line: a tray's
    output is ~50 kB and a rack's is a megabyte, so this is the parser's hot loop.
    """
    begin = f"::mctl-{nonce}::begin "
    end = f"::mctl-{nonce}::end "
    found: dict[str, Section] = {}

    def next_begin(pos: int) -> int:
        if pos == 0 and output.startswith(begin):
            return 0
        at = output.find("\n" + begin, max(pos - 1, 0))
        return -1 if at < 0 else at + 1

    b = next_begin(0)
    while b >= 0:
        eol = output.find("\n", b)
        if eol < 0:
            name = output[b + len(begin):].strip()
            found[name] = Section(name, "", None)
            break
        name = output[b + len(begin):eol].strip()
        body = eol + 1
        after = next_begin(body)
        stop = output.find("\n" + end + name + " ", body - 1)
        if stop < 0 or (after >= 0 and stop > after):
            found[name] = Section(name, output[body:(after - 1) if after >= 0 else len(output)], None)
            b = after
            continue
        line_end = output.find("\n", stop + 1)
        marker = output[stop + 1 + len(end) + len(name):line_end if line_end >= 0 else len(output)].strip()
        rc = int(marker[3:]) if marker.startswith("rc=") and marker[3:].lstrip("-").isdigit() else -1
        # sec() puts a newline before the end marker, so the text up to it is the exact output
        found[name] = Section(name, output[body:stop] if stop >= body else "", rc)
        b = next_begin(line_end + 1) if line_end >= 0 else -1
    return found


def parse_section(sections: dict[str, Section], name: str, parse, problems: list[str]):
    """parse(section) of a complete section; None, with a line in *problems*, when it is missing, cut off or
    unreadable (FactsParseError)."""
    sec = sections.get(name)
    if sec is None or not sec.complete:
        problems.append(f"{name}: output {'missing' if sec is None else 'cut off'}")
        return None
    try:
        return parse(sec)
    except FactsParseError as exc:
        problems.append(f"{name}: {exc.message}")
        return None


def xid_section(sections: dict[str, Section], problems: list[str]) -> "tuple[str | None, list[XidEvent]]":
    """The xid section (shell function `xid`): (the log it read, or None; its XID events, in log order)."""
    from mctl.facts.kernel_log import parse_xid_events

    sec = sections.get("xid")
    if sec is None or not sec.complete:
        problems.append("xid: output " + ("missing" if sec is None else "cut off"))
        return None, []
    first, _, rest = sec.text.partition("\n")
    source = first.removeprefix("source=") if first.startswith("source=") else None
    return source, parse_xid_events(rest if source else sec.text)


def smi_section(smi: Section | None, err: Section | None, smi_timeout: float):
    """The nvidia-smi section (`smi -q -x`) and its stderr -> (GpuReport | None, error text | None,
    nvidia-smi's stderr lines)."""
    from mctl.facts.nvidia_smi import parse_xml

    messages = tuple(l.strip() for l in (err.text if err else "").splitlines() if l.strip())
    if smi is None:
        return None, "nvidia-smi output missing from the probe (output cut off)", messages
    if not smi.complete:
        return None, "nvidia-smi output cut off before it ended", messages
    if smi.rc == 127:
        return None, "nvidia-smi is not installed (command not found)", messages
    if smi.rc in (124, 137):
        return None, f"nvidia-smi hung: no answer within {smi_timeout:g}s (driver wedged?)", messages
    try:
        report = parse_xml(smi.text)
    except DriverUnavailable as exc:
        return None, exc.message, messages
    except FactsParseError as exc:
        detail = f" (exit {smi.rc}{': ' + messages[-1] if messages else ''})" if smi.rc else ""
        return None, f"nvidia-smi output unreadable: {exc.message}{detail}", messages
    return report, None, messages


def tray_facts(result: "HostResult", nonce: str, *, smi_timeout: float) -> TrayFacts:
    """A tray's SSH result -> its facts. Never raises for bad output: problems are recorded."""
    from mctl.facts.kernel_log import observe_xid
    from mctl.facts.os_release import parse_kernel_release, parse_os_release
    from mctl.facts.services import IMEX_UNIT, SLURMD_UNIT, parse_imex_config_sums, parse_service_probe

    base = dict(host=result.host, address=result.address, elapsed=result.elapsed)
    if result.status.value in ("unreachable", "timeout", "host-key-mismatch"):
        return TrayFacts(reach=result.status.value, error=result.error,
                         host_key=result.host_key.to_dict() if result.host_key else None, **base)
    sections = split_sections(result.stdout, nonce)
    if not sections:
        why = result.summary() if not result.ok else "the probe printed no sections"
        return TrayFacts(reach="ok", gpu_error="no facts: " + why,
                         problems=(f"probe output unreadable ({why})",), **base)
    problems: list[str] = []

    def parsed(name: str, parse):
        return parse_section(sections, name, parse, problems)

    hostname = parsed("hostname", lambda s: s.text.strip() or None)
    os_rel = parsed("os-release", lambda s: parse_os_release(s.text))
    kernel = parsed("kernel", lambda s: parse_kernel_release(s.text))
    services = parsed("services", lambda s: parse_service_probe(s.text)) or {}
    imex_cfg = parsed("imex-config", lambda s: parse_imex_config_sums(s.text))
    xid_source, events = xid_section(sections, problems)
    xids = tuple(observe_xid(e, None) for e in events)
    gpus, gpu_error, gpu_messages = smi_section(sections.get("nvidia-smi"),
                                                split_sections(result.stderr, nonce).get("nvidia-smi"), smi_timeout)
    return TrayFacts(reach="ok", hostname=hostname, os=os_rel, kernel=kernel, gpus=gpus, gpu_error=gpu_error,
                     gpu_messages=gpu_messages,
                     imex_service=services.get(IMEX_UNIT), imex_config=imex_cfg, slurmd=services.get(SLURMD_UNIT),
                     xids=xids, xid_source=xid_source, problems=tuple(problems), **base)


async def collect_facts(pool: "SSHPool", targets: Sequence["SSHTarget"], *,
                        timeout: float | None = None, deadline: float | None = None) -> list[TrayFacts]:
    """Facts of every target, in target order, over the pool's (reused) connections.

    With *deadline* (seconds), each tray's whole work ends within it (SSHPool.run_one)."""
    command_timeout = pool.config.command_timeout if timeout is None else timeout
    if deadline is not None:
        command_timeout = min(command_timeout, deadline) if timeout is not None else deadline
    smi_timeout = smi_timeout_for(command_timeout)
    nonce = secrets.token_hex(8)
    script = facts_script(nonce, smi_timeout=smi_timeout)
    facts: dict[str, TrayFacts] = {}

    def parse(result: "HostResult") -> None:
        # parse each tray as it answers, while slower trays are still running
        facts[result.host] = tray_facts(result, nonce, smi_timeout=smi_timeout)

    await pool.run(targets, script, timeout=command_timeout if deadline is None else None, deadline=deadline,
                   on_result=parse)
    return [facts[t.name] for t in targets]
