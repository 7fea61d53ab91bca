"""The POSIX sh that mctl runs on a host to read it: one function library and one builder.

The tray probe (mctl.facts.probe: inventory, health, node check and audit
purposes) and the audit's controller probe (mctl.audit.collect) are all built here, so they share one framing and one copy
of each shell function:

- every section runs as `sec NAME COMMAND...`, which prints the command's
  output, stdout and stderr alike, between marker lines carrying the per-run
  nonce (mctl.facts.probe.split_sections cuts them apart again), so no file
  content can fake a section boundary;
- a script takes from FUNCTIONS only what its sections call (and what those
  call in turn); a probe's own small functions are passed in beside them;
- builtins read /proc wherever they can, because on a rack every fork is paid
  once per tray; every command that can hang runs under `timeout` (`to`).

Standard library only: the node check bundle carries this module to the trays.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

XID_TAIL = 200          # newest XID lines kept per tray
XID_BYTES = 4 << 20     # the probe reads at most the last 4 MiB of kern.log: an XID storm costs bounded time
RC_ABSENT = 200         # `file` (and a probe's own functions): the subject is not on this host

_FRAME = r"""M='::mctl-@NONCE@::'
sec() {
  n=$1; shift
  printf '%sbegin %s\n' "$M" "$n"; printf '%sbegin %s\n' "$M" "$n" >&2
  "$@"; rc=$?
  printf '\n%send %s rc=%d\n' "$M" "$n" "$rc"; printf '\n%send %s rc=%d\n' "$M" "$n" "$rc" >&2
}"""

# The library: name -> definition, in the order a script defines them. @NAME@ placeholders are filled by
# script(); NEEDS names what a function calls from the library itself.
FUNCTIONS: dict[str, str] = {
    # the first line of a file, read by the shell itself
    "line": r"""line() { IFS= read -r v < "$1" && printf '%s\n' "$v"; }""",
    # a file as it is; RC_ABSENT when it is not there (as opposed to unreadable)
    "file": r"""file() { [ -e "$1" ] || return @RC_ABSENT@; cat "$1"; }""",
    # `to SECONDS COMMAND...`: under timeout(1) where the host has it, else plainly
    "to": r"""T=; command -v timeout >/dev/null 2>&1 && T="timeout -k 2"
to() { if [ -n "$T" ]; then $T "$@"; else shift; "$@"; fi; }""",
    # `smi ARGS...`: nvidia-smi under the run's timeout; 127 with the shell's words when it is not installed
    "smi": r"""smi() {
  command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi: command not found' >&2; return 127; }
  to @SMI_TIMEOUT@ nvidia-smi "$@"
}""",
    # nvidia-imex's and slurmd's units: systemctl where systemd runs, else unit files and the process table
    "svc": r"""svc() {
  pid1=; IFS= read -r pid1 < /proc/1/comm 2>/dev/null
  if [ "$pid1" = systemd ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    echo source=systemd
    systemctl show -p Id,LoadState,ActiveState,SubState,UnitFileState,MainPID nvidia-imex.service slurmd.service
    return 0
  fi
  echo source=process-table
  for u in nvidia-imex slurmd; do
    f=
    for d in /etc/systemd/system /run/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system /lib/systemd/system; do
      if [ -e "$d/$u.service" ]; then f="$d/$u.service"; break; fi
    done
    en=no
    for w in /etc/systemd/system/*.wants/"$u".service; do [ -e "$w" ] && en=yes; done
    echo "unit=$u.service file=$f enabled=$en"
  done
  grep -Hx -e nvidia-imex -e slurmd /proc/[0-9]*/comm 2>/dev/null
  return 0
}""",
    # the newest XID lines of the kernel log, after a source= line naming where they came from (an empty
    # log, just rotated, needs no grep and tail); with them the driver's "fallen off the bus" lines, which
    # recent drivers can log with no Xid at all (the first of the two-line form starts "NVRM: The NVIDIA GPU").
    # Only the log's last XID_BYTES are read (an XID storm grows it by megabytes), without the first, cut
    # line when the log is longer
    "xid": r"""xid() {
  if [ -r /var/log/kern.log ]; then echo source=/var/log/kern.log; [ -s /var/log/kern.log ] || return 0
    tail -c @XID_BYTES@ /var/log/kern.log | { if [ "$(wc -c < /var/log/kern.log)" -gt @XID_BYTES@ ]; then sed 1d; \
      else cat; fi; } | grep -a -e 'NVRM: Xid' -e 'fallen off the bus' -e 'NVRM: The NVIDIA GPU' | tail -n @XID_TAIL@
  else echo source=dmesg
    dmesg 2>/dev/null | grep -a -e 'NVRM: Xid' -e 'fallen off the bus' -e 'NVRM: The NVIDIA GPU' | tail -n @XID_TAIL@; fi
  return 0
}""",
}
NEEDS: dict[str, tuple[str, ...]] = {"smi": ("to",)}

# Sections more than one probe runs, the same way: name -> (command, the library functions it calls).
STANDARD: dict[str, tuple[str, tuple[str, ...]]] = {
    "hostname": ("line /proc/sys/kernel/hostname", ("line",)),
    "os-release": ("cat /etc/os-release", ()),
    "kernel": ("line /proc/sys/kernel/osrelease", ("line",)),
    "nvidia-smi": ("smi -q -x", ("smi",)),
    "services": ("svc", ("svc",)),
    "xid": ("xid", ("xid",)),
    # the kernel's id of this boot (a new one at every boot; a reboot between two sweeps changes it)
    "boot-id": ("line /proc/sys/kernel/random/boot_id", ("line",)),
}

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Step:
    """A piece of the script's run, in order: shell text, the section it frames (if any) and the
    library functions it calls."""

    text: str
    section: str | None = None
    needs: tuple[str, ...] = ()


def sec(name: str, command: str | None = None, *, needs: Sequence[str] = ()) -> Step:
    """The section NAME: its STANDARD command unless *command* (shell text, quoted by the caller) is given.

    *needs*: the library functions *command* calls.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"section name {name!r}: letters, digits, '_', '.' and '-' only")
    if command is None:
        command, needs = STANDARD[name]
    return Step(f"sec {name} {command}", name, tuple(needs))


def raw(text: str, *, needs: Sequence[str] = ()) -> Step:
    """Shell run as it is between sections (a job started beside one, say)."""
    return Step(text.strip("\n"), None, tuple(needs))


def sections(steps: Sequence[Step]) -> list[str]:
    """The section names the steps print, in order."""
    return [s.section for s in steps if s.section is not None]


def _closure(names: Sequence[str]) -> list[str]:
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in FUNCTIONS:
            raise ValueError(f"no shell function {name!r} in the library")
        if name not in wanted:
            wanted.add(name)
            todo.extend(NEEDS.get(name, ()))
    return [n for n in FUNCTIONS if n in wanted]


def smi_seconds(timeout: float) -> str:
    """nvidia-smi's timeout as the script writes it (1 s at the least)."""
    return f"{max(1.0, timeout):g}"


def script(nonce: str, steps: Sequence[Step], *, functions: Sequence[str] = (), local: str = "",
           smi_timeout: float | None = None, values: Mapping[str, object] | None = None) -> str:
    """The script body: the framing, the library functions that the steps and *local* call (*functions*),
    the probe's own *local* definitions, then the steps in order.

    @NAME@ placeholders in the framing, the library and *local* are filled from NONCE, XID_TAIL,
    RC_ABSENT, SMI_TIMEOUT (*smi_timeout*, see smi_seconds) and *values*; one left unfilled is a
    ValueError. Steps are taken as they are, so nothing a caller puts in them (a path) is ever read as a
    placeholder.
    """
    fill: dict[str, str] = {"NONCE": nonce, "XID_TAIL": str(XID_TAIL), "RC_ABSENT": str(RC_ABSENT),
                            "XID_BYTES": str(XID_BYTES)}
    if smi_timeout is not None:
        fill["SMI_TIMEOUT"] = smi_seconds(smi_timeout)
    fill.update((k, str(v)) for k, v in (values or {}).items())

    def put(match: re.Match) -> str:
        if match.group(1) not in fill:
            raise ValueError(f"shell script: no value for @{match.group(1)}@")
        return fill[match.group(1)]

    used = _closure([*functions, *(n for s in steps for n in s.needs)])
    defs = [_FRAME, *(FUNCTIONS[n] for n in used)] + ([local.strip("\n")] if local.strip() else [])
    head = _PLACEHOLDER.sub(put, "\n".join(defs))
    return "\n".join([head, *(s.text for s in steps)]) + "\n"


def command(body: str) -> str:
    """The command sent over SSH: the script under /bin/sh whatever the login shell is."""
    return "exec /bin/sh -c " + shlex.quote(body)
