#!/usr/bin/python3
"""nvidia-smi for the trays of the mctl virtual rack.

Installed by the lab as /usr/bin/nvidia-smi inside each compute tray, where it runs
under the image's /usr/bin/python3 with nothing but the standard library. It
re-reads the tray's gpus.json and faults.json on every call, so a fault injected
by `mctl lab fault` shows in the very next call, the way a real driver's state
would. Output formats follow real driver 570 output (the XML element tree of
tests/fixtures/gb200-nvidia-smi-q-x.xml, the text layout of `nvidia-smi -q`, the
summary table, CSV queries and `nvlink --status`), so mctl's parsers read the
lab and real trays with the same code.

How faults.json shows (what a real driver would print for the same condition):
  gpu_missing [i]          GPU i is not enumerated at all (gone from PCI): attached_gpus drops,
                           the remaining GPUs are renumbered 0..n-1 as NVML numbers them.
  fabric "in-progress"     Fabric State "In Progress"; Status, CliqueId, ClusterUUID and Health N/A.
  fabric "degraded"        Completed/Success, Health Bandwidth "Degraded".
  fabric "unhealthy"       Completed, Status "Unknown Error" (NVML_ERROR_UNKNOWN as nvmlErrorString
                           prints it), Health Route Unhealthy "True".
  nvlink_down [[g, l]]     link l of GPU g "<inactive>" in `nvlink --status`; GPU g's fabric
                           Bandwidth reads "Degraded" (fewer links than the fabric expects).
  ecc_uncorrectable {g: n} volatile and aggregate DRAM Uncorrectable = n, n remapped uncorrectable
                           rows with a remap pending, GPU Recovery Action "Reset".
  xid [{gpu, code}]        XIDs are kernel-log events (see xid_log_line); nvidia-smi only shows
                           their lasting effect: 79 (fallen off the bus) makes the GPU unreadable
                           ("Unable to determine the device handle ..." on stderr, left out of
                           every listing while attached_gpus still counts it); codes whose
                           resolution is a GPU reset set GPU Recovery Action "Reset".
  unreachable, hang        not nvidia-smi's to show: the lab applies them to the tray's sshd.
A missing gpus.json is a tray without a working driver: the real failure message, exit 9.
"""

from __future__ import annotations

import marshal
import os
import sys
import time

STATE_PATH = "/var/lib/mctl-lab/gpus.json"
FAULTS_PATH = "/var/lib/mctl-lab/faults.json"
STATE_ENV = "MCTL_LAB_GPU_STATE"
FAULTS_ENV = "MCTL_LAB_FAULTS"
# Set by the lab's /usr/bin/nvidia-smi (LAUNCHER) when it calls the emulator for an answer it replays.
REPLAY_FILE_ENV = "MCTL_LAB_SMI_REPLAY"
REPLAY_KEY_ENV = "MCTL_LAB_SMI_KEY"
XML_TIME_FORMAT = "\t<timestamp>%a %b %e %H:%M:%S %Y</timestamp>"     # date(1) for time.asctime's layout

# /usr/bin/nvidia-smi on a lab tray (@LIB@: where this module is installed). Every health sweep asks
# each tray for `-q -x` and `nvlink --status`. Those two answers depend only on the tray's GPU state
# files (and, for -q -x, on the time of the call), so the emulator stores each answer it gives beside
# the state, with the key the launcher computed before calling it: the device, inode, size, mtime and
# ctime (ns) of gpus.json and faults.json. While the key still holds, the launcher replays the answer
# (stderr, stdout, exit status) and prints the current time where -q -x has its <timestamp>: the
# same bytes the emulator would print, for ~3 ms of a tray's CPU instead of a ~20 ms Python start.
# Any change to either file (a fault, a partition change: both are written by rename) changes the key.
# Replay file: key, exit status, number of stderr lines E, number of stdout lines before the time
# line B, the time line's date(1) format ('' for none); then E stderr lines, B stdout lines, the rest.
LAUNCHER = r"""#!/bin/sh
# Written by `mctl lab up`: nvidia-smi of the lab, emulated by @LIB@/nvidia_smi.py (mctl/lab/emulators):
# see LAUNCHER there for the replay of unchanged answers.
S=${MCTL_LAB_GPU_STATE:-/var/lib/mctl-lab/gpus.json}
F=${MCTL_LAB_FAULTS:-/var/lib/mctl-lab/faults.json}
case "$*" in
  "-q -x") c=q-x ;;
  "nvlink --status") c=nvlink-status ;;
  *) c= ;;
esac
if [ -n "$c" ] && [ -e "$S" ]; then
  k=$(stat -L --printf '%d:%i:%s:%.9Y:%.9Z;' "$S" "$F" 2>/dev/null)
  R=${S%/*}/.nvidia-smi.$c
  if [ -n "$k" ] && [ -r "$R" ]; then
    {
      if IFS= read -r v && [ "$v" = "$k" ] && IFS= read -r rc && IFS= read -r ne && IFS= read -r nb \
          && IFS= read -r tf; then
        while [ "$ne" -gt 0 ] && IFS= read -r l; do printf '%s\n' "$l" >&2; ne=$((ne - 1)); done
        while [ "$nb" -gt 0 ] && IFS= read -r l; do printf '%s\n' "$l"; nb=$((nb - 1)); done
        [ -z "$tf" ] || LC_ALL=C date "+$tf"
        cat
        exit "$rc"
      fi
    } < "$R"
  fi
  [ -z "$k" ] || export MCTL_LAB_SMI_REPLAY="$R" MCTL_LAB_SMI_KEY="$k"
fi
exec /usr/bin/python3 -IS -c 'import sys; sys.path.insert(0, "@LIB@"); import nvidia_smi; nvidia_smi.run()' "$@"
"""

EXIT_OK = 0
EXIT_INVALID_ARG = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER = 9

DRIVER_FAILURE_TEXT = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                       "Make sure that the latest NVIDIA driver is installed and running.")
INVALID_ARGS_TEXT = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
NO_DEVICES_TEXT = "No devices were found"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
NVLINKS_PER_GPU = 18
NVLINK_SPEED = "53.125 GB/s"
NA = "N/A"

# Kernel-log messages for the XIDs operators meet most (text after "pid=..., name=..., ").
XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_12340000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    46: "GPU stopped processing",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
        "subpartition 0.",
    61: "Internal micro-controller breakpoint/warning (PMU)",
    62: "Internal micro-controller halt (PMU)",
    63: "Row Remapper: New row (0x0000000000001f2e) was marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x0000000000001f2e), a row remapping failure occurred.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x2c014",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
         "(0x20802a02 0x8).",
    120: "GSP task timeout @ pc:0x4bc5b3c, task: 1",
    136: "Link training failed on NVLink 3",
    140: "An unrecoverable ECC error was detected and contained, GPU reset required.",
    144: "NVLINK: SAW_MVB Nonfatal error on link 3",
    145: "NVLINK: RLW Fatal error on link 3",
    146: "NVLINK: TLW Fatal error on link 3",
    147: "NVLINK: TREX Fatal error on link 3",
    148: "NVLINK: NVLPW_CTRL Fatal error on link 3",
    149: "NVLINK: NETIR Fatal error on link 3",
    150: "NVLINK: MSE Fatal error on link 3",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    155: "NVLINK: SW defined error on link 3",
    158: "NVLINK: fatal timeout on link 3",
}
# XIDs whose resolution is a GPU reset: the driver reports GPU Recovery Action "Reset" after them.
RESET_XIDS = frozenset({46, 48, 64, 95, 119, 120, 136, 140, 155, 158})
LOST_XIDS = frozenset({79})


def escape(text: str) -> str:
    """XML character data, as xml.sax.saxutils.escape writes it (that module imports urllib: ~40 ms a call)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def kernel_pci(pci_bus_id: str) -> str:
    """nvidia-smi's `00000008:01:00.0` as NVRM prints it in XID lines: `0008:01:00`."""
    domain, bus, rest = pci_bus_id.split(":")
    return "%04x:%02x:%02x" % (int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16))


def xid_log_line(hostname, pci_bus_id, code, pid=None, process_name=None, when=None, *, uptime=None, message=None):
    """One kernel-log line for an XID, as rsyslog writes it to /var/log/kern.log.

    `when` is the epoch time (default now), rendered in local time as rsyslog does;
    `uptime` the kernel's seconds since boot (default: from this machine's boot time).
    A missing pid/process name is printed the way the driver prints an unknown owner.
    """
    when = time.time() if when is None else float(when)
    if uptime is None:
        uptime = max(0.0, when - _boot_time(when))
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(when))
    stamp = stamp[:4] + ("%2d" % int(stamp[4:6])) + stamp[6:]     # rsyslog pads the day with a space
    owner = "pid=%s, name=%s" % ((pid if pid is not None else "'<unknown>'"), (process_name or "<unknown>"))
    text = message or XID_MESSAGES.get(int(code), "Unknown XID %d" % int(code))
    return "%s %s kernel: [%12.6f] NVRM: Xid (PCI:%s): %d, %s, %s" % (
        stamp, hostname, uptime, kernel_pci(pci_bus_id), int(code), owner, text)


def _boot_time(fallback):
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return fallback


# --- state -------------------------------------------------------------------------------------

class DriverMissing(Exception):
    """No gpus.json: the tray behaves like a host without a loaded driver."""


def _read_json(path):
    """A JSON file, through a marshal copy kept beside it while the file is unchanged.

    Every health sweep runs nvidia-smi twice on every tray; importing json (and the re
    module it compiles patterns with) was a third of each call's CPU time. marshal is
    built in. The copy is keyed by the file's inode, size and mtime, so a fault written
    by `mctl lab fault` (an atomic rename) shows in the very next call as before.
    """
    st = os.stat(path)
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    head, tail = os.path.split(path)
    cache = os.path.join(head, "." + tail + ".marshal")
    try:
        with open(cache, "rb") as fh:
            cached_key, value = marshal.load(fh)
        if tuple(cached_key) == key:
            return value
    except (OSError, EOFError, ValueError, TypeError):
        pass
    import json

    with open(path, encoding="utf-8") as fh:
        value = json.load(fh)
    tmp = "%s.%d" % (cache, os.getpid())
    try:
        with open(tmp, "wb") as fh:
            marshal.dump((key, value), fh)
        os.replace(tmp, cache)
    except (OSError, ValueError):      # read-only folder, or a value marshal cannot hold: no copy
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return value


def load(env=None):
    """(state, faults) from the files the environment names (or the lab's default paths)."""
    env = os.environ if env is None else env
    try:
        state = _read_json(env.get(STATE_ENV) or STATE_PATH)
    except (OSError, ValueError):
        raise DriverMissing() from None
    try:
        faults = _read_json(env.get(FAULTS_ENV) or FAULTS_PATH) or {}
    except FileNotFoundError:
        faults = {}
    except (OSError, ValueError):
        faults = {}
    return state, faults


def _fmt_w(value):
    return NA if value is None else "%.2f W" % float(value)


class GpuView:
    """One GPU as the driver would show it, state and faults combined."""

    def __init__(self, state, gpu, faults, index):
        self.state = state
        self.raw = gpu
        self.id = int(gpu["index"])                # index in gpus.json / faults.json
        self.index = index                         # NVML index now
        g = gpu.get
        self.uuid = g("uuid")
        self.serial = g("serial", NA)
        self.bus_id = g("pci_bus_id")
        self.module_id = g("module_id", NA)
        self.minor = g("minor_number", self.id)
        self.guid = g("gpu_fabric_guid", "0x0")
        self.memory_total = int(g("memory_total_mib", 189471))
        self.memory_used = int(g("memory_used_mib", 0))
        self.power_limit = float(g("power_limit_w", 1200.0))
        self.power_draw = float(g("power_draw_w", 160.0 + 3.5 * self.id))
        self.temperature = int(g("temperature_c", 30))
        self.name = state.get("product_name", "NVIDIA GB200")

        ecc = faults.get("ecc_uncorrectable") or {}
        self.dram_unc = int(ecc.get(str(self.id), ecc.get(self.id, 0)) or 0)
        xids = {int(x.get("code")) for x in faults.get("xid") or [] if int(x.get("gpu", -1)) == self.id}
        self.lost = bool(xids & LOST_XIDS)
        self.recovery = "Reset" if (self.dram_unc or xids & RESET_XIDS) else "None"
        self.down_links = sorted({int(link) for gpu_id, link in faults.get("nvlink_down") or [] if int(gpu_id) == self.id})
        self._fabric(state, gpu, faults.get("fabric"))

    def _fabric(self, state, gpu, fault):
        fstate = state.get("fabric_state") or "Completed"
        status = state.get("fabric_status") or ("Success" if fstate == "Completed" else NA)
        cluster = gpu.get("cluster_uuid", state.get("cluster_uuid")) or ZERO_UUID
        clique = gpu.get("clique_id", state.get("clique_id"))
        health = {"bandwidth": "Full", "route_recovery_in_progress": "False",
                  "route_unhealthy": "False", "access_timeout_recovery": "False"}
        if fault == "in-progress":
            fstate = "In Progress"
        if fstate != "Completed":
            status, cluster, clique = NA, NA, NA
            health = {key: NA for key in health}
        else:
            if clique is None:
                clique = 0
            if fault == "unhealthy":
                status = "Unknown Error"
                health["route_unhealthy"] = "True"
            if fault == "degraded" or self.down_links:
                health["bandwidth"] = "Degraded"
        self.fabric_state, self.fabric_status = fstate, status
        self.cluster_uuid, self.clique_id = str(cluster), str(clique)
        self.health = health

    @property
    def kernel_bus(self):
        """Bus id as the device-handle error prints it: `0008:01:00.0`."""
        domain, rest = self.bus_id.split(":", 1)
        return "%04x:%s" % (int(domain, 16), rest)

    # Pieces of the PCI address, as the XML prints them.
    def pci_parts(self):
        domain, bus, rest = self.bus_id.split(":")
        device = rest.split(".")[0]
        return domain[-4:], bus, device


class Rack:
    """The GPUs of one tray as the driver enumerates them."""

    def __init__(self, state, faults):
        self.state = state
        self.faults = faults
        missing = {int(i) for i in faults.get("gpu_missing") or []}
        present = [g for g in sorted(state.get("gpus") or [], key=lambda g: int(g["index"])) if int(g["index"]) not in missing]
        self.gpus = [GpuView(state, g, faults, i) for i, g in enumerate(present)]
        self.attached = len(self.gpus)

    @property
    def readable(self):
        return [g for g in self.gpus if not g.lost]

    def lost_messages(self, selected):
        return ["Unable to determine the device handle for GPU%d: %s: Unknown Error" % (g.index, g.kernel_bus)
                for g in selected if g.lost]

    def select(self, ident):
        if ident is None:
            return list(self.gpus)
        out = []
        for part in str(ident).split(","):
            part = part.strip()
            for g in self.gpus:
                if part == str(g.index) or part.lower() in (g.uuid.lower(), g.bus_id.lower(), g.kernel_bus.lower()):
                    out.append(g)
                    break
            else:
                return None
        return out


# --- -q -x and -q: one element tree, two renderings ----------------------------------------------
# A node is (xml_tag, text_label, value): value is a string, a list of nodes, or a (xml, text) pair
# when the two formats print the same fact differently. A None tag is text-only, a None label XML-only.

def _na_pages():
    return [("retired_count", None, NA), ("retired_pagelist", None, NA)]


def _gpu_tree(g):
    domain, bus, device = g.pci_parts()
    bus_int = int(bus, 16)
    mem_reserved = 799
    used = g.memory_used
    ecc_unc = str(g.dram_unc)
    remap_unc = g.dram_unc
    draw = g.power_draw
    ver = g.state.get("driver_version", "570.148.08")
    return [
        ("product_name", "Product Name", g.name),
        ("product_brand", "Product Brand", "NVIDIA"),
        ("product_architecture", "Product Architecture", "Blackwell"),
        ("display_mode", "Display Mode", "Enabled"),
        ("display_active", "Display Active", "Disabled"),
        ("persistence_mode", "Persistence Mode", "Enabled"),
        ("addressing_mode", "Addressing Mode", "ATS"),
        ("mig_mode", "MIG Mode", [("current_mig", "Current", "Disabled"), ("pending_mig", "Pending", "Disabled")]),
        ("mig_devices", None, _Block("None")),
        ("accounting_mode", "Accounting Mode", "Disabled"),
        ("accounting_mode_buffer_size", "Accounting Mode Buffer Size", "4000"),
        ("driver_model", "Driver Model", [("current_dm", "Current", NA), ("pending_dm", "Pending", NA)]),
        ("serial", "Serial Number", g.serial),
        ("uuid", "GPU UUID", g.uuid),
        ("minor_number", "Minor Number", str(g.minor)),
        ("vbios_version", "VBIOS Version", "97.00.B9.00.3D"),
        ("multigpu_board", "MultiGPU Board", "No"),
        ("board_id", "Board ID", "0x%x" % ((int(domain, 16) << 16) | (bus_int << 8) | int(device, 16))),
        ("board_part_number", "Board Part Number", "900-2G548-A801-000"),
        ("gpu_part_number", "GPU Part Number", "2941-892-A1"),
        ("gpu_fru_part_number", "FRU Part Number", NA),
        ("platformInfo", "Platform Info", [
            ("chassis_serial_number", "Chassis Serial Number", str(g.state.get("chassis_serial", ""))),
            ("slot_number", "Slot Number", str(g.state.get("slot_number", 0))),
            ("tray_index", "Tray Index", str(g.state.get("tray_index", 0))),
            ("host_id", "Host ID", str(g.state.get("host_id", 1))),
            ("peer_type", "Peer Type", "Switch Connected"),
            ("module_id", "Module Id", str(g.module_id)),
            ("gpu_fabric_guid", "GPU Fabric GUID", g.guid),
        ]),
        ("inforom_version", "Inforom Version", [
            ("img_version", "Image Version", "G548.0201.00.06"), ("oem_object", "OEM Object", "2.1"),
            ("ecc_object", "ECC Object", "7.16"), ("pwr_object", "Power Management Object", NA)]),
        ("inforom_bbx_flush", "Inforom BBX Object Flush", [
            ("latest_timestamp", "Latest Timestamp", NA), ("latest_duration", "Latest Duration", NA)]),
        ("gpu_operation_mode", "GPU Operation Mode", [("current_gom", "Current", NA), ("pending_gom", "Pending", NA)]),
        ("c2c_mode", "GPU C2C Mode", "Enabled"),
        ("gpu_virtualization_mode", "GPU Virtualization Mode", [
            ("virtualization_mode", "Virtualization Mode", "Pass-Through"),
            ("host_vgpu_mode", "Host VGPU Mode", NA), ("vgpu_heterogeneous_mode", "vGPU Heterogeneous Mode", NA)]),
        ("gpu_reset_status", "GPU Reset Status", [
            ("reset_required", "Reset Required", "Requested functionality has been deprecated"),
            ("drain_and_reset_recommended", "Drain and Reset Recommended", "Requested functionality has been deprecated")]),
        ("gpu_recovery_action", "GPU Recovery Action", g.recovery),
        ("gsp_firmware_version", "GSP Firmware Version", ver),
        ("ibmnpu", "IBMNPU", [("relaxed_ordering_mode", "Relaxed Ordering Mode", NA)]),
        ("pci", "PCI", [
            ("pci_bus", "Bus", (bus, "0x" + bus)),
            ("pci_device", "Device", (device, "0x" + device)),
            ("pci_domain", "Domain", (domain, "0x" + domain)),
            ("pci_base_class", "Base Classcode", ("3", "0x3")),
            ("pci_sub_class", "Sub Classcode", ("2", "0x2")),
            ("pci_device_id", "Device Id", ("294110DE", "0x294110DE")),
            ("pci_bus_id", "Bus Id", g.bus_id),
            ("pci_sub_system_id", "Sub System Id", ("204610DE", "0x204610DE")),
            ("pci_gpu_link_info", "GPU Link Info", [
                ("pcie_gen", "PCIe Generation", [
                    ("max_link_gen", "Max", "5"), ("current_link_gen", "Current", "5"),
                    ("device_current_link_gen", "Device Current", "5"), ("max_device_link_gen", "Device Max", "6"),
                    ("max_host_link_gen", "Host Max", NA)]),
                ("link_widths", "Link Width", [("max_link_width", "Max", "16x"), ("current_link_width", "Current", "16x")]),
            ]),
            ("pci_bridge_chip", "Bridge Chip", [("bridge_chip_type", "Type", NA), ("bridge_chip_fw", "Firmware", NA)]),
            ("replay_counter", "Replays Since Reset", "0"),
            ("replay_rollover_counter", "Replay Number Rollovers", "0"),
            ("tx_util", "Tx Throughput", "0 KB/s"),
            ("rx_util", "Rx Throughput", "0 KB/s"),
            ("atomic_caps_outbound", "Atomic Caps Outbound", NA),
            ("atomic_caps_inbound", "Atomic Caps Inbound", NA),
        ]),
        ("fan_speed", "Fan Speed", NA),
        ("performance_state", "Performance State", "P0"),
        ("clocks_event_reasons", "Clocks Event Reasons", [
            ("clocks_event_reason_" + tag, label, "Not Active") for tag, label in (
                ("gpu_idle", "Idle"), ("applications_clocks_setting", "Applications Clocks Setting"),
                ("sw_power_cap", "SW Power Cap"), ("hw_slowdown", "HW Slowdown"),
                ("hw_thermal_slowdown", "HW Thermal Slowdown"), ("hw_power_brake_slowdown", "HW Power Brake Slowdown"),
                ("sync_boost", "Sync Boost"), ("sw_thermal_slowdown", "SW Thermal Slowdown"),
                ("display_clocks_setting", "Display Clock Setting"))]),
        ("sparse_operation_mode", "Sparse Operation Mode", NA),
        ("fb_memory_usage", "FB Memory Usage", [
            ("total", "Total", "%d MiB" % g.memory_total), ("reserved", "Reserved", "%d MiB" % mem_reserved),
            ("used", "Used", "%d MiB" % used),
            ("free", "Free", "%d MiB" % max(0, g.memory_total - mem_reserved - used))]),
        ("bar1_memory_usage", "BAR1 Memory Usage", [
            ("total", "Total", "262144 MiB"), ("used", "Used", "1 MiB"), ("free", "Free", "262143 MiB")]),
        ("cc_protected_memory_usage", "Conf Compute Protected Memory Usage", [
            ("total", "Total", "0 MiB"), ("used", "Used", "0 MiB"), ("free", "Free", "0 MiB")]),
        ("compute_mode", "Compute Mode", "Default"),
        ("utilization", "Utilization", [
            ("gpu_util", "GPU", "0 %"), ("memory_util", "Memory", "0 %"), ("encoder_util", "Encoder", "0 %"),
            ("decoder_util", "Decoder", "0 %"), ("jpeg_util", "JPEG", "0 %"), ("ofa_util", "OFA", "0 %")]),
        ("encoder_stats", "Encoder Stats", [
            ("session_count", "Active Sessions", "0"), ("average_fps", "Average FPS", "0"),
            ("average_latency", "Average Latency", "0")]),
        ("fbc_stats", "FBC Stats", [
            ("session_count", "Active Sessions", "0"), ("average_fps", "Average FPS", "0"),
            ("average_latency", "Average Latency", "0")]),
        ("dram_encryption_mode", "DRAM Encryption Mode", [
            ("current_dram_encryption", "Current", NA), ("pending_dram_encryption", "Pending", NA)]),
        ("ecc_mode", "ECC Mode", [("current_ecc", "Current", "Enabled"), ("pending_ecc", "Pending", "Enabled")]),
        ("ecc_errors", "ECC Errors", [
            ("volatile", "Volatile", _ecc_rows(ecc_unc)),
            ("aggregate", "Aggregate", _ecc_rows(ecc_unc) + [("sram_threshold_exceeded", "SRAM Threshold Exceeded", "No")]),
            ("aggregate_uncorrectable_sram_sources", "Aggregate Uncorrectable SRAM Sources", [
                ("sram_l2", "SRAM L2", "0"), ("sram_sm", "SRAM SM", "0"),
                ("sram_microcontroller", "SRAM Microcontroller", "0"), ("sram_pcie", "SRAM PCIE", "0"),
                ("sram_other", "SRAM Other", "0")]),
        ]),
        ("retired_pages", "Retired Pages", [
            ("multiple_single_bit_retirement", "Single Bit ECC", (_na_pages(), NA)),
            ("double_bit_retirement", "Double Bit ECC", (_na_pages(), NA)),
            ("pending_blacklist", "Pending Page Blacklist", NA),
            ("pending_retirement", None, NA),
        ]),
        ("remapped_rows", "Remapped Rows", [
            ("remapped_row_corr", "Correctable Error", "0"),
            ("remapped_row_unc", "Uncorrectable Error", str(remap_unc)),
            ("remapped_row_pending", "Pending", "Yes" if remap_unc else "No"),
            ("remapped_row_failure", "Remapping Failure Occurred", "No"),
            ("row_remapper_histogram", "Bank Remap Availability Histogram", [
                ("row_remapper_histogram_max", "Max", "%d bank(s)" % (3968 - remap_unc)),
                ("row_remapper_histogram_high", "High", "%d bank(s)" % remap_unc),
                ("row_remapper_histogram_partial", "Partial", "0 bank(s)"),
                ("row_remapper_histogram_low", "Low", "0 bank(s)"),
                ("row_remapper_histogram_none", "None", "0 bank(s)")]),
        ]),
        ("temperature", "Temperature", [
            ("gpu_temp", "GPU Current Temp", "%d C" % g.temperature),
            ("gpu_temp_tlimit", "GPU T.Limit Temp", "%d C" % (87 - g.temperature)),
            ("gpu_temp_max_tlimit_threshold", "GPU Shutdown T.Limit Temp", "-5 C"),
            ("gpu_temp_slow_tlimit_threshold", "GPU Slowdown T.Limit Temp", "-2 C"),
            ("gpu_temp_max_gpu_tlimit_threshold", "GPU Max Operating T.Limit Temp", "0 C"),
            ("gpu_target_temperature", "GPU Target Temperature", NA),
            ("memory_temp", "Memory Current Temp", "%d C" % g.temperature),
            ("gpu_temp_max_mem_tlimit_threshold", "Memory Max Operating T.Limit Temp", "0 C")]),
        ("supported_gpu_target_temp", None, [("gpu_target_temp_min", None, NA), ("gpu_target_temp_max", None, NA)]),
        ("gpu_power_readings", "GPU Power Readings", [
            ("power_state", None, "P0"),
            ("average_power_draw", "Average Power Draw", _fmt_w(draw)),
            ("instant_power_draw", "Instantaneous Power Draw", _fmt_w(draw + 0.38)),
            ("current_power_limit", "Current Power Limit", _fmt_w(g.power_limit)),
            ("requested_power_limit", "Requested Power Limit", _fmt_w(g.power_limit)),
            ("default_power_limit", "Default Power Limit", _fmt_w(g.power_limit)),
            ("min_power_limit", "Min Power Limit", "200.00 W"),
            ("max_power_limit", "Max Power Limit", _fmt_w(g.power_limit))]),
        ("gpu_memory_power_readings", "GPU Memory Power Readings", [
            ("average_power_draw", "Average Power Draw", "28.96 W"), ("instant_power_draw", "Instantaneous Power Draw", NA)]),
        ("module_power_readings", "Module Power Readings", [
            ("power_state", None, "P0"),
            ("average_power_draw", "Average Power Draw", _fmt_w(2.5 * draw)),
            ("instant_power_draw", "Instantaneous Power Draw", _fmt_w(2.5 * draw)),
            ("current_power_limit", "Current Power Limit", "2500.00 W"),
            ("requested_power_limit", "Requested Power Limit", "2500.00 W"),
            ("default_power_limit", "Default Power Limit", "2500.00 W"),
            ("min_power_limit", "Min Power Limit", "500.00 W"),
            ("max_power_limit", "Max Power Limit", "2500.00 W")]),
        ("power_smoothing", "Power Smoothing", "Insufficient Permissions"),
        ("power_profiles", "Workload Power Profiles", [
            ("power_profile_requested_profiles", "Requested Profiles", NA),
            ("power_profile_enforced_profiles", "Enforced Profiles", NA)]),
        ("clocks", "Clocks", [("graphics_clock", "Graphics", "2062 MHz"), ("sm_clock", "SM", "2062 MHz"),
                              ("mem_clock", "Memory", "3996 MHz"), ("video_clock", "Video", "1822 MHz")]),
        ("applications_clocks", "Applications Clocks", [("graphics_clock", "Graphics", "2062 MHz"),
                                                        ("mem_clock", "Memory", "3996 MHz")]),
        ("default_applications_clocks", "Default Applications Clocks", [("graphics_clock", "Graphics", "2062 MHz"),
                                                                        ("mem_clock", "Memory", "3996 MHz")]),
        ("deferred_clocks", "Deferred Clocks", [("mem_clock", "Memory", NA)]),
        ("max_clocks", "Max Clocks", [("graphics_clock", "Graphics", "2062 MHz"), ("sm_clock", "SM", "2062 MHz"),
                                      ("mem_clock", "Memory", "3996 MHz"), ("video_clock", "Video", "1890 MHz")]),
        ("max_customer_boost_clocks", "Max Customer Boost Clocks", [("graphics_clock", "Graphics", "2062 MHz")]),
        ("clock_policy", "Clock Policy", [("auto_boost", "Auto Boost", NA), ("auto_boost_default", "Auto Boost Default", NA)]),
        ("voltage", "Voltage", [("graphics_volt", "Graphics", NA)]),
        ("fabric", "Fabric", [
            ("state", "State", g.fabric_state),
            ("status", "Status", g.fabric_status),
            ("cliqueId", "CliqueId", g.clique_id),
            ("clusterUuid", "ClusterUUID", g.cluster_uuid),
            ("health", "Health", [
                ("bandwidth", "Bandwidth", g.health["bandwidth"]),
                ("route_recovery_in_progress", "Route Recovery in progress", g.health["route_recovery_in_progress"]),
                ("route_unhealthy", "Route Unhealthy", g.health["route_unhealthy"]),
                ("access_timeout_recovery", "Access Timeout Recovery", g.health["access_timeout_recovery"])]),
        ]),
        ("processes", "Processes", ([], "None")),
        ("accounted_processes", None, []),
        ("capabilities", "Capabilities", [("egm", "EGM", "disabled")]),
    ]


def _ecc_rows(dram_unc):
    return [("sram_correctable", "SRAM Correctable", "0"),
            ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity", "0"),
            ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED", "0"),
            ("dram_correctable", "DRAM Correctable", "0"),
            ("dram_uncorrectable", "DRAM Uncorrectable", dram_unc)]


class _Block(str):
    """XML text printed on its own indented line inside the element (e.g. <mig_devices> None)."""


def _xml_nodes(nodes, depth, out):
    pad = "\t" * depth
    for tag, _label, value in nodes:
        if tag is None:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if isinstance(value, _Block):
            out.append("%s<%s>\n%s\t%s\n%s</%s>" % (pad, tag, pad, escape(value), pad, tag))
        elif isinstance(value, list):
            out.append("%s<%s>" % (pad, tag))
            _xml_nodes(value, depth + 1, out)
            out.append("%s</%s>" % (pad, tag))
        else:
            out.append("%s<%s>%s</%s>" % (pad, tag, escape(str(value)), tag))


def render_xml(rack, selected, now=None):
    stamp = time.asctime(time.localtime(now))
    out = ['<?xml version="1.0" ?>',
           '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
           "<nvidia_smi_log>",
           "\t<timestamp>%s</timestamp>" % stamp,
           "\t<driver_version>%s</driver_version>" % escape(rack.state.get("driver_version", "")),
           "\t<cuda_version>%s</cuda_version>" % escape(rack.state.get("cuda_version", "")),
           "\t<attached_gpus>%d</attached_gpus>" % rack.attached]
    for g in selected:
        if g.lost:
            continue
        out.append('\t<gpu id="%s">' % escape(g.bus_id))
        _xml_nodes(_gpu_tree(g), 2, out)
        out.append("\t</gpu>")
        out.append("")
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


_TEXT_KEY_WIDTH = 42


def _text_nodes(nodes, depth, out):
    pad = "    " * depth
    for _tag, label, value in nodes:
        if label is None:
            continue
        if isinstance(value, tuple):
            value = value[1]
        if isinstance(value, list):
            out.append(pad + label)
            _text_nodes(value, depth + 1, out)
        else:
            key = (pad + label).ljust(_TEXT_KEY_WIDTH)
            out.append("%s: %s" % (key, value))


def render_text(rack, selected, now=None):
    stamp = time.asctime(time.localtime(now))
    out = ["", "==============NVSMI LOG==============", "",
           "%s: %s" % ("Timestamp".ljust(_TEXT_KEY_WIDTH), stamp),
           "%s: %s" % ("Driver Version".ljust(_TEXT_KEY_WIDTH), rack.state.get("driver_version", "")),
           "%s: %s" % ("CUDA Version".ljust(_TEXT_KEY_WIDTH), rack.state.get("cuda_version", "")),
           "",
           "%s: %d" % ("Attached GPUs".ljust(_TEXT_KEY_WIDTH), rack.attached)]
    for g in selected:
        if g.lost:
            continue
        out.append("GPU " + g.bus_id)
        _text_nodes(_gpu_tree(g), 1, out)
        out.append("")
    return "\n".join(out) + "\n"


# --- summary table, -L, nvlink --------------------------------------------------------------------

def render_table(rack, selected, now=None):
    st = rack.state
    rule = "+-----------------------------------------+------------------------+----------------------+"
    lines = [time.asctime(time.localtime(now)) + "       ",
             "+" + "-" * 89 + "+",
             "| " + ("NVIDIA-SMI %s" % st.get("driver_version", "")).ljust(34)
             + ("Driver Version: %s" % st.get("driver_version", "")).ljust(31)
             + ("CUDA Version: %s" % st.get("cuda_version", "")).ljust(23) + "|",
             "|" + rule[1:],
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|                                         |                        |               MIG M. |",
             "|=========================================+========================+======================|"]
    shown = [g for g in selected if not g.lost]
    for g in shown:
        name = g.name if len(g.name) <= 29 else g.name[:26] + "..."
        lines.append("|%4d  %-29s%4s  |%19s %3s |%21s |" % (g.index, name, "On", g.bus_id, "Off", g.dram_unc))
        lines.append("|%4s %4dC %5s%15dW / %4dW |%8dMiB / %6dMiB |%7d%%%13s |" % (
            "N/A", g.temperature, "P0", round(g.power_draw), round(g.power_limit),
            g.memory_used, g.memory_total, 0, "Default"))
        lines.append("|%41s|%24s|%21s |" % ("", "", "Disabled"))
        lines.append(rule)
    if not shown:
        lines.append(rule)
    lines += [" " * 89,
              "+" + "-" * 89 + "+",
              "| Processes:" + " " * 78 + "|",
              "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|" + "=" * 89 + "|",
              "|  No running processes found" + " " * 61 + "|",
              "+" + "-" * 89 + "+"]
    return "\n".join(lines) + "\n"


def render_list(rack, selected):
    return "".join("GPU %d: %s (UUID: %s)\n" % (g.index, g.name, g.uuid) for g in selected if not g.lost)


def render_nvlink_status(rack, selected):
    out = []
    for g in selected:
        if g.lost:
            continue
        out.append("GPU %d: %s (UUID: %s)" % (g.index, g.name, g.uuid))
        for link in range(NVLINKS_PER_GPU):
            out.append("\t Link %d: %s" % (link, "<inactive>" if link in g.down_links else NVLINK_SPEED))
    return "\n".join(out) + ("\n" if out else "")


# --- --query-gpu ----------------------------------------------------------------------------------

def _w(value):
    return "%.2f" % value


QUERY_FIELDS = {
    # field: (unit shown in the header and after the value, getter -> str or None for [N/A])
    "index": (None, lambda g: str(g.index)),
    "name": (None, lambda g: g.name),
    "gpu_name": (None, lambda g: g.name),
    "uuid": (None, lambda g: g.uuid),
    "gpu_uuid": (None, lambda g: g.uuid),
    "serial": (None, lambda g: g.serial),
    "gpu_serial": (None, lambda g: g.serial),
    "pci.bus_id": (None, lambda g: g.bus_id),
    "gpu_bus_id": (None, lambda g: g.bus_id),
    "driver_version": (None, lambda g: g.state.get("driver_version")),
    "count": (None, None),
    "temperature.gpu": (None, lambda g: str(g.temperature)),
    "temperature.memory": (None, lambda g: str(g.temperature)),
    "power.draw": ("W", lambda g: _w(g.power_draw)),
    "power.draw.average": ("W", lambda g: _w(g.power_draw)),
    "power.draw.instant": ("W", lambda g: _w(g.power_draw + 0.38)),
    "power.limit": ("W", lambda g: _w(g.power_limit)),
    "enforced.power.limit": ("W", lambda g: _w(g.power_limit)),
    "memory.total": ("MiB", lambda g: str(g.memory_total)),
    "memory.used": ("MiB", lambda g: str(g.memory_used)),
    "memory.free": ("MiB", lambda g: str(max(0, g.memory_total - 799 - g.memory_used))),
    "utilization.gpu": ("%", lambda g: "0"),
    "pstate": (None, lambda g: "P0"),
    "persistence_mode": (None, lambda g: "Enabled"),
    "ecc.mode.current": (None, lambda g: "Enabled"),
    "ecc.errors.uncorrected.volatile.total": (None, lambda g: str(g.dram_unc)),
    "ecc.errors.uncorrected.aggregate.total": (None, lambda g: str(g.dram_unc)),
    "ecc.errors.uncorrected.volatile.dram": (None, lambda g: str(g.dram_unc)),
    "ecc.errors.uncorrected.aggregate.dram": (None, lambda g: str(g.dram_unc)),
    "ecc.errors.corrected.volatile.total": (None, lambda g: "0"),
    "ecc.errors.corrected.aggregate.total": (None, lambda g: "0"),
    "fabric.state": (None, lambda g: g.fabric_state),
    "fabric.status": (None, lambda g: None if g.fabric_status == NA else g.fabric_status),
    "fabric.clusterUuid": (None, lambda g: None if g.cluster_uuid == NA else g.cluster_uuid),
    "fabric.cliqueId": (None, lambda g: None if g.clique_id == NA else g.clique_id),
    "module_id": (None, lambda g: str(g.module_id)),
    "platform.chassis_serial_number": (None, lambda g: str(g.state.get("chassis_serial", ""))),
    "platform.slot_number": (None, lambda g: str(g.state.get("slot_number", 0))),
    "platform.tray_index": (None, lambda g: str(g.state.get("tray_index", 0))),
    "platform.host_id": (None, lambda g: str(g.state.get("host_id", 1))),
    "platform.peer_type": (None, lambda g: "Switch Connected"),
    "platform.module_id": (None, lambda g: str(g.module_id)),
    "platform.gpu_fabric_guid": (None, lambda g: g.guid),
    "gpu_recovery_action": (None, lambda g: g.recovery),
}


def render_query(rack, selected, fields, fmt):
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts or not opts <= {"csv", "noheader", "nounits"}:
        return None
    out = []
    if "noheader" not in opts:
        out.append(", ".join(f if QUERY_FIELDS[f][0] is None else "%s [%s]" % (f, QUERY_FIELDS[f][0]) for f in fields))
    for g in selected:
        if g.lost:
            continue
        cells = []
        for f in fields:
            unit, getter = QUERY_FIELDS[f]
            value = str(rack.attached) if f == "count" else getter(g)
            if value is None or value == "":
                cells.append("[N/A]")
            elif unit and "nounits" not in opts:
                cells.append("%s %s" % (value, unit))
            else:
                cells.append(value)
        out.append(", ".join(cells))
    return "\n".join(out) + "\n"


# --- command line ---------------------------------------------------------------------------------

HELP = """NVIDIA System Management Interface -- mctl lab emulation of nvidia-smi (driver 570)

    nvidia-smi [-i ID] [-L | -q [-x] | --query-gpu=FIELDS --format=csv[,noheader][,nounits]]
    nvidia-smi nvlink --status [-i ID]

    -h,   --help                Print usage information and exit.
    -i,   --id=                 Target a specific GPU (index, PCI bus id or UUID).
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -x,   --xml-format          Produce XML output.
          --query-gpu=          Information about GPU (see QUERY_FIELDS).
          --format=             csv, noheader, nounits.
"""


class _Args:
    def __init__(self):
        self.sub = None
        self.ident = None
        self.list = self.query = self.xml = self.help = self.status = False
        self.query_gpu = None
        self.fmt = None


def _parse(argv):
    args = _Args()
    rest = list(argv)
    if rest and rest[0] == "nvlink":
        args.sub = rest.pop(0)
    i = 0
    while i < len(rest):
        a = rest[i]
        value = None
        if a.startswith("--") and "=" in a:
            a, value = a.split("=", 1)

        def take():
            nonlocal i
            if value is not None:
                return value
            i += 1
            if i >= len(rest):
                raise ValueError(a)
            return rest[i]

        if a in ("-h", "--help"):
            args.help = True
        elif a in ("-i", "--id"):
            args.ident = take()
        elif a in ("-L", "--list-gpus") and args.sub is None:
            args.list = True
        elif a in ("-q", "--query") and args.sub is None:
            args.query = True
        elif a in ("-x", "--xml-format") and args.sub is None:
            args.xml = True
        elif a == "--query-gpu" and args.sub is None:
            args.query_gpu = take()
        elif a == "--format" and args.sub is None:
            args.fmt = take()
        elif a in ("-s", "--status") and args.sub == "nvlink":
            args.status = True
        else:
            raise ValueError(a)
        i += 1
    return args


def main(argv=None, env=None, stdout=None, stderr=None, now=None):
    """Run one nvidia-smi call; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        args = _parse(argv)
    except ValueError:
        stdout.write(INVALID_ARGS_TEXT + "\n")
        return EXIT_INVALID_ARG
    if args.help:
        stdout.write(HELP)
        return EXIT_OK
    if args.query_gpu is not None:
        fields = [f.strip() for f in args.query_gpu.split(",") if f.strip()]
        for f in fields:
            if f not in QUERY_FIELDS:
                stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
                return EXIT_INVALID_ARG
        if not fields or args.fmt is None:
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
    try:
        state, faults = load(env)
    except DriverMissing:
        stdout.write(DRIVER_FAILURE_TEXT + "\n\n")
        return EXIT_DRIVER
    rack = Rack(state, faults)
    selected = rack.select(args.ident)
    if selected is None or (args.ident is None and not rack.gpus):
        stdout.write(NO_DEVICES_TEXT + "\n")
        return EXIT_NOT_FOUND
    messages = list(rack.lost_messages(selected))
    for message in messages:
        stderr.write(message + "\n")
    env = os.environ if env is None else env
    if args.sub == "nvlink":
        if not args.status:
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
        text = render_nvlink_status(rack, selected)
        stdout.write(text)
        if args.ident is None:
            save_replay(env, messages, text, 0)
    elif args.query_gpu is not None:
        text = render_query(rack, selected, fields, args.fmt)
        if text is None:
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
        stdout.write(text)
    elif args.list:
        stdout.write(render_list(rack, selected))
    elif args.query and args.xml:
        text = render_xml(rack, selected, now)
        stdout.write(text)
        if args.ident is None:
            save_replay(env, messages, text, 3)
    elif args.query:
        stdout.write(render_text(rack, selected, now))
    elif args.xml:
        stdout.write(INVALID_ARGS_TEXT + "\n")
        return EXIT_INVALID_ARG
    else:
        stdout.write(render_table(rack, selected, now))
    return EXIT_OK


def save_replay(env, messages, text, time_line):
    """Store this answer for LAUNCHER to replay (see there), when it asked for that; never fails the call.

    time_line: the index of the -q -x <timestamp> line, which the launcher prints anew; 0 for none.
    """
    path, key = env.get(REPLAY_FILE_ENV), env.get(REPLAY_KEY_ENV)
    if not path or not key:
        return
    lines = text.split("\n")
    if time_line:
        if not lines[time_line].startswith("\t<timestamp>"):
            return
        before, rest, fmt = lines[:time_line], "\n".join(lines[time_line + 1:]), XML_TIME_FORMAT
    else:
        before, rest, fmt = [], text, ""
    errors = [line for message in messages for line in message.split("\n")]
    head = [key, str(EXIT_OK), str(len(errors)), str(len(before)), fmt, *errors, *before]
    tmp = "%s.%d" % (path, os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("\n".join(head) + "\n" + rest)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def run() -> None:
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(EXIT_OK)


if __name__ == "__main__":
    run()
