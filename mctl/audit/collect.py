"""Gather the actual state an audit compares with the inventory, read-only, in one pass.

One SSH connection per host carries everything: the audit probe (mctl.facts.probe,
purpose AUDIT: OS release, kernel, slurmd version, the IMEX files, one dpkg-query for the
images' packages) and the health sweep's probe run side
by side on it, the controller answers one command for the whole of Slurm
(nodes, topology, config, partitions, topology.conf, its clock), and NMX-M is
asked over HTTP at the same time. Nothing here writes anywhere, takes a lock
or drains: an audit may run beside `mctl health watch` and any mutating
command. The host-key comparison costs nothing extra: the pool connects with
strict checking against the inventory's known_hosts, so a refused key comes
back with the fingerprint the host presented.

Parsing is pure (mctl.facts.probe.parse_tray, parse_controller) and tested on captured output.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mctl.errors import MctlError
from mctl.facts import shell
from mctl.facts.probe import AUDIT, from_result, last_line, probe_command, split_sections
from mctl.facts.shell import RC_ABSENT
from mctl.model.tray import TrayFacts, smi_timeout_for

if TYPE_CHECKING:
    from mctl.fabric.reconcile import FabricState
    from mctl.health.sweep import SweepResult
    from mctl.model.site import Host, Rack, Site
    from mctl.model.gpu import GpuReport
    from mctl.sched.slurm.facts import NodeState, TopologyEntry
    from mctl.transport import HostResult, SSHPool, SSHTarget
    from mctl.transport.results import HostKeyProblem

SCONTROL_TIMEOUT = 20    # seconds; slurmctld that does not answer makes scontrol wait its MessageTimeout

# scontrol on the controller (127 with the shell's words when it is not installed)
_CONTROLLER_LOCAL = r"""
sc() { command -v scontrol >/dev/null 2>&1 || { echo 'scontrol: command not found' >&2; return 127; }; to @TO@ scontrol "$@"; }
conf() { sc show config | grep -E '^(TopologyPlugin|SwitchType|SLURM_VERSION) '; }
"""


def controller_command(nonce: str, conf_dir: str) -> str:
    steps = [shell.sec("clock", "date '+%s %Y-%m-%dT%H:%M:%S'"), shell.sec("nodes", "sc show node -o"),
             shell.sec("topology", "sc show topology"), shell.sec("config", "conf"),
             shell.sec("partitions", "sc show partition -o"),
             shell.sec("topology-conf", "file " + shlex.quote(conf_dir.rstrip("/") + "/topology.conf"),
                       needs=("file",))]
    return shell.command(shell.script(nonce, steps, functions=("to",), local=_CONTROLLER_LOCAL,
                                      values={"TO": SCONTROL_TIMEOUT}))


# --------------------------------------------------------------------------- controller

@dataclass(frozen=True)
class ControllerState:
    """Slurm as the controller sees it. `error` set: none of it could be read."""

    host: str
    reach: str
    error: str | None = None
    host_key: "HostKeyProblem | None" = None
    now_local: datetime | None = None              # the controller's wall clock (Slurm stamps are local time)
    nodes: "tuple[NodeState, ...]" = ()
    topology: "tuple[TopologyEntry, ...] | None" = None
    topology_error: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, dict[str, str]] | None = None
    topology_conf: str | None = None                # None: absent or unreadable
    topology_conf_error: str | None = None

    @property
    def reached(self) -> bool:
        return self.reach in ("ok", "failed")


def parse_controller(result: "HostResult", nonce: str) -> ControllerState:
    """The controller's answer -> Slurm's view. slurmctld not answering is `error`, not an exception."""
    from mctl.sched.slurm.facts import key_values, parse_show_nodes, parse_show_topology

    base: dict[str, Any] = dict(host=result.host, host_key=result.host_key)
    if not result.status.reached:
        return ControllerState(reach=result.status.value, error=f"{result.host}: {result.summary()}", **base)
    out = split_sections(result.stdout, nonce)
    err = split_sections(result.stderr, nonce)

    def said(name: str, fallback: str) -> str:
        e = err.get(name)
        o = out.get(name)
        return last_line((e.text if e else "") or (o.text if o else ""), fallback)

    nodes_sec = out.get("nodes")
    if nodes_sec is None or not nodes_sec.complete:
        return ControllerState(reach=result.status.value, error=f"scontrol on {result.host}: output cut off", **base)
    if nodes_sec.rc != 0:
        why = "timed out" if nodes_sec.rc in (124, 137) else said("nodes", f"exit {nodes_sec.rc}")
        return ControllerState(reach=result.status.value, error=f"scontrol show node on {result.host}: {why}",
                               **base)
    now = None
    clock = out.get("clock")
    if clock is not None and clock.complete:
        try:
            now = datetime.fromisoformat(clock.text.split()[1])
        except (IndexError, ValueError):
            now = None
    topo_sec = out.get("topology")
    topology = None
    topology_error = None
    if topo_sec is not None and topo_sec.complete and topo_sec.rc == 0:
        topology = tuple(parse_show_topology(topo_sec.text))
    else:
        topology_error = "scontrol show topology: " + (said("topology", "no answer") if topo_sec else "missing")
    config: dict[str, str] = {}
    conf_sec = out.get("config")
    for line in (conf_sec.text if conf_sec else "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    part_sec = out.get("partitions")
    partitions = None
    if part_sec is not None and part_sec.complete and part_sec.rc == 0:
        partitions = {}
        for line in part_sec.text.splitlines():
            if line.startswith("PartitionName="):
                kv = key_values(line)
                partitions[kv["PartitionName"]] = kv
    conf = out.get("topology-conf")
    topology_conf = conf_error = None
    if conf is None or not conf.complete:
        conf_error = "output missing or cut off"
    elif conf.rc == 0:
        topology_conf = conf.text
    elif conf.rc != RC_ABSENT:
        conf_error = said("topology-conf", f"cat exited {conf.rc}")
    return ControllerState(reach=result.status.value, now_local=now,
                           nodes=tuple(parse_show_nodes(nodes_sec.text)), topology=topology,
                           topology_error=topology_error, config=config, partitions=partitions,
                           topology_conf=topology_conf, topology_conf_error=conf_error, **base)


# --------------------------------------------------------------------------- NMX-M

@dataclass(frozen=True)
class FabricView:
    rack: str
    state: "FabricState | None" = None
    error: str | None = None


def discover_fabric(site: "Site", rack: "Rack") -> FabricView:
    """NMX-M's partitions and compute nodes for *rack* (GET requests only)."""
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover

    try:
        return FabricView(rack.name, discover(NMXClient.for_rack(site, rack), rack))
    except MctlError as exc:
        return FabricView(rack.name, error=exc.message)


# --------------------------------------------------------------------------- Kubernetes

@dataclass(frozen=True)
class NodesView:
    """The audited trays' Node objects (GET /api/v1/nodes/NAME each), or why they could not be read."""

    items: tuple[dict, ...] | None = None
    error: str | None = None


NODES_DEADLINE = 30.0     # seconds for every Node of the audit together (each GET also has the client's timeout)


def read_nodes(site: "Site", names: Sequence[str], deadline: float = NODES_DEADLINE) -> NodesView:
    """The Node of each tray in *names* (GET by name: the `get nodes` right mctl already needs, no `list`),
    through the kubeconfig of scheduler.k8s as `mctl deploy k8s`. A tray without a Node is left out; a
    refused, missing or unreachable API, or the deadline passing, is `error`, never an exception."""
    import time

    from mctl.sched.k8s import KubeClient
    from mctl.sched.k8s import kubeconfig as kc

    settings = site.scheduler.k8s
    end = time.monotonic() + deadline
    items: list[dict] = []
    try:
        path = (site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path()
        client = KubeClient(kc.load(path, settings.context), timeout=min(10.0, deadline))
        for n, name in enumerate(names):
            if time.monotonic() > end:
                return NodesView(error=f"the Kubernetes API answered {n} of {len(names)} Nodes within "
                                       f"{deadline:g} s")
            node = client.get("Node", name)
            if node is not None:
                items.append(node)
    except MctlError as exc:
        return NodesView(error=exc.message)
    return NodesView(tuple(items))


# --------------------------------------------------------------------------- all of it

@dataclass
class Actual:
    trays: dict[str, TrayFacts]
    controller: ControllerState | None
    fabric: dict[str, FabricView]
    health: "SweepResult | None" = None
    health_error: str | None = None
    elapsed: float = 0.0
    bmc: "dict[str, Any] | None" = None            # host -> mctl.bmc.inventory.TrayBMC (firmware only)
    bmc_error: str | None = None
    nodes: NodesView | None = None                 # Kubernetes sites: the Node objects (clique labels)

    def gpu_versions(self, host: str) -> tuple[str | None, str | None, str | None]:
        """(driver, CUDA, why unknown) from the health sweep's nvidia-smi on that tray, else the audit probe's."""
        tray = self.trays.get(host)
        if tray is not None and (tray.gpus is not None or tray.gpu_error is not None):
            if tray.gpus is None:
                return None, None, tray.gpu_error
            return tray.gpus.driver_version, tray.gpus.cuda_version, None
        if self.health is None:
            return None, None, self.health_error or "no health sweep"
        facts = self.health.facts.get(host)
        if facts is None or facts.gpus is None:
            return None, None, (facts.gpu_error if facts is not None else None) or "nvidia-smi gave no answer"
        return facts.gpus.driver_version, facts.gpus.cuda_version, None


async def _health_sweep(site: "Site", hosts: Sequence["Host"], state_dir: Path, pool: "SSHPool",
                        timeout: float) -> "SweepResult":
    """One sweep of the health catalogue without remediation: no drain, no lock, no state written."""
    from mctl.health.engine import Engine
    from mctl.health.site_view import Scope, settings_of

    from dataclasses import replace

    # a report: no events out (docs/events.md), so the watch's finding memory is not the audit's
    engine = Engine(site, Scope(tuple(hosts)), replace(settings_of(site), events=()), state_dir, pool,
                    remediate=False, dry_run=False, timeout=timeout)
    return await engine.sweep()


def gather(site: "Site", racks: Sequence["Rack"], *, state_dir: Path, files: Sequence[str],
           packages: Sequence[str] = (),
           controller: "Host | None", conf_dir: str, timeout: float | None = None, health: bool = True,
           bmc: "tuple[Sequence[Host], Any] | None" = None, k8s: bool = False) -> Actual:
    """Everything an audit compares, from every tray of *racks*, the controller and NMX-M, concurrently;
    *bmc* = (trays, mctl.bmc.inventory.Settings): their BMCs' FirmwareInventory too, each under the BMC
    tray deadline; *k8s*: the Kubernetes Node objects too (their clique labels)."""
    import time

    from mctl.transport import SSHConfig, SSHPool, targets_for

    start = time.monotonic()
    from mctl.transport.ssh import per_tray_deadline

    config = SSHConfig.from_site(site)
    # Each tray's whole work (connect, session, probe, output) ends within this, in the audit's own
    # probe and in its health sweep alike: a hung tray costs the deadline, not ssh.command_timeout.
    command_timeout = per_tray_deadline(configured=site.health.tray_deadline, command_timeout=config.command_timeout,
                                        override=timeout)
    trays = [h for r in racks for h in r.compute]
    targets: list["SSHTarget"] = targets_for(site, trays)
    nonce = secrets.token_hex(8)
    # nvidia-smi runs once per tray: in the health probe, or here when there is no health sweep
    smi_timeout = None if health else smi_timeout_for(command_timeout)
    probe = probe_command(AUDIT, nonce, files=files, smi_timeout=smi_timeout, packages=packages)

    async def main() -> Actual:
        async with SSHPool(config, waves=True) as pool:     # each tray's deadline from its slot (D124)
            jobs: list[Any] = [pool.run(targets, probe, deadline=command_timeout)]
            if controller is not None:
                (ctl_target,) = targets_for(site, [controller])
                # Its scontrol calls wait up to SCONTROL_TIMEOUT each; bounded as a whole here.
                ctl_deadline = min(config.command_timeout, max(command_timeout, SCONTROL_TIMEOUT * 5 + 10))
                jobs.append(pool.run_one(ctl_target, controller_command(nonce, conf_dir), deadline=ctl_deadline))
            fabric_racks = [r for r in racks if r.nmx is not None]
            jobs += [asyncio.to_thread(discover_fabric, site, r) for r in fabric_racks]
            health_job = _health_sweep(site, trays, state_dir, pool, command_timeout) if health and trays else None
            if health_job is not None:
                jobs.append(health_job)
            if bmc is not None:
                from mctl.bmc.inventory import collect as read_bmcs, read_firmware

                jobs.append(asyncio.to_thread(read_bmcs, list(bmc[0]), bmc[1], reader=read_firmware))
            if k8s:
                jobs.append(asyncio.to_thread(read_nodes, site, [h.name for h in trays]))
            answers = await asyncio.gather(*jobs, return_exceptions=True)
        tray_results = _unwrap(answers[0])
        states = {r.host: from_result(AUDIT, r, nonce, files=files, packages=packages,
                                      smi_timeout=smi_timeout or 30.0)
                  for r in tray_results}
        i = 1
        ctl_state = None
        if controller is not None:
            ctl_state = parse_controller(_unwrap(answers[i]), nonce)
            i += 1
        fabric = {}
        for r in fabric_racks:
            fabric[r.name] = _unwrap(answers[i])
            i += 1
        sweep = sweep_error = None
        if health_job is not None:
            got = answers[i]
            if isinstance(got, MctlError):
                sweep_error = got.message
            else:
                sweep = _unwrap(got)
        elif health and not trays:
            sweep_error = "no compute trays to check"
        nodes = _unwrap(answers.pop()) if k8s else None
        bmc_trays = None
        if bmc is not None:
            bmc_trays = {t.host: t for t in _unwrap(answers[-1])}
        return Actual(states, ctl_state, fabric, sweep, sweep_error, bmc=bmc_trays, nodes=nodes)

    actual = asyncio.run(main())
    actual.elapsed = time.monotonic() - start
    return actual


def _unwrap(value: Any) -> Any:
    """gather(return_exceptions=True) keeps one failing job from cancelling the others; re-raise real bugs."""
    if isinstance(value, BaseException):
        raise value
    return value


# --------------------------------------------------------------------------- the host IMEX unit (Kubernetes)

@dataclass
class HostImex:
    """`imex.host_service` on the trays of a Kubernetes site: findings for the trays read, and the trays that
    could not be read (host -> why), so nobody takes an unread tray for a clean one."""

    findings: list = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)

    @property
    def conflicts(self) -> list:
        from mctl.model.findings import Severity

        return [f for f in self.findings if f.severity is Severity.CRITICAL]


def read_host_imex(site: "Site", trays: Sequence["Host"], *, timeout: float | None = None) -> HostImex:
    """Each tray's nvidia-imex unit over SSH (the audit probe, within one tray deadline each), judged by
    mctl.audit.rules.imex.check_host_service: what `mctl deploy k8s` checks before it writes."""
    from mctl.audit.rules.imex import check_host_service
    from mctl.transport import SSHConfig, SSHPool, targets_for
    from mctl.transport.ssh import per_tray_deadline

    config = SSHConfig.from_site(site)
    deadline = per_tray_deadline(configured=site.health.tray_deadline, command_timeout=config.command_timeout,
                                 override=timeout)
    nonce = secrets.token_hex(8)
    probe = probe_command(AUDIT, nonce)

    async def main() -> list["HostResult"]:
        async with SSHPool(config, waves=True) as pool:
            return await pool.run(targets_for(site, list(trays)), probe, deadline=deadline)

    out = HostImex()
    for r in asyncio.run(main()):
        facts = from_result(AUDIT, r, nonce, smi_timeout=30.0)
        if not facts.reached:
            out.unread[r.host] = facts.error or r.summary()
            continue
        out.findings += check_host_service(r.host, facts.imex_service)
    return out
