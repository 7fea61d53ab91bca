"""The typed section of a site inventory (what operators write in mctl.yml).

mctl.inventory.spec checks types, bounds and unknown keys; cross-field rules (tray
counts, overlaps, references) live in the loader and validate.py so each can say
exactly what is wrong. Each section is converted once, by the loader, into the model's
settings (mctl.model.settings, via mctl.inventory.convert); nothing after the loader
reads these classes. Their defaults agree with the model's (tests/unit/test_settings_model.py).
"""

from __future__ import annotations

from mctl.inventory.spec import ANY, DictOf, Either, F, ListOf, OneOf, Opt, Spec
from mctl.model.settings import (DEFAULT_HYSTERESIS_CHECKS, EVENT_KINDS, EVENT_SINK_TYPES, FABRIC_FLAG_DEFAULTS,
                                 LEAK_SWITCH_TRAY, SYSLOG_FACILITIES, subcode_texts)
from mctl.model.xid import DEFAULT_DRAIN_XIDS, DEFAULT_NVLINK5_NO_DRAIN

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
DURATION_PATTERN = r"^[0-9]+[smhd]$"
FABRIC_FLAGS = tuple(FABRIC_FLAG_DEFAULTS)
# Hints of the newer keys (the older ones say only what was wrong, as their --json has always said).
_SHARE = "a share of the trays: a number above 0 and at most 1, e.g. 0.25"
_CAP = "a whole number of trays, at least 1"
_BOOL = "true or false"
_DURATION = "a duration: a whole number and s, m, h or d, e.g. 5s"
_TRAYS = "a list of tray names, e.g. [rack-a-tray01, rack-a-nvsw01]"


# Defaults are taken as written, as pydantic did (it never validated them): `interval` stays 60, not 60.0.

class SSHSpec(Spec):
    user = F(str, "root")
    port = F(int, 22, ge=1, le=65535)
    identity_file = F(Opt(str), None)
    known_hosts = F(str, "known_hosts")
    connect_timeout = F(float, 10.0, gt=0)
    command_timeout = F(float, 60.0, gt=0)
    concurrency = F(int, 64, ge=1, le=4096)


class NMXSpec(Spec):
    url = F(str)
    credentials_file = F(str)
    verify_tls = F(Either(bool, str), True)     # true, false, or a CA bundle path (loader: _nmx_problems)
    allow_http = F(bool, False)                 # plain http:// on a routed address (else loopback only)


class BMCSpec(Spec):
    """How mctl reaches the trays' BMCs over Redfish (docs/bmc.md); the addresses are each group's `bmc`."""

    credentials_file = F(str)                   # one line username:password, mode 0600
    verify_tls = F(Either(bool, str), True)     # true, false, or a CA bundle path
    scheme = F(OneOf("https", "http"), "https")
    port = F(Opt(int), None, ge=1, le=65535)
    timeout_s = F(float, 10.0, gt=0)            # each connect and each read
    deadline_s = F(float, 60.0, gt=0)           # one tray, every request together
    concurrency = F(int, 32, ge=1, le=1024)     # trays read at once (one connection per BMC)


class HeadNode(Spec):
    name = F(str)
    address = F(str)
    vars = F(DictOf(str, ANY), factory=dict)


class TrayGroup(Spec):
    nodes = F(str)
    addresses = F(str)
    bmc = F(Opt(str), None)
    image = F(Opt(str), None)
    # Per-group Ansible variables; a value that is a bracketed range string such as
    # "[16801-16818]" is expanded per tray like the address list.
    vars = F(DictOf(str, ANY), factory=dict)


class RackShape(Spec):
    """A rack that is deliberately not fully populated states it here."""

    compute_trays = F(int, ge=0)
    switch_trays = F(int, ge=0)


class PartitionSpec(Spec):
    name = F(str, pattern=NAME_PATTERN)
    trays = F(str)


class RackSpec(Spec):
    model = F(OneOf("nvl72"), "nvl72")
    shape = F(Opt(RackShape), None)
    nvlink_domain = F(Opt(str), None, pattern=r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
    nmx = F(Opt(NMXSpec), None)
    head = F(Opt(HeadNode), None)
    compute = F(TrayGroup)
    switches = F(Opt(TrayGroup), None)
    partitions = F(ListOf(PartitionSpec), factory=list)


class SlurmSpec(Spec):
    partition_name = F(str, "gpu")
    imex_channel_count = F(int, 2048, ge=1)
    health_check_interval = F(int, 300, ge=0)
    conf_dir = F(str, "/etc/slurm")
    extra = F(DictOf(str, str), factory=dict)
    # Everything below is optional; the defaults are right for a real GB200 site
    # (systemd, cgroup v2, NVIDIA driver loaded). See docs/scheduler.md.
    topology = F(OneOf("auto", "block", "tree"), "auto")          # auto: block when Slurm supports it
    imex_dev_major = F(Opt(int), None, ge=0)                      # else the plugin reads /proc/devices
    # partition: static IMEX domains (mctl imex apply); job: the deployment installs the per-job
    # prolog/epilog (mctl/sched/slurm/imex_job.py) and wires them into slurm.conf (docs/scheduler.md)
    imex_scope = F(OneOf("partition", "job"), "partition")
    slurmctld_port = F(int, 6817, ge=1, le=65535)
    slurmd_port = F(int, 6818, ge=1, le=65535)                    # a tray's `slurmd_port` var overrides it
    communication_parameters = F(Opt(str), None)
    cgroup_plugin = F(str, "autodetect")                          # "disabled" where there is no cgroup fs
    proctrack_type = F(str, "proctrack/cgroup")
    task_plugin = F(str, "task/cgroup,task/affinity")
    jobacct_gather_type = F(str, "jobacct_gather/cgroup")
    # expect: the NVIDIA driver made /dev/nvidia*; create: make the nodes (major 195) like nvidia-modprobe
    gpu_device_nodes = F(OneOf("expect", "create"), "expect")
    # HealthCheckProgram (mctl node check), HealthCheckInterval and HealthCheckNodeState in slurm.conf,
    # and the node check installed with the Slurm deployment; false turns all of it off (docs/scheduler.md)
    node_check = F(bool, True)
    node_check_installed = F(Opt(bool), None)                     # deprecated: the old name of node_check
    node_check_program = F(str, "/usr/local/sbin/mctl-node-check")
    health_check_node_state = F(str, "ANY,CYCLE")                # CYCLE spreads the checks over the interval (D67)
    state_save_location = F(str, "/var/spool/slurmctld")
    slurmd_spool_dir = F(str, "/var/spool/slurmd")
    log_dir = F(str, "/var/log/slurm")
    verify_timeout = F(float, 120, gt=0)                        # seconds for every tray to register


class K8sSpec(Spec):
    kubeconfig = F(Opt(str), None)
    namespace = F(str, "gpu-operator")
    # Optional; see docs/scheduler.md.
    context = F(Opt(str), None)                     # kubeconfig context (default: its current-context)
    dra_namespace = F(str, "nvidia-dra-driver-gpu")
    workload_namespace = F(str, "default")          # ComputeDomains and example workloads
    operator_manages_driver = F(bool, False)        # False: the trays' image delivers the NVIDIA driver
    dra_gpu_resources = F(bool, False)              # True: the DRA driver also serves GPUs (not only IMEX channels)
    helm_repo = F(Opt(str), None)                   # NVIDIA's Helm repository URL (install.sh asks when unset)
    gpu_operator_version = F(Opt(str), None)
    dra_driver_version = F(Opt(str), None)
    example_image = F(str, "ubuntu:24.04")
    kubernetes_version = F(str, "1.32", pattern=r"^1\.[0-9]{1,2}$")   # the cluster's: manifests are checked for it


class SchedulerSpec(Spec):
    type = F(OneOf("slurm", "k8s"))
    cluster_name = F(str, "mctl")
    controller = F(Opt(str), None)
    slurm = F(SlurmSpec, factory=SlurmSpec)
    k8s = F(K8sSpec, factory=K8sSpec)


class BreakerSpec(Spec):
    max_drained_share = F(float, 0.25, gt=0, le=1)
    window = F(str, "1h", pattern=DURATION_PATTERN)
    # Optional (docs/health.md): count drains per rack (default) or over the whole site.
    scope = F(OneOf("rack", "site"), "rack")


class HysteresisSpec(Spec):
    # Flapping findings (docs/health.md "Flapping and storms"; mctl/health/hysteresis.py).
    clear_sweeps = F(int, 1, ge=1)           # clear sweeps that release a finding that never came back
    max_hold_sweeps = F(int, 64, ge=1)       # the longest hold, however often it flapped
    window_sweeps = F(int, 10, ge=0)         # back within this many sweeps after its release: it flapped
    checks = F(ListOf(str), factory=lambda: sorted(DEFAULT_HYSTERESIS_CHECKS))


class LeakSpec(Spec):
    # Leaks read from the trays' BMCs (docs/health.md "Leaks and power"; mctl/health/leaks.py).
    power_off = F(bool, True)                                 # power a tray with a critical leak off ...
    power_off_after = F(str, "10m", pattern=DURATION_PATTERN)  # ... this long after it was first seen
    clear_sweeps = F(int, 3, ge=1)                            # sweeps without Critical that end the episode
    exclude = F(ListOf(str), factory=list, hint=_TRAYS)       # trays never powered off for a leak (loader: hosts)
    rack_share = F(float, 0.25, gt=0, le=1, hint=_SHARE)      # critical leaks on more of a rack's trays: the rack
    rack_power_off = F(bool, True, hint=_BOOL)                # false: the rack-wide response drains and alerts only
    switch_tray = F(OneOf(*LEAK_SWITCH_TRAY), "power-off",    # a switch tray's leak: power-off | rack | alert
                    hint="power-off (the switch tray alone), rack (the whole rack, in order) or alert")


class BmcEventsSpec(Spec):
    # The watch's receiver of Redfish EventService events (docs/health.md "Leak events"; model: BmcEventSettings).
    listen = F(Opt(str), None)                                # an IP; loopback may take http, any other needs TLS
    port = F(int, 0, ge=0, le=65535)
    url = F(Opt(str), None)                                   # what the BMCs POST to (default from listen/port)
    tls_cert = F(Opt(str), None)
    tls_key = F(Opt(str), None)
    leak_interval = F(Opt(float), None, gt=0)                 # a subscribed BMC's leak poll (default: bmc_interval)
    queue = F(int, 1024, ge=1, le=100000)


class EscalationSpec(Spec):
    # Rack-level escalation (docs/health.md "Rack escalation"; mctl/health/escalation.py): off unless the site
    # turns it on (D98).
    enabled = F(bool, False, hint=_BOOL)
    rack_share = F(float, 0.5, gt=0, le=0.99, hint="a share of the rack's compute trays, above 0 and at most 0.99")
    window = F(str, "10m", pattern=DURATION_PATTERN, hint=_DURATION)   # each failure begun within it counts
    min_trays = F(int, 2, ge=1, le=72)                        # at least this many failed trays
    on_switch_tray = F(bool, True, hint=_BOOL)                # a failed switch tray escalates its rack
    count_unreachable = F(bool, False, hint=_BOOL)            # unreachable trays count as failed


class LadderSpec(Spec):
    # The recovery ladder (docs/health.md "The recovery ladder"; mctl/health/ladder.py): every rung opt-in.
    gpu_reset = F(bool, False)                               # nvidia-smi -r on an idle tray whose XIDs say reset
    reboot = F(bool, False)                                  # systemctl reboot through the OS
    power_cycle = F(bool, False)                             # PowerCycle through the tray's BMC (needs bmc:)
    power_cycle_when = F(OneOf("unanswered", "unfixed"), "unanswered")
    burn_in = F(OneOf("off", "quick", "medium", "long"), "off")     # DCGM/NCCL must pass before the resume
    max_failures = F(int, 3, ge=1, le=100)                   # failed recoveries within failure_window: repair
    failure_window = F(str, "24h", pattern=DURATION_PATTERN)
    fail_after_sweeps = F(int, 3, ge=1)                      # critical sweeps after a rung: it did not fix it
    retry_after = F(str, "1m", pattern=DURATION_PATTERN)     # after a failed recovery, the next no sooner
    gpu_reset_deadline = F(str, "2m", pattern=DURATION_PATTERN)
    reboot_deadline = F(str, "10m", pattern=DURATION_PATTERN)
    power_cycle_deadline = F(str, "15m", pattern=DURATION_PATTERN)
    verify_deadline = F(str, "10m", pattern=DURATION_PATTERN)
    burn_in_deadline = F(str, "1h", pattern=DURATION_PATTERN)
    repair_hook = F(Opt(ListOf(str)), None)                  # argv of a command; {tray} {rack} {reason} {failures}
    repair_hook_timeout = F(str, "60s", pattern=DURATION_PATTERN)
    evidence = F(bool, True)                                 # a bundle per tray before each rung (state dir)
    evidence_deadline = F(str, "60s", pattern=DURATION_PATTERN)


class IsolateSpec(Spec):
    # Isolating a tray drained for a hardware fault from its NVLink partition (docs/health.md "Isolating a
    # failed tray"; mctl/health/isolate.py): off unless the site turns it on; needs NMX-M on every rack.
    enabled = F(bool, False)
    to = F(OneOf("quarantine", "default"), "quarantine")     # as `mctl partition isolate --to`


class EventSinkSpec(Spec):
    # One sink of the event stream (docs/events.md; mctl/health/events.py). Which keys each type takes is
    # the loader's check (_event_problems), each refused at its line.
    type = F(OneOf(*EVENT_SINK_TYPES), hint="file, syslog, webhook or exec")
    name = F(Opt(str), None, pattern=NAME_PATTERN)           # its label in metrics and dead letters
    path = F(Opt(str), None)                                 # file
    address = F(Opt(str), None)                              # syslog: unix:/dev/log or udp:HOST:PORT
    facility = F(OneOf(*SYSLOG_FACILITIES), "daemon")        # syslog
    url = F(Opt(str), None)                                  # webhook: http:// or https://
    timeout = F(str, "5s", pattern=DURATION_PATTERN, hint=_DURATION)   # webhook: each attempt; exec: the command
    retries = F(int, 3, ge=0, le=20)                         # webhook: attempts after the first
    backoff = F(str, "1s", pattern=DURATION_PATTERN, hint=_DURATION)   # webhook: first retry's wait, doubled
    headers_file = F(Opt(str), None)                         # webhook: "Name: value" lines, mode 0600
    command = F(Opt(ListOf(str)), None)                      # exec: argv; {tray} {rack} {reason} {failures}
    kinds = F(ListOf(OneOf(*EVENT_KINDS)), factory=list)     # finding, action (empty: both)
    actions = F(ListOf(str), factory=list)                   # action events of these actions only
    queue = F(int, 1000, ge=1, le=1000000)                   # events waiting; a full queue drops the newest
    dead_letter = F(Opt(str), None)                          # undeliverable events (default in the state dir)


class FailoverSpec(Spec):
    # The watch's leader lease in etcd v3 (docs/health.md "Failover"); no endpoints: no lease.
    etcd = F(ListOf(str), factory=list)                      # client URLs, http://host:2379
    key_prefix = F(str, "/mctl", pattern=r"^/[A-Za-z0-9._/-]*$")
    ttl = F(Opt(str), None, pattern=DURATION_PATTERN)        # default: the watch's interval (at least 2s)
    timeout = F(str, "2s", pattern=DURATION_PATTERN)         # each request to etcd


class HealthSpec(Spec):
    interval = F(float, 60, gt=0)
    drain_xids = F(ListOf(int), factory=lambda: sorted(DEFAULT_DRAIN_XIDS))
    # NVLink5 XIDs 144-150 (docs/health.md): drain on the line's Fatal word ("fatal") or on every line ("all");
    # Fatal XID.subcode pairs that never drain (NVIDIA's catalogue: ignore).
    nvlink5_drain = F(OneOf("fatal", "all"), "fatal")
    nvlink5_no_drain = F(ListOf(str), factory=lambda: subcode_texts(DEFAULT_NVLINK5_NO_DRAIN))
    resume_after_healthy_sweeps = F(int, 3, ge=1)
    unreachable_sweeps_before_drain = F(int, 3, ge=1)
    max_gpu_temp_c = F(float, 90)
    breaker = F(BreakerSpec, factory=BreakerSpec)
    # Everything below is optional; see docs/health.md for what each key changes.
    remediate = F(bool, True)                                # `mctl health watch` drains unless --no-remediate
    confirm_sweeps = F(int, 1, ge=1)                         # consecutive critical sweeps before a drain
    xid_window = F(str, "1h", pattern=DURATION_PATTERN)      # older XIDs (or from an earlier boot) stop counting
    boot_grace = F(str, "2m", pattern=DURATION_PATTERN)      # start-up checks warn while the tray is younger (0s: off)
    gpu_temp_warn_c = F(Opt(float), None)                    # default: max_gpu_temp_c - 5
    max_power_overshoot_pct = F(float, 5, ge=0)            # draw above the enforced limit by more than this warns
    nvlink_error_window = F(str, "10m", pattern=DURATION_PATTERN)   # NVLink error counters judged as rates over it
    nvlink_error_rate_critical = F(float, 100, gt=0)         # errors a second on a link that fail (DCGM's CRC limit)
    clock_event_sweeps = F(int, 3, ge=1)                     # sweeps of HW slowdown / power brake before critical
    # Severity per fabric health flag; route_unhealthy is a warning because real GB200 trays on
    # driver 570 report it True while the fabric is Completed/Success.
    fabric_flags = F(DictOf(OneOf(*FABRIC_FLAGS), OneOf("ok", "warn", "critical")), factory=dict)
    driver_mismatch = F(OneOf("warn", "critical"), "warn")
    imex = F(OneOf("auto", "required", "ignore"), "auto")     # auto: checked where the tray has an IMEX config
    dcgm = F(OneOf("auto", "required", "off"), "auto")        # DCGM health: auto where dcgmi is installed
    disk_paths = F(ListOf(str), factory=lambda: ["/", "/var", "/tmp"])
    disk_warn_pct = F(float, 90, gt=0, le=100)
    disk_critical_pct = F(float, 98, gt=0, le=100)
    memory_warn_available_pct = F(float, 5, ge=0, le=100)
    metrics_textfile = F(Opt(str), None)                     # Prometheus textfile (node_exporter collector)
    metrics_port = F(Opt(int), None, ge=1, le=65535)         # HTTP /metrics on metrics_listen
    metrics_listen = F(str, "127.0.0.1")                     # address /metrics binds (an IP; checked at the CLI)
    tray_deadline = F(Opt(float), None, gt=0)                # seconds per tray probe (default: interval, 5..15)
    k8s_taint = F(str, "mctl.io/unhealthy=true:NoSchedule",
                  pattern=r"^[A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$")
    k8s_evict = F(bool, False)                               # a drained node's GPU pods evicted (Eviction API)
    hysteresis = F(HysteresisSpec, factory=HysteresisSpec)
    bmc_checks = F(OneOf("auto", "off"), "auto")              # leaks and power from the BMCs (auto: bmc section)
    leak_interval = F(Opt(float), None, gt=0)                # seconds between a BMC's leak reads (default: interval)
    bmc_interval = F(Opt(float), None, gt=0)                 # ... of its health/power (default: leak_interval, >= 60)
    bmc_stale_after = F(int, 3, ge=1)                        # leak intervals a BMC view may age (bmc.stale)
    bmc_events = F(BmcEventsSpec, factory=BmcEventsSpec)     # leaks pushed by the BMCs (Redfish EventService)
    leak = F(LeakSpec, factory=LeakSpec)

    ladder = F(LadderSpec, factory=LadderSpec)
    escalation = F(EscalationSpec, factory=EscalationSpec)
    isolate = F(IsolateSpec, factory=IsolateSpec)
    events = F(ListOf(EventSinkSpec), factory=list)          # finding changes and actions out (docs/events.md)
    shards = F(DictOf(str, ListOf(str)), factory=dict)       # watch shards: name -> racks (docs/health.md)
    failover = F(FailoverSpec, factory=FailoverSpec)         # the watch's leader lease in etcd


class BudgetSpec(Spec):
    # Trays out of service by mctl's own decision (docs/health.md "The safety budget"; model: BudgetSettings).
    rack_share = F(float, 0.25, gt=0, le=1, hint=_SHARE)
    rack_max = F(int, 4, ge=1, hint=_CAP)
    site_share = F(float, 0.25, gt=0, le=1, hint=_SHARE)
    site_max = F(int, 64, ge=1, hint=_CAP)
    allow_whole_rack = F(bool, False, hint=_BOOL)   # a budget that allows a whole rack or site (loader: _budget_problems)


class SafetySpec(Spec):
    budget = F(BudgetSpec, factory=BudgetSpec)


class SiteSpec(Spec):
    plugin = F(OneOf("mctl"), "mctl")
    site = F(str, pattern=NAME_PATTERN)
    images_dir = F(Opt(str), None)
    ssh = F(SSHSpec, factory=SSHSpec)
    racks = F(DictOf(str, RackSpec))
    scheduler = F(Opt(SchedulerSpec), None)
    health = F(HealthSpec, factory=HealthSpec)
    safety = F(SafetySpec, factory=SafetySpec)
    vars = F(DictOf(str, ANY), factory=dict)
    bmc = F(Opt(BMCSpec), None)
