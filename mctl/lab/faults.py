"""Injected faults on a lab tray (pure): the faults.json document of the lab contract.

A fault is state, not an event: it stays in the tray's faults.json (and so in
every nvidia-smi call) until `mctl lab fault TRAY --clear`. XIDs are the one
exception that also leave an event behind, a kernel-log line, as on real trays.
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
        if key in out and value is not None:
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
    labels += _host_fault_labels(d)
    return labels


@dataclass
class FaultRequest:
    """What one `mctl lab fault` call asks for; several faults may be combined."""

    xid: int | None = None
    gpu: int | None = None
    fabric: str | None = None
    gpu_missing: int | None = None
    nvlink_down: str | None = None          # "GPU:LINK"
    ecc_uncorrectable: int | None = None
    unreachable: bool = False
    hang: bool = False
    clear: bool = False
    # process, transport and host faults (see HOST_FAULTS below)
    slow: float | None = None               # seconds every command waits before it runs
    sshd_restart: bool = False              # event: sshd and every open connection killed, sshd comes back
    reboot: bool = False                    # event: the host stops and starts again with a new boot id
    down_for: float | None = None           # with --reboot: seconds the host stays off (default REBOOT_DOWN_S)
    slurmd_down: bool = False
    imex_crash: bool = False
    slurmctld_down: bool = False

    def is_empty(self) -> bool:
        return not (self.clear or self.unreachable or self.hang or self.has_host_fault()) and all(
            v is None for v in (self.xid, self.gpu, self.fabric, self.gpu_missing, self.nvlink_down,
                                self.ecc_uncorrectable))

    def has_host_fault(self) -> bool:
        return (self.slow is not None or self.down_for is not None
                or any((self.sshd_restart, self.reboot, self.slurmd_down, self.imex_crash, self.slurmctld_down)))

    def events(self) -> list[str]:
        """The one-off events asked for (they change the host, not faults.json)."""
        return [name for name, on in (("sshd-restart", self.sshd_restart), ("reboot", self.reboot)) if on]


def _gpu_index(value: int, what: str) -> int:
    if not 0 <= value < GPUS_PER_TRAY:
        raise UsageError(f"{what}: GPU index {value} out of range", hint=f"a GB200 tray has GPUs 0..{GPUS_PER_TRAY - 1}")
    return value


def validate(req: FaultRequest) -> None:
    if req.is_empty():
        raise UsageError("no fault given",
                         hint="give one of --xid CODE --gpu N, --fabric STATE, --gpu-missing N, --nvlink-down GPU:LINK, "
                              "--ecc-uncorrectable N --gpu N, --unreachable (--freeze), --hang, --slow SECONDS, "
                              "--sshd-restart, --reboot, --slurmd-down, --imex-crash, --slurmctld-down, or --clear")
    if req.clear and not _only_clear(req):
        raise UsageError("--clear cannot be combined with other faults", hint="clear first, then inject")
    if (req.xid is not None or req.ecc_uncorrectable is not None) and req.gpu is None:
        raise UsageError("--xid and --ecc-uncorrectable need --gpu N", hint="e.g. mctl lab fault lab-r1-tray03 --xid 79 --gpu 0")
    if req.gpu is not None and req.xid is None and req.ecc_uncorrectable is None:
        raise UsageError("--gpu only goes with --xid or --ecc-uncorrectable")
    if req.gpu is not None:
        _gpu_index(req.gpu, "--gpu")
    if req.xid is not None and not 1 <= req.xid <= 1000:
        raise UsageError(f"--xid {req.xid}: not an XID code", hint="XID codes are small positive integers, e.g. 79")
    if req.fabric is not None and req.fabric not in FABRIC_FAULTS:
        raise UsageError(f"--fabric {req.fabric!r}: unknown state", hint=f"one of {', '.join(FABRIC_FAULTS)}")
    if req.gpu_missing is not None:
        _gpu_index(req.gpu_missing, "--gpu-missing")
    if req.nvlink_down is not None:
        parse_link(req.nvlink_down)
    if req.ecc_uncorrectable is not None and req.ecc_uncorrectable < 1:
        raise UsageError("--ecc-uncorrectable N: N is a count of errors, at least 1")
    _validate_host_faults(req)


def _only_clear(req: FaultRequest) -> bool:
    return not (req.unreachable or req.hang or req.has_host_fault()) and all(
        v is None for v in (req.xid, req.gpu, req.fabric, req.gpu_missing, req.nvlink_down, req.ecc_uncorrectable))


def parse_link(text: str) -> tuple[int, int]:
    try:
        gpu_s, link_s = text.split(":")
        gpu, link = int(gpu_s), int(link_s)
    except ValueError:
        raise UsageError(f"--nvlink-down {text!r}: expected GPU:LINK", hint="e.g. --nvlink-down 0:3") from None
    _gpu_index(gpu, "--nvlink-down")
    if not 0 <= link < NVLINKS_PER_GPU:
        raise UsageError(f"--nvlink-down {text}: link {link} out of range", hint=f"links are 0..{NVLINKS_PER_GPU - 1}")
    return gpu, link


def apply(doc: dict | None, req: FaultRequest, now: float) -> dict:
    """The faults document after *req*; the input is not changed."""
    validate(req)
    if req.clear:
        return empty()
    d = normalize(doc)
    d = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    if req.fabric is not None:
        d["fabric"] = req.fabric
    if req.gpu_missing is not None and req.gpu_missing not in d["gpu_missing"]:
        d["gpu_missing"] = sorted(d["gpu_missing"] + [req.gpu_missing])
    if req.nvlink_down is not None:
        pair = list(parse_link(req.nvlink_down))
        if pair not in [list(p) for p in d["nvlink_down"]]:
            d["nvlink_down"] = sorted([list(p) for p in d["nvlink_down"]] + [pair])
    if req.ecc_uncorrectable is not None:
        d["ecc_uncorrectable"][str(req.gpu)] = req.ecc_uncorrectable
    if req.xid is not None:
        d["xid"] = d["xid"] + [{"gpu": req.gpu, "code": req.xid, "time": now}]
    if req.unreachable:
        d["unreachable"] = True
    if req.hang:
        d["hang"] = True
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
        if req.slow != req.slow or not 0 < req.slow <= SLOW_MAX_S:      # NaN too
            raise UsageError(f"--slow {req.slow:g}: not a delay in seconds",
                             hint=f"give seconds above 0 and at most {SLOW_MAX_S:g}, e.g. --slow 3")
    if req.down_for is not None:
        if not req.reboot:
            raise UsageError("--down-for only goes with --reboot", hint="e.g. --reboot --down-for 10")
        if req.down_for != req.down_for or not 0 <= req.down_for <= REBOOT_DOWN_MAX_S:
            raise UsageError(f"--down-for {req.down_for:g}: not a time in seconds",
                             hint=f"0 to {REBOOT_DOWN_MAX_S:g} seconds")
    events = req.events()
    if events:
        others = FaultRequest(**{k: v for k, v in vars(req).items()
                                 if k not in ("sshd_restart", "reboot", "down_for")})
        if len(events) > 1 or not others.is_empty():
            raise UsageError(f"--{events[0]} is an event and goes alone",
                             hint="inject other faults in a separate call (a reboot clears the host's process "
                                  "faults; GPU faults stay, as hardware faults do)")


def _apply_host_faults(d: dict, req: FaultRequest) -> None:
    if req.slow is not None:
        d["slow"] = float(req.slow)
    for key in ("slurmd_down", "imex_crash", "slurmctld_down"):
        if getattr(req, key) and not d.get(key):        # again: keep what --clear is to restart
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
