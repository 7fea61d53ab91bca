"""Parsers for nvidia-smi output: `-q -x`, `--query-gpu ... --format=csv`, `nvlink --status`, `-L`.

Real output first: the XML reader follows the element tree of a real GB200 capture
(tests/fixtures/gb200-nvidia-smi-q-x.xml). Anything the driver reports as N/A,
Not Supported or an error placeholder becomes None; anything that is not what
nvidia-smi prints raises FactsParseError so the caller can record a finding.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from typing import Iterable, Sequence

from mctl.facts import DriverUnavailable, FactsParseError
from mctl.model.gpu import (
    CLOCK_REASONS,
    COUNTER_MAX,
    ClockEvents,
    EccCounts,
    FabricHealth,
    Gpu,
    GpuFabric,
    GpuNvLinkCounters,
    GpuNvLinks,
    GpuReport,
    MemoryRepair,
    NvLink,
    PlatformInfo,
    RemappedRows,
    cluster_uuid_or_none,
)

DRIVER_FAILURE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
NO_DEVICES = "No devices were found"

# What the driver prints in place of a value it cannot give; all of them mean "no value".
_PLACEHOLDERS = frozenset({
    "", "n/a", "not supported", "unknown error", "unknown", "insufficient permissions",
    "requested functionality has been deprecated", "gpu is lost", "gpu requires reset",
    "not found", "no data",
})
_NUMBER = re.compile(r"^(?P<num>[-+]?\d+(?:\.\d+)?)(?:\s*(?P<unit>[A-Za-z%/]+(?:/s)?))?$")
_TRUE = frozenset({"true", "yes", "enabled", "active"})
_FALSE = frozenset({"false", "no", "disabled", "not active"})
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_FOREIGN_ROOT = re.compile(r"^(?:<\?xml[^>]*>\s*)?<(?:!doctype\s+html|html)\b", re.I)
_FIELD_ERROR = re.compile(r'Field "(?P<field>[^"]*)" is not a valid field to query\.')


def _check_driver(text: str, what: str) -> None:
    if DRIVER_FAILURE in text:
        raise DriverUnavailable(f"{what}: nvidia-smi could not communicate with the NVIDIA driver",
                                hint="check that the nvidia kernel module is loaded (lsmod | grep nvidia) "
                                     "and matches the installed driver")


def _refuse_binary(text: str, what: str) -> None:
    """NUL bytes or other control characters: not text any nvidia-smi mode prints."""
    bad = _CONTROL.search(text)
    if bad is not None:
        raise FactsParseError(f"{what} output is binary data (control byte {ord(bad[0]):#04x} at offset "
                              f"{bad.start()}), not nvidia-smi output",
                              hint="the command printed something else; run it by hand on the tray (mctl exec)")


def _opening(text: str) -> str:
    return repr(text.strip()[:60])


def _placeholder(value: str) -> bool:
    return value.strip().strip("[]").strip().lower() in _PLACEHOLDERS


# --- -q -x -----------------------------------------------------------------------------------

def _find(elem: ET.Element, path: str) -> ET.Element | None:
    """elem.find(path) for a plain a/b/c path, one child tag at a time: Element.find() of a bare tag
    runs in C, a path with '/' goes through ElementPath in Python (~40 lookups per GPU, every sweep)."""
    if "/" not in path:
        return elem.find(path)
    node: ET.Element | None = elem
    for tag in _PATHS.get(path) or _PATHS.setdefault(path, tuple(path.split("/"))):
        node = node.find(tag)
        if node is None:
            return None
    return node


_PATHS: dict[str, tuple[str, ...]] = {}     # a/b/c -> its tags (the reader's paths are the code's, a few dozen)


class _Reader:
    """Typed lookups under one element, naming the GPU and path in every error."""

    def __init__(self, elem: ET.Element, where: str):
        self.elem = elem
        self.where = where

    def text(self, path: str) -> str | None:
        node = _find(self.elem, path)
        if node is None or node.text is None:
            return None
        value = " ".join(node.text.split())
        if value[:1].isdigit():         # a number (most values): no placeholder starts with a digit
            return value
        return None if _placeholder(value) else value

    def status(self, path: str) -> str | None:
        """An NVML return code as nvidia-smi spells it ("Success", "Unknown Error"): only N/A is no value."""
        node = _find(self.elem, path)
        if node is None or node.text is None:
            return None
        value = " ".join(node.text.split())
        return None if value.strip("[]").lower() in ("", "n/a") else value

    def number(self, path: str) -> float | None:
        value = self.text(path)
        if value is None:
            return None
        match = _NUMBER.match(value)
        if not match:
            raise FactsParseError(f"{self.where}: <{path}> is {value!r}, expected a number",
                                  hint="the nvidia-smi output looks garbled; rerun the collection")
        return float(match["num"])

    def integer(self, path: str) -> int | None:
        value = self.number(path)
        if value is None:
            return None
        if value != int(value):
            raise FactsParseError(f"{self.where}: <{path}> is {value!r}, expected a whole number")
        return int(value)

    def flag(self, path: str) -> bool | None:
        value = self.text(path)
        if value is None:
            return None
        low = value.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise FactsParseError(f"{self.where}: <{path}> is {value!r}, expected True/False or Yes/No")

    def sum_of(self, path: str, keep) -> int | None:
        """Sum the integer children of `path` whose tag passes `keep`; None if none has a value."""
        node = _find(self.elem, path)
        if node is None:
            return None
        sub = _Reader(node, self.where)
        values = [sub.integer(child.tag) for child in node if keep(child.tag)]
        present = [v for v in values if v is not None]
        return sum(present) if present else None


def _is_uncorrectable(tag: str) -> bool:
    return "uncorrectable" in tag


def _is_correctable(tag: str) -> bool:
    return tag.endswith("correctable") and "uncorrectable" not in tag


def _ecc(r: _Reader) -> EccCounts:
    def total(scope: str, keep, legacy: str) -> int | None:
        # Drivers before the SRAM/DRAM split report <single_bit>/<double_bit> with a <total>.
        value = r.sum_of(f"ecc_errors/{scope}", keep)
        return value if value is not None else r.integer(f"ecc_errors/{scope}/{legacy}/total")

    return EccCounts(
        volatile_uncorrectable=total("volatile", _is_uncorrectable, "double_bit"),
        aggregate_uncorrectable=total("aggregate", _is_uncorrectable, "double_bit"),
        volatile_correctable=total("volatile", _is_correctable, "single_bit"),
        aggregate_correctable=total("aggregate", _is_correctable, "single_bit"),
        volatile_dram_uncorrectable=r.integer("ecc_errors/volatile/dram_uncorrectable"),
        aggregate_dram_uncorrectable=r.integer("ecc_errors/aggregate/dram_uncorrectable"),
    )


def _fabric(r: _Reader) -> GpuFabric:
    if r.elem.find("fabric") is None:
        return GpuFabric()
    return GpuFabric(
        state=r.text("fabric/state"),
        status=r.status("fabric/status"),
        clique_id=r.integer("fabric/cliqueId"),
        cluster_uuid=cluster_uuid_or_none(r.text("fabric/clusterUuid")),
        health=FabricHealth(
            bandwidth=r.text("fabric/health/bandwidth"),
            route_recovery_in_progress=r.flag("fabric/health/route_recovery_in_progress"),
            route_unhealthy=r.flag("fabric/health/route_unhealthy"),
            access_timeout_recovery=r.flag("fabric/health/access_timeout_recovery"),
            summary=r.text("fabric/health/summary"),
            incorrect_configuration=r.text("fabric/health/incorrect_configuration"),
        ),
    )


def _gpu(elem: ET.Element, index: int) -> Gpu:
    bus_id = (elem.get("id") or "").strip() or None
    r = _Reader(elem, f"GPU {bus_id or index}")
    bus_id = bus_id or r.text("pci/pci_bus_id")
    uuid = r.text("uuid")
    if not bus_id or not uuid:
        missing = "PCI bus id" if not bus_id else "UUID"
        raise FactsParseError(f"GPU {index}: no {missing} in the nvidia-smi XML (partial output)",
                              hint="rerun `nvidia-smi -q -x` on the tray")
    return Gpu(
        index=index,
        uuid=uuid,
        pci_bus_id=bus_id,
        serial=r.text("serial"),
        product_name=r.text("product_name"),
        module_id=r.integer("platformInfo/module_id"),
        minor_number=r.integer("minor_number"),
        platform=PlatformInfo(
            chassis_serial_number=r.text("platformInfo/chassis_serial_number"),
            slot_number=r.integer("platformInfo/slot_number"),
            tray_index=r.integer("platformInfo/tray_index"),
            host_id=r.integer("platformInfo/host_id"),
            peer_type=r.text("platformInfo/peer_type"),
            gpu_fabric_guid=r.text("platformInfo/gpu_fabric_guid"),
        ),
        fabric=_fabric(r),
        ecc=_ecc(r),
        remapped_rows=RemappedRows(
            correctable=r.integer("remapped_rows/remapped_row_corr"),
            uncorrectable=r.integer("remapped_rows/remapped_row_unc"),
            pending=r.flag("remapped_rows/remapped_row_pending"),
            failure=r.flag("remapped_rows/remapped_row_failure"),
        ),
        repair=MemoryRepair(
            channel_repair_pending=r.flag("ecc_errors/channel_repair_pending"),
            tpc_repair_pending=r.flag("ecc_errors/tpc_repair_pending"),
            unrepairable_memory=r.flag("ecc_errors/unrepairable_memory"),
            sram_threshold_exceeded=r.flag("ecc_errors/aggregate/sram_threshold_exceeded"),
        ),
        temperature_c=r.number("temperature/gpu_temp"),
        power_draw_w=_first(r.number, *_POWER_DRAW),
        power_limit_w=_first(r.number, *_POWER_LIMIT),
        memory_total_mib=r.integer("fb_memory_usage/total"),
        gpu_recovery_action=r.text("gpu_recovery_action"),
        clock_events=_clock_events(r),
    )


# R535 renamed the element (real captures: 510-525 clocks_throttle_reasons, 535-595 clocks_event_reasons)
_CLOCK_ELEMENTS = (("clocks_event_reasons", "clocks_event_reason_"), ("clocks_throttle_reasons", "clocks_throttle_reason_"))


def _clock_events(r: _Reader) -> ClockEvents:
    """The clock-event reasons of either branch; a reason the driver left out or printed as N/A is not reported."""
    for element, prefix in _CLOCK_ELEMENTS:
        if r.elem.find(element) is None:
            continue
        active, reported = [], []
        for reason in CLOCK_REASONS:
            value = r.flag(f"{element}/{prefix}{reason}")
            if value is None:
                continue
            reported.append(reason)
            if value:
                active.append(reason)
        return ClockEvents(element, tuple(active), tuple(reported))
    return ClockEvents()


# Where each driver branch puts the GPU's own power draw and limit (real captures in tests/fixtures/real/):
# R570/R580 <gpu_power_readings> with average/instant draw; R535 <gpu_power_readings><power_draw>; R515-R530
# <power_readings> with <power_draw> and an enforced limit. <module_power_readings> is the whole module
# (on GB200 the superchip), not the GPU, so it is never compared with the GPU's limit.
_POWER_DRAW = ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw",
               "gpu_power_readings/power_draw", "power_readings/power_draw", "power_readings/average_power_draw",
               "power_readings/instant_power_draw")
_POWER_LIMIT = ("gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit",
                "power_readings/current_power_limit", "power_readings/power_limit")


def _first(get, *paths: str):
    for path in paths:
        value = get(path)
        if value is not None:
            return value
    return None


def parse_xml(text: str) -> GpuReport:
    """Read `nvidia-smi -q -x`. GPUs keep the order nvidia-smi printed them in (NVML index)."""
    _check_driver(text, "nvidia-smi -q -x")
    if "<!ENTITY" in text:
        raise FactsParseError("nvidia-smi XML declares entities, which nvidia-smi never does; refusing to read it")
    if not text.strip():
        raise FactsParseError("nvidia-smi -q -x printed nothing", hint="check that nvidia-smi exists on the tray")
    _refuse_binary(text, "nvidia-smi -q -x")
    body = text.strip()
    if not body.startswith("<"):
        looks = " (it looks like `nvidia-smi -q` text: the -x is missing)" if "NVSMI LOG" in body[:200] else ""
        raise FactsParseError(f"nvidia-smi -q -x printed no XML{looks}: it starts {_opening(body)}",
                              hint="run `nvidia-smi -q -x` by hand on the tray (mctl exec) and look at what it prints")
    if _FOREIGN_ROOT.match(body):
        raise FactsParseError(f"nvidia-smi -q -x printed an HTML page, not nvidia-smi XML: it starts {_opening(body)}",
                              hint="something else answers as nvidia-smi on the tray (a wrapper or proxy?)")
    try:
        root = ET.fromstring(body)      # str: expat reads it faster than the same bytes
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else 0
        cut = (" (the document ends before it closes: output truncated)"
               if "no element found" in str(exc) or line >= body.count("\n") + 1 else "")
        raise FactsParseError(f"nvidia-smi XML is not well-formed ({exc}){cut or '; output garbled or truncated'}",
                              hint="rerun `nvidia-smi -q -x` on the tray") from None
    if root.tag != "nvidia_smi_log":
        raise FactsParseError(f"nvidia-smi XML has root <{root.tag[:40]}>, expected <nvidia_smi_log>: "
                              "not nvidia-smi output")
    top = _Reader(root, "nvidia_smi_log")
    if root.find("driver_version") is None or root.find("attached_gpus") is None:
        raise FactsParseError("nvidia-smi XML lacks <driver_version> or <attached_gpus> (partial output)")
    gpus = tuple(_gpu(elem, i) for i, elem in enumerate(root.findall("gpu")))
    attached = top.integer("attached_gpus")
    if attached is not None and len(gpus) > attached:
        raise FactsParseError(f"nvidia-smi XML lists {len(gpus)} GPUs but attached_gpus is {attached}")
    return GpuReport(
        driver_version=top.text("driver_version"),
        cuda_version=top.text("cuda_version"),
        attached_gpus=attached,
        gpus=gpus,
        timestamp=top.text("timestamp"),
    )


# --- --query-gpu CSV --------------------------------------------------------------------------

_HEADER_UNIT = re.compile(r"^(?P<name>.*?)\s*\[(?P<unit>[^\]]+)\]$")


def _csv_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]


def _csv_value(cell: str) -> str | None:
    # CSV brackets its placeholders ("[N/A]", "[Unknown Error]"); a bare "Unknown Error" is a value,
    # e.g. a fabric status.
    if not cell or cell == "N/A" or (cell.startswith("[") and cell.endswith("]")):
        return None
    match = _NUMBER.match(cell)
    if match and match["unit"]:
        return match["num"]
    return cell


def parse_query_csv(text: str, fields: Sequence[str], *, header: bool | None = None) -> list[dict[str, str | None]]:
    """Read `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`, one dict per GPU.

    Values are strings with units removed ("242.67 W" -> "242.67"); placeholders such as
    "[N/A]" are None. `header=None` detects the header line from the field names.
    """
    fields = list(fields)
    if not fields:
        raise FactsParseError("no query fields given")
    _check_driver(text, "nvidia-smi --query-gpu")
    bad = _FIELD_ERROR.search(text)
    if bad:
        raise FactsParseError(f'nvidia-smi rejected query field "{bad["field"]}"',
                              hint="this driver does not know the field; check `nvidia-smi --help-query-gpu`")
    if text.strip() == NO_DEVICES:
        return []
    if not text.strip():
        raise FactsParseError("nvidia-smi --query-gpu printed nothing", hint="rerun the query on the tray")
    _refuse_binary(text, "nvidia-smi --query-gpu")
    rows = _csv_rows(text)
    if header is None:
        names = [(_HEADER_UNIT.match(c)["name"] if _HEADER_UNIT.match(c) else c).lower() for c in rows[0]]
        header = names == [f.lower() for f in fields]
    if header:
        if len(rows[0]) != len(fields):
            raise FactsParseError(f"CSV header has {len(rows[0])} columns, expected {len(fields)}")
        rows = rows[1:]
    out = []
    for n, row in enumerate(rows, start=1):
        if len(row) != len(fields):
            raise FactsParseError(f"CSV row {n} has {len(row)} values, expected {len(fields)} "
                                  f"({', '.join(fields)}); output garbled or truncated")
        out.append({name: _csv_value(cell) for name, cell in zip(fields, row)})
    return out


# --- nvlink --status --------------------------------------------------------------------------

_NVLINK_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?$")
_NVLINK_LINK = re.compile(r"^Link (?P<link>\d+): (?P<value>.+)$")
_SPEED = re.compile(r"^(?P<num>\d+(?:\.\d+)?) ?GB/s$")
_ALL_INACTIVE = re.compile(r"^NVML: Unable to retrieve NVLink information as all links are inactive\.?$", re.I)


def parse_nvlink_status(text: str) -> tuple[GpuNvLinks, ...]:
    """Read `nvidia-smi nvlink --status`: per GPU, each link's speed in GB/s or None when inactive.

    A GPU whose links are all down has no link lines; NVML prints
    `NVML: Unable to retrieve NVLink information as all links are inActive` under its GPU line
    instead (real B200 output, leptonai/gpud issue 1085), read as all_inactive=True.
    """
    _check_driver(text, "nvidia-smi nvlink --status")
    if not text.strip():
        raise FactsParseError("nvidia-smi nvlink --status printed nothing", hint="rerun it on the tray")
    _refuse_binary(text, "nvidia-smi nvlink --status")
    gpus: list[GpuNvLinks] = []
    current: dict | None = None

    def close() -> None:
        if current is not None:
            gpus.append(GpuNvLinks(current["index"], current["name"], current["uuid"], tuple(current["links"]),
                                   all_inactive=current["all_inactive"]))

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        gpu = _NVLINK_GPU.match(line)
        if gpu:
            close()
            current = {"index": int(gpu["index"]), "name": gpu["name"] or None, "uuid": gpu["uuid"], "links": [],
                       "all_inactive": False}
            continue
        if current is not None and _ALL_INACTIVE.search(line):
            if current["links"]:
                raise FactsParseError(f"nvlink --status line {lineno}: GPU {current['index']} lists links and "
                                      "also says all links are inactive", hint="rerun `nvidia-smi nvlink --status`")
            current["all_inactive"] = True
            continue
        link = _NVLINK_LINK.match(line)
        if link and current is not None and not current["all_inactive"]:
            value = link["value"].strip()
            if value.lower() in ("<inactive>", "inactive"):
                speed = None
            else:
                match = _SPEED.match(value)
                if not match:
                    raise FactsParseError(f"nvlink --status line {lineno}: unexpected link value {value[:40]!r}")
                speed = float(match["num"])
            current["links"].append(NvLink(int(link["link"]), speed))
            continue
        raise FactsParseError(f"nvlink --status line {lineno}: unexpected text {line[:80]!r}",
                              hint="output garbled or truncated; rerun `nvidia-smi nvlink --status`")
    close()
    return tuple(gpus)


def with_stderr(gpus: tuple[GpuNvLinks, ...], stderr: str) -> tuple[GpuNvLinks, ...]:
    """NVML's all-links-inactive sentence can come on stderr, apart from its GPU line: then every GPU
    that printed no link line is the one it is about."""
    if not any(_ALL_INACTIVE.search(line.strip()) for line in stderr.splitlines()):
        return gpus
    from dataclasses import replace

    return tuple(replace(g, all_inactive=True) if not g.links and not g.all_inactive else g for g in gpus)


# --- nvlink -e (error counters) ----------------------------------------------------------------

_FLOAT_E = re.compile(r"^[-+]?\d+(?:\.\d+)?[eE][-+]?\d+$")
_HEADER_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?$")


def parse_nvlink_errors(text: str) -> tuple[GpuNvLinkCounters, ...]:
    """Read `nvidia-smi nvlink -e`: per GPU, per link, every integer counter by the name the driver prints.

    Both shapes read: `Link 0: Replay Errors: 0` (Hopper and earlier) and the NVLink5 names of Blackwell
    drivers (`Link 0: Rx Errors: 0`, `Link 0: FEC Errors - 1: 0`). A value that is not a whole number
    (`Effective BER: 15e-255`) is not a count and is left out; one too large to be a count (NVML's
    not-available, -1 as unsigned) likewise. Blank lines between links are as the driver prints them.
    A GPU whose links are all inactive has NVML's sentence and no link lines.
    """
    _check_driver(text, "nvidia-smi nvlink -e")
    if not text.strip():
        raise FactsParseError("nvidia-smi nvlink -e printed nothing", hint="rerun it on the tray")
    _refuse_binary(text, "nvidia-smi nvlink -e")
    gpus: list[GpuNvLinkCounters] = []
    current: GpuNvLinkCounters | None = None
    # str methods, not a regex per line: a GB200 tray prints ~2,200 lines every sweep (72 trays: 160,000)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Link ") and current is not None:
            left, sep, value = line.rpartition(": ")
            where, sep2, name = left.partition(": ")
            link = where[5:]
            if sep and sep2 and link.isdigit() and name and name[0].isalpha():
                if value.isdigit():
                    number = int(value)
                    if number < COUNTER_MAX:
                        current.links.setdefault(int(link), {})[name] = number
                    continue
                if _NUMBER.match(value) or _FLOAT_E.match(value) or _placeholder(value):
                    continue                        # a BER (15e-255), a rate: not a count
                raise FactsParseError(f"nvlink -e line {lineno}: unexpected value {value[:40]!r}",
                                      hint="output garbled or truncated; rerun `nvidia-smi nvlink -e`")
        head = _HEADER_GPU.match(line)
        if head:
            current = GpuNvLinkCounters(int(head["index"]), head["uuid"], {})
            gpus.append(current)
            continue
        if current is not None and _ALL_INACTIVE.search(line):
            continue
        raise FactsParseError(f"nvlink -e line {lineno}: unexpected text {line[:80]!r}",
                              hint="output garbled or truncated; rerun `nvidia-smi nvlink -e`")
    if not gpus:
        raise FactsParseError("nvidia-smi nvlink -e listed no GPU", hint="rerun `nvidia-smi nvlink -e` on the tray")
    return tuple(gpus)


# --- -L ---------------------------------------------------------------------------------------

_LIST_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?) \(UUID: (?P<uuid>[^)]+)\)$")


def parse_list(text: str) -> tuple[tuple[int, str, str], ...]:
    """Read `nvidia-smi -L` as (index, name, uuid) per GPU; MIG lines under a GPU are skipped."""
    _check_driver(text, "nvidia-smi -L")
    if text.strip() == NO_DEVICES:
        return ()
    out = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.startswith((" ", "\t")):
            continue
        match = _LIST_LINE.match(raw.strip())
        if not match:
            raise FactsParseError(f"nvidia-smi -L line {lineno}: unexpected text {raw.strip()[:80]!r}")
        out.append((int(match["index"]), match["name"], match["uuid"]))
    if not out:
        raise FactsParseError("nvidia-smi -L printed no GPUs", hint="rerun `nvidia-smi -L` on the tray")
    return tuple(out)


def parse_number(value: str | None) -> float | None:
    """A CSV value from parse_query_csv as a number; None stays None."""
    if value is None:
        return None
    match = _NUMBER.match(value.strip())
    if not match:
        raise FactsParseError(f"expected a number, got {value!r}")
    return float(match["num"])


__all__: Iterable[str] = [
    "parse_xml", "parse_query_csv", "parse_nvlink_status", "parse_nvlink_errors", "parse_list", "parse_number", "with_stderr",
    "FactsParseError", "DriverUnavailable", "DRIVER_FAILURE",
]
