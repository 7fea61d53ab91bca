"""slurm.conf, gres.conf, cgroup.conf and topology.conf from the site, its facts and its partitions (pure).

Nothing here reads a file or a host: the adapter hands in the Slurm version of
the controller and each tray's `slurmd -C`, and gets back the exact text every
host will hold. Golden tests pin the output.

Lab or not is never asked here: a site without a cgroup filesystem or GPU
device files says so through optional `scheduler.slurm` settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from ClusterShell.NodeSet import NodeSet

from mctl.errors import UsageError
from mctl.model.settings import SlurmSettings
from mctl.model.site import Host, Site, fold
from mctl.sched.slurm.budget import site_licenses
from mctl.sched.slurm.facts import NodeHardware
from mctl.sched.slurm.gpus import TrayGpus
from mctl.sched.slurm.topology import Block, Plugin, block_sizes, blocks_for, render_topology
from mctl.facts.slurm_version import (BLOCK_SIZES, BLOCK_TOPOLOGY, NVIDIA_IMEX, SlurmVersion, release_name,
                                      require_supported)

HEADER = "# Managed by mctl (mctl deploy slurm) from the site inventory; local edits are overwritten."
FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf")
_ONE_RANGE = re.compile(r"^[^\[\],]*(\[[0-9]+-[0-9]+\])?[^\[\],]*$")


@dataclass
class SlurmConfig:
    """Everything `mctl deploy slurm` puts on the hosts, plus why it looks the way it does."""

    files: dict[str, str]
    version: SlurmVersion
    plugin: Plugin
    blocks: list[Block]
    block_sizes: list[int]
    imex: bool
    controller: Host
    nodes: list[str]
    warnings: list[str] = field(default_factory=list)
    partition: str = "gpu"
    imex_job: "ImexJobFiles | None" = None   # scheduler.slurm.imex_scope: job

    def to_dict(self) -> dict:
        return {"version": str(self.version), "topology_plugin": f"topology/{self.plugin}",
                "switch_nvidia_imex": self.imex, "controller": self.controller.name,
                "imex_scope": "job" if self.imex_job else "partition",
                "imex_job": self.imex_job.to_dict() if self.imex_job else None,
                "nodes": fold(self.nodes), "node_count": len(self.nodes),
                "blocks": [b.to_dict() for b in self.blocks], "block_sizes": self.block_sizes,
                "warnings": self.warnings, "files": self.files}


@dataclass(frozen=True)
class ImexJobFiles:
    """The IMEX per-job scope on the trays: the prolog and epilog slurm.conf names, and each tray's
    config.cfg (the node list is the prolog's to write)."""

    prolog_path: str
    epilog_path: str
    prolog: str
    epilog: str
    config_path: str
    nodes_config_path: str
    configs: dict[str, str]              # tray -> config.cfg

    def to_dict(self) -> dict:
        return {"prolog": self.prolog_path, "epilog": self.epilog_path, "config": self.config_path,
                "nodes_config": self.nodes_config_path, "trays": fold(self.configs)}


def render_imex_job(site: Site, settings: SlurmSettings, trays: list[Host]) -> ImexJobFiles:
    """The per-job IMEX files from the site's vars.imex (mctl/sched/slurm/imex_job.py renders the scripts)."""
    from mctl.model.imex import CONFIG_FILE, ImexSettings
    from mctl.sched.slurm.imex_job import EPILOG_NAME, PROLOG_NAME, JobScopeSettings, render_epilog, \
        render_job_config, render_prolog

    imex = ImexSettings.from_vars((site.vars or {}).get("imex"))
    job = JobScopeSettings.from_imex(imex)
    conf_dir = settings.conf_dir.rstrip("/")
    return ImexJobFiles(f"{conf_dir}/{PROLOG_NAME}", f"{conf_dir}/{EPILOG_NAME}", render_prolog(job),
                        render_epilog(job), CONFIG_FILE, imex.node_config_file,
                        {t.name: render_job_config(imex, t.rack or site.name, t.name, t.address) for t in trays})


def _check_job_scope_keys(settings: SlurmSettings) -> None:
    """scheduler.slurm.extra may not undo what the per-job scope needs in slurm.conf."""
    extra = {k.lower(): str(v) for k, v in settings.extra.items()}
    for key in ("prolog", "epilog"):
        if key in extra:
            raise UsageError(f"scheduler.slurm.imex_scope is 'job' but scheduler.slurm.extra sets {key.capitalize()}: "
                             "the IMEX per-job script would never run",
                             hint=f"remove {key.capitalize()} from scheduler.slurm.extra (mctl names its own "
                                  "script), or set imex_scope: partition; nothing was changed")
    flags = extra.get("prologflags")
    if flags is not None and "alloc" not in [f.strip().lower() for f in flags.split(",")]:
        raise UsageError(f"scheduler.slurm.imex_scope is 'job' but scheduler.slurm.extra sets PrologFlags={flags} "
                         "without Alloc: the prolog would run on each node only at its first step, not on every "
                         "node of the job at allocation",
                         hint="add Alloc to PrologFlags, or drop PrologFlags from extra; nothing was changed")


def settings_of(site: Site) -> SlurmSettings:
    return site.scheduler.slurm if site.scheduler else SlurmSettings()


def node_check_enabled(settings: SlurmSettings) -> bool:
    """scheduler.slurm.node_check (on unless the site says false); the old name node_check_installed
    still decides where an inventory sets it."""
    if settings.node_check_installed is not None:
        return settings.node_check_installed
    return settings.node_check


def controller_of(site: Site) -> Host:
    """The host running slurmctld: scheduler.controller, else the first rack's head node."""
    name = site.scheduler.controller if site.scheduler else None
    if name:
        host = site.host(name)
        if host is None:   # the loader already refuses this; kept for sites built in code
            raise UsageError(f"scheduler.controller names unknown host {name!r}")
        return host
    heads = [r.head for r in site.racks.values() if r.head]
    if not heads:
        raise UsageError("no Slurm controller: the inventory names no scheduler.controller and no rack has a head node",
                         hint="set scheduler.controller to the head node that should run slurmctld")
    return heads[0]


def choose_plugin(version: SlurmVersion, settings: SlurmSettings) -> tuple[Plugin, list[str]]:
    warnings: list[str] = []
    if settings.topology == "tree":
        return "tree", warnings
    if version.block_topology:
        return "block", warnings
    if settings.topology == "block":
        raise UsageError(f"scheduler.slurm.topology is 'block' but Slurm {version} has no topology/block "
                         f"(it needs {release_name(BLOCK_TOPOLOGY)})",
                         hint="upgrade Slurm, or set topology: auto to fall back to topology/tree; nothing was changed")
    warnings.append(f"Slurm {version} has no topology/block (needs {release_name(BLOCK_TOPOLOGY)}): falling back to "
                    "topology/tree with one leaf switch per NVLink partition; jobs are packed into one partition "
                    "when they fit, but nothing stops a job from spanning partitions")
    return "tree", warnings


def check_plugins(settings: SlurmSettings) -> None:
    if settings.cgroup_plugin.lower() == "disabled":
        users = [v for v in (settings.proctrack_type, settings.task_plugin, settings.jobacct_gather_type)
                 if "cgroup" in v]
        if users:
            raise UsageError(f"scheduler.slurm.cgroup_plugin is 'disabled' but {', '.join(users)} needs cgroups",
                             hint="without a cgroup filesystem use proctrack_type: proctrack/linuxproc, "
                                  "task_plugin: task/none, jobacct_gather_type: jobacct_gather/linux")


def render(site: Site, version: SlurmVersion, hardware: Mapping[str, NodeHardware] | None, *,
           topology_only: bool = False, gpus: "Mapping[str, TrayGpus] | None" = None) -> SlurmConfig:
    """Render every Slurm file; *hardware* must hold each compute tray's `slurmd -C` facts.

    *gpus* (mctl.sched.slurm.gpus.tray_gpus: the trays' facts, else the rack model) gives each
    tray's `Gres=gpu:N` and gres.conf device files; without it, the rack model's count.

    With *topology_only* only topology.conf is rendered (no hardware needed): that is
    all a partition change touches.
    """
    settings = settings_of(site)
    controller = controller_of(site)
    require_supported(version, controller.name)
    check_plugins(settings)
    trays = site.compute_trays()
    if not trays:
        raise UsageError("the inventory has no compute trays to run slurmd on")
    hardware = hardware or {}
    missing = [] if topology_only else [t.name for t in trays if t.name not in hardware]
    if missing:
        raise UsageError(f"no hardware facts for {fold(missing)}", hint="every tray must answer 'slurmd -C'")
    plugin, warnings = choose_plugin(version, settings)
    imex = version.nvidia_imex
    if not imex:
        warnings.append(f"Slurm {version} has no switch/nvidia_imex (needs {release_name(NVIDIA_IMEX)}): jobs get no "
                        "private IMEX channel; multi-node NVLink memory sharing relies on the host IMEX service alone")
    if plugin == "block" and not version.block_sizes:
        warnings.append(f"Slurm {version} predates BlockSizes and --segment ({release_name(BLOCK_SIZES)}): "
                        "topology.conf lists the blocks only and Slurm aggregates them with its default levels")
    blocks = blocks_for(site)
    for rack in site.racks.values():
        if rack.compute and not rack.partitions:
            warnings.append(f"rack {rack.name} has no NVLink partitions in the inventory: one block for the whole rack")
    sizes = sorted({b.size for b in blocks})
    if plugin == "block" and len(sizes) > 1:
        warnings.append(f"blocks differ in size ({', '.join(map(str, sizes))} trays): Slurm plans in base blocks of "
                        f"{sizes[0]}, so a job larger than that may be given trays of two partitions; equal "
                        "partitions (mctl partition templates) avoid this")
    with_sizes = plugin == "block" and version.block_sizes
    imex_job = None
    if settings.imex_scope == "job" and not topology_only:
        _check_job_scope_keys(settings)
        imex_job = render_imex_job(site, settings, trays)
    files: dict[str, str] = {}
    if not topology_only:
        files["slurm.conf"] = render_slurm_conf(site, settings, controller, trays, hardware, plugin, imex, gpus,
                                                imex_job)
        files["gres.conf"] = render_gres_conf(site, gpus)
        files["cgroup.conf"] = render_cgroup_conf(settings)
    files["topology.conf"] = render_topology(blocks, plugin, with_block_sizes=with_sizes,
                                             top_switch=_top_switch(site, blocks))
    return SlurmConfig(files, version, plugin, blocks, block_sizes(blocks) if with_sizes else [], imex, controller,
                       [t.name for t in trays], warnings, settings.partition_name, imex_job)


def _top_switch(site: Site, blocks: list[Block]) -> str:
    name = f"{site.name}-nvlink"
    taken = {b.name for b in blocks}
    while name in taken:
        name += "_"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


# ------------------------------------------------------------------ slurm.conf

def _globals(site: Site, settings: SlurmSettings, controller: Host, plugin: Plugin, imex: bool,
             imex_job: ImexJobFiles | None = None) -> list[tuple[str, str]]:
    cluster = (site.scheduler.cluster_name if site.scheduler else site.name).lower()
    g: list[tuple[str, str]] = [
        ("ClusterName", cluster),
        ("SlurmctldHost", f"{controller.name}({controller.address})"),
        ("SlurmctldPort", str(settings.slurmctld_port)),
        ("SlurmdPort", str(settings.slurmd_port)),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("SlurmUser", "slurm"),
    ]
    if settings.communication_parameters:
        g.append(("CommunicationParameters", settings.communication_parameters))
    g += [
        ("StateSaveLocation", settings.state_save_location),
        ("SlurmdSpoolDir", settings.slurmd_spool_dir),
        ("SlurmctldPidFile", "/run/slurmctld/slurmctld.pid"),
        ("SlurmdPidFile", "/run/slurmd.pid"),
        ("SlurmctldLogFile", f"{settings.log_dir.rstrip('/')}/slurmctld.log"),
        ("SlurmdLogFile", f"{settings.log_dir.rstrip('/')}/slurmd.log"),
        ("ReturnToService", "1"),
        ("MpiDefault", "none"),
        ("ProctrackType", settings.proctrack_type),
        ("TaskPlugin", settings.task_plugin),
        ("JobAcctGatherType", settings.jobacct_gather_type),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core_Memory"),
        ("GresTypes", "gpu"),
        ("TopologyPlugin", f"topology/{plugin}"),
    ]
    if imex:
        params = f"imex_channel_count={settings.imex_channel_count}"
        if settings.imex_dev_major is not None:
            params += f",imex_dev_major={settings.imex_dev_major}"
        g += [("SwitchType", "switch/nvidia_imex"), ("SwitchParameters", params)]
    if imex_job is not None:
        # IMEX per-job scope: the prolog runs as root on every node of the job at allocation (Alloc),
        # before the first task; the epilog after the job on every node.
        g += [("Prolog", imex_job.prolog_path), ("Epilog", imex_job.epilog_path), ("PrologFlags", "Alloc")]
    # The site's safety budget: one license per rack and one for the site (mctl.sched.slurm.budget, D67).
    g.append(("Licenses", site_licenses(site)))
    if node_check_enabled(settings):
        g += [("HealthCheckProgram", settings.node_check_program),
              ("HealthCheckInterval", str(settings.health_check_interval)),
              ("HealthCheckNodeState", settings.health_check_node_state)]
    return g


def _merge_extra(params: list[tuple[str, str]], extra: Mapping[str, str]) -> list[tuple[str, str]]:
    """scheduler.slurm.extra wins over mctl's value for the same key (Slurm keys are case-insensitive),
    except `Licenses`: the site's own licenses are kept beside the safety budget's."""
    wanted = {k.lower(): (k, str(v)) for k, v in extra.items()}
    out = []
    for key, value in params:
        if key.lower() == "licenses" and key.lower() in wanted:
            theirs = wanted.pop(key.lower())
            out.append((theirs[0], f"{theirs[1]},{value}"))
        elif key.lower() in wanted:
            out.append(wanted.pop(key.lower()))
        else:
            out.append((key, value))
    return out + list(wanted.values())


def _fold_in_order(values: list[str]) -> str | None:
    """A node set string that Slurm's hostlist expands back to exactly *values*, in order; else None."""
    folded = str(NodeSet.fromlist(values))
    if not _ONE_RANGE.match(folded) or list(NodeSet(folded)) != values:
        return None
    return folded


def _fold_ports(ports: list[int]) -> str | None:
    if len(ports) == 1:
        return str(ports[0])
    if ports == list(range(ports[0], ports[0] + len(ports))):
        return f"[{ports[0]}-{ports[-1]}]"
    return None


def _gpu_count(site: Site, t: Host, gpus: "Mapping[str, TrayGpus] | None") -> int:
    if gpus is not None and t.name in gpus:
        return gpus[t.name].count
    rack = site.racks[t.rack] if t.rack else None
    return rack.gpus_per_tray if rack else 0


def _node_lines(site: Site, trays: list[Host], hardware: Mapping[str, NodeHardware],
                gpus: "Mapping[str, TrayGpus] | None" = None) -> list[str]:
    runs: list[tuple[tuple, list[Host]]] = []
    for t in trays:
        key = (hardware[t.name], _gpu_count(site, t, gpus), t.rack, "slurmd_port" in t.vars)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(t)
        else:
            runs.append((key, [t]))
    lines = []
    for (hw, gpus, rack_name, has_port), hosts in runs:
        groups = [hosts]
        names = _fold_in_order([h.name for h in hosts])
        addrs = _fold_in_order([h.address for h in hosts])
        ports = _fold_ports([int(h.vars["slurmd_port"]) for h in hosts]) if has_port else ""
        if len(hosts) > 1 and (names is None or addrs is None or ports is None):
            groups = [[h] for h in hosts]
        for group in groups:
            parts = [f"NodeName={fold([h.name for h in group]) if len(group) > 1 else group[0].name}",
                     f"NodeAddr={addrs if len(group) > 1 else group[0].address}"]
            if has_port:
                parts.append(f"Port={ports if len(group) > 1 else int(group[0].vars['slurmd_port'])}")
            parts += [f"CPUs={hw.cpus}", f"Sockets={hw.sockets}", f"CoresPerSocket={hw.cores_per_socket}",
                      f"ThreadsPerCore={hw.threads_per_core}", f"RealMemory={hw.real_memory}"]
            if gpus:
                parts.append(f"Gres=gpu:{gpus}")
            if rack_name:
                parts.append(f"Features={rack_name}")
            parts.append("State=UNKNOWN")
            lines.append(" ".join(_word(*p.split("=", 1)) for p in parts))
    return lines


_UNSAFE_WORD = re.compile(r"[\s#\"'\\]|[\x00-\x1f\x7f]")


def _word(key: str, value: object) -> str:
    """One `Key=Value` of slurm.conf. The inventory checked every name and setting already; this is
    the last guard where the file is written: a value with a newline would add lines (Prolog=...)."""
    text = str(value)
    if _UNSAFE_WORD.search(key) or not text or _UNSAFE_WORD.search(text):
        raise UsageError(f"refusing to write slurm.conf: {key}={text!r} holds whitespace, quotes, '#' or control "
                         "characters", hint="fix the inventory value it comes from ('mctl inventory validate')")
    return f"{key}={text}"


def render_slurm_conf(site: Site, settings: SlurmSettings, controller: Host, trays: list[Host],
                      hardware: Mapping[str, NodeHardware], plugin: Plugin, imex: bool,
                      gpus: "Mapping[str, TrayGpus] | None" = None, imex_job: ImexJobFiles | None = None) -> str:
    params = _merge_extra(_globals(site, settings, controller, plugin, imex, imex_job), settings.extra)
    lines = [HEADER, ""]
    lines += [_word(k, v) for k, v in params]
    # one text whatever the source, so a new snapshot with the same counts changes nothing
    lines += ["", "# Compute trays: hardware from 'slurmd -C' on each tray, GPUs from the last rack inventory",
              "# (mctl rack inventory), else the rack model; 'mctl deploy slurm --dry-run' says which."]
    lines += _node_lines(site, trays, hardware, gpus)
    lines += ["", f"{_word('PartitionName', settings.partition_name)} Nodes=ALL Default=YES MaxTime=INFINITE State=UP"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ gres.conf, cgroup.conf

def gpu_files(count: int) -> str:
    return "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"


def minor_files(minors: tuple[int, ...]) -> str:
    """/dev/nvidia<minor> of each GPU, as gres.conf's File= expands them: /dev/nvidia[0-1,3]."""
    if len(minors) == 1:
        return f"/dev/nvidia{minors[0]}"
    runs: list[list[int]] = []
    for m in minors:
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    return "/dev/nvidia[" + ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) + "]"


def render_gres_conf(site: Site, gpus: "Mapping[str, TrayGpus] | None" = None) -> str:
    lines = [HEADER, "# One line per tray model: the GPUs' device files (Slurm needs File= for gres/gpu)."]
    by_files: dict[str, list[str]] = {}
    for rack in site.racks.values():
        for h in rack.compute:
            if gpus is not None and h.name in gpus:
                minors = gpus[h.name].minors
                if not minors:
                    continue                 # a tray with no GPU left: Gres=gpu:0 and no gres.conf line
                files = minor_files(minors)
            else:
                files = gpu_files(rack.gpus_per_tray)
            by_files.setdefault(files, []).append(h.name)
    for files, names in by_files.items():
        lines.append(f"NodeName={fold(names)} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def render_cgroup_conf(settings: SlurmSettings) -> str:
    lines = [HEADER, f"CgroupPlugin={settings.cgroup_plugin}"]
    if settings.cgroup_plugin.lower() != "disabled":
        lines += ["ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]
    else:
        lines.append("# no cgroup filesystem on these hosts: no confinement of jobs (scheduler.slurm.cgroup_plugin)")
    return "\n".join(lines) + "\n"
