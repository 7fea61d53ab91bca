"""The phases of `mctl rack bring-up`, one module each, each built on the service functions of the other commands.

Every phase has a plan (read-only; `--dry-run` prints it) and a run. A run
discovers first and changes only what differs, so a phase that finds its part
in place changes nothing and says so; re-running a finished bring-up is
therefore a no-op. A phase that cannot finish raises PhaseFailed with what it
found, per host, and the run stops there.

    preflight   inventory valid, hosts reachable (transport.reach), NMX-M answers (fabric.discovery)
    inventory   rackinv.service.run_inventory
    provision   provision.service + provision.markers (what provisioned a host) + images drift
    partitions  fabric.service.apply_partitions
    imex        fabric.service.apply_imex / wait_for_imex
    scheduler   sched.slurm plan/dry_run/apply/verify, then the trays held (sched.slurm.holds)
    health      health.service.run_check, the gate with --accept exceptions
    burn-in     health.burnin (DCGM / NCCL tests where the trays have them)
    open        the held trays resumed (sched.slurm.holds on sched.slurm.control)
    validate    bringup.validate: an all-reduce across each NVLink partition through Slurm; a dragging tray held again

REGISTRY maps each phase name (bringup.context.PHASES) to its Phase.
"""

from __future__ import annotations

from mctl.bringup.phases import (burn_in, health, imex, inventory, open as open_, partitions, preflight, provision,
                                 scheduler, validate)
from mctl.bringup.phases.base import Phase

REGISTRY: dict[str, Phase] = {m.PHASE.name: m.PHASE for m in (
    preflight, inventory, provision, partitions, imex, scheduler, health, burn_in, open_, validate)}
