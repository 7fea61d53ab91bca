"""The typed section of a site inventory (what operators write in mctl.yml).

Pydantic checks types and unknown keys; cross-field rules (tray counts, overlaps,
references) live in validate.py so each can say exactly what is wrong.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class SSHSettings(Strict):
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str = "known_hosts"
    connect_timeout: float = Field(10.0, gt=0)
    command_timeout: float = Field(60.0, gt=0)
    concurrency: int = Field(64, ge=1, le=4096)


class NMXSettings(Strict):
    url: str
    credentials_file: str
    verify_tls: bool | str = True


class HeadNode(Strict):
    name: str
    address: str
    vars: dict[str, Any] = Field(default_factory=dict)


class TrayGroup(Strict):
    nodes: str
    addresses: str
    bmc: str | None = None
    image: str | None = None
    # Per-group Ansible variables; a value that is a bracketed range string such as
    # "[16801-16818]" is expanded per tray like the address list.
    vars: dict[str, Any] = Field(default_factory=dict)


class RackShape(Strict):
    """A rack that is deliberately not fully populated states it here."""

    compute_trays: int = Field(ge=0)
    switch_trays: int = Field(ge=0)


class PartitionSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    trays: str


class RackSpec(Strict):
    model: Literal["nvl72"] = "nvl72"
    shape: RackShape | None = None
    nvlink_domain: str | None = Field(None, pattern=r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
    nmx: NMXSettings | None = None
    head: HeadNode | None = None
    compute: TrayGroup
    switches: TrayGroup | None = None
    partitions: list[PartitionSpec] = Field(default_factory=list)


class SlurmSettings(Strict):
    partition_name: str = "gpu"
    imex_channel_count: int = Field(2048, ge=1)
    health_check_interval: int = Field(300, ge=0)
    conf_dir: str = "/etc/slurm"
    extra: dict[str, str] = Field(default_factory=dict)
    # Everything below is optional; the defaults are right for a real GB200 site
    # (systemd, cgroup v2, NVIDIA driver loaded). See docs/scheduler.md.
    topology: Literal["auto", "block", "tree"] = "auto"      # auto: block when Slurm supports it
    imex_dev_major: int | None = Field(None, ge=0)           # else the plugin reads /proc/devices
    slurmctld_port: int = Field(6817, ge=1, le=65535)
    slurmd_port: int = Field(6818, ge=1, le=65535)           # a tray's `slurmd_port` var overrides it
    communication_parameters: str | None = None
    cgroup_plugin: str = "autodetect"                        # "disabled" where there is no cgroup fs
    proctrack_type: str = "proctrack/cgroup"
    task_plugin: str = "task/cgroup,task/affinity"
    jobacct_gather_type: str = "jobacct_gather/cgroup"
    # expect: the NVIDIA driver made /dev/nvidia*; create: make the nodes (major 195) like nvidia-modprobe
    gpu_device_nodes: Literal["expect", "create"] = "expect"
    node_check_installed: bool = False                       # render HealthCheckProgram once it is there
    node_check_program: str = "/usr/local/sbin/mctl-node-check"
    health_check_node_state: str = "ANY"
    state_save_location: str = "/var/spool/slurmctld"
    slurmd_spool_dir: str = "/var/spool/slurmd"
    log_dir: str = "/var/log/slurm"
    verify_timeout: float = Field(120, gt=0)                 # seconds for every tray to register


class K8sSettings(Strict):
    kubeconfig: str | None = None
    namespace: str = "gpu-operator"
    # Optional; see docs/scheduler.md.
    context: str | None = None                     # kubeconfig context (default: its current-context)
    dra_namespace: str = "nvidia-dra-driver-gpu"
    workload_namespace: str = "default"            # ComputeDomains and example workloads
    operator_manages_driver: bool = False          # False: the trays' image delivers the NVIDIA driver
    dra_gpu_resources: bool = False                # True: the DRA driver also serves GPUs (not only IMEX channels)
    helm_repo: str | None = None                   # NVIDIA's Helm repository URL (install.sh asks when unset)
    gpu_operator_version: str | None = None
    dra_driver_version: str | None = None
    example_image: str = "ubuntu:24.04"


class SchedulerSpec(Strict):
    type: Literal["slurm", "k8s"]
    cluster_name: str = "mctl"
    controller: str | None = None
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    k8s: K8sSettings = Field(default_factory=K8sSettings)


class BreakerSpec(Strict):
    max_drained_share: float = Field(0.25, gt=0, le=1)
    window: str = Field("1h", pattern=r"^[0-9]+[smhd]$")
    # Optional (docs/health.md): count drains per rack (default) or over the whole site.
    scope: Literal["rack", "site"] = "rack"


class HealthSpec(Strict):
    interval: float = Field(60, gt=0)
    drain_xids: list[int] = Field(default_factory=lambda: [46, 48, 64, 74, 79, 95, 119, 120, 136, 140,
                                                            144, 145, 146, 147, 148, 149, 150, 155, 158])
    resume_after_healthy_sweeps: int = Field(3, ge=1)
    unreachable_sweeps_before_drain: int = Field(3, ge=1)
    max_gpu_temp_c: float = 90
    breaker: BreakerSpec = Field(default_factory=BreakerSpec)
    # Everything below is optional; see docs/health.md for what each key changes.
    remediate: bool = True                                   # `mctl health watch` drains unless --no-remediate
    confirm_sweeps: int = Field(1, ge=1)                     # consecutive critical sweeps before a drain
    xid_window: str = Field("1h", pattern=r"^[0-9]+[smhd]$")  # older XIDs (or from an earlier boot) stop counting
    gpu_temp_warn_c: float | None = None                     # default: max_gpu_temp_c - 5
    max_power_overshoot_pct: float = Field(5, ge=0)          # draw above the enforced limit by more than this warns
    # Severity per fabric health flag; route_unhealthy is a warning because real GB200 trays on
    # driver 570 report it True while the fabric is Completed/Success.
    fabric_flags: dict[Literal["degraded_bandwidth", "route_recovery_in_progress", "route_unhealthy",
                               "access_timeout_recovery", "incorrect_configuration", "summary_unhealthy",
                               "summary_limited_capacity"],
                       Literal["ok", "warn", "critical"]] = Field(default_factory=dict)
    driver_mismatch: Literal["warn", "critical"] = "warn"
    imex: Literal["auto", "required", "ignore"] = "auto"    # auto: checked where the tray has an IMEX config
    disk_paths: list[str] = Field(default_factory=lambda: ["/", "/var", "/tmp"])
    disk_warn_pct: float = Field(90, gt=0, le=100)
    disk_critical_pct: float = Field(98, gt=0, le=100)
    memory_warn_available_pct: float = Field(5, ge=0, le=100)
    metrics_textfile: str | None = None                      # Prometheus textfile (node_exporter collector)
    metrics_port: int | None = Field(None, ge=1, le=65535)   # HTTP /metrics on 127.0.0.1
    k8s_taint: str = Field("mctl.io/unhealthy=true:NoSchedule",
                           pattern=r"^[A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$")


class SiteSpec(Strict):
    plugin: Literal["mctl"] = "mctl"
    site: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    images_dir: str | None = None
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    racks: dict[str, RackSpec]
    scheduler: SchedulerSpec | None = None
    health: HealthSpec = Field(default_factory=HealthSpec)
    vars: dict[str, Any] = Field(default_factory=dict)
