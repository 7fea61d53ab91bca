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
  nvlink_all_down [g]      every link of GPU g down: `nvlink --status` prints, under the GPU line,
                           "NVML: Unable to retrieve NVLink information as all links are inActive"
                           (leptonai/gpud issue 1085, B200); fabric Bandwidth "Degraded".
  nvlink_flap [{gpu, link, since, period}]
                           the link is down for the first half of every `period` seconds since `since`
                           and up for the second half: computed from the clock on every call (no daemon).
  fell_off_bus [g]         GPU g fell off the bus without an Xid line (the kernel-log form is written by
                           `mctl lab fault`, see fell_off_bus_lines); nvidia-smi shows it lost, as for 79.
  xid_storm [{gpu, code, nonfatal, since}]
                           while set, every call appends the kernel-log lines the storm produced since the
                           previous call (STORM_RATE a second, at most STORM_MAX_APPEND a call).
  smi_hang                 every call blocks (the wedged-driver case: nvidia-smi in D state) until the
                           fault is cleared; the launcher's replay key includes faults.json, so it hangs too.
  nvlink_errors [{gpu, link, rate, since}]
                           `nvlink -e`: the link's "Rx Errors" counter grows by `rate` a second since `since`
                           (computed from the clock on every call); every other counter stays 0.
  clock_events [{gpu, reason}]
                           -q -x: <clocks_event_reason_REASON> of GPU gpu "Active" (hw_slowdown,
                           hw_power_brake_slowdown, hw_thermal_slowdown, sw_thermal_slowdown, sw_power_cap).
  gpu_processes [{gpu, pid, name}]
                           compute processes holding GPU gpu: `--query-compute-apps` lists them and a
                           `--gpu-reset` of that GPU is refused ("In use by another client").
  persistence_off [g]      driver state, not a fault: persistence mode of GPU g is Disabled (`-pm 0` writes
                           it, `-pm 1` removes it); a `--gpu-reset` is refused while persistence mode is on.
                           A reset that goes through ends the GPU's XIDs' lasting effects (its xid entries).
  driver_branch "535"|"570"|"580"
                           the -q -x / -q element tree of that driver branch (see BRANCHES), overriding
                           gpus.json's own driver_branch (default: the branch of its driver_version).
A missing gpus.json is a tray without a working driver: the real failure message, exit 9.
"""

from __future__ import annotations

import marshal
import os
import signal
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
  "nvlink -e") c=nvlink-e ;;
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

# --- real kernel-log forms (sources in docs/lab.md, "Real forms the lab emits") -----------------------
# NVLink5 XIDs 144-150 (GB200/B200) print the unit, the word Fatal or Nonfatal, the cross-containment
# domain, the injection flag, the link and the interrupt words, and no pid/name. Templates are real
# lines with the link number made a field; {link} is printed as %02d like the real "Link 09"/"Link 13".
# Key: (code, fatal).
NVLINK5_XIDS = range(144, 151)
NVLINK5_LINES = {
    # gpud PR 1174 (GB200, PCI 0018:01:00): a real RLW_RXPIPE line
    (145, False): "RLW_RXPIPE Nonfatal XC0 i0 Link {link:02d} (0x0409a0c2 0x00000008 0x00000001 0x00000000 "
                  "0x00100000 0x00000004)",
    # NVIDIA/NVSentinel syslog-health-monitor test data (GB200, PCI 0018:01:00), spacing as printed
    (149, True): "NETIR_LINK_EVT  Fatal   XC0 i0 Link {link:02d} (0x025525c6 0x00000000 0x00000000 0x00000000 "
                 "0x00000000 0x00000000)",
    # gpud NVLink XID parser test data (PCI 0018:01:00)
    (149, False): "NETIR_BER_EVENT Nonfatal XC0 i0 Link {link:02d} (0x00086226 0x00000001 0x00000000 0x00000000 "
                  "0x00000000 0x00000000)",
    # gpud PR 1160: a real SAW_MVB line
    (144, False): "SAW_MVB Nonfatal XC0 i0 Link {link:02d} (0x00000001 0x00000008 0x00000000 0x00000000 "
                  "0x00000000 0x00000000)",
}
# Units for the other codes and severities (no real line found): the catalogue's unit of the code in the
# real line shape above (Nonfatal single-spaced as in the 145 sample, Fatal padded as in the 149 sample).
NVLINK5_UNITS = {144: "SAW_MVB", 145: "RLW_SRC_TRACK", 146: "TLW_RX_PIPE1", 147: "TREX", 148: "NVLPW_CTRL",
                 149: "NETIR_LINK_EVT", 150: "MSE"}
# XID 154: the new recovery action, as real drivers print it (NVIDIA's XID catalogue lists the observed
# transitions 0x0 -> 0x1, 0x2, 0x4; the 0x4 line is real, NVSentinel / a GB200 journal).
RECOVERY_ACTIONS = {"reset": (0x1, "GPU Reset Required", "Reset"),
                    "reboot": (0x2, "Node Reboot Required", "Reboot"),
                    "drain-reset": (0x4, "Drain and Reset", "Drain and Reset")}
NVLINK_ALL_INACTIVE_TEXT = "NVML: Unable to retrieve NVLink information as all links are inActive"
STORM_RATE = 20                # lines a second while an XID storm is set
STORM_MAX_APPEND = 2000        # most lines one call appends (a tray left stormed for hours stays bounded)
STORM_BURST = 500              # lines `mctl lab fault gpu --xid-storm` writes at once
KERN_LOG_PATH = "/var/log/kern.log"
KERN_LOG_ENV = "MCTL_LAB_KERN_LOG"
FLAP_PERIOD_S = 6.0            # --nvlink-flap: down 3 s, up 3 s


def nvlink5_message(code, link=13, nonfatal=False):
    """The text after `NN, ` of a real NVLink5 XID line (144-150)."""
    code = int(code)
    template = NVLINK5_LINES.get((code, not nonfatal))
    if template is None:
        unit = NVLINK5_UNITS.get(code, "NVLINK")
        if nonfatal:
            template = unit + " Nonfatal XC0 i0 Link {link:02d} (0x00000001 0x00000001 0x00000000 0x00000000 " \
                              "0x00000000 0x00000000)"
        else:
            template = unit + "  Fatal   XC0 i0 Link {link:02d} (0x00000001 0x00000002 0x00000000 0x00000000 " \
                              "0x00000000 0x00000000)"
    return template.format(link=int(link))


def recovery_message(action="drain-reset"):
    code, label, _smi = RECOVERY_ACTIONS[action]
    return "GPU recovery action changed from 0x0 (None) to 0x%x (%s)" % (code, label)


# xid_log_line's texts for these codes are the real ones too (event_line also drops the pid/name for them)
XID_MESSAGES.update({code: nvlink5_message(code) for code in NVLINK5_XIDS})
XID_MESSAGES[154] = recovery_message()


def kernel_log_line(hostname, when, uptime, text):
    """`Mon dd HH:MM:SS host kernel: [uptime] text` as rsyslog writes kernel messages to kern.log."""
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(when))
    stamp = stamp[:4] + ("%2d" % int(stamp[4:6])) + stamp[6:]
    return "%s %s kernel: [%12.6f] %s" % (stamp, hostname, uptime, text)


def event_line(hostname, pci_bus_id, code, when=None, *, uptime=None, nonfatal=False, link=13,
               recovery="drain-reset"):
    """The kernel-log line for an XID as the real driver words it: NVLink5 (144-150) and 154 lines carry
    no pid/name; every other code goes through xid_log_line."""
    code = int(code)
    when = time.time() if when is None else float(when)
    if uptime is None:
        uptime = max(0.0, when - _boot_time(when))
    if code in NVLINK5_XIDS:
        text = nvlink5_message(code, link, nonfatal)
    elif code == 154:
        text = recovery_message(recovery)
    else:
        return xid_log_line(hostname, pci_bus_id, code, when=when, uptime=uptime)
    return kernel_log_line(hostname, when, uptime, "NVRM: Xid (PCI:%s): %d, %s" % (kernel_pci(pci_bus_id), code, text))


def fell_off_bus_lines(hostname, pci_bus_id, device_id="2941", when=None, *, uptime=None):
    """A GPU that fell off the bus, logged without any Xid line (NVIDIA/NVSentinel issue 155; the driver's
    nv_printf in open-gpu-kernel-modules): one printk of three lines, then the failed probe. The kernel's
    syslog interface prefixes every line of a multi-line record, so kern.log holds each with the same stamp."""
    when = time.time() if when is None else float(when)
    if uptime is None:
        uptime = max(0.0, when - _boot_time(when))
    domain, bus, rest = pci_bus_id.split(":")
    dev, fn = rest.split(".")
    pci = "%04x:%02x:%02x.%x" % (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16))
    texts = [("NVRM: The NVIDIA GPU %s" % pci, uptime),
             ("NVRM: (PCI ID: 10de:%s) installed in this system has" % device_id.lower(), uptime),
             ("NVRM: fallen off the bus and is not responding to commands.", uptime),
             ("nvidia: probe of %s failed with error -1" % pci, uptime + 0.000173),
             ("NVRM: The NVIDIA probe routine failed for 1 device(s).", uptime + 0.064169)]
    return [kernel_log_line(hostname, when, up, text) for text, up in texts]


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


# Driver branches a tray can run (gpus.json "driver_branch", or `mctl lab fault gpu TRAY --driver-branch B`):
# version and CUDA version printed, and the element tree differences (see _branch_tree; sources in
# docs/lab.md). 570 is the shape of the real GB200 capture in tests/fixtures/gb200-nvidia-smi-q-x.xml.
BRANCHES = {"535": ("535.129.03", "12.2"), "570": ("570.148.08", "12.8"), "580": ("580.105.08", "13.0")}


def driver_branch(state, faults):
    """The branch this tray's driver speaks: the fault's, gpus.json's, else its driver version's major."""
    for value in ((faults or {}).get("driver_branch"), state.get("driver_branch")):
        if value and str(value) in BRANCHES:
            return str(value)
    major = str(state.get("driver_version") or "570").split(".")[0]
    return major if major in BRANCHES else "570"


def driver_versions(state, faults):
    """(driver version, CUDA version) printed: gpus.json's unless a --driver-branch fault changed the branch."""
    branch = (faults or {}).get("driver_branch")
    if branch and str(branch) in BRANCHES:
        return BRANCHES[str(branch)]
    return state.get("driver_version", ""), state.get("cuda_version", "")


def _fmt_w(value):
    return NA if value is None else "%.2f W" % float(value)


class GpuView:
    """One GPU as the driver would show it, state and faults combined."""

    def __init__(self, state, gpu, faults, index, now=None):
        self.state = state
        self.branch = driver_branch(state, faults)
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
        self.driver_version = driver_versions(state, faults)[0] or "570.148.08"

        ecc = faults.get("ecc_uncorrectable") or {}
        self.dram_unc = int(ecc.get(str(self.id), ecc.get(self.id, 0)) or 0)
        mine = [x for x in (faults.get("xid") or []) + (faults.get("xid_storm") or []) if int(x.get("gpu", -1)) == self.id]
        xids = {int(x.get("code")) for x in mine}
        fatal5 = any(int(x.get("code")) in NVLINK5_XIDS and not x.get("nonfatal") for x in mine)
        self.lost = bool(xids & LOST_XIDS) or self.id in {int(i) for i in faults.get("fell_off_bus") or []}
        self.recovery = "Reset" if (self.dram_unc or xids & RESET_XIDS or fatal5) else "None"
        for x in mine:                   # XID 154 names the action itself (the latest one wins)
            if int(x.get("code")) == 154:
                self.recovery = RECOVERY_ACTIONS.get(x.get("recovery") or "drain-reset",
                                                     RECOVERY_ACTIONS["drain-reset"])[2]
        self.down_links = sorted({int(link) for gpu_id, link in faults.get("nvlink_down") or [] if int(gpu_id) == self.id}
                                 | set(flapping_down(faults, self.id, now)))
        self.all_links_down = self.id in {int(i) for i in faults.get("nvlink_all_down") or []}
        self.persistence = "Disabled" if self.id in {int(i) for i in faults.get("persistence_off") or []} else "Enabled"
        self.processes = [p for p in faults.get("gpu_processes") or [] if int(p.get("gpu", -1)) == self.id]
        self.clock_active = {str(c.get("reason")) for c in faults.get("clock_events") or [] if int(c.get("gpu", -1)) == self.id}
        t = time.time() if now is None else now
        self.link_errors = {int(e["link"]): int(max(0.0, float(e["rate"]) * (t - float(e["since"]))))
                            for e in faults.get("nvlink_errors") or [] if int(e.get("gpu", -1)) == self.id}
        if self.all_links_down:
            self.down_links = list(range(NVLINKS_PER_GPU))
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


def flapping_down(faults, gpu_id, now=None):
    """Links of GPU *gpu_id* that a --nvlink-flap fault has down at *now*: down for the first half of each
    period since the fault was set, up for the second half."""
    now = time.time() if now is None else float(now)
    out = []
    for f in faults.get("nvlink_flap") or []:
        try:
            if int(f.get("gpu", -1)) != gpu_id:
                continue
            period = float(f.get("period") or FLAP_PERIOD_S)
            if ((now - float(f.get("since") or 0.0)) % period) < period / 2:
                out.append(int(f.get("link")))
        except (TypeError, ValueError, AttributeError):
            continue
    return out


def time_dependent(faults):
    """Whether this tray's answers change with the clock (then the launcher must not replay them)."""
    return bool(faults.get("nvlink_flap") or faults.get("xid_storm") or faults.get("nvlink_errors"))


class Rack:
    """The GPUs of one tray as the driver enumerates them."""

    def __init__(self, state, faults, now=None):
        self.state = state
        self.faults = faults
        self.branch = driver_branch(state, faults)
        self.versions = driver_versions(state, faults)
        missing = {int(i) for i in faults.get("gpu_missing") or []}
        present = [g for g in sorted(state.get("gpus") or [], key=lambda g: int(g["index"])) if int(g["index"]) not in missing]
        self.gpus = [GpuView(state, g, faults, i, now) for i, g in enumerate(present)]
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
    ver = g.driver_version
    return _branch_tree(g.branch, g, [
        ("product_name", "Product Name", g.name),
        ("product_brand", "Product Brand", "NVIDIA"),
        ("product_architecture", "Product Architecture", "Blackwell"),
        ("display_mode", "Display Mode", "Enabled"),
        ("display_active", "Display Active", "Disabled"),
        ("persistence_mode", "Persistence Mode", g.persistence),
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
            ("clocks_event_reason_" + tag, label, "Active" if tag in g.clock_active else "Not Active")
            for tag, label in (
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
    ])


def _branch_tree(branch, g, tree):
    """The element tree of driver branch *branch*, from the R570 tree.

    R535: power readings are `power_draw` with `current/requested/default/min/max_power_limit` (the
    average/instant split came later) in gpu_, gpu_memory_ and module_power_readings.
    R580: `ecc_errors` ends with `channel_repair_pending`, `tpc_repair_pending` and `unrepairable_memory`
    ("Channel Repair Pending", "TPC Repair Pending", "Unrepairable Memory" in -q).
    """
    if branch == "570":
        return tree
    out = []
    for tag, label, value in tree:
        if branch == "535" and tag in ("gpu_power_readings", "module_power_readings"):
            kept = [n for n in value if n[0] in ("power_state",)]
            draw = next(v for t, _l, v in value if t == "average_power_draw")
            kept.append(("power_draw", "Power Draw", draw))
            kept += [n for n in value if n[0] in ("current_power_limit", "requested_power_limit", "default_power_limit",
                                                  "min_power_limit", "max_power_limit")]
            value = kept
        elif branch == "535" and tag == "gpu_memory_power_readings":
            value = [("power_draw", "Power Draw", next(v for t, _l, v in value if t == "average_power_draw"))]
        elif branch == "580" and tag == "ecc_errors":
            value = list(value) + [("channel_repair_pending", "Channel Repair Pending", "No"),
                                   ("tpc_repair_pending", "TPC Repair Pending", "No"),
                                   ("unrepairable_memory", "Unrepairable Memory", "No")]
        out.append((tag, label, value))
    return out


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
           "\t<driver_version>%s</driver_version>" % escape(rack.versions[0]),
           "\t<cuda_version>%s</cuda_version>" % escape(rack.versions[1]),
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
           "%s: %s" % ("Driver Version".ljust(_TEXT_KEY_WIDTH), rack.versions[0]),
           "%s: %s" % ("CUDA Version".ljust(_TEXT_KEY_WIDTH), rack.versions[1]),
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
             "| " + ("NVIDIA-SMI %s" % rack.versions[0]).ljust(34)
             + ("Driver Version: %s" % rack.versions[0]).ljust(31)
             + ("CUDA Version: %s" % rack.versions[1]).ljust(23) + "|",
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
        if g.all_links_down:
            out.append(NVLINK_ALL_INACTIVE_TEXT)
            continue
        for link in range(NVLINKS_PER_GPU):
            out.append("\t Link %d: %s" % (link, "<inactive>" if link in g.down_links else NVLINK_SPEED))
    return "\n".join(out) + ("\n" if out else "")


# `nvlink -e` on Blackwell: the NVLink5 counter names (docs/lab.md: the names a B300 on driver 595.91.07 prints)
# in the line shape of the real H100 capture (tests/fixtures/real/ml-engineering-nvlink-e-h100.txt: nine spaces,
# `Link N: NAME: VALUE`, a blank line after each link), the FEC buckets and the BER floor after them.
NVLINK5_COUNTERS = ("Malformed packet Errors", "Buffer overrun Errors", "Rx Errors", "Rx remote Errors",
                    "Rx General Errors", "Local link integrity Errors", "Tx discards",
                    "Link recovery successful events", "Link recovery failed events", "Total link recovery events",
                    "Effective Errors", "Symbol Errors")
FEC_BUCKET0 = 36140749276          # the corrected-codeword bucket reads in the billions on a healthy link


def render_nvlink_errors(rack, selected):
    out = []
    for g in selected:
        if g.lost:
            continue
        out.append("GPU %d: %s (UUID: %s)" % (g.index, g.name, g.uuid))
        if g.all_links_down:
            out.append(NVLINK_ALL_INACTIVE_TEXT)
            continue
        for link in range(NVLINKS_PER_GPU):
            for name in NVLINK5_COUNTERS:
                value = g.link_errors.get(link, 0) if name == "Rx Errors" else 0
                out.append("         Link %d: %s: %d" % (link, name, value))
            out.append("         Link %d: FEC Errors - 0: %d" % (link, FEC_BUCKET0))
            for bucket in range(1, 16):
                out.append("         Link %d: FEC Errors - %d: 0" % (link, bucket))
            out.append("         Link %d: Effective BER: 15e-255" % link)
            out.append("         Link %d: Symbol BER: 15e-255" % link)
            out.append("")
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
    "driver_version": (None, lambda g: g.driver_version),
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
    "persistence_mode": (None, lambda g: g.persistence),
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
    nvidia-smi nvlink -e [-i ID]

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
        self.list = self.query = self.xml = self.help = self.status = self.errors = False
        self.query_gpu = None
        self.query_apps = None
        self.fmt = None
        self.reset = False
        self.pm = None


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
        elif a == "--query-compute-apps" and args.sub is None:
            args.query_apps = take()
        elif a in ("-r", "--gpu-reset") and args.sub is None:
            args.reset = True
        elif a in ("-pm", "--persistence-mode") and args.sub is None:
            args.pm = take()
        elif a == "--format" and args.sub is None:
            args.fmt = take()
        elif a in ("-s", "--status") and args.sub == "nvlink":
            args.status = True
        elif a in ("-e", "--errorcounters") and args.sub == "nvlink":
            args.errors = True
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
    if args.query_apps is not None or args.reset or args.pm is not None:
        return _manage(args, env, stdout, stderr, now)
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
        if faults.get("smi_hang"):
            state, faults = hang_while_set(env)     # the driver may also go away under the wedge
    except DriverMissing:
        stdout.write(DRIVER_FAILURE_TEXT + "\n\n")
        return EXIT_DRIVER
    if faults.get("xid_storm"):
        storm_append(state, faults, env, now)
    rack = Rack(state, faults, now)
    selected = rack.select(args.ident)
    if selected is None or (args.ident is None and not rack.gpus):
        stdout.write(NO_DEVICES_TEXT + "\n")
        return EXIT_NOT_FOUND
    messages = list(rack.lost_messages(selected))
    for message in messages:
        stderr.write(message + "\n")
    env = os.environ if env is None else env
    if time_dependent(faults):           # a flapping link or a storm: every call must compute its answer
        env = {k: v for k, v in env.items() if k not in (REPLAY_FILE_ENV, REPLAY_KEY_ENV)}
    if args.sub == "nvlink":
        if args.status == args.errors:
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
        text = render_nvlink_status(rack, selected) if args.status else render_nvlink_errors(rack, selected)
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


# --- the burn-in and evidence tools' own faults (faults.json "tool_faults": {tool: mode}) -----------
# Used by the lab's dcgmi, all_reduce_perf and nvidia-bug-report.sh (dcgmi.py, nccl_tests.py, bug_report.py).

def tool_fault(faults, tool):
    return str(((faults or {}).get("tool_faults") or {}).get(tool) or "")


def misbehave(mode, tool, text, env=None, stdout=None):
    """The tool-level faults: never returns for hang (until cleared) and crash. *text*: what a sane run prints."""
    stdout = stdout or sys.stdout
    if mode == "hang":
        while True:                      # a wedged tool: ends when the fault is cleared or on a signal
            time.sleep(0.25)
            _state, faults = load(env)
            if tool_fault(faults, tool) != "hang":
                return None
    if mode == "crash":
        stdout.write(text[: len(text) // 3])
        stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)
        os._exit(139)
    if mode == "garbage":
        return "\x1b[2J#@!\xff" + "".join(chr(33 + (i * 7919) % 90) for i in range(400)) + "\n"
    if mode == "truncated":
        return text[: max(1, len(text) // 2)]
    return None


def write_output(tool, text, faults, env=None, stdout=None):
    """A burn-in tool's output as its tool fault leaves it (hang and crash never return), written out."""
    stdout = stdout or sys.stdout
    mode = tool_fault(faults, tool)
    bad = misbehave(mode, tool, text, env, stdout) if mode else None
    stdout.write(text if bad is None else bad)


# --- management: compute processes, persistence mode, GPU reset -----------------------------------

APP_FIELDS = {"gpu_bus_id": lambda g, p: g.bus_id, "gpu_uuid": lambda g, p: g.uuid, "pid": lambda g, p: str(p["pid"]),
              "process_name": lambda g, p: str(p.get("name") or "python3"), "used_memory": lambda g, p: "1024 MiB"}
RESET_IN_USE = ("%d device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
                "application, graphics application such as an X server, or a monitoring application such as another "
                "instance of nvidia-smi). Please first kill all processes using this device and all compute "
                "applications running in the system.")


def _write_faults(env, doc):
    import json

    path = (env or os.environ).get(FAULTS_ENV) or FAULTS_PATH
    tmp = "%s.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def _manage(args, env, stdout, stderr, now):
    try:
        state, faults = load(env)
    except DriverMissing:
        stdout.write(DRIVER_FAILURE_TEXT + "\n\n")
        return EXIT_DRIVER
    rack = Rack(state, faults, now)
    selected = rack.select(args.ident)
    if selected is None or not rack.gpus:
        stdout.write(NO_DEVICES_TEXT + "\n")
        return EXIT_NOT_FOUND
    if args.query_apps is not None:
        fields = [f.strip() for f in args.query_apps.split(",") if f.strip()]
        if not fields or any(f not in APP_FIELDS for f in fields) or args.fmt is None \
                or "csv" not in args.fmt.split(","):
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
        out = [] if "noheader" in args.fmt else [", ".join(fields)]
        out += [", ".join(APP_FIELDS[f](g, p) for f in fields) for g in selected if not g.lost for p in g.processes]
        stdout.write("".join(line + "\n" for line in out))
        return EXIT_OK
    if args.pm is not None:
        if args.pm not in ("0", "1", "ENABLED", "DISABLED"):
            stdout.write(INVALID_ARGS_TEXT + "\n")
            return EXIT_INVALID_ARG
        on = args.pm in ("1", "ENABLED")
        off = {int(i) for i in faults.get("persistence_off") or []}
        for g in selected:
            off = (off - {g.id}) if on else (off | {g.id})
            stdout.write("%s persistence mode for GPU %s.\n" % ("Enabled" if on else "Disabled", g.bus_id))
        faults = dict(faults, persistence_off=sorted(off))
        _write_faults(env, faults)
        stdout.write("All done.\n")
        return EXIT_OK
    # --gpu-reset: refused while anything holds a GPU (a process, or the driver kept up by persistence mode)
    held = [g for g in selected if g.processes or g.persistence == "Enabled"]
    if held:
        stdout.write("The following GPUs could not be reset:\n")
        for g in held:
            stdout.write("  GPU %s: In use by another client\n" % g.bus_id)
        stdout.write("\n" + RESET_IN_USE % len(held) + "\n")
        return 255
    ids = {g.id for g in selected}
    for key in ("xid", "xid_storm"):
        if faults.get(key):
            faults[key] = [x for x in faults[key] if int(x.get("gpu", -1)) not in ids]
    faults = dict(faults, fell_off_bus=[i for i in faults.get("fell_off_bus") or [] if int(i) not in ids])
    _write_faults(env, faults)
    for g in selected:
        stdout.write("GPU %s was successfully reset.\n" % g.bus_id)
    stdout.write("All done.\n")
    return EXIT_OK


def hang_while_set(env, poll=0.25):
    """Block for as long as the tray's faults say smi_hang: a wedged driver leaves nvidia-smi (and every
    NVML caller) stuck. Returns the state once the fault is cleared (the lab's nicety: stuck calls end
    with the wedge instead of piling up). Only a signal (the caller's timeout) ends it earlier."""
    while True:
        time.sleep(poll)
        state, faults = load(env)          # DriverMissing: the driver went away under the wedge
        if not faults.get("smi_hang"):
            return state, faults


def storm_append(state, faults, env=None, now=None):
    """Append to kern.log the lines each XID storm produced since the last call (STORM_RATE a second, at
    most STORM_MAX_APPEND), remembering the time in a mark file beside faults.json. Never fails the call."""
    import fcntl

    env = os.environ if env is None else env
    now = time.time() if now is None else float(now)
    faults_path = env.get(FAULTS_ENV) or FAULTS_PATH
    mark = os.path.join(os.path.dirname(faults_path), ".xid-storm.mark")
    log = env.get(KERN_LOG_ENV) or KERN_LOG_PATH
    try:
        with open(mark, "a+", encoding="ascii") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read().strip()
            lines = []
            for storm in faults.get("xid_storm") or []:
                since = float(storm.get("since") or now)
                try:
                    last = max(since, float(text)) if text else since
                except ValueError:
                    last = since
                count = min(STORM_MAX_APPEND, int((now - last) * STORM_RATE))
                if count <= 0:
                    continue
                lines += storm_lines(state, storm, count, last, now)
            if lines:
                with open(log, "a", encoding="utf-8") as out:
                    out.write("\n".join(lines) + "\n")
            if lines or not text:
                fh.seek(0)
                fh.truncate()
                fh.write(repr(now))
    except OSError:
        pass


def storm_lines(state, storm, count, start, end):
    """*count* kernel-log lines of one storm, evenly spread over (start, end]."""
    gpu = int(storm.get("gpu") or 0)
    pci = next((g["pci_bus_id"] for g in state.get("gpus") or [] if int(g["index"]) == gpu), "00000000:00:00.0")
    host = state.get("hostname") or "localhost"
    step = (end - start) / count if count else 0.0
    boot = _boot_time(end)
    out = []
    for i in range(count):
        when = start + step * (i + 1)
        out.append(event_line(host, pci, storm.get("code"), when, uptime=max(0.0, when - boot),
                              nonfatal=bool(storm.get("nonfatal")), link=int(storm.get("link", 13))))
    return out


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
