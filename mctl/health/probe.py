"""The health probe: one shell script per tray and sweep, and its output read back into facts.

Standard library only: the watch sends the script over SSH, `mctl node check`
runs the very same script on the tray with /bin/sh, so both read a tray through
one parser. The script is built from mctl.facts.shell's function library:
sections are framed with a per-run nonce, every command that can hang runs
under `timeout`, and builtins read /proc so a sweep forks as little as it can
on every tray.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime
from typing import Sequence

from mctl.facts import FactsParseError, shell
from mctl.facts.collect import Section, parse_section, smi_section, split_sections, xid_section
from mctl.facts.shell import RC_ABSENT
from mctl.health.facts import Clock, DiskUsage, ImexObservation, Memory, TrayHealthFacts, observe_xid

IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
RC_NOT_INSTALLED = 127
# imex-query's exit when nvidia-imex-ctl -q was not asked because the -N answer just before it said the
# domain is UP: a domain is UP only when every node's daemon is READY, this tray's included.
RC_READY_BY_DOMAIN = 201

# The health probe's own functions: the clock with the uptime, nvidia-imex-ctl against the config
# (RC_ABSENT when IMEX is not set up here, or its node list is empty), MemTotal and MemAvailable read by the shell itself.
# IMEX is asked once per sweep when all is well: the domain status (-N -j) first, kept in $io, then the
# local daemon (-q) only when that answer is not an UP domain (see RC_READY_BY_DOMAIN).
_LOCAL = r"""
clock() { date '+%s %Y-%m-%dT%H:%M:%S'; IFS=' ' read -r up _ < /proc/uptime && echo "$up"; }
imex() {
  [ -r @IMEX_CONFIG@ ] || return @RC_ABSENT@
  # an empty node list is no domain wanted here (IMEX per-job scope between jobs): not checked
  nf=; while IFS='=' read -r ik iv; do [ "$ik" = IMEX_NODE_CONFIG_FILE ] && nf=$iv; done < @IMEX_CONFIG@
  [ -z "$nf" ] || [ ! -e "$nf" ] || [ -s "$nf" ] || return @RC_ABSENT@
  command -v nvidia-imex-ctl >/dev/null 2>&1 || return 127
  to 5 nvidia-imex-ctl -c @IMEX_CONFIG@ "$@"
}
imexn() { io=$(imex -N -j); ir=$?; [ -z "$io" ] || printf '%s\n' "$io"; return $ir; }
imexq() {
  if [ "$ir" = 0 ]; then case $io in *'"status":"UP"'*|*'"status": "UP"'*) return @RC_READY_BY_DOMAIN@;; esac; fi
  imex -q
}
mem() { while IFS=': ' read -r k v _; do case $k in MemTotal|MemAvailable) echo "$k $v";; esac; done < /proc/meminfo; }
"""

# `nvlink --status` runs beside `-q -x` (a tray has cores to spare; a sweep waits for its slowest
# tray), into three files the shell creates itself (noclobber: O_EXCL, so nothing planted under the
# name is followed) and the nvlink section prints with builtins and removes: on a rack every fork is
# paid once per tray and sweep (mktemp, two cats and a directory cost three more). Sequential when
# the files cannot be made.
_GPU_STEPS = (
    shell.raw(r"""
nvf=${TMPDIR:-/tmp}/.mctl-nvlink.$$
set -C
{ : > "$nvf.o" && : > "$nvf.e" && : > "$nvf.rc"; } 2>/dev/null || nvf=
set +C
if [ -n "$nvf" ]; then { smi nvlink --status > "$nvf.o" 2> "$nvf.e"; echo $? > "$nvf.rc"; } & fi
""", needs=("smi",)),
    shell.sec("nvidia-smi"),
    shell.raw(r"""
wait
put() { while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < "$1"; }
nvl() {
  [ -n "$nvf" ] || { smi nvlink --status; return; }
  put "$nvf.o"; put "$nvf.e" >&2; IFS= read -r r < "$nvf.rc" || r=1; rm -f "$nvf.o" "$nvf.e" "$nvf.rc"
  return "$r"
}
"""),
    shell.sec("nvlink", "nvl"),
)


def probe_script(nonce: str, *, smi_timeout: float, disk_paths: Sequence[str] = ("/",), gpus: bool = True,
                 imex_config: str = IMEX_CONFIG) -> str:
    """The script body. gpus=False leaves nvidia-smi out (the node check read NVML instead)."""
    paths = " ".join(shlex.quote(p) for p in disk_paths) or "/"
    steps = (shell.sec("clock", "clock"), shell.sec("boot-id"), shell.sec("hostname"), *(_GPU_STEPS if gpus else ()),
             shell.sec("services"), shell.sec("imex-domain", "imexn"), shell.sec("imex-query", "imexq"),
             shell.sec("xid"), shell.sec("disk", "df -P -k " + paths), shell.sec("memory", "mem"))
    return shell.script(nonce, steps, functions=("to",), local=_LOCAL, smi_timeout=smi_timeout,
                        values={"IMEX_CONFIG": shlex.quote(imex_config), "RC_READY_BY_DOMAIN": RC_READY_BY_DOMAIN})


def ssh_command(body: str) -> str:
    """The command sent to a tray: the script under /bin/sh whatever the login shell is."""
    return shell.command(body)


# --- parsing (pure) ------------------------------------------------------------------------------

def parse_clock(text: str) -> Clock:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    try:
        epoch_s, local_s = lines[0].split()
        return Clock(float(epoch_s), datetime.fromisoformat(local_s), float(lines[1]))
    except (IndexError, ValueError):
        raise FactsParseError(f"clock: unreadable {text[:60]!r}") from None


_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_boot_id(section: Section | None, problems: list[str]) -> str | None:
    """/proc/sys/kernel/random/boot_id (a UUID, new at every boot); None when the probe did not print it
    (an older probe, or a kernel without it: nothing to judge, no problem)."""
    if section is None or not section.complete or section.rc != 0:
        return None
    text = section.text.strip().lower()
    if not _BOOT_ID.fullmatch(text):
        problems.append(f"boot id unreadable: {text[:60]!r}")
        return None
    return text


def parse_df(text: str) -> tuple[DiskUsage, ...]:
    """`df -P -k PATH...`: one line per path given, in order (a header first)."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 6:
            continue
        try:
            size, used, avail = int(parts[1]), int(parts[2]), int(parts[3])
        except ValueError:
            raise FactsParseError(f"df: unreadable line {line[:80]!r}") from None
        out.append(DiskUsage(path="", mount=" ".join(parts[5:]), size_kib=size, used_kib=used, avail_kib=avail))
    return tuple(out)


def parse_meminfo(text: str) -> Memory:
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    if "MemTotal" not in values or "MemAvailable" not in values:
        raise FactsParseError("memory: MemTotal or MemAvailable missing from /proc/meminfo")
    return Memory(values["MemTotal"], values["MemAvailable"])


def imex_observation(query: Section | None, domain: Section | None,
                     query_err: Section | None = None) -> ImexObservation | None:
    """IMEX facts from the two imex sections; None when the probe did not ask."""
    from mctl.facts.imex import parse_domain_json, parse_query

    if query is None or not query.complete:
        return None
    if query.rc == RC_ABSENT:
        return ImexObservation(configured=False)
    if query.rc == RC_NOT_INSTALLED:
        return ImexObservation(configured=True, error="nvidia-imex-ctl is not installed")
    errors: list[str] = []
    daemon = None
    if query.rc == RC_READY_BY_DOMAIN:
        daemon = "READY"          # checked against the domain's parsed state below
    elif query.rc in (124, 137):
        errors.append("nvidia-imex-ctl -q did not answer within 5s")
    elif query.rc != 0:
        text = query.text.strip() or (query_err.text.strip() if query_err is not None else "")
        said = (text.splitlines() or [f"exit {query.rc}"])[-1]
        errors.append(f"nvidia-imex-ctl -q: {said[:160]}")
    else:
        try:
            daemon = parse_query(query.text)
        except FactsParseError as exc:
            errors.append(exc.message)
    state = None
    problems: list[str] = []
    if domain is not None and domain.complete and domain.rc == 0:
        try:
            status = parse_domain_json(domain.text)
        except FactsParseError as exc:
            errors.append(exc.message)
        else:
            state = status.state
            problems = _link_problems(status)
    elif daemon == "READY" and domain is not None and domain.complete:
        errors.append(f"nvidia-imex-ctl -N -j failed (exit {domain.rc})")
    if query.rc == RC_READY_BY_DOMAIN and state != "UP":
        daemon = None
        errors.append("nvidia-imex-ctl -N -j: the answer looked UP to the probe but reads as "
                      f"{state or 'unreadable'}")
    return ImexObservation(True, daemon, state, tuple(problems), "; ".join(errors) or None)


def _link_problems(status) -> list[str]:
    from mctl.model.fabric import LINK_WORDS

    names = {n.index: (n.hostname or n.address) for n in status.nodes}
    out = []
    for node in status.nodes:
        if node.state != "READY":
            out.append(f"node {names[node.index]} is {node.state}")
    seen = set()
    for node in status.nodes:
        for j, letter in enumerate(node.links):
            if letter == "C" or j == node.index or j not in names or letter == "I":
                continue
            pair = tuple(sorted((node.index, j))) + (letter,)
            if pair in seen:
                continue
            seen.add(pair)
            out.append(f"{names[node.index]} to {names[j]}: {LINK_WORDS.get(letter, letter).lower().replace('_', ' ')}")
    return out


def parse_probe(host: str, stdout: str, stderr: str, nonce: str, *, address: str | None = None,
                smi_timeout: float = 30.0, disk_paths: Sequence[str] = ("/",), elapsed: float = 0.0,
                gpu_facts: tuple | None = None) -> TrayHealthFacts:
    """A tray's probe output -> facts. Never raises for bad output: problems are recorded.

    gpu_facts: (GpuReport | None, error | None, messages, nvlinks | None, nvlink_error | None, source)
    when the caller read the GPUs another way (NVML); the nvidia-smi sections are then absent.
    """
    from mctl.facts.nvidia_smi import parse_nvlink_status, with_stderr
    from mctl.facts.services import SLURMD_UNIT, parse_service_probe

    sections = split_sections(stdout, nonce)
    errors = split_sections(stderr, nonce)
    if not sections:
        return TrayHealthFacts(host=host, address=address, gpu_error="no facts: the probe printed no sections",
                               problems=("probe output unreadable",), elapsed=elapsed)
    problems: list[str] = []

    def parsed(name: str, parse):
        return parse_section(sections, name, parse, problems)

    clock = parsed("clock", lambda s: parse_clock(s.text))
    boot_id = parse_boot_id(sections.get("boot-id"), problems)
    hostname = parsed("hostname", lambda s: s.text.strip() or None)
    services = parsed("services", lambda s: parse_service_probe(s.text)) or {}
    memory = parsed("memory", lambda s: parse_meminfo(s.text))
    disks = parsed("disk", lambda s: parse_df(s.text)) or ()
    if disks:
        # df prints one line per path it could read, in order; a path it could not stat is left out.
        named = list(disk_paths) if len(disks) == len(disk_paths) else [d.mount for d in disks]
        disks = tuple(DiskUsage(p, d.mount, d.size_kib, d.used_kib, d.avail_kib) for p, d in zip(named, disks))
    xid_source, events = xid_section(sections, problems)
    xids = tuple(observe_xid(e, clock) for e in events)
    imex = imex_observation(sections.get("imex-query"), sections.get("imex-domain"), errors.get("imex-query"))

    if gpu_facts is not None:
        gpus, gpu_error, gpu_messages, nvlinks, nvlink_error, source = gpu_facts
    else:
        source = "nvidia-smi"
        gpus, gpu_error, gpu_messages = smi_section(sections.get("nvidia-smi"), errors.get("nvidia-smi"), smi_timeout)
        nvlinks, nvlink_error = None, None
        nvl = sections.get("nvlink")
        if gpus is not None:
            if nvl is None or not nvl.complete:
                nvlink_error = "nvlink --status output " + ("missing" if nvl is None else "cut off")
            elif nvl.rc in (124, 137):
                nvlink_error = f"nvidia-smi nvlink --status hung (no answer within {smi_timeout:g}s)"
            else:
                try:
                    nvlinks = parse_nvlink_status(nvl.text)
                    if errors.get("nvlink") is not None:
                        nvlinks = with_stderr(nvlinks, errors["nvlink"].text)
                except FactsParseError as exc:
                    nvlink_error = f"nvlink --status unreadable: {exc.message}"
    return TrayHealthFacts(host=host, address=address, hostname=hostname, clock=clock, gpus=gpus, gpu_error=gpu_error,
                           gpu_messages=tuple(gpu_messages), gpu_source=source, nvlinks=nvlinks,
                           nvlink_error=nvlink_error, xids=xids, xid_source=xid_source, imex=imex,
                           slurmd=services.get(SLURMD_UNIT), disks=disks, memory=memory, problems=tuple(problems),
                           elapsed=elapsed, boot_id=boot_id)


def unreached(host: str, address: str | None, reach: str, error: str | None, elapsed: float = 0.0) -> TrayHealthFacts:
    return TrayHealthFacts(host=host, address=address, reach=reach, error=error, elapsed=elapsed)
