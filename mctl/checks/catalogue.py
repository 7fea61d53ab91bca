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

from dataclasses import dataclass
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
    # -- NVLink and the fabric
    Check("nvlink.links", C, "every GPU's 18 NVLinks are up (unreadable link facts warn)", _TRAY, milder=True),
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
    Check("partition.layers", C, "NMX-M, the cliques, IMEX, Slurm and the labels follow one partition plan "
          "(no layer compared warns)", _AUD, milder=True),
    Check("nmx.partition", C, "NMX-M holds each planned partition with its GPUs (an extra one warns)", _AUD,
          milder=True),
    Check("nmx.partition_health", C, "NMX-M reports each partition HEALTHY (DEGRADED warns)", _AUD, milder=True),
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
    Check("firmware.version", W, "each firmware item the tray's image names is listed by its BMC at that version",
          _AUD),
    Check("firmware.rack", W, "every tray of a rack reports the same version of each firmware item its image names",
          _AUD),
    Check("boot.kernel_parameters", W, "the tray booted with its image's kernel parameters (else: reboot required)",
          _AUD),
)

CHECKS: Mapping[str, Check] = {c.id: c for c in _ENTRIES}
if len(CHECKS) != len(_ENTRIES):         # an import-time guard: one entry per id
    raise RuntimeError("mctl.checks.catalogue: a check id is defined twice")


def spec(check_id: str) -> Check:
    """The catalogue entry of *check_id*; KeyError for an id the catalogue does not define."""
    return CHECKS[check_id]


def for_purpose(purpose: str) -> tuple[Check, ...]:
    """The checks *purpose* evaluates, in catalogue order."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r} (one of {', '.join(PURPOSES)})")
    return tuple(c for c in _ENTRIES if purpose in c.purposes)


__all__ = ["Check", "CHECKS", "spec", "for_purpose"]
