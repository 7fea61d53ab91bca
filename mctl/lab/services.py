"""The lab's registry of what runs where: per-host services, per-host files, per-rack services.

Adding an emulator to the lab is one entry here, nothing else:

* ``HostFile``: a file installed into every host of the given kinds at `lab up`
  (the GPU emulator becomes /usr/bin/nvidia-smi on each tray this way; the IMEX
  daemon emulator, its nvidia-imex-ctl and the ``nvidia-imex.service`` unit are
  installed the same way and enabled and started by the playbooks and
  `mctl imex apply` like the real unit).
* ``HostService``: a long-running program inside each host's namespaces, started
  and restarted by the host's init (sshd is the first).
* ``RackService``: a program on the machine itself, one per rack, in its own
  PID namespace so `lab down` stops it and everything it started (the NMX-M
  emulator, listening on the rack's service address, 127.77.R.200). It reaches
  tray files through :func:`mctl.lab.hosts.host_path`.

The NMX-M emulator keeps everything of its rack under ``racks/<rack>/`` of the
lab folder (config, credentials, partition state, logs), so `lab down` removes
it with the rest of the lab.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mctl.lab.aptrepo import APT_PORT
from mctl.lab.layout import Kind, LabHost, LabLayout

EMULATORS = Path(__file__).resolve().parent / "emulators"


@dataclass(frozen=True)
class HostContext:
    layout: LabLayout
    host: LabHost
    lab_dir: Path


@dataclass(frozen=True)
class RackContext:
    layout: LabLayout
    rack: str
    rack_index: int
    address: str            # the rack's service address (127.77.R.200)
    lab_dir: Path
    log_dir: Path


@dataclass(frozen=True)
class HostFile:
    dest: str                                        # path inside the host
    kinds: tuple[Kind, ...]
    content: Callable[[HostContext], bytes | None]   # None: not available (yet); `lab up` says so
    mode: int = 0o644
    # The lab package (mctl/lab/aptrepo.py) that holds this file, named without its driver branch
    # (nvidia-utils for nvidia-utils-570): provisioning installs it through apt; `lab up --os-only`
    # leaves it off the tray, a default `lab up` puts it there at once (the GPU tools right after `up`).
    package: str | None = None


@dataclass(frozen=True)
class HostService:
    name: str
    kinds: tuple[Kind, ...]
    argv: Callable[[HostContext], list[str]]
    dirs: tuple[str, ...] = ()       # created before each start (e.g. tmpfs /run entries)
    port: int | None = None          # TCP port it listens on at the host's address, for `lab status`
    restart: bool = True


@dataclass(frozen=True)
class RackService:
    name: str
    argv: Callable[[RackContext], list[str]]
    port: int | None = None          # TCP port on the rack's service address
    # Run on the machine before the service starts, once the hosts are up (write a config
    # naming the trays' files through mctl.lab.hosts.host_path, credentials, ...).
    prepare: Callable[[RackContext], None] | None = None
    # Keys merged into the rack's entry of the lab inventory (e.g. an NMX-M emulator's
    # `nmx: {url, credentials_file}`), so the lab stays an ordinary site.
    inventory: Callable[[RackContext], dict] | None = None


def python_script(path: Path) -> Callable[[HostContext], bytes | None]:
    """A stdlib-only script from this package, run by the host's own /usr/bin/python3."""

    def read(_ctx: HostContext) -> bytes | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        if text.startswith("#!"):
            text = text[text.index("\n") + 1:]
        return ("#!/usr/bin/python3\n" + text).encode()

    return read


# Where the tray keeps emulator modules that a launcher imports (see python_launcher).
EMULATOR_LIB = "/usr/lib/mctl-lab/python"


def python_module(path: Path) -> Callable[[HostContext], bytes | None]:
    """The module itself, installed under EMULATOR_LIB."""

    def read(_ctx: HostContext) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    return read


def python_launcher(module: str) -> Callable[[HostContext], bytes]:
    """A command that imports an emulator module rather than running it as a script.

    Python compiles a script on every call but caches an imported module's bytecode
    (__pycache__ in the tray's own upper layer), which makes the emulated nvidia-smi,
    run on every tray at every health sweep, start in a fraction of the time.
    """

    def text(_ctx: HostContext) -> bytes:
        call = f"sys.exit({module}.main())"
        # -IS: no site module and no PYTHON* variables (the emulators use the standard library only):
        # 3-4 ms less of the ~20 ms each call costs a tray, measured on the lab's Debian 13 image.
        return ("#!/usr/bin/python3 -IS\n# Written by `mctl lab up`: the emulator lives in "
                f"{EMULATOR_LIB}/{module}.py (mctl/lab/emulators).\n"
                f"import sys\nsys.path.insert(0, {EMULATOR_LIB!r})\nimport {module}\n{call}\n").encode()

    return text


def _smi_launcher(_ctx: HostContext) -> bytes:
    """nvidia-smi: a shell script that replays the emulator's unchanged answers (nvidia_smi.LAUNCHER)."""
    from mctl.lab.emulators.nvidia_smi import LAUNCHER

    return LAUNCHER.replace("@LIB@", EMULATOR_LIB).encode()


def _dcgmi_launcher(_ctx: HostContext) -> bytes:
    """dcgmi: a shell script that replays the emulator's unchanged `health -c -j` answers (dcgmi.LAUNCHER)."""
    from mctl.lab.emulators.dcgmi import LAUNCHER

    return LAUNCHER.replace("@LIB@", EMULATOR_LIB).encode()


def _imex_unit(_ctx: HostContext) -> bytes:
    from mctl.lab.emulators.imex_daemon import SYSTEMD_UNIT

    return SYSTEMD_UNIT.encode()


# Slurm 24.11 daemons re-execute themselves on `scontrol reconfigure` and report the new main pid over
# sd_notify. The image's systemctl (docker-systemctl-replacement) listens on the notify socket only while
# a unit starts, so it loses the daemon and calls it failed; the next `systemctl start` then fails on
# the taken port. As forking units with the pid file slurm.conf names (mctl.sched.slurm.render), the
# daemons stay tracked across a reconfigure. Lab only: systemd on a real host follows MAINPID.
SLURM_PID_FILES = {"slurmctld": "/run/slurmctld/slurmctld.pid", "slurmd": "/run/slurmd.pid"}


def _slurm_dropin(daemon: str) -> Callable[[HostContext], bytes]:
    def text(_ctx: HostContext) -> bytes:
        options = "$SLURMCTLD_OPTIONS" if daemon == "slurmctld" else "$SLURMD_OPTIONS"
        return ("# Written by `mctl lab up`: track the daemon by its pid file across `scontrol reconfigure`\n"
                "# (the lab's systemctl does not follow sd_notify MAINPID changes). See mctl/lab/services.py.\n"
                # An empty Type= first: the image's systemctl keeps the FIRST value of a key, so the unit's
                # Type=notify would win over a plain Type=forking here (as it did until 2026-11-30).
                "[Service]\nType=\nType=forking\nExecStart=\n"
                f"ExecStart=/usr/sbin/{daemon} {options}\nPIDFile={SLURM_PID_FILES[daemon]}\n").encode()
    return text


def _chrony_dropin(_ctx: HostContext) -> bytes:
    return ("# Written by `mctl lab up`: the image's systemctl (docker-systemctl-replacement) does not honour the\n"
            "# unit's `ExecStart=!` (run as root, chronyd drops to _chrony itself), and a RuntimeDirectory it creates\n"
            "# as root keeps chronyd from making its command socket there. chronyd makes /run/chrony itself.\n"
            # empty first: the image's systemctl keeps the FIRST value of a key (see _slurm_dropin)
            "[Service]\nUser=\nUser=root\nRuntimeDirectory=\nExecStart=\nExecStart=/usr/sbin/chronyd $DAEMON_OPTS\n"
            ).encode()


HOST_FILES: tuple[HostFile, ...] = (
    HostFile("/etc/systemd/system/chrony.service.d/10-mctl-lab.conf", ("tray",), _chrony_dropin),
    HostFile("/etc/systemd/system/slurmctld.service.d/10-mctl-lab.conf", ("head",), _slurm_dropin("slurmctld")),
    HostFile("/etc/systemd/system/slurmd.service.d/10-mctl-lab.conf", ("tray",), _slurm_dropin("slurmd")),
    HostFile(f"{EMULATOR_LIB}/nvidia_smi.py", ("tray",), python_module(EMULATORS / "nvidia_smi.py"),
             package='nvidia-utils'),
    HostFile("/usr/bin/nvidia-smi", ("tray",), _smi_launcher, 0o755,
             package='nvidia-utils'),
    # the driver's log collector (evidence before repair: mctl/health/evidence.py)
    HostFile(f"{EMULATOR_LIB}/bug_report.py", ("tray",), python_module(EMULATORS / "bug_report.py"),
             package='nvidia-utils'),
    HostFile("/usr/bin/nvidia-bug-report.sh", ("tray",), python_launcher("bug_report"), 0o755,
             package='nvidia-utils'),
    HostFile("/usr/bin/nvidia-imex", ("tray",), python_script(EMULATORS / "imex_daemon.py"), 0o755,
             package='nvidia-imex'),
    HostFile(f"{EMULATOR_LIB}/imex_ctl.py", ("tray",), python_module(EMULATORS / "imex_ctl.py"),
             package='nvidia-imex'),
    HostFile("/usr/bin/nvidia-imex-ctl", ("tray",), python_launcher("imex_ctl"), 0o755,
             package='nvidia-imex'),
    # /usr/lib, not /lib: the image has a merged /usr (/lib -> usr/lib), and a file written below /lib
    # into the host's upper layer would make /lib a real folder there, hiding every unit and library of
    # the image's /lib. On the running tray both paths name this file.
    HostFile("/usr/lib/systemd/system/nvidia-imex.service", ("tray",), _imex_unit, 0o644,
             package='nvidia-imex'),
    # Burn-in's tools (mctl/health/burnin.py): DCGM's dcgmi and nccl-tests' all_reduce_perf, whose results
    # follow the tray's faults (mctl/lab/emulators/dcgmi.py, nccl_tests.py; both read the GPUs through the
    # nvidia-smi emulator's module, as DCGM and NCCL need the driver).
    HostFile(f"{EMULATOR_LIB}/dcgmi.py", ("tray",), python_module(EMULATORS / "dcgmi.py"),
             package='datacenter-gpu-manager-4-core'),
    HostFile("/usr/bin/dcgmi", ("tray",), _dcgmi_launcher, 0o755,
             package='datacenter-gpu-manager-4-core'),
    HostFile(f"{EMULATOR_LIB}/nccl_tests.py", ("tray",), python_module(EMULATORS / "nccl_tests.py"),
             package='nccl-tests'),
    HostFile("/usr/bin/all_reduce_perf", ("tray",), python_launcher("nccl_tests"), 0o755,
             package='nccl-tests'),
)

HOST_SERVICES: tuple[HostService, ...] = (
    HostService("sshd", ("tray", "head"), lambda ctx: ["/usr/sbin/sshd", "-D", "-e"], dirs=("/run/sshd",), port=22),
)

# --- the NMX-Manager emulator, one per rack ------------------------------------------------------

NMX_PORT = 8443                 # plain HTTP on the rack's service address
NMX_USER = "admin"
NMX_RO_USER = "ro-user"


def nmx_files(ctx: RackContext) -> dict[str, Path]:
    d = ctx.log_dir
    return {"config": d / "nmx.json", "credentials": d / "nmx.cred", "state": d / "nmx-state.json",
            "log": d / "nmx-requests.log", "ro_credentials": d / "nmx-ro.cred",
            "faults": d / "nmx-faults.json"}          # `mctl lab fault nmx RACK ...` (mctl/lab/nmx_faults.py)


def nmx_config(ctx: RackContext) -> dict:
    """The emulator's config: the rack's trays with their gpus.json as the running trays see them."""
    from mctl.errors import EnvironmentProblem
    from mctl.lab.gpus import GPUS_PER_TRAY, chassis_serial
    from mctl.lab.hosts import GPUS_FILE, host_path

    def gpus_json(name: str) -> str | None:
        """Where the running tray's gpus.json is; None for a tray that is off (several trays of a rack may
        reboot at once: the last one up writes every path again)."""
        try:
            return str(host_path(ctx.lab_dir, name, GPUS_FILE))
        except EnvironmentProblem:
            return None

    files = nmx_files(ctx)
    trays = [{"name": t.name, "tray_index": t.tray_index, "slot_id": t.slot, "host_id": 1, "gpus": GPUS_PER_TRAY,
              "gpus_json": gpus_json(t.name)} for t in ctx.layout.trays_of(ctx.rack)]
    return {"listen": ctx.address, "port": NMX_PORT, "credentials_file": str(files["credentials"]),
            "domain_uuid": ctx.layout.nvlink_domain(ctx.rack), "chassis_serial": chassis_serial(ctx.layout, ctx.rack),
            "state_file": str(files["state"]), "trays": trays,
            "ro_credentials_file": str(files["ro_credentials"]), "faults_file": str(files["faults"]),
            # the lab's switch tray BMCs (`lab up --switch-trays`): an Off one takes its NVLinks down
            "switch_power_files": [str(p) for p in switch_power_files(ctx)]}


def switch_power_files(ctx: RackContext) -> list[Path]:
    """Where each of the rack's 9 possible lab switch trays' BMC keeps its power state (absent: On, or no such
    tray), so switch trays added to a running lab are seen too."""
    from mctl.lab.bmcs import SWITCH_POWER_FILE, tray_bmc_dir
    from mctl.lab.layout import MAX_SWITCH_TRAYS, switch_name

    return [tray_bmc_dir(ctx.lab_dir, switch_name(ctx.rack_index, s)) / SWITCH_POWER_FILE
            for s in range(1, MAX_SWITCH_TRAYS + 1)]


def _write_private(path: Path, text: str) -> None:
    """Created 0600 from the start: the password is never readable by others, not even for a moment."""
    from mctl.state.files import atomic_write

    atomic_write(path, text, mode=0o600)


def _nmx_prepare(ctx: RackContext) -> None:
    from mctl.state.files import write_json

    files = nmx_files(ctx)
    if not files["credentials"].exists():
        _write_private(files["credentials"], f"{NMX_USER}:{secrets.token_urlsafe(18)}\n")
    if not files["ro_credentials"].exists():        # NMX-M's read-only user, as its gateway has one
        _write_private(files["ro_credentials"], f"{NMX_RO_USER}:{secrets.token_urlsafe(18)}\n")
    write_json(files["config"], nmx_config(ctx), mode=0o600)


def _nmx_argv(ctx: RackContext) -> list[str]:
    files = nmx_files(ctx)
    return [sys.executable, "-m", "mctl.lab.nmx_emulator", "--config", str(files["config"]),
            "--log-file", str(files["log"])]


def _nmx_inventory(ctx: RackContext) -> dict:
    return {"nmx": {"url": f"http://{ctx.address}:{NMX_PORT}", "credentials_file": str(nmx_files(ctx)["credentials"]),
                    "verify_tls": False}}


NMX_SERVICE = RackService("nmx", _nmx_argv, port=NMX_PORT, prepare=_nmx_prepare, inventory=_nmx_inventory)

# --- the lab's apt repository, served on each rack's service address ------------------------------

def _apt_prepare(ctx: RackContext) -> None:
    from mctl.lab import aptrepo
    from mctl.lab.site import REPO_IMAGES

    tray = ctx.layout.trays_of(ctx.rack)[0]
    aptrepo.build(ctx.lab_dir, REPO_IMAGES, HostContext(ctx.layout, tray, ctx.lab_dir))


def _apt_argv(ctx: RackContext) -> list[str]:
    from mctl.lab import aptrepo

    return [sys.executable, "-m", "mctl.lab.aptrepo", "serve", "--root", str(aptrepo.repo_dir(ctx.lab_dir)),
            "--address", ctx.address, "--port", str(aptrepo.APT_PORT),
            "--log-file", str(ctx.log_dir / "aptrepo-requests.log")]


def _apt_inventory(ctx: RackContext) -> dict:
    from mctl.lab import aptrepo
    from mctl.lab.site import REPO_IMAGES

    repos = aptrepo.repositories(aptrepo.packages_of(REPO_IMAGES))
    return {"compute_vars": {"apt_repositories": aptrepo.inventory_vars(ctx.lab_dir, ctx.address, repos)}}


APT_SERVICE = RackService("aptrepo", _apt_argv, port=APT_PORT, prepare=_apt_prepare, inventory=_apt_inventory)


# --- the lab's time server (mctl/lab/ntp.py), on each rack's service address, UDP 123 -------------

def _ntp_argv(ctx: RackContext) -> list[str]:
    return [sys.executable, "-m", "mctl.lab.ntp", "serve", "--address", ctx.address]


def _ntp_inventory(ctx: RackContext) -> dict:
    # The site's time servers, and what the lab's chronyd needs: never adjust the clock it shares with the
    # machine (-x), no UDP command port (every tray shares 127.0.0.1:323; chronyc uses the Unix socket).
    return {"compute_vars": {"time_servers": [ctx.address], "chrony_daemon_options": "-F 1 -x",
                             "chrony_extra_config": ["cmdport 0"]}}


NTP_SERVICE = RackService("ntp", _ntp_argv, port=None, inventory=_ntp_inventory)   # UDP: no TCP port to wait for

RACK_SERVICES: tuple[RackService, ...] = (NMX_SERVICE, APT_SERVICE, NTP_SERVICE)


def refresh_nmx(ctx: RackContext) -> int | None:
    """After a tray of the rack restarted (its /proc/<init>/root moved): rewrite the config, SIGHUP the emulator.

    Returns the emulator's pid, or None when it is not running.
    """
    from mctl.lab import procs
    from mctl.state.files import write_json

    write_json(nmx_files(ctx)["config"], nmx_config(ctx), mode=0o600)
    table = procs.scan()
    marker = f"MCTL_LAB_SERVICE={ctx.rack}/{NMX_SERVICE.name}"
    prefix = f"MCTL_LAB_DIR={ctx.lab_dir}"
    for launcher in table.values():
        if launcher.comm == "unshare" and marker in launcher.cmdline and prefix in launcher.cmdline:
            for child in procs.children(table, launcher.pid):
                os.kill(child.pid, signal.SIGHUP)
                return child.pid
    return None


def host_files(kind: Kind) -> list[HostFile]:
    return [f for f in HOST_FILES if kind in f.kinds]


def host_services(kind: Kind) -> list[HostService]:
    return [s for s in HOST_SERVICES if kind in s.kinds]


def listeners(layout: LabLayout, only: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
    """host -> the (address, port) its services listen on once it is up (mctl.lab.hosts.wait_ready)."""
    return {h.name: [(h.address, s.port) for s in host_services(h.kind) if s.port]
            for h in layout.hosts() if only is None or h.name in only}
