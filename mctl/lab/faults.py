"""Injected faults on a lab host (pure): the faults.json document of the lab contract.

A fault is state, not an event: it stays in the host's faults.json (and so in
every nvidia-smi call) until `mctl lab fault clear HOST`. XIDs are the one
exception that also leave an event behind, a kernel-log line, as on real trays.

faults.json holds three families, one `mctl lab fault` target each (TARGETS): the
GPU faults of a compute tray, the host's own (freeze, hang, slow; plus the events
sshd-restart and reboot), and its daemons (service). A tray's BMC and a rack's
NMX-M keep their faults in files of their own (bmc_faults.py, nmx_faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mctl.errors import UsageError
from mctl.lab.gpus import GPUS_PER_TRAY

FABRIC_FAULTS = ("in-progress", "degraded", "unhealthy")
NVLINKS_PER_GPU = 18          # NVLink 5: 18 links per Blackwell GPU


def empty() -> dict:
    return {"fabric": None, "gpu_missing": [], "nvlink_down": [], "ecc_uncorrectable": {}, "xid": [],
            "unreachable": False, "hang": False}


def normalize(doc: dict | None) -> dict:
    """Fill in keys an older or hand-written faults.json lacks."""
    out = empty()
    for key, value in (doc or {}).items():
        if (key in out or key in _emulator_empty()) and value is not None:
            out[key] = value
    _normalize_host_faults(doc or {}, out)
    return out


def active(doc: dict | None) -> list[str]:
    """Short human labels of the faults in *doc* (empty when healthy)."""
    d = normalize(doc)
    labels = []
    if d["fabric"]:
        labels.append(f"fabric {d['fabric']}")
    labels += [f"gpu{g} missing" for g in d["gpu_missing"]]
    labels += [f"nvlink gpu{g}:link{link} down" for g, link in d["nvlink_down"]]
    labels += [f"gpu{g} ecc uncorrectable {n}" for g, n in sorted(d["ecc_uncorrectable"].items())]
    labels += [f"xid {x['code']} gpu{x['gpu']}" for x in d["xid"]]
    if d["unreachable"]:
        labels.append("unreachable")
    if d["hang"]:
        labels.append("hang")
    labels += _emulator_labels(d)
    labels += _host_fault_labels(d)
    return labels


@dataclass(frozen=True)
class FaultRequest:
    """What one `mctl lab fault` call asks for; several faults may be combined.

    *target* is the family the call is for (`mctl lab fault gpu|host|service`): only its faults may be
    given, and with *clear* only its faults are cleared. None (the library's callers) takes any mix, and
    *clear* then clears every family.
    """

    xid: int | None = None
    gpu: int | None = None
    fabric: str | None = None
    gpu_missing: int | None = None
    nvlink_down: str | None = None          # "GPU:LINK"
    ecc_uncorrectable: int | None = None
    unreachable: bool = False
    hang: bool = False
    clear: bool = False
    # GPU-emulator faults (the nvidia-smi side; see the block "GPU emulator faults" below)
    nonfatal: bool = False                  # with --xid 144..150: the Nonfatal line
    recovery_action: str | None = None      # with --xid 154: reset | reboot | drain-reset
    fell_off_bus: bool = False              # with --gpu N
    nvlink_flap: str | None = None          # "GPU:LINK"
    xid_storm: int | None = None            # CODE, with --gpu N
    smi_hang: bool = False
    driver_branch: str | None = None        # "535" | "570" | "580"
    tool_fault: str | None = None           # "TOOL:MODE": a burn-in or evidence tool misbehaves (TOOL_FAULTS)
    nvlink_errors: str | None = None        # "GPU:LINK:RATE": the link's Rx Errors grow RATE a second
    clock_event: str | None = None          # "GPU:REASON": a clock-event reason Active (CLOCK_EVENTS)
    gpu_process: str | None = None          # "GPU:NAME": a compute process holds the GPU (nvidia-smi lists it)
    # process, transport and host faults (see HOST_FAULTS below)
    slow: float | None = None               # seconds every command waits before it runs
    sshd_restart: bool = False              # event: sshd and every open connection killed, sshd comes back
    reboot: bool = False                    # event: the host stops and starts again with a new boot id
    down_for: float | None = None           # with --reboot: seconds the host stays off (default REBOOT_DOWN_S)
    slurmd_down: bool = False
    imex_crash: bool = False
    slurmctld_down: bool = False
    target: str | None = None               # one of TARGETS, or None: any family

    def is_empty(self) -> bool:
        return not self.clear and not any(given(self, t) for t in TARGETS)

    def events(self) -> list[str]:
        """The one-off events asked for (they change the host, not faults.json)."""
        return [name for name, on in (("sshd-restart", self.sshd_restart), ("reboot", self.reboot)) if on]


# --- the families of faults.json: `mctl lab fault TARGET` ------------------------------------------

TARGETS = ("gpu", "host", "service")
# FaultRequest fields of each target
FIELDS = {"gpu": ("xid", "gpu", "fabric", "gpu_missing", "nvlink_down", "ecc_uncorrectable", "nonfatal",
                  "recovery_action", "fell_off_bus", "nvlink_flap", "xid_storm", "smi_hang", "driver_branch",
                  "tool_fault", "nvlink_errors", "clock_event", "gpu_process"),
          "host": ("unreachable", "hang", "slow", "sshd_restart", "reboot", "down_for"),
          "service": ("slurmd_down", "imex_crash", "slurmctld_down")}
# what each target's flags are, for "no fault given"
OPTIONS = {"gpu": "--xid CODE --gpu N, --fabric STATE, --gpu-missing N, --nvlink-down GPU:LINK, "
                  "--ecc-uncorrectable N --gpu N, --fell-off-bus --gpu N, --nvlink-flap GPU:LINK, "
                  "--xid-storm CODE --gpu N, --smi-hang, --driver-branch B, --tool-fault TOOL:MODE, "
                  "--nvlink-errors GPU:LINK:RATE, --clock-event GPU:REASON, --gpu-process GPU:NAME",
           "host": "--freeze (--unreachable), --hang, --slow SECONDS, --sshd-restart, --reboot [--down-for SECONDS]",
           "service": "--slurmd-down, --imex-crash, --slurmctld-down"}
EXAMPLES = {"gpu": "mctl lab fault gpu lab-r1-tray03 --xid 79 --gpu 0",
            "host": "mctl lab fault host lab-r1-tray03 --freeze",
            "service": "mctl lab fault service lab-r1-tray03 --slurmd-down"}


def _flag(field: str) -> str:
    return "--freeze" if field == "unreachable" else "--" + field.replace("_", "-")


def _asked(req: FaultRequest, field: str) -> bool:
    value = getattr(req, field)
    return value is not None and value is not False        # GPU 0 and --slow 0 are given


def given(req: FaultRequest, target: str) -> bool:
    """Whether *req* asks for a fault of *target*'s family."""
    return any(_asked(req, f) for f in FIELDS[target])


def cleared(doc: dict | None, target: str | None) -> dict:
    """The faults document with *target*'s faults removed (None: every fault)."""
    if target is None:
        return empty()
    d = normalize(doc)
    base = empty()
    if target == "gpu":
        for key in ("fabric", "gpu_missing", "nvlink_down", "ecc_uncorrectable", "xid"):
            d[key] = base[key]
        for key in _emulator_empty():
            d.pop(key, None)
    elif target == "host":
        d["unreachable"], d["hang"] = False, False
        d.pop("slow", None)
    else:
        for key in ("slurmd_down", "imex_crash", "slurmctld_down"):
            d.pop(key, None)
    return d


def _validate_target(req: FaultRequest) -> None:
    if req.target is None:
        return
    if req.target not in TARGETS:
        raise UsageError(f"{req.target!r} is not a target of faults.json", hint=f"one of {', '.join(TARGETS)}")
    for other in TARGETS:
        if other != req.target:
            stray = [f for f in FIELDS[other] if _asked(req, f)]
            if stray:
                raise UsageError(f"{_flag(stray[0])} is a {other} fault, not a {req.target} one",
                                 hint=f"mctl lab fault {other} HOST {_flag(stray[0])} ...")


def _no_fault_hint(target: str | None) -> str:
    if target is not None:
        return f"give one of {OPTIONS[target]}; e.g. {EXAMPLES[target]}"
    return "give one of " + "; ".join(f"{t}: {OPTIONS[t]}" for t in TARGETS) + "; or clear"


def check_delay(value: float, option: str, maximum: float) -> None:
    """A delay fault's seconds: above 0 and at most *maximum* (NaN refused)."""
    if value != value or not 0 < value <= maximum:
        raise UsageError(f"{option} {value:g}: not a delay in seconds",
                         hint=f"give seconds above 0 and at most {maximum:g}, e.g. {option} 3")


def _gpu_index(value: int, what: str) -> int:
    if not 0 <= value < GPUS_PER_TRAY:
        raise UsageError(f"{what}: GPU index {value} out of range", hint=f"a GB200 tray has GPUs 0..{GPUS_PER_TRAY - 1}")
    return value


def validate(req: FaultRequest) -> None:
    _validate_target(req)
    if req.is_empty():
        raise UsageError("no fault given", hint=_no_fault_hint(req.target))
    if req.clear and not _only_clear(req):
        raise UsageError("--clear cannot be combined with other faults", hint="clear first, then inject")
    if (req.xid is not None or req.ecc_uncorrectable is not None) and req.gpu is None:
        raise UsageError("--xid and --ecc-uncorrectable need --gpu N", hint=f"e.g. {EXAMPLES['gpu']}")
    _validate_emulator(req)
    if req.gpu is not None and req.xid is None and req.ecc_uncorrectable is None and not (
            req.fell_off_bus or req.xid_storm is not None):
        raise UsageError("--gpu only goes with --xid, --xid-storm, --fell-off-bus or --ecc-uncorrectable")
    if req.gpu is not None:
        _gpu_index(req.gpu, "--gpu")
    if req.xid is not None and not 1 <= req.xid <= 1000:
        raise UsageError(f"--xid {req.xid}: not an XID code", hint="XID codes are small positive integers, e.g. 79")
    if req.fabric is not None and req.fabric not in FABRIC_FAULTS:
        raise UsageError(f"--fabric {req.fabric!r}: unknown state", hint=f"one of {', '.join(FABRIC_FAULTS)}")
    if req.gpu_missing is not None:
        _gpu_index(req.gpu_missing, "--gpu-missing")
    if req.nvlink_down is not None and not _all_links(req.nvlink_down):
        parse_link(req.nvlink_down)
    if req.ecc_uncorrectable is not None and req.ecc_uncorrectable < 1:
        raise UsageError("--ecc-uncorrectable N: N is a count of errors, at least 1")
    _validate_host_faults(req)


def _only_clear(req: FaultRequest) -> bool:
    return not any(given(req, t) for t in TARGETS)


def parse_link(text: str, option: str = "--nvlink-down") -> tuple[int, int]:
    try:
        gpu_s, link_s = text.split(":")
        gpu, link = int(gpu_s), int(link_s)
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected GPU:LINK", hint=f"e.g. {option} 0:3") from None
    _gpu_index(gpu, option)
    if not 0 <= link < NVLINKS_PER_GPU:
        raise UsageError(f"{option} {text}: link {link} out of range", hint=f"links are 0..{NVLINKS_PER_GPU - 1}")
    return gpu, link


def apply(doc: dict | None, req: FaultRequest, now: float) -> dict:
    """The faults document after *req*; the input is not changed."""
    validate(req)
    if req.clear:
        return cleared(doc, req.target)
    d = normalize(doc)
    d = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    if req.fabric is not None:
        d["fabric"] = req.fabric
    if req.gpu_missing is not None and req.gpu_missing not in d["gpu_missing"]:
        d["gpu_missing"] = sorted(d["gpu_missing"] + [req.gpu_missing])
    if req.nvlink_down is not None and not _all_links(req.nvlink_down):
        pair = list(parse_link(req.nvlink_down))
        if pair not in [list(p) for p in d["nvlink_down"]]:
            d["nvlink_down"] = sorted([list(p) for p in d["nvlink_down"]] + [pair])
    if req.ecc_uncorrectable is not None:
        d["ecc_uncorrectable"][str(req.gpu)] = req.ecc_uncorrectable
    if req.xid is not None:
        d["xid"] = d["xid"] + [{"gpu": req.gpu, "code": req.xid, "time": now, **_xid_extra(req)}]
    if req.unreachable:
        d["unreachable"] = True
    if req.hang:
        d["hang"] = True
    _apply_emulator(d, req, now)
    _apply_host_faults(d, req)
    return d


# --- process, transport and host faults ----------------------------------------------------------
# Kept in faults.json only while set (older readers, the GPU emulator among them, never see them):
#   "slow": SECONDS, "slurmd_down": true, "imex_crash": true, "slurmctld_down": true.
# `--sshd-restart` and `--reboot` are events: they change the running host, not the document.

HOST_FAULTS = ("slow", "slurmd_down", "imex_crash", "slurmctld_down")
SLOW_MAX_S = 3600.0
REBOOT_DOWN_S = 2.0           # how long a rebooting host stays off unless --down-for says otherwise
REBOOT_DOWN_MAX_S = 600.0
HEAD_ONLY = ("slurmctld_down",)
TRAY_ONLY = ("slurmd_down", "imex_crash")


def _normalize_host_faults(doc: dict, out: dict) -> None:
    for key in HOST_FAULTS:
        value = doc.get(key)
        if value is not None and value is not False:
            out[key] = value


def _host_fault_labels(d: dict) -> list[str]:
    labels = []
    if d.get("slow") is not None:
        labels.append(f"slow {d['slow']:g}s")
    for key, label in (("slurmd_down", "slurmd down"), ("imex_crash", "imex crashed"),
                       ("slurmctld_down", "slurmctld down")):
        if d.get(key):
            labels.append(label)
    return labels


def _validate_host_faults(req: FaultRequest) -> None:
    if req.slow is not None:
        check_delay(req.slow, "--slow", SLOW_MAX_S)
    if req.down_for is not None:
        if not req.reboot:
            raise UsageError("--down-for only goes with --reboot", hint="e.g. --reboot --down-for 10")
        if req.down_for != req.down_for or not 0 <= req.down_for <= REBOOT_DOWN_MAX_S:
            raise UsageError(f"--down-for {req.down_for:g}: not a time in seconds",
                             hint=f"0 to {REBOOT_DOWN_MAX_S:g} seconds")
    events = req.events()
    if events:
        others = FaultRequest(**{k: v for k, v in vars(req).items()
                                 if k not in ("sshd_restart", "reboot", "down_for", "target")})
        if len(events) > 1 or not others.is_empty():
            raise UsageError(f"--{events[0]} is an event and goes alone",
                             hint="inject other faults in a separate call (a reboot clears the host's process "
                                  "faults; GPU faults stay, as hardware faults do)")


def _apply_host_faults(d: dict, req: FaultRequest) -> None:
    if req.slow is not None:
        d["slow"] = float(req.slow)
    for key in ("slurmd_down", "imex_crash", "slurmctld_down"):
        if getattr(req, key) and not d.get(key):        # again: keep what a clear is to restart
            d[key] = True


def without_host_faults(doc: dict | None) -> dict:
    """The document after a reboot: process faults gone (hang, slow, freeze, daemons), and the lasting
    effects of XIDs too (a boot resets the GPUs; their kern.log lines stay). Hardware state (a GPU
    missing, links down, fabric state, ECC counts) is kept."""
    d = normalize(doc)
    for key in HOST_FAULTS:
        d.pop(key, None)
    d["unreachable"] = False
    d["hang"] = False
    d["xid"] = []
    return d


# --- GPU emulator faults (nvidia-smi and the kernel log; mctl/lab/emulators/nvidia_smi.py reads them) ----

DRIVER_BRANCHES = ("535", "570", "580")
# --tool-fault TOOL:MODE: the lab's stand-ins of burn-in's and evidence's tools (mctl/lab/emulators/dcgmi.py,
# nccl_tests.py, bug_report.py) read faults.json "tool_faults" {tool: mode}: hang (never returns until the
# fault is cleared), crash (part of the output, then SIGSEGV), garbage (bytes that are no output of the
# tool, exit 0), truncated (the first half of the output, exit 0).
TOOL_FAULT_TOOLS = ("dcgmi", "all_reduce_perf", "nvidia-bug-report.sh")
TOOL_FAULT_MODES = ("hang", "crash", "garbage", "truncated")
RECOVERY_ACTIONS = ("reset", "reboot", "drain-reset")
NVLINK5_XIDS = range(144, 151)
FLAP_PERIOD_S = 6.0
# --clock-event REASON -> the -q -x reason it sets Active (mctl.model.gpu.CLOCK_REASONS)
CLOCK_EVENTS = {"hw-slowdown": "hw_slowdown", "hw-power-brake": "hw_power_brake_slowdown",
                "hw-thermal": "hw_thermal_slowdown", "sw-thermal": "sw_thermal_slowdown", "sw-power-cap": "sw_power_cap"}
NVLINK_ERROR_RATE_MAX = 1e6           # errors a second: more than any real link counts


def _emulator_empty() -> dict:
    return {"nvlink_all_down": [], "nvlink_flap": [], "fell_off_bus": [], "xid_storm": [], "smi_hang": False,
            "driver_branch": None, "tool_faults": {}, "nvlink_errors": [], "clock_events": [], "gpu_processes": [],
            "persistence_off": []}


def _emulator_labels(d: dict) -> list[str]:
    """Labels of the emulator faults; their keys are written only once set, so older documents stay as they were."""
    d = {**_emulator_empty(), **d}
    labels = [f"nvlink gpu{g}:all links down" for g in d["nvlink_all_down"]]
    labels += [f"nvlink gpu{f['gpu']}:link{f['link']} flapping" for f in d["nvlink_flap"]]
    labels += [f"gpu{g} fell off the bus (no xid)" for g in d["fell_off_bus"]]
    labels += [f"xid storm {s['code']}{' nonfatal' if s.get('nonfatal') else ''} gpu{s['gpu']}"
               for s in d["xid_storm"]]
    if d["smi_hang"]:
        labels.append("nvidia-smi hangs")
    if d["driver_branch"]:
        labels.append(f"driver branch R{d['driver_branch']}")
    labels += [f"{tool} {mode}s" if mode != "garbage" else f"{tool} prints garbage"
               for tool, mode in sorted((d.get("tool_faults") or {}).items())]
    labels += [f"nvlink gpu{e['gpu']}:link{e['link']} errors {e['rate']:g}/s" for e in d["nvlink_errors"]]
    words = {v: k for k, v in CLOCK_EVENTS.items()}
    labels += [f"gpu{c['gpu']} clock event {words.get(c['reason'], c['reason'])}" for c in d["clock_events"]]
    labels += [f"gpu{p['gpu']} held by pid {p['pid']} {p['name']}" for p in d["gpu_processes"]]
    return labels


def _emulator_given(req: FaultRequest) -> bool:
    return bool(req.nonfatal or req.fell_off_bus or req.smi_hang) or any(
        v is not None for v in (req.recovery_action, req.nvlink_flap, req.xid_storm, req.driver_branch,
                                req.tool_fault, req.nvlink_errors, req.clock_event, req.gpu_process))


def _all_links(text: str) -> bool:
    return str(text).strip().lower().endswith(":all")


def _validate_emulator(req: FaultRequest) -> None:
    if req.nvlink_down is not None and _all_links(req.nvlink_down):
        gpu_s = req.nvlink_down.split(":")[0]
        if not gpu_s.strip().isdigit():
            raise UsageError(f"--nvlink-down {req.nvlink_down!r}: expected GPU:LINK or GPU:all",
                             hint="e.g. --nvlink-down 0:all")
        _gpu_index(int(gpu_s), "--nvlink-down")
    storm_or_xid = req.xid if req.xid is not None else req.xid_storm
    if req.nonfatal and (storm_or_xid is None or storm_or_xid not in NVLINK5_XIDS):
        raise UsageError("--nonfatal goes with --xid or --xid-storm 144..150 (NVLink5 XIDs say Fatal or Nonfatal)",
                         hint="e.g. mctl lab fault gpu lab-r1-tray03 --xid 145 --nonfatal --gpu 0")
    if req.recovery_action is not None:
        if req.xid != 154:
            raise UsageError("--recovery-action goes with --xid 154", hint="e.g. --xid 154 --recovery-action drain-reset")
        if req.recovery_action not in RECOVERY_ACTIONS:
            raise UsageError(f"--recovery-action {req.recovery_action!r}: unknown action",
                             hint=f"one of {', '.join(RECOVERY_ACTIONS)}")
    if (req.fell_off_bus or req.xid_storm is not None) and req.gpu is None:
        raise UsageError("--fell-off-bus and --xid-storm need --gpu N", hint="e.g. --fell-off-bus --gpu 2")
    if req.xid_storm is not None and not 1 <= req.xid_storm <= 1000:
        raise UsageError(f"--xid-storm {req.xid_storm}: not an XID code", hint="e.g. --xid-storm 145 --nonfatal")
    if req.nvlink_flap is not None:
        parse_link(req.nvlink_flap, "--nvlink-flap")
    if req.tool_fault is not None:
        parse_tool_fault(req.tool_fault)
    if req.nvlink_errors is not None:
        parse_link_rate(req.nvlink_errors)
    if req.clock_event is not None:
        parse_clock_event(req.clock_event)
    if req.gpu_process is not None:
        parse_gpu_process(req.gpu_process)
    if req.driver_branch is not None and req.driver_branch not in DRIVER_BRANCHES:
        raise UsageError(f"--driver-branch {req.driver_branch!r}: not an emulated branch",
                         hint=f"one of {', '.join(DRIVER_BRANCHES)}")


def parse_tool_fault(text: str) -> tuple[str, str]:
    tool, sep, mode = str(text).rpartition(":")
    if not sep or tool not in TOOL_FAULT_TOOLS or mode not in TOOL_FAULT_MODES:
        raise UsageError(f"--tool-fault {text!r}: expected TOOL:MODE",
                         hint=f"TOOL one of {', '.join(TOOL_FAULT_TOOLS)}; MODE one of {', '.join(TOOL_FAULT_MODES)}; "
                              "e.g. --tool-fault dcgmi:hang")
    return tool, mode


def parse_link_rate(text: str) -> tuple[int, int, float]:
    """--nvlink-errors GPU:LINK:RATE (RATE: errors a second, above 0)."""
    parts = str(text).split(":")
    if len(parts) != 3:
        raise UsageError(f"--nvlink-errors {text!r}: expected GPU:LINK:RATE", hint="e.g. --nvlink-errors 0:3:5")
    gpu, link = parse_link(f"{parts[0]}:{parts[1]}", "--nvlink-errors")
    try:
        rate = float(parts[2])
    except ValueError:
        rate = float("nan")
    if rate != rate or not 0 < rate <= NVLINK_ERROR_RATE_MAX:
        raise UsageError(f"--nvlink-errors {text}: {parts[2]!r} is not a rate",
                         hint=f"errors a second, above 0 and at most {NVLINK_ERROR_RATE_MAX:g}, e.g. 0:3:5")
    return gpu, link, rate


def parse_clock_event(text: str) -> tuple[int, str]:
    """--clock-event GPU:REASON -> (GPU, the -q -x reason name)."""
    gpu_s, _, reason = str(text).partition(":")
    if not gpu_s.strip().isdigit() or reason not in CLOCK_EVENTS:
        raise UsageError(f"--clock-event {text!r}: expected GPU:REASON",
                         hint=f"REASON one of {', '.join(CLOCK_EVENTS)}; e.g. --clock-event 0:hw-slowdown")
    return _gpu_index(int(gpu_s), "--clock-event"), CLOCK_EVENTS[reason]


def parse_gpu_process(text: str) -> tuple[int, str]:
    """--gpu-process GPU:NAME (NAME: a process name, letters, digits, '._-', at most 32)."""
    import re

    gpu_s, _, name = str(text).partition(":")
    if not gpu_s.strip().isdigit() or not re.fullmatch(r"[A-Za-z0-9._-]{1,32}", name):
        raise UsageError(f"--gpu-process {text!r}: expected GPU:NAME", hint="e.g. --gpu-process 0:python3")
    return _gpu_index(int(gpu_s), "--gpu-process"), name


def _xid_extra(req: FaultRequest) -> dict:
    extra: dict = {}
    if req.xid in NVLINK5_XIDS:
        extra["nonfatal"] = bool(req.nonfatal)
    if req.xid == 154:
        extra["recovery"] = req.recovery_action or "drain-reset"
    return extra


def _apply_emulator(d: dict, req: FaultRequest, now: float) -> None:
    if not _emulator_given(req) and not (req.nvlink_down is not None and _all_links(req.nvlink_down)):
        return
    for key, value in _emulator_empty().items():
        d.setdefault(key, value)
    if req.nvlink_down is not None and _all_links(req.nvlink_down):
        gpu = int(req.nvlink_down.split(":")[0])
        if gpu not in d["nvlink_all_down"]:
            d["nvlink_all_down"] = sorted(d["nvlink_all_down"] + [gpu])
    if req.nvlink_flap is not None:
        gpu, link = parse_link(req.nvlink_flap, "--nvlink-flap")
        if not any((f["gpu"], f["link"]) == (gpu, link) for f in d["nvlink_flap"]):
            d["nvlink_flap"] = d["nvlink_flap"] + [{"gpu": gpu, "link": link, "since": now, "period": FLAP_PERIOD_S}]
    if req.fell_off_bus and req.gpu not in d["fell_off_bus"]:
        d["fell_off_bus"] = sorted(d["fell_off_bus"] + [req.gpu])
    if req.xid_storm is not None:
        storm = {"gpu": req.gpu, "code": req.xid_storm, "since": now}
        if req.xid_storm in NVLINK5_XIDS:
            storm["nonfatal"] = bool(req.nonfatal)
        d["xid_storm"] = [s for s in d["xid_storm"] if (s["gpu"], s["code"]) != (req.gpu, req.xid_storm)] + [storm]
    if req.smi_hang:
        d["smi_hang"] = True
    if req.driver_branch is not None:
        d["driver_branch"] = req.driver_branch
    if req.tool_fault is not None:
        tool, mode = parse_tool_fault(req.tool_fault)
        d["tool_faults"] = {**(d.get("tool_faults") or {}), tool: mode}
    if req.nvlink_errors is not None:
        gpu, link, rate = parse_link_rate(req.nvlink_errors)
        d["nvlink_errors"] = [e for e in d["nvlink_errors"] if (e["gpu"], e["link"]) != (gpu, link)] + [
            {"gpu": gpu, "link": link, "rate": rate, "since": now}]
    if req.gpu_process is not None:
        gpu, name = parse_gpu_process(req.gpu_process)
        pid = 4000 + 97 * gpu + len(d["gpu_processes"])
        d["gpu_processes"] = d["gpu_processes"] + [{"gpu": gpu, "pid": pid, "name": name}]
    if req.clock_event is not None:
        gpu, reason = parse_clock_event(req.clock_event)
        if not any((c["gpu"], c["reason"]) == (gpu, reason) for c in d["clock_events"]):
            d["clock_events"] = d["clock_events"] + [{"gpu": gpu, "reason": reason}]
