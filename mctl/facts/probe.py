"""One probe of a compute tray: the script, with its sections chosen by purpose, and one parser.

Every reader of a tray builds its probe here and reads the answer back into
mctl.model.tray.TrayFacts with the same parser:

- INVENTORY (`mctl rack inventory`): hostname, OS, kernel, nvidia-smi, services, IMEX config
  checksums, XIDs;
- HEALTH (the watch's SSH sweep, and `mctl node check` when NVML does not load): clock, boot id,
  hostname, nvidia-smi with `nvlink --status` beside it, services, IMEX, XIDs, disk, memory;
- NODE_CHECK (`mctl node check` with NVML): HEALTH without the nvidia-smi sections;
- AUDIT: OS, kernel, slurmd -V, services (the host IMEX unit a Kubernetes site must not run), the files
  asked for, and nvidia-smi when no health sweep runs.

The script is one POSIX sh program built from mctl.facts.shell's function library:
each section's output (stdout and stderr alike) is framed between marker lines
carrying a per-run nonce, so a tray costs one command however many facts there
are and no file content can fake a section boundary. Parsing is pure: a missing,
truncated or unreadable section becomes a line in `problems`, never an
exception. Standard library only (the node check bundle carries it). Running
the probe over SSH is the caller's (mctl.rackinv.collect, mctl.health.engine,
mctl.audit.collect).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Sequence

from mctl.facts import DriverUnavailable, FactsParseError, shell
from mctl.facts import packages as dpkg
from mctl.facts.shell import RC_ABSENT
from mctl.model.tray import (AUDIT, GPU_TOOLS_MISSING, HEALTH, INVENTORY, NODE_CHECK, PURPOSES, Clock, DiskUsage, ImexObservation, Memory,
                             TrayFacts)

if TYPE_CHECKING:
    from mctl.model.tray import XidEvent
    from mctl.transport import HostResult


# Statuses whose host gave no output to read (HostStatus values)
UNREACHED = ("unreachable", "timeout", "host-key-mismatch")

IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
RC_NOT_INSTALLED = 127
# imex-query's exit when nvidia-imex-ctl -q was not asked because the -N answer just before it said the
# domain is UP: a domain is UP only when every node's daemon is READY, this tray's included.
RC_READY_BY_DOMAIN = 201

# The health probe's own functions (node check too): the clock with the uptime, nvidia-imex-ctl against the config
# (RC_ABSENT when IMEX is not set up here, or its node list is empty), MemTotal and MemAvailable read by the shell itself.
# IMEX is asked once per sweep when all is well: the domain status (-N -j) first, kept in $io, then the
# local daemon (-q) only when that answer is not an UP domain (see RC_READY_BY_DOMAIN).
_HEALTH_LOCAL = r"""
clock() { date '+%s.%N %Y-%m-%dT%H:%M:%S'; IFS=' ' read -r up _ < /proc/uptime && echo "$up"; }
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
    # the NVLink error counters (mctl.checks.nvlink_errors judges their rates over the watch's sweeps)
    shell.sec("nvlink-errors", "smi nvlink -e", needs=("smi",)),
)



# DCGM's health check (mctl.facts.dcgm), when the site asks for it (health.dcgm): 127 without dcgmi. The
# whole section runs under one deadline (@DCGM_TIMEOUT@, mctl.model.tray.dcgm_timeout_for), so a hung host
# engine is killed inside the tray's deadline. `dcgmi health -c` needs the health watches set; when it says
# they are not (a new host engine: watches do not survive its restart), the probe sets every system's once
# (`dcgmi health -s a`), says so on stderr, and checks again.
_DCGM_LOCAL = r"""
DS='o=$(dcgmi health -c -j); r=$?
case $o in *"watches not enabled"*)
  dcgmi health -s a >/dev/null || { printf "%s\n" "$o"; exit $r; }
  echo "@WATCHES_SET_NOTE@" >&2; o=$(dcgmi health -c -j); r=$? ;;
esac
printf "%s\n" "$o"; exit $r'
dcgm() { command -v dcgmi >/dev/null 2>&1 || return 127; to @DCGM_TIMEOUT@ /bin/sh -c "$DS"; }
"""

# The inventory's own function: the IMEX config files' checksums ("absent": no /etc/nvidia-imex at all)
_INVENTORY_LOCAL = r"""
imexsum() {
  [ -d /etc/nvidia-imex ] || { echo absent; return 0; }
  set -- /etc/nvidia-imex/*.cfg
  [ -e "$1" ] || return 0
  sha256sum "$@"
}
"""
_INVENTORY_STEPS = (shell.sec("hostname"), shell.sec("os-release"), shell.sec("kernel"), shell.sec("nvidia-smi"),
                    shell.sec("services"), shell.sec("imex-config", "imexsum"), shell.sec("xid"))

# The audit's own function: slurmd -V on a tray (127 when it is not installed)
_AUDIT_LOCAL = r"""
slurmdv() { command -v slurmd >/dev/null 2>&1 || return 127; to 10 slurmd -V; }
"""


def _check_purpose(purpose: str) -> None:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown probe purpose {purpose!r} (one of {', '.join(PURPOSES)})")


def probe_script(purpose: str, nonce: str, *, smi_timeout: float | None = None, disk_paths: Sequence[str] = ("/",),
                 imex_config: str = IMEX_CONFIG, files: Sequence[str] = (), packages: Sequence[str] = (),
                 dcgm_timeout: float | None = None) -> str:
    """The script body for *purpose*. nvidia-smi runs under *smi_timeout* seconds; AUDIT runs it only when
    *smi_timeout* is given (when no health sweep reads the GPUs), NODE_CHECK never (it read NVML).
    *packages* (AUDIT): Debian packages whose installed versions one dpkg-query reads (mctl.facts.packages).
    *dcgm_timeout* (HEALTH, NODE_CHECK): DCGM's health check runs, under that many seconds; None: not asked."""
    _check_purpose(purpose)
    if purpose == INVENTORY:
        if smi_timeout is None:
            raise ValueError("the inventory probe runs nvidia-smi: give smi_timeout")
        return shell.script(nonce, _INVENTORY_STEPS, local=_INVENTORY_LOCAL, smi_timeout=smi_timeout)
    if purpose == AUDIT:
        steps = [shell.sec("os-release"), shell.sec("kernel"), shell.sec("slurmd", "slurmdv"), shell.sec("services")]
        steps += [shell.sec(f"file{i}", "file " + shlex.quote(p), needs=("file",)) for i, p in enumerate(files)]
        if packages:
            steps.append(shell.sec("packages", dpkg.command(packages)))
        if smi_timeout is not None:
            steps.append(shell.sec("nvidia-smi"))
        return shell.script(nonce, steps, functions=("to",), local=_AUDIT_LOCAL + dpkg.LOCAL, smi_timeout=smi_timeout)
    gpus = purpose == HEALTH
    if gpus and smi_timeout is None:
        raise ValueError("the health probe runs nvidia-smi: give smi_timeout")
    paths = " ".join(shlex.quote(p) for p in disk_paths) or "/"
    steps = (shell.sec("clock", "clock"), shell.sec("boot-id"), shell.sec("hostname"), *(_GPU_STEPS if gpus else ()),
             shell.sec("services"), shell.sec("imex-domain", "imexn"), shell.sec("imex-query", "imexq"),
             shell.sec("xid"), shell.sec("disk", "df -P -k " + paths), shell.sec("memory", "mem"))
    values: dict[str, object] = {"IMEX_CONFIG": shlex.quote(imex_config), "RC_READY_BY_DOMAIN": RC_READY_BY_DOMAIN}
    local = _HEALTH_LOCAL
    if dcgm_timeout is not None:
        from mctl.facts.dcgm import WATCHES_SET_NOTE

        steps += (shell.sec("dcgm", "dcgm"),)
        local += _DCGM_LOCAL
        values.update(DCGM_TIMEOUT=shell.smi_seconds(dcgm_timeout), WATCHES_SET_NOTE=WATCHES_SET_NOTE)
    return shell.script(nonce, steps, functions=("to",), local=local, smi_timeout=smi_timeout, values=values)


def probe_command(purpose: str, nonce: str, **options) -> str:
    """The command sent to a tray: the probe script under /bin/sh whatever the login shell is."""
    return shell.command(probe_script(purpose, nonce, **options))


# --- parsing (pure) ------------------------------------------------------------------------------

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
        return None, GPU_TOOLS_MISSING, messages
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


def parse_clock(text: str) -> Clock:
    """`date '+%s.%N ...'` and /proc/uptime. The epoch has nanoseconds, so two sweeps within one second still
    differ (a rate over the window needs it); a `date` without %N (BusyBox prints "1764441600.N") counts whole
    seconds."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    try:
        epoch_s, local_s = lines[0].split()
        whole, dot, frac = epoch_s.partition(".")
        epoch = float(whole) + (float("0." + frac) if dot and frac.isdigit() else 0.0)
        return Clock(epoch, datetime.fromisoformat(local_s), float(lines[1]))
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




def last_line(text: str, fallback: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else fallback


def _nvlinks(nvl: Section | None, err: Section | None, smi_timeout: float):
    """The nvlink section (`nvidia-smi nvlink --status`) -> (links | None, error | None)."""
    from mctl.facts.nvidia_smi import parse_nvlink_status, with_stderr

    if nvl is None or not nvl.complete:
        return None, "nvlink --status output " + ("missing" if nvl is None else "cut off")
    if nvl.rc in (124, 137):
        return None, f"nvidia-smi nvlink --status hung (no answer within {smi_timeout:g}s)"
    try:
        links = parse_nvlink_status(nvl.text)
        return (with_stderr(links, err.text) if err is not None else links), None
    except FactsParseError as exc:
        return None, f"nvlink --status unreadable: {exc.message}"


def _nvlink_counters(sec: Section | None, err: Section | None, smi_timeout: float):
    """The nvlink-errors section (`nvidia-smi nvlink -e`) -> (counters | None, error | None)."""
    from mctl.facts.nvidia_smi import parse_nvlink_errors

    if sec is None or not sec.complete:
        return None, "nvlink -e output " + ("missing" if sec is None else "cut off")
    if sec.rc in (124, 137):
        return None, f"nvidia-smi nvlink -e hung (no answer within {smi_timeout:g}s)"
    if sec.rc not in (0, None):
        said = last_line((err.text if err else "") or sec.text, f"exit {sec.rc}")
        return None, f"nvidia-smi nvlink -e failed (exit {sec.rc}): {said[:160]}"
    try:
        return parse_nvlink_errors(sec.text), None
    except FactsParseError as exc:
        return None, f"nvlink -e unreadable: {exc.message}"


class LastParse:
    """Each host's last parse of a section, given again when the section's text is the same as last time.

    The health probe runs every sweep and most of what a tray prints does not change between two sweeps:
    `nvidia-smi nvlink -e` is ~2,200 lines a GB200 tray, all counters that stay where they are on a healthy
    tray, and its parse was the largest cost of a sweep's event loop (bench/README.md, "Issue 29.4"). The
    parsers are pure functions of (section text, return code, stderr, timeout), so the same inputs give the
    same answer: the host's last answer is kept with a fingerprint of its inputs (the text's hash and length,
    not the text: a tray's 84 kB are not held), and a match gives that same answer object (never mutated by
    its readers). One entry per (host, section); at most MAX_HOSTS hosts (the oldest forgotten first)."""

    MAX_HOSTS = 16384

    def __init__(self):
        self._last: dict[tuple[str, str], tuple[tuple, object]] = {}
        self.hits = self.misses = 0

    def parsed(self, host: str, name: str, sec: Section | None, err: Section | None, timeout: float, parse):
        if sec is None or not sec.complete:
            return parse(sec, err, timeout)
        said = err.text if err is not None else None
        key = (hash(sec.text), len(sec.text), sec.rc, said, timeout)
        slot = (host, name)
        last = self._last.get(slot)
        if last is not None and last[0] == key:
            self.hits += 1
            return last[1]
        self.misses += 1
        value = parse(sec, err, timeout)
        self._last.pop(slot, None)
        if len(self._last) >= self.MAX_HOSTS:
            del self._last[next(iter(self._last))]
        self._last[slot] = (key, value)
        return value


LAST = LastParse()


def _dcgm(sec: Section | None, err: Section | None, timeout: float, problems: list[str]):
    """The dcgm section (shell function `dcgm`) -> DcgmHealth; None (a problem noted) when it is missing or cut off."""
    from mctl.facts.dcgm import observe

    if sec is None or not sec.complete:
        problems.append("dcgm: output " + ("missing" if sec is None else "cut off"))
        return None
    return observe(sec.rc, sec.text, err.text if err is not None else "", timeout=timeout)


def _slurmd_version(sec: Section, err: Section | None) -> tuple[str | None, str | None]:
    """The slurmd section (`slurmd -V`) -> (version | None, why not | None)."""
    from mctl.facts.slurm_version import parse_version

    if sec.rc == 127:
        return None, "slurmd is not installed"
    try:
        return str(parse_version(sec.text)), None
    except ValueError:
        return None, "slurmd -V: " + last_line((err.text if err else "") or sec.text, f"exit {sec.rc}")


def _packages(sec: Section | None, err: Section | None, names: Sequence[str]):
    """The packages section (one dpkg-query) -> (name -> version | None, name -> why None, why none was read)."""
    if sec is None:
        return None, {}, "dpkg-query output missing or cut off"
    if sec.rc == RC_NOT_INSTALLED:
        return None, {}, "dpkg-query is not on the tray (not a Debian-based OS): mctl reads package versions with it"
    if sec.rc not in (0, 1):        # 1: some name unknown to dpkg, the others printed
        return None, {}, "dpkg-query: " + last_line((err.text if err else "") or sec.text, f"exit {sec.rc}")
    found, why = dpkg.parse(sec.text, names)
    return found, why, None


def parse_tray(purpose: str, host: str, stdout: str, stderr: str, nonce: str, *, address: str | None = None,
               smi_timeout: float = 30.0, disk_paths: Sequence[str] = ("/",), files: Sequence[str] = (),
               packages: Sequence[str] = (), elapsed: float = 0.0, gpu_facts: tuple | None = None, no_output: str | None = None,
               dcgm_timeout: float | None = None) -> TrayFacts:
    """A tray's probe output (the script built for *purpose*) -> its facts. Never raises for bad output:
    what could not be read is recorded in `problems` (and gpu_error, nvlink_error, slurmd_error, file_errors).

    gpu_facts: (GpuReport | None, error | None, messages, nvlinks | None, nvlink_error | None, source)
    when the caller read the GPUs another way (NVML, NODE_CHECK); the nvidia-smi sections are then absent.
    no_output: why there was no output, for the finding when the probe printed no section at all.
    """
    from mctl.facts.kernel_log import observe_xid
    from mctl.facts.os_release import parse_kernel_release, parse_os_release
    from mctl.facts.services import IMEX_UNIT, SLURMD_UNIT, parse_imex_config_sums, parse_service_probe

    _check_purpose(purpose)
    base = dict(host=host, address=address, elapsed=elapsed)
    sections = split_sections(stdout, nonce)
    errors = split_sections(stderr, nonce)
    if not sections:
        if purpose == AUDIT:
            return TrayFacts(error=f"the audit probe printed nothing ({no_output or 'no sections'})",
                             problems=("probe output unreadable",), **base)
        if no_output is not None:
            return TrayFacts(gpu_error="no facts: " + no_output, problems=(f"probe output unreadable ({no_output})",),
                             **base)
        return TrayFacts(gpu_error="no facts: the probe printed no sections", problems=("probe output unreadable",),
                         **base)
    problems: list[str] = []

    def parsed(name: str, parse):
        return parse_section(sections, name, parse, problems)

    facts: dict = {}
    if purpose in (HEALTH, NODE_CHECK):
        facts["clock"] = parsed("clock", lambda s: parse_clock(s.text))
        facts["boot_id"] = parse_boot_id(sections.get("boot-id"), problems)
    if purpose != AUDIT:
        facts["hostname"] = parsed("hostname", lambda s: s.text.strip() or None)
    if purpose in (INVENTORY, AUDIT):
        facts["os"] = parsed("os-release", lambda s: parse_os_release(s.text))
        facts["kernel"] = parsed("kernel", lambda s: parse_kernel_release(s.text))
    services = parsed("services", lambda s: parse_service_probe(s.text)) or {}
    facts["slurmd"] = services.get(SLURMD_UNIT)
    facts["imex_service"] = services.get(IMEX_UNIT)
    if purpose == INVENTORY:
        facts["imex_config"] = parsed("imex-config", lambda s: parse_imex_config_sums(s.text))
    if purpose in (HEALTH, NODE_CHECK):
        facts["memory"] = parsed("memory", lambda s: parse_meminfo(s.text))
        disks = parsed("disk", lambda s: parse_df(s.text)) or ()
        if disks:
            # df prints one line per path it could read, in order; a path it could not stat is left out.
            named = list(disk_paths) if len(disks) == len(disk_paths) else [d.mount for d in disks]
            disks = tuple(DiskUsage(p, d.mount, d.size_kib, d.used_kib, d.avail_kib) for p, d in zip(named, disks))
        facts["disks"] = disks
    if purpose != AUDIT:
        xid_source, events = xid_section(sections, problems)
        facts["xids"] = tuple(observe_xid(e, facts.get("clock")) for e in events)
        facts["xid_source"] = xid_source
    if purpose in (HEALTH, NODE_CHECK):
        facts["imex"] = imex_observation(sections.get("imex-query"), sections.get("imex-domain"),
                                         errors.get("imex-query"))
        if dcgm_timeout is not None:
            facts["dcgm"] = _dcgm(sections.get("dcgm"), errors.get("dcgm"), dcgm_timeout, problems)
    if purpose == AUDIT:
        sec = _complete(sections, "slurmd", problems)
        if sec is not None:
            facts["slurmd_version"], facts["slurmd_error"] = _slurmd_version(sec, errors.get("slurmd"))
        held: dict[str, str | None] = {}
        file_errors: dict[str, str] = {}
        for i, path in enumerate(files):
            sec = _complete(sections, f"file{i}", problems)
            if sec is None:
                file_errors[path] = "probe output missing or cut off"
            elif sec.rc == RC_ABSENT:
                held[path] = None
            elif sec.rc != 0:
                said = errors.get(f"file{i}")
                file_errors[path] = last_line(said.text if said else "", f"cat exited {sec.rc}")
            else:
                held[path] = sec.text
        facts["files"], facts["file_errors"] = held, file_errors
        if packages:
            facts["packages"], facts["package_notes"], facts["packages_error"] = _packages(
                _complete(sections, "packages", problems), errors.get("packages"), packages)
    if gpu_facts is not None:
        gpus, gpu_error, gpu_messages, nvlinks, nvlink_error, source = gpu_facts
        facts.update(gpus=gpus, gpu_error=gpu_error, gpu_messages=tuple(gpu_messages), nvlinks=nvlinks,
                     nvlink_error=nvlink_error, gpu_source=source)
    elif purpose != NODE_CHECK and (purpose != AUDIT or "nvidia-smi" in sections):
        gpus, gpu_error, gpu_messages = smi_section(sections.get("nvidia-smi"), errors.get("nvidia-smi"), smi_timeout)
        facts.update(gpus=gpus, gpu_error=gpu_error, gpu_messages=tuple(gpu_messages))
        if purpose == HEALTH:
            facts["gpu_source"] = "nvidia-smi"
            if gpus is not None:
                facts["nvlinks"], facts["nvlink_error"] = _nvlinks(sections.get("nvlink"), errors.get("nvlink"),
                                                                   smi_timeout)
                facts["nvlink_counters"], facts["nvlink_counters_error"] = LAST.parsed(
                    host, "nvlink-errors", sections.get("nvlink-errors"), errors.get("nvlink-errors"), smi_timeout,
                    _nvlink_counters)
    return TrayFacts(problems=tuple(problems), **facts, **base)


def _complete(sections: dict[str, Section], name: str, problems: list[str]) -> Section | None:
    sec = sections.get(name)
    if sec is None or not sec.complete:
        problems.append(f"{name}: output {'missing' if sec is None else 'cut off'}")
        return None
    return sec


def from_result(purpose: str, result: "HostResult", nonce: str, **options) -> TrayFacts:
    """A tray's SSH result -> its facts (parse_tray's *options*). A tray that gave no output to read
    (unreachable, hung, host key refused) has reach set and no facts."""
    if result.status.value in UNREACHED:
        error = result.error
        if purpose == AUDIT:
            error = result.error or result.summary()
        return TrayFacts(host=result.host, address=result.address, reach=result.status.value, error=error,
                         host_key=result.host_key, elapsed=result.elapsed)
    no_output = None
    if purpose == AUDIT:
        no_output = result.summary()
    elif purpose == INVENTORY:
        no_output = result.summary() if not result.ok else "the probe printed no sections"
    return parse_tray(purpose, result.host, result.stdout, result.stderr, nonce, address=result.address,
                      elapsed=result.elapsed, no_output=no_output, **options)
