"""`mctl deploy slurm` as a service: discover, render, show the difference, apply, verify.

Order matters for "nothing half-deployed": every check that can refuse (the
scheduler type, the controller, the Slurm version, every tray answering
`slurmd -C`, settings that contradict each other) runs before anything is
written anywhere. Then the rendered files and the MUNGE key go to the hosts
through the slurm playbook (ansible-runner), and the controller is asked
whether every tray registered and the blocks are the partitions.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mctl.errors import UsageError
from mctl.model.site import Host, Site, fold
from mctl.sched.slurm import munge
from mctl.sched.site import check_scheduler
from mctl.sched.slurm.render import SlurmConfig, controller_of, node_check_enabled, render, settings_of

PLAYBOOK = "slurm"
RUN_KIND = "deploy-slurm"


@dataclass
class SlurmPlan:
    site: Site
    state_dir: Path
    config: SlurmConfig
    hosts: list[Host]                  # controller first, then the trays
    topology_only: bool = False
    gpus: dict = field(default_factory=dict)     # tray -> TrayGpus (facts, else the rack model)

    @property
    def key_path(self) -> Path:
        return munge.key_path(self.state_dir, self.site.name)

    @property
    def files_dir(self) -> Path:
        return munge.site_dir(self.state_dir, self.site.name) / "files"

    def to_dict(self) -> dict:
        d = self.config.to_dict()
        d.update({"site": self.site.name, "hosts": fold(h.name for h in self.hosts), "host_count": len(self.hosts),
                  "topology_only": self.topology_only, "conf_dir": settings_of(self.site).conf_dir,
                  "gpus": {"from_facts": fold(n for n, g in self.gpus.items() if g.source == "facts") or None,
                           "from_model": fold(n for n, g in self.gpus.items() if g.source == "model") or None,
                           "per_tray": {n: g.to_dict() for n, g in self.gpus.items()}},
                  "munge_key": {"path": str(self.key_path), "exists": self.key_path.exists()}})
        return d


def plan_slurm(site: Site, state_dir: Path, *, topology_only: bool = False) -> SlurmPlan:
    """Facts over SSH and the rendered files; raises before anything changes."""
    from mctl.sched.slurm.remote import controller_state, gather_facts

    check_scheduler(site, "slurm")
    controller = controller_of(site)
    trays = site.compute_trays()
    if not trays:
        raise UsageError("the inventory has no compute trays to run slurmd on")
    if topology_only:
        version, running = controller_state(site, controller)
        config = render(site, version, None, topology_only=True)
        if running != f"topology/{config.plugin}":
            now = f"slurmctld on {controller.name} runs {running}" if running else \
                f"slurmctld does not answer on {controller.name}"
            raise UsageError(f"--topology-only needs a running Slurm with topology/{config.plugin}, but {now}",
                             hint="run a full 'mctl deploy slurm' (it writes slurm.conf too); nothing was changed")
    gpus: dict = {}
    if not topology_only:
        gpus, gpu_warnings = gpus_from_inventory(site, Path(state_dir))
        facts = gather_facts(site, controller, trays)
        config = render(site, facts.version, facts.hardware, gpus=gpus)
        config.warnings.extend(facts.skew_warnings())
        config.warnings.extend(gpu_warnings)
    hosts = [controller] + [t for t in trays if t.name != controller.name]
    return SlurmPlan(site, Path(state_dir), config, hosts, topology_only, gpus)


def gpus_from_inventory(site: Site, state_dir: Path) -> tuple[dict, list[str]]:
    """Each tray's GPUs from its rack's last `mctl rack inventory` snapshot, else the rack model."""
    from mctl.state.snapshots import RACK_INVENTORY as SNAPSHOT_KIND
    from mctl.sched.slurm.gpus import tray_gpus
    from mctl.state import latest_snapshot

    snapshots: dict = {}
    taken: dict[str, str] = {}
    for rack in site.racks.values():
        if not rack.compute:
            continue
        try:
            snap = latest_snapshot(state_dir, SNAPSHOT_KIND, rack.name)
        except (OSError, ValueError) as exc:          # unreadable: refuse before anything changes
            raise UsageError(f"cannot read the last rack inventory of {rack.name}: {exc}",
                             hint=f"run 'mctl rack inventory {rack.name}' again; nothing was deployed") from None
        snapshots[rack.name] = snap.data if snap is not None and isinstance(snap.data, dict) else None
        if snap is not None:
            taken[rack.name] = snap.taken_at.isoformat(timespec="seconds")
    return tray_gpus(site, snapshots, taken)


# ----------------------------------------------------------------- --dry-run

@dataclass
class FileDiff:
    """One rendered file against what a group of hosts holds now."""

    name: str
    path: str
    hosts: list[str]
    status: str                        # same | changed | new | unreachable
    diff: str = ""

    def to_dict(self) -> dict:
        return {"file": self.name, "path": self.path, "hosts": fold(self.hosts), "count": len(self.hosts),
                "status": self.status, "diff": self.diff}


@dataclass
class DryRun:
    files: list[FileDiff]
    munge: dict[str, list[str]]        # same | differs | missing | would-create -> hosts

    @property
    def changes(self) -> int:
        return sum(1 for f in self.files if f.status in ("changed", "new")) + len(self.munge.get("differs", [])) \
            + len(self.munge.get("missing", [])) + len(self.munge.get("would-create", []))

    def to_dict(self) -> dict:
        return {"files": [f.to_dict() for f in self.files],
                "munge_key": {k: fold(v) for k, v in self.munge.items() if v}, "changes": self.changes}


def dry_run(plan: SlurmPlan) -> DryRun:
    """Rendered files against the hosts' files (read over SSH); changes nothing, not even the key."""
    from mctl.sched.slurm.remote import fetch_current

    conf_dir = settings_of(plan.site).conf_dir.rstrip("/")
    names = list(plan.config.files)
    current = fetch_current(plan.site, plan.hosts, conf_dir, names)
    out: list[FileDiff] = []
    for name in names:
        rendered = plan.config.files[name]
        path = f"{conf_dir}/{name}"
        groups: dict[str | None, list[str]] = {}
        unreachable = [h.host for h in current if h.error]
        for h in current:
            if not h.error:
                groups.setdefault(h.files.get(name), []).append(h.host)
        for text, hosts in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
            if text == rendered:
                out.append(FileDiff(name, path, hosts, "same"))
                continue
            diff = "".join(difflib.unified_diff((text or "").splitlines(keepends=True),
                                                rendered.splitlines(keepends=True),
                                                fromfile=f"{fold(hosts)}:{path}" if text is not None else "/dev/null",
                                                tofile=f"rendered {name}"))
            out.append(FileDiff(name, path, hosts, "new" if text is None else "changed", diff))
        if unreachable:
            out.append(FileDiff(name, path, unreachable, "unreachable"))
    key_digest = munge.digest(plan.key_path)
    key: dict[str, list[str]] = {"same": [], "differs": [], "missing": [], "would-create": []}
    if not plan.topology_only:
        for h in current:
            if h.error:
                continue
            if key_digest is None:
                key["would-create"].append(h.host)
            elif h.munge_digest is None:
                key["missing"].append(h.host)
            else:
                key["same" if h.munge_digest == key_digest else "differs"].append(h.host)
    return DryRun(out, key)


# ----------------------------------------------------------------- apply

@dataclass
class DeployResult:
    plan: SlurmPlan
    run: object                         # mctl.ansible.runner.RunResult
    verification: object | None = None  # remote.Verification
    key_created: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        run = self.run
        return (run.status == "successful" and not run.failed_hosts and self.verification is not None
                and self.verification.ok)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "plan": {k: v for k, v in self.plan.to_dict().items() if k != "files"},
                "run": self.run.to_dict(), "munge_key_created": self.key_created,
                "verification": self.verification.to_dict() if self.verification else None}


def _extravars(plan: SlurmPlan) -> dict:
    s = settings_of(plan.site)
    return {
        "slurm_files_dir": str(plan.files_dir),
        "slurm_munge_key_file": str(plan.key_path),
        "slurm_conf_dir": s.conf_dir,
        "slurm_state_save_location": s.state_save_location,
        "slurm_slurmd_spool_dir": s.slurmd_spool_dir,
        "slurm_log_dir": s.log_dir,
        "slurm_topology_only": plan.topology_only,
        "slurm_gpus_by_rack": {r.name: r.gpus_per_tray for r in plan.site.racks.values()},
        "slurm_gpu_minors_by_host": {n: list(g.minors) for n, g in plan.gpus.items()},
        "slurm_gpu_device_nodes": s.gpu_device_nodes,
        "slurm_node_check": node_check_enabled(s),
        "node_check_program": s.node_check_program,
        "slurm_imex_job": _imex_job_vars(plan),
    }


def _imex_job_vars(plan: SlurmPlan) -> dict | None:
    """scheduler.slurm.imex_scope job: what the slurm_node role installs on each tray (imex_job.yml)."""
    job = plan.config.imex_job
    if job is None or plan.topology_only:
        return None
    return {"prolog_path": job.prolog_path, "epilog_path": job.epilog_path, "prolog": job.prolog,
            "epilog": job.epilog, "config_path": job.config_path, "nodes_config_path": job.nodes_config_path,
            "configs": dict(job.configs)}


@contextlib.contextmanager
def _site_locks(plan: SlurmPlan):
    from mctl.state import rack_lock

    with contextlib.ExitStack() as stack:
        for rack in sorted(plan.site.racks):
            stack.enter_context(rack_lock(plan.state_dir, rack, purpose="mctl deploy slurm"))
        yield


def apply(plan: SlurmPlan, *, on_event: Callable | None = None, verify: bool = True,
          locked: bool = False) -> DeployResult:
    """Write the rendered files, run the slurm playbook, then check the cluster the controller reports.

    Every rack's lock is taken here, unless the caller holds them already (*locked*: the CLI takes them
    before it plans or prints anything)."""
    from mctl.ansible.runner import PlaybookRequest, run_playbook
    from mctl.sched.slurm.remote import verify as verify_cluster
    from mctl.state import atomic_write, write_json

    with contextlib.nullcontext() if locked else _site_locks(plan):
        created = False if plan.topology_only else munge.ensure_key(plan.key_path)
        for name, text in plan.config.files.items():
            atomic_write(plan.files_dir / name, text, mode=0o644)
        req = PlaybookRequest(playbook=PLAYBOOK, inventory=str(plan.site.file), limit=[h.name for h in plan.hosts],
                              extravars=_extravars(plan), forks=max(5, min(100, len(plan.hosts))))
        run = run_playbook(req, plan.state_dir, kind=RUN_KIND, on_event=on_event)
        result = DeployResult(plan, run, key_created=created)
        if verify and run.status == "successful" and not run.failed_hosts:
            result.verification = verify_cluster(plan.site, plan.config, settings_of(plan.site).verify_timeout)
        write_json(munge.site_dir(plan.state_dir, plan.site.name) / "deployed.json", {
            "time": time.time(), "ok": result.ok, "run_id": run.run_id, "topology_only": plan.topology_only,
            "version": str(plan.config.version), "topology_plugin": plan.config.plugin,
            "blocks": [b.to_dict() for b in plan.config.blocks], "block_sizes": plan.config.block_sizes,
            "files": {n: hashlib.sha256(t.encode()).hexdigest() for n, t in plan.config.files.items()},
            "verification": result.verification.to_dict() if result.verification else None,
        })
    return result
