"""IMEX and slurmd service state, and the IMEX config checksum, from a tray's probe output.

When systemd is PID 1 the probe prints `systemctl show -p ...` blocks (KEY=value
lines, one block per unit, blank line between). Without a systemd PID 1
(containers; hosts where a systemctl stand-in replays unit files) there is no
service manager whose word counts, so the probe prints raw evidence instead:
the unit file it found, whether a `.wants/` link enables it, and which
processes run under the unit's program name. Both become the same
ServiceState, with `source` saying which kind of evidence it rests on.
"""

from __future__ import annotations

import re

from mctl.facts import FactsParseError
from mctl.model.tray import ImexConfig, ServiceState

IMEX_UNIT = "nvidia-imex.service"
SLURMD_UNIT = "slurmd.service"
UNITS = (IMEX_UNIT, SLURMD_UNIT)
# The process name each unit runs (comm, as the kernel truncates it to 15 chars).
UNIT_PROCESS = {IMEX_UNIT: "nvidia-imex", SLURMD_UNIT: "slurmd"}

_SHA_LINE = re.compile(r"^(?P<sum>[0-9a-f]{64}) [ *](?P<path>\S.*)$")
_COMM_LINE = re.compile(r"^/proc/(?P<pid>\d+)/comm:(?P<comm>.*)$")
_UNIT_LINE = re.compile(r"^unit=(?P<unit>\S+) file=(?P<file>\S*) enabled=(?P<enabled>yes|no)$")


def _systemd_blocks(lines: list[str]) -> dict[str, ServiceState]:
    out: dict[str, ServiceState] = {}
    block: dict[str, str] = {}

    def flush() -> None:
        if not block:
            return
        unit = block.get("Id")
        if not unit:
            raise FactsParseError("systemctl show printed a block without Id=")
        load = block.get("LoadState")
        out[unit] = ServiceState(unit=unit, installed=load not in (None, "not-found"),
                                 active=block.get("ActiveState"), sub=block.get("SubState"),
                                 enabled=block.get("UnitFileState") or None, source="systemd",
                                 pids=tuple(int(p) for p in [block.get("MainPID", "0")] if p.isdigit() and p != "0"))
        block.clear()

    for line in lines:
        if not line.strip():
            flush()
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise FactsParseError(f"systemctl show printed {line[:60]!r}, expected KEY=value")
        block[key.strip()] = value.strip()
    flush()
    return out


def _process_table(lines: list[str]) -> dict[str, ServiceState]:
    units: dict[str, tuple[str, str]] = {}
    pids: dict[str, list[int]] = {}
    for line in lines:
        if not line.strip():
            continue
        unit = _UNIT_LINE.match(line.strip())
        if unit:
            units[unit["unit"]] = (unit["file"], unit["enabled"])
            continue
        comm = _COMM_LINE.match(line.strip())
        if comm:
            pids.setdefault(comm["comm"].strip(), []).append(int(comm["pid"]))
            continue
        raise FactsParseError(f"service probe printed {line[:60]!r}")
    out = {}
    for unit, (file, enabled) in units.items():
        running = tuple(sorted(pids.get(UNIT_PROCESS.get(unit, unit.removesuffix(".service")), [])))
        out[unit] = ServiceState(unit=unit, installed=bool(file), active="active" if running else "inactive",
                                 sub="running" if running else "dead",
                                 enabled=("enabled" if enabled == "yes" else "disabled") if file else None,
                                 source="process-table", pids=running)
    return out


def parse_service_probe(text: str) -> dict[str, ServiceState]:
    """The probe's output -> state per unit. The first line names the kind of evidence."""
    lines = text.splitlines()
    if not lines:
        raise FactsParseError("the service probe printed nothing")
    head, rest = lines[0].strip(), lines[1:]
    if head == "source=systemd":
        states = _systemd_blocks(rest)
    elif head == "source=process-table":
        states = _process_table(rest)
    else:
        raise FactsParseError(f"the service probe started with {head[:60]!r}")
    return states


def parse_imex_config_sums(text: str) -> ImexConfig:
    """`sha256sum /etc/nvidia-imex/*.cfg` output, or the single word `absent`."""
    lines = [l for l in text.splitlines() if l.strip()]
    if lines == ["absent"]:
        return ImexConfig(present=False)
    files = {}
    for line in lines:
        match = _SHA_LINE.match(line.strip())
        if not match:
            raise FactsParseError(f"sha256sum printed {line[:80]!r}")
        files[match["path"]] = match["sum"]
    return ImexConfig(present=True, files=files)
