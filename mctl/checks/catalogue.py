"""The check catalogue: every check id mctl judges a compute tray or a rack by, defined once.

Each entry names one check id, its one severity (what the check reports when it
fails), what it is about, and the purposes that evaluate it (mctl.model.tray:
inventory, health, node check, audit). The evaluators (the modules of this
package, one rule each; mctl.checks.inventory for the rack-wide inventory rules)
build findings with these ids only, a failure at the entry's severity
(mctl.checks._base.fail), and unit tests hold them to it.

Two qualifiers keep "one severity" honest where a check has more than one
outcome:

- `milder`: the same problem in a form that passes by itself or is not yet
  harmful warns before it fails (a row remap *pending*, a fabric *In Progress*,
  a disk over the warning but under the critical threshold);
- `setting`: the site chooses the severity (health settings: which XIDs drain,
  the fabric flags' severities, a driver that differs from the image); the
  entry's severity is the default.

Standard library only: `mctl node check` carries this package to the tray.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from mctl.model.findings import Severity
from mctl.model.tray import AUDIT, HEALTH, INVENTORY, NODE_CHECK, PURPOSES


@dataclass(frozen=True)
class Check:
    id: str
    severity: Severity                 # what a failure of this check is (OK: an informational note)
    about: str                         # one line: what the check judges
    purposes: frozenset[str]
    milder: bool = False               # a milder form of the problem warns first
    setting: str | None = None         # the health setting that chooses the severity (the default is `severity`)
    source: str = ""                   # the NVIDIA, SchedMD or other document the check follows
    thresholds: str = ""               # what fails and what warns, with the settings that move it
    lab: str = ""                      # the `mctl lab fault ...` that makes it fail in the lab, or "none: why"

    def allows(self, severity: Severity) -> bool:
        """Whether a finding of this check may carry *severity* (OK always: what was checked)."""
        if severity is Severity.OK or severity is self.severity or self.setting is not None:
            return True
        return self.milder and severity is Severity.WARN


# The purposes of the tray checks the health catalogue runs: a health sweep, `mctl node check` on the tray,
# and the audit (whose health family is one sweep of the same catalogue).
_TRAY = frozenset({HEALTH, NODE_CHECK, AUDIT})
_ALL = frozenset(PURPOSES)
_INV = frozenset({INVENTORY})
_AUD = frozenset({AUDIT})               # the audit's own rule families (mctl.audit.rules, mctl.images.drift)
_INV_AUD = frozenset({INVENTORY, AUDIT})
_SWF = frozenset({HEALTH})             # read from the rack's NMX-M by the sweep (mctl/health/nmx_watch.py)
_OOB = frozenset({HEALTH, AUDIT})          # read from the tray's BMC by the sweep (mctl.health.oob), not on the tray
C, W, OK = Severity.CRITICAL, Severity.WARN, Severity.OK

_ENTRIES = (
    # -- reachability and the probe
    Check("tray.reachable", C, "the tray answered the probe (SSH, or the node check ran on it)", _TRAY),
    Check("ssh.unreachable", C, "the inventory could not reach the tray over SSH", _INV),
    Check("ssh.timeout", C, "the tray accepted SSH but the inventory probe never finished (wedged)", _INV),
    Check("ssh.host-key", C, "the host's SSH key is the one known_hosts holds (a key not recorded warns)", _INV_AUD,
          milder=True),
    Check("probe.partial", W, "a probe section was missing, cut off or unreadable", _ALL),
    Check("host.name", W, "the tray answers with the inventory's host name", _INV),
    Check("tray.boot", W, "the tray did not reboot since the last sweep (boot id)", _TRAY),
    # -- out of band: the tray's BMC over Redfish (mctl/checks/leak.py)
    Check("bmc.reachable", W, "the tray's BMC answered within its deadline (leaks and power read out of band)", _OOB),
    Check("bmc.stale", W, "the BMC view the sweep judged is recent (the watch reads each BMC beside the sweep, "
          "health.bmc_stale_after)", _OOB),
    Check("leak.detectors", C, "no leak detector reports Critical (Warning, unknown or unread detectors warn)", _OOB,
          milder=True),
    Check("power.supplies", W, "the tray's power subsystem and power supplies report OK", _OOB),

    Check("tray.repair", C, "the recovery ladder has not marked the tray for repair (the watch's records)",
          frozenset({HEALTH})),
    # -- GPUs
    Check("gpu.facts", C, "nvidia-smi (or NVML) answered with readable GPU facts (warns in the boot grace)", _ALL,
          milder=True),
    Check("gpu.count", C, "the tray shows all its GPUs, as many as the driver counts", _ALL),
    Check("gpu.driver", W, "the tray's driver is its image's (health), and the rack's (inventory)", _ALL,
          setting="driver_mismatch"),
    Check("gpu.duplicate", C, "one GPU UUID answers at one inventory address only", _INV),
    Check("gpu.out-of-band", C, "a tray without GPU tools yet: its BMC and NMX-M show all its GPUs (bring-up; "
          "provisioning installs the tools)", _INV),
    Check("bmc.serial-duplicate", C, "one tray chassis serial per BMC across the rack (two addresses, one tray)", _INV),
    Check("gpu.xid", C, "no XID that drains in the XID window of this boot (others warn)", _TRAY,
          setting="drain_xids"),
    Check("gpu.ecc", C, "no uncorrectable ECC error since the driver loaded (lifetime ones warn)", _TRAY,
          milder=True),
    Check("gpu.remapped-rows", C, "no row-remap failure (a pending remap warns)", _TRAY, milder=True),
    Check("gpu.memory-repair", C, "no unrepairable memory or SRAM threshold (a pending repair warns)", _TRAY,
          milder=True),
    Check("gpu.recovery", C, "the driver asks for no GPU recovery action", _TRAY),
    Check("gpu.temperature", C, "GPU temperatures under the site's limit (over the warning level warns)", _TRAY,
          milder=True),
    Check("gpu.power", W, "GPU power draw within the enforced limit", _TRAY),
    Check("gpu.clocks", C, "no HW slowdown or HW power brake holds the GPU clocks for N sweeps (one sweep, thermal "
          "slowdown and SW power cap warn)", _TRAY, milder=True),
    Check("dcgm.health", C, "DCGM's health watches report no Failure where DCGM runs (Warning, or DCGM installed "
          "but not reporting, warns)", _TRAY, milder=True),
    # -- NVLink and the fabric
    Check("nvlink.links", C, "every GPU's 18 NVLinks are up (unreadable link facts warn)", _TRAY, milder=True),
    Check("nvlink.errors", C, "no NVLink error counter grows past its rate over the window (any growth of a "
          "CRC-like counter warns)", _TRAY, milder=True),
    Check("fabric.state", C, "every GPU's fabric is Completed/Success (In Progress warns)", _ALL, milder=True),
    Check("fabric.health", W, "no fabric health flag set (each flag's severity is a setting)", _ALL,
          setting="fabric_flags"),
    Check("fabric.domain", C, "the tray's GPUs are in one NVLink domain, the rack's", _TRAY),
    Check("fabric.clique", C, "the tray is in its planned partition's clique (rack-wide doubts warn)", _TRAY,
          milder=True),
    Check("fabric.no-domain", C, "every GPU is in an NVLink domain (cluster UUID not absent or zero)", _INV),
    Check("fabric.cluster-uuid-conflict", C, "one tray's GPUs report one cluster UUID", _INV),
    Check("fabric.clique-split", C, "one tray's GPUs are in one clique", _INV),
    Check("fabric.rack-domains", C, "the rack's trays report one NVLink domain", _INV),
    Check("fabric.domain-mismatch", C, "the trays' NVLink domain is the inventory's nvlink_domain", _INV),
    Check("fabric.domain-shared", C, "no other rack has this rack's NVLink domain", _INV),
    Check("fabric.domain-undeclared", OK, "the NVLink domain observed where the inventory declares none", _INV),
    # -- services and the host
    Check("imex.daemon", C, "the IMEX daemon is READY where IMEX is configured (warns in the boot grace)", _TRAY,
          milder=True),
    Check("imex.domain", W, "the IMEX domain is UP", _TRAY),
    Check("slurm.slurmd", C, "slurmd runs and the controller hears from it (Slurm sites)", _TRAY, milder=True),
    Check("host.disk", C, "local file systems under the critical fill level (over the warning level warns)", _TRAY,
          milder=True),
    Check("host.memory", W, "enough memory available", _TRAY),
    # -- the audit's families: the layers above the tray (Slurm, NMX-M, IMEX files, partitions, drains, image)
    Check("drain.reason", W, "a drained tray says why (a reason is recorded)", _AUD),
    Check("drain.age", W, "no tray stays drained longer than the audit's limit", _AUD),
    Check("imex.nodes_config", C, "each tray's IMEX node list is its partition's, as mctl renders it", _AUD),
    Check("imex.config", C, "each tray's IMEX config.cfg is what mctl renders (harmless keys warn)", _AUD,
          milder=True),
    Check("imex.host_service", C, "no host nvidia-imex service running or enabled where the DRA driver's "
          "ComputeDomains manage IMEX (Kubernetes sites; an unreadable state warns)", _AUD, milder=True),
    Check("partition.layers", C, "NMX-M, the cliques, IMEX, Slurm and the labels follow one partition plan "
          "(no layer compared warns)", _AUD, milder=True),
    Check("nmx.partition", C, "NMX-M holds each planned partition with its GPUs (an extra one warns)", _AUD,
          milder=True),
    Check("nmx.partition_health", C, "NMX-M reports each partition HEALTHY (DEGRADED warns)", _AUD, milder=True),
    # -- the switch side, from the rack's NMX-M in each sweep (mctl/checks/switch_fabric.py; the fault is the
    #    switch tray's: every finding on a compute tray warns, D106)
    Check("nmx.switch_tray", W, "no NVLink switch tray serving the tray's GPUs is UNHEALTHY or MISSING_NVLINK on "
          "NMX-M", _SWF),
    Check("nmx.switch_port", W, "no switch port cabled to the tray's GPUs is down on NMX-M", _SWF),
    Check("nmx.tray_partition", W, "the tray's NVLink partition is HEALTHY on NMX-M", _SWF),
    Check("nmx.switch_side", W, "the rack's NMX-M switch side was read, well-formed, within its deadline and recent",
          _SWF),
    Check("nmx.fabric_limit", W, "the trays of a degraded partition carry the degraded-fabric mark (Slurm's "
          "nvl_degraded, Kubernetes' mctl.io/nvlink-degraded), and only they", _AUD),
    Check("nmx.compute_nodes", W, "NMX-M knows every compute tray of the rack", _AUD),
    Check("slurm.nodes", C, "every tray is a Slurm node (a node the inventory does not list warns)", _AUD,
          milder=True),
    Check("slurm.node_address", C, "Slurm reaches each tray at its inventory address", _AUD),
    Check("slurm.partition", C, "the Slurm partition mctl renders exists, is UP and holds every tray", _AUD),
    Check("slurm.topology", C, "the live topology has the partitions' blocks (unreadable warns)", _AUD,
          milder=True),
    Check("slurm.topology_conf", C, "topology.conf has the partitions' blocks (unreadable warns)", _AUD,
          milder=True),
    Check("image.os", W, "the tray runs its image's OS release", _AUD),
    Check("image.kernel", W, "the tray runs its image's kernel", _AUD),
    Check("image.driver", C, "the tray's NVIDIA driver is its image's (a driver not reported warns)", _AUD,
          milder=True),
    Check("image.cuda", W, "the tray's CUDA is its image's", _AUD),
    Check("image.slurm", W, "the tray's slurmd is its image's Slurm", _AUD),
    Check("image.imex", W, "the tray's IMEX is its image's (its packages' installed versions)", _AUD),
    Check("image.dcgm", W, "the tray's DCGM is its image's (its packages' installed versions)", _AUD),
    Check("image.doca_ofed", W, "the tray's DOCA-OFED is its image's (its packages' installed versions)", _AUD),
    Check("image.munge", W, "the tray's MUNGE is its image's (its packages' installed versions)", _AUD),
    Check("image.enroot", W, "the tray's enroot is its image's (its packages' installed versions)", _AUD),
    Check("image.pyxis", W, "the tray's pyxis is its image's (its packages' installed versions)", _AUD),
    Check("image.nccl_tests", W, "the tray's nccl-tests are its image's (its packages' installed versions)", _AUD),
    Check("firmware.version", W, "each firmware item the tray's image names is listed by its BMC at that version",
          _AUD),
    Check("firmware.rack", W, "every tray of a rack reports the same version of each firmware item its image names",
          _AUD),
    Check("boot.kernel_parameters", W, "the tray booted with its image's kernel parameters (else: reboot required)",
          _AUD),
)

# -- what each check follows, its thresholds, and the lab fault that makes it fail (`mctl health catalogue`)
# (source, thresholds, lab): lab is a `mctl lab fault ...` command, or "none: why" where no lab fault exists.
_T = "lab-r1-tray03"
_SMI = "NVIDIA nvidia-smi documentation (nvidia-smi -q -x, NVML API reference)"
_XID = "NVIDIA XID Errors catalogue (docs.nvidia.com/deploy/xid-errors), as mapped by NVIDIA NVSentinel"
_HV = "NVIDIA GB200 NVL72 health validation (Mission Control), shared/reference/health-signals.md"
_FM = "NVIDIA Fabric Manager user guide (GPU fabric state and health, GB200 NVL)"
_IMEX = "NVIDIA IMEX user guide (nvidia-imex-ctl -q, -N)"
_SLURM = "SchedMD Slurm documentation (slurm.conf, scontrol, topology.conf block plugin)"
_K8S = "Kubernetes API reference (Node labels, merge patch)"
_NMX = "NVIDIA NMX-Manager REST API (tests/fixtures/real/nmx-m/opennmxm.yaml)"
_RF = "DMTF Redfish and NVIDIA GB200 BMC (Redfish LeakDetection, PowerSubsystem)"
_MCTL = "mctl (docs/health.md)"
_AUD = "mctl audit (docs/audit.md)"
_IMG = "mctl software images (docs/provisioning.md)"
REFERENCE: dict[str, tuple[str, str, str]] = {
    "tray.reachable": (_MCTL, "the probe answers within health.tray_deadline (default 5-15 s from the interval); "
                       "health.unreachable_sweeps_before_drain (3) before a drain",
                       f"mctl lab fault host {_T} --freeze"),
    "ssh.unreachable": (_MCTL, "no SSH session within ssh.connect_timeout", f"mctl lab fault host {_T} --freeze"),
    "ssh.timeout": (_MCTL, "the inventory probe within ssh.command_timeout", f"mctl lab fault host {_T} --hang"),
    "ssh.host-key": (_MCTL, "the key equals the known_hosts entry", "none: a changed host key is made by hand "
                     "(tests/integration/test_ssh_trust.py replaces a tray's key)"),
    "probe.partial": (_MCTL, "every section of the probe complete and readable", f"mctl lab fault gpu {_T} --smi-hang"),
    "host.name": (_MCTL, "the hostname equals the inventory name", "none: the lab names its hosts from the inventory"),
    "tray.boot": (_MCTL, "the boot id equals the last sweep's", f"mctl lab fault host {_T} --reboot"),
    "bmc.reachable": (_RF, "an answer within bmc.deadline (at least 10 s)", f"mctl lab fault bmc {_T} --hang"),
    "bmc.stale": (_RF, "a view younger than health.bmc_stale_after (3) BMC intervals", f"mctl lab fault bmc {_T} --hang"),
    "leak.detectors": (_RF, "Critical: drain, power off after health.leak.power_off_after (10 min, as NVIDIA "
                       "Base Command Manager); Warning warns", f"mctl lab fault bmc {_T} --leak critical"),
    "power.supplies": (_RF, "PowerSubsystem and every supply Health OK", f"mctl lab fault bmc {_T} --psu-fail"),
    "tray.repair": (_MCTL, "health.ladder.max_recoveries failed recoveries within health.ladder.window",
                    "none: reached through the ladder after repeated faults (tests/integration/test_ladder.py)"),
    "gpu.facts": (_SMI, "nvidia-smi answers within the probe's smi timeout; health.boot_grace (2 min) warns",
                  f"mctl lab fault gpu {_T} --smi-hang"),
    "gpu.count": (_HV, "4 GPUs per GB200 tray, as many as attached_gpus", f"mctl lab fault gpu {_T} --gpu-missing 2"),
    "gpu.driver": (_IMG, "the driver version is the tray's image's (health.driver_mismatch: warn)",
                   f"mctl lab fault gpu {_T} --driver-branch 535"),
    "gpu.duplicate": (_MCTL, "one UUID, one address", "none: two trays' GPUs are made equal by hand in its tests"),
    "gpu.xid": (_XID, "the XIDs of health.drain_xids within health.xid_window (1 h) drain; NVLink5 144-150 by "
                "their Fatal word (health.nvlink5_drain)", f"mctl lab fault gpu {_T} --xid 79 --gpu 0"),
    "gpu.ecc": (_SMI, "volatile uncorrectable ECC above 0 fails; aggregate warns",
                f"mctl lab fault gpu {_T} --ecc-uncorrectable 1 --gpu 0"),
    "gpu.remapped-rows": (_SMI + "; NVIDIA A100/H100 row remapping guide", "remap failure fails; pending warns",
                          f"mctl lab fault gpu {_T} --ecc-uncorrectable 1 --gpu 0"),
    "gpu.memory-repair": (_SMI + " (R580 <ecc_errors> repair fields)", "unrepairable memory or SRAM threshold "
                          "fails; a pending channel/TPC repair warns", f"mctl lab fault gpu {_T} --driver-branch 580"),
    "gpu.recovery": (_XID + " (GPU Recovery Action, XID 154)", "any action but None fails",
                     f"mctl lab fault gpu {_T} --xid 154 --gpu 0 --recovery-action reset"),
    "gpu.temperature": (_SMI, "health.max_gpu_temp_c (90) fails; health.gpu_temp_warn_c (limit - 5) warns",
                        "none: the lab's GPU temperatures are fixed (tests set them in facts)"),
    "gpu.power": (_SMI, "draw above the enforced limit by health.max_power_overshoot_pct (5 %) warns",
                  "none: the lab's power draw is fixed below its limit"),
    "gpu.clocks": ("NVIDIA NVML nvmlClocksEventReasons (nvidia-smi -q -x clocks_event_reasons since R535, "
                   "clocks_throttle_reasons before)", "HW slowdown or HW power brake active health.clock_event_sweeps "
                   "(3) sweeps in a row fails, fewer warn; thermal slowdown and SW power cap warn",
                   f"mctl lab fault gpu {_T} --clock-event 0:hw-slowdown"),
    "dcgm.health": ("NVIDIA DCGM user guide (Health and Diagnostics: dcgmi health -s/-c); the report's JSON as "
                    "dcgmi writes it (NVIDIA/DCGM dcgmi/Health.cpp, tests/fixtures/real/README.md)",
                    "overall Failure fails; Warning warns; with health.dcgm auto (where dcgmi is installed) or "
                    "required (no dcgmi warns); no report within the section's deadline (a third of nvidia-smi's, "
                    "1-5 s), an unreadable or unknown report warns (the lab: --tool-fault dcgmi:hang)",
                    f"mctl lab fault gpu {_T} --ecc-uncorrectable 1 --gpu 0"),
    "nvlink.links": (_HV, "18 active NVLinks per GPU at 53.125 GB/s; any inactive fails",
                     f"mctl lab fault gpu {_T} --nvlink-down 0:3"),
    "nvlink.errors": ("NVIDIA DCGM health watch (DcgmHealthWatch.cpp: DCGM_LIMIT_MAX_NVLINK_ERROR 1, "
                      "DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100/s)", "over health.nvlink_error_window (10 min): any replay, "
                      "recovery or failed link recovery fails; CRC-like counters warn on any growth and fail at "
                      "health.nvlink_error_rate_critical (100/s); successful recoveries warn",
                      f"mctl lab fault gpu {_T} --nvlink-errors 0:3:200"),
    "fabric.state": (_FM, "Completed/Success; In Progress warns", f"mctl lab fault gpu {_T} --fabric in-progress"),
    "fabric.health": (_FM, "each flag's severity is health.fabric_flags (route_unhealthy warns)",
                      f"mctl lab fault gpu {_T} --fabric degraded"),
    "fabric.domain": (_FM, "every GPU's cluster UUID is the rack's nvlink_domain",
                      "none: the lab sets each rack's domain (tests edit gpus.json)"),
    "fabric.clique": (_FM + "; " + _NMX, "the clique is the planned partition's",
                      "none: a partition changed behind mctl's back (the partition tests)"),
    "fabric.no-domain": (_FM, "cluster UUID present and non-zero", f"mctl lab fault gpu {_T} --fabric in-progress"),
    "fabric.cluster-uuid-conflict": (_FM, "one cluster UUID per tray", "none: made by editing one GPU in its tests"),
    "fabric.clique-split": (_FM, "one clique per tray", "none: made by editing one GPU in its tests"),
    "fabric.rack-domains": (_FM, "one NVLink domain per rack", "none: made by editing a tray's gpus.json in its tests"),
    "fabric.domain-mismatch": (_FM, "the domain equals the inventory's nvlink_domain",
                               "none: made by editing the inventory in its tests"),
    "fabric.domain-shared": (_FM, "no two racks share a domain", "none: made by editing the inventory in its tests"),
    "fabric.domain-undeclared": (_FM, "informational", "none: an inventory without nvlink_domain shows it"),
    "imex.daemon": (_IMEX, "the daemon READY; health.boot_grace warns", f"mctl lab fault service {_T} --imex-crash"),
    "imex.domain": (_IMEX, "the domain UP", f"mctl lab fault service {_T} --imex-crash"),
    "slurm.slurmd": (_SLURM, "slurmd active and the node not DOWN/NOT_RESPONDING",
                     f"mctl lab fault service {_T} --slurmd-down"),
    "host.disk": (_MCTL, "health.disk_critical_pct (98 %) fails, health.disk_warn_pct (90 %) warns",
                  "none: fill a file system by hand (tests set facts)"),
    "host.memory": (_MCTL, "MemAvailable under health.memory_warn_available_pct (5 %) warns",
                    "none: tests set facts"),
    "drain.reason": (_AUD, "a drained node has a reason", "none: an operator's drain without reason"),
    "drain.age": (_AUD, "audit.max_drain_age", "none: a drain older than the limit (tests set the stamp)"),
    "imex.nodes_config": (_IMEX + "; " + _AUD, "byte-equal to mctl's rendering",
                          "none: edit /etc/nvidia-imex/nodes_config.cfg on a tray"),
    "imex.config": (_IMEX + "; " + _AUD, "equal to mctl's rendering (harmless keys warn)",
                    "none: edit /etc/nvidia-imex/config.cfg on a tray"),
    "imex.host_service": ("NVIDIA DRA driver for GPUs (ComputeDomains: the host nvidia-imex service stopped and "
                          "disabled); " + _AUD,
                          "scheduler.type k8s: the unit's ActiveState active/activating or its UnitFileState "
                          "enabled fails; not installed, inactive and disabled/static/masked passes",
                          "none: the lab's trays run the host nvidia-imex unit; on a k8s site the audit names "
                          "them (tests/integration/test_health_k8s.py)"),
    "partition.layers": (_AUD, "every layer follows one plan", "none: a layer changed by hand in its tests"),
    "nmx.partition": (_NMX, "NMX-M holds every planned partition", f"mctl lab fault nmx lab-r1 500"),
    "nmx.partition_health": (_NMX, "HEALTHY; DEGRADED warns", "none: the NMX-M emulator's partition health is set "
                             "in its tests"),
    "nmx.switch_tray": (_NMX + "; NMX-M documentation, Partition Health (a loss of a switch: UNHEALTHY)",
                        "SwitchNode Health UNHEALTHY or MISSING_NVLINK warns on every tray cabled to its ASICs "
                        "(UNKNOWN is not reported)", "mctl lab fault nmx lab-r1 switch-unhealthy --switch 1"),
    "nmx.switch_port": (_NMX, "a Port not LINKUP/STATE_ACTIVE warns on the tray at its other end",
                        "mctl lab fault nmx lab-r1 port-down --switch 1 --port 1"),
    "nmx.tray_partition": (_NMX + "; NMX-M documentation, Partition Health",
                           "DEGRADED, DEGRADED_BANDWIDTH, UNHEALTHY or UNKNOWN warns on the partition's trays",
                           "mctl lab fault nmx lab-r1 partition-degraded --nmx-partition p0"),
    "nmx.switch_side": (_NMX, "each sweep's read within the tray deadline; a view older than "
                        "3 sweep intervals (at least 3 deadlines), or malformed, warns", "mctl lab fault nmx lab-r1 timeout"),
    "nmx.fabric_limit": (_NMX + "; " + _SLURM + "; " + _K8S, "a tray of a DEGRADED/DEGRADED_BANDWIDTH/UNHEALTHY "
                         "partition without nvl_degraded (Kubernetes: the node label mctl.io/nvlink-degraded), or one "
                         "with it in a healthy partition, warns; a marked degraded one warns",
                         "mctl lab fault nmx lab-r1 partition-degraded --nmx-partition 'Default Partition'"),
    "nmx.compute_nodes": (_NMX, "every compute tray known", f"mctl lab fault nmx lab-r1 500"),
    "slurm.nodes": (_SLURM, "every tray a node", "none: a slurm.conf edited by hand in its tests"),
    "slurm.node_address": (_SLURM, "NodeAddr is the inventory address", "none: a slurm.conf edited by hand"),
    "slurm.partition": (_SLURM, "the partition exists, UP, with every tray", f"mctl lab fault service lab-r1-head "
                        "--slurmctld-down"),
    "slurm.topology": (_SLURM, "the live topology has the blocks", "none: a topology changed by hand in its tests"),
    "slurm.topology_conf": (_SLURM, "topology.conf has the blocks", "none: a topology.conf edited by hand"),
    "image.os": (_IMG, "os-release equals the image's", "none: the lab runs its image's OS"),
    "image.kernel": (_IMG, "the kernel equals the image's", "none: the lab shares the host kernel"),
    "image.driver": (_IMG, "the driver equals the image's", f"mctl lab fault gpu {_T} --driver-branch 535"),
    "image.cuda": (_IMG, "CUDA equals the image's", f"mctl lab fault gpu {_T} --driver-branch 535"),
    "image.slurm": (_IMG, "slurmd -V equals the image's Slurm", "none: the lab installs its image's Slurm"),
    "image.imex": (_IMG, "IMEX equals the image's", "none: the lab installs its image's IMEX"),
    "image.dcgm": (_IMG, "every DCGM package of the image installed at its pinned version (dpkg-query)",
                   "none: the lab installs its image's DCGM (a package removed by hand shows it)"),
    "image.doca_ofed": (_IMG, "every DOCA-OFED package of the image installed at its pinned version (dpkg-query)",
                        "none: the lab installs its image's DOCA-OFED"),
    "image.munge": (_IMG, "every MUNGE package of the image installed at its pinned version (dpkg-query)",
                    "none: the lab installs its image's MUNGE"),
    "image.enroot": (_IMG, "every enroot package of the image installed at its pinned version (dpkg-query)",
                     "none: the lab installs its image's enroot"),
    "image.pyxis": (_IMG, "every pyxis package of the image installed at its pinned version (dpkg-query)",
                    "none: the lab installs its image's pyxis"),
    "image.nccl_tests": (_IMG, "every nccl-tests package of the image installed at its pinned version (dpkg-query)",
                         "none: the lab installs its image's nccl-tests"),
    "gpu.out-of-band": (_RF, "a tray without GPU tools: its BMC (HGX_GPU_n chassis not Absent) and NMX-M show all "
                        "its GPUs, else bring-up stops at its inventory phase",
                        f"mctl lab fault bmc {_T} --hang"),
    "bmc.serial-duplicate": (_RF, "no two BMCs of a rack report the same tray chassis serial",
                             "none: the lab gives each tray its own serial (tests/unit/test_bare_tray.py)"),
    "firmware.version": (_IMG + "; " + _RF, "each firmware item at the image's version",
                         "none: the lab BMC's firmware inventory is fixed"),
    "firmware.rack": (_IMG + "; " + _RF, "one version per item across a rack", "none: as firmware.version"),
    "boot.kernel_parameters": (_IMG, "/proc/cmdline has the image's parameters",
                               "none: the lab shares the host's command line"),
}

if set(REFERENCE) != {c.id for c in _ENTRIES}:     # an import-time guard: every check documented, nothing else
    raise RuntimeError("mctl.checks.catalogue: REFERENCE and the entries name different check ids: "
                       f"{sorted(set(REFERENCE) ^ {c.id for c in _ENTRIES})}")
_ENTRIES = tuple(replace(c, source=REFERENCE[c.id][0], thresholds=REFERENCE[c.id][1], lab=REFERENCE[c.id][2])
                 for c in _ENTRIES)

CHECKS: Mapping[str, Check] = {c.id: c for c in _ENTRIES}
if len(CHECKS) != len(_ENTRIES):         # an import-time guard: one entry per id
    raise RuntimeError("mctl.checks.catalogue: a check id is defined twice")


def spec(check_id: str) -> Check:
    """The catalogue entry of *check_id*; KeyError for an id the catalogue does not define."""
    return CHECKS[check_id]


def entries() -> tuple[Check, ...]:
    """Every check, in catalogue order."""
    return _ENTRIES


def to_dict(c: Check) -> dict:
    """One check as `mctl health catalogue --json` prints it."""
    return {"id": c.id, "severity": c.severity.value, "about": c.about, "purposes": sorted(c.purposes),
            "milder": c.milder, "setting": c.setting, "source": c.source, "thresholds": c.thresholds, "lab": c.lab}


def for_purpose(purpose: str) -> tuple[Check, ...]:
    """The checks *purpose* evaluates, in catalogue order."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r} (one of {', '.join(PURPOSES)})")
    return tuple(c for c in _ENTRIES if purpose in c.purposes)


__all__ = ["Check", "CHECKS", "REFERENCE", "spec", "entries", "to_dict", "for_purpose"]
