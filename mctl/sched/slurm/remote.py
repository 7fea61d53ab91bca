"""What a Slurm deploy asks the hosts over SSH: versions, hardware, the files they hold, registration.

Read-only; every fan-out goes through mctl.transport (strict host keys, bounded
concurrency, one result per host). Changing hosts is the playbook's job.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ClusterShell.NodeSet import NodeSet

from mctl.errors import EnvironmentProblem, PartialFailure
from mctl.model.site import Host, Site, fold
from mctl.sched.slurm.facts import (NodeHardware, TopologyEntry, key_values, parse_show_nodes, parse_show_topology,
                                    parse_slurmd_c)
from mctl.facts.slurm_version import SlurmVersion, parse_version

if TYPE_CHECKING:
    from mctl.sched.slurm.render import SlurmConfig
    from mctl.transport import HostResult, SSHPool

CTLD_VERSION = "slurmctld -V 2>&1 || sinfo -V 2>&1"
TRAY_FACTS = "slurmd -C && slurmd -V"
MUNGE_KEY = "/etc/munge/munge.key"
_TOPO_MARK = "@@mctl-topology"
_CONF_MARK = "@@mctl-config"


@dataclass
class SlurmFacts:
    controller: str
    version: SlurmVersion
    hardware: dict[str, NodeHardware] = field(default_factory=dict)
    slurmd_versions: dict[str, SlurmVersion] = field(default_factory=dict)

    def skew_warnings(self) -> list[str]:
        newer = sorted(h for h, v in self.slurmd_versions.items() if v.release > self.version.release)
        if not newer:
            return []
        return [f"slurmd on {fold(newer)} is newer than slurmctld {self.version} on {self.controller}: "
                "Slurm supports older slurmd than slurmctld, not newer; upgrade the controller first"]


def _targets(site: Site, hosts: Sequence[Host]):
    from mctl.transport import targets_for

    return targets_for(site, list(hosts))


def _unreached(results: Sequence["HostResult"]) -> list["HostResult"]:
    return [r for r in results if not r.status.reached]


def _refuse_unreached(results: Sequence["HostResult"], doing: str) -> None:
    bad = _unreached(results)
    if bad:
        detail = "; ".join(f"{r.host}: {r.summary()}" for r in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise PartialFailure(f"{len(bad)} host(s) did not answer while {doing}: {detail}{more}; nothing was deployed",
                             hint="bring them back (see 'mctl exec HOSTS -- true'), or take a dead tray out of the "
                                  "inventory, then run the command again")


def gather_facts(site: Site, controller: Host, trays: Sequence[Host]) -> SlurmFacts:
    """The controller's Slurm version and every tray's `slurmd -C`; refuses if any host is missing."""
    from mctl.transport import SSHConfig, run_sync

    hosts = [controller] + [t for t in trays if t.name != controller.name]
    results = run_sync(SSHConfig.from_site(site), _targets(site, hosts),
                       lambda t: CTLD_VERSION if t.name == controller.name else TRAY_FACTS)
    _refuse_unreached(results, "gathering Slurm facts")
    by_host = {r.host: r for r in results}
    ctld = by_host[controller.name]
    try:
        version = parse_version(ctld.stdout) if ctld.ok else None
    except ValueError:
        version = None
    if version is None:
        raise EnvironmentProblem(f"cannot read the Slurm version on the controller {controller.name}: "
                                 f"{(ctld.stdout + ctld.stderr).strip()[:200] or ctld.summary()}",
                                 hint="the head node's image must deliver Slurm (slurmctld); nothing was deployed")
    facts = SlurmFacts(controller.name, version)
    broken: list[str] = []
    for t in trays:
        r = by_host[t.name]
        try:
            name, hw = parse_slurmd_c(r.stdout)
        except ValueError as exc:
            broken.append(f"{t.name}: {(r.stderr.strip().splitlines() or [str(exc)])[-1]}")
            continue
        if name != t.name:
            broken.append(f"{t.name}: its hostname is {name!r}, so slurmd would look for the wrong node line")
            continue
        facts.hardware[t.name] = hw
        try:
            facts.slurmd_versions[t.name] = parse_version(r.stdout)
        except ValueError:
            pass
    if broken:
        raise EnvironmentProblem(f"'slurmd -C' failed on {len(broken)} tray(s): " + "; ".join(broken[:5]),
                                 hint="the trays' image must deliver slurmd, and each tray's hostname must be its "
                                      "inventory name; nothing was deployed")
    return facts


def controller_state(site: Site, controller: Host) -> tuple[SlurmVersion, str | None]:
    """The controller's Slurm version and the TopologyPlugin slurmctld runs (None when it does not answer)."""
    from mctl.transport import SSHConfig, run_sync

    command = f"{CTLD_VERSION}; echo {_CONF_MARK}; scontrol show config 2>/dev/null | grep -E '^TopologyPlugin '"
    (result,) = run_sync(SSHConfig.from_site(site), _targets(site, [controller]), command)
    _refuse_unreached([result], "reading the Slurm version")
    version_text, _, conf = result.stdout.partition(_CONF_MARK)
    try:
        version = parse_version(version_text)
    except ValueError:
        raise EnvironmentProblem(f"cannot read the Slurm version on the controller {controller.name}: "
                                 f"{(result.stdout + result.stderr).strip()[:200]}",
                                 hint="is Slurm installed on the head node?") from None
    plugin = None
    for line in conf.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "TopologyPlugin":
            plugin = value.strip()
    return version, plugin


# --------------------------------------------------------------- files on hosts

@dataclass
class HostFiles:
    host: str
    files: dict[str, str | None]           # name -> text, None when absent
    munge_digest: str | None
    error: str | None = None


def _fetch_command(conf_dir: str, names: Sequence[str]) -> str:
    """A read-only shell loop over the Slurm files; every inventory value in it is shlex-quoted."""
    quoted = " ".join(shlex.quote(n) for n in names)
    directory = shlex.quote(conf_dir.rstrip("/") or "/")
    return (f"for f in {quoted}; do p={directory}/\"$f\"; "
            "if [ -r \"$p\" ]; then printf '%s\\t' \"$f\"; base64 -w0 \"$p\"; echo; "
            "else printf '%s\\t-\\n' \"$f\"; fi; done; "
            f"if [ -r {MUNGE_KEY} ]; then printf 'munge.key\\t%s\\n' \"$(sha256sum < {MUNGE_KEY} | cut -d' ' -f1)\"; "
            "else printf 'munge.key\\t-\\n'; fi")


def parse_fetch(host: str, text: str, names: Sequence[str]) -> HostFiles:
    files: dict[str, str | None] = {n: None for n in names}
    digest = None
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if name == "munge.key":
            digest = None if value == "-" else value.strip()
        elif name in files:
            files[name] = None if value == "-" else base64.b64decode(value).decode("utf-8", "replace")
    return HostFiles(host, files, digest)


def fetch_current(site: Site, hosts: Sequence[Host], conf_dir: str, names: Sequence[str]) -> list[HostFiles]:
    """The Slurm files and the MUNGE key digest each host holds now (for --dry-run)."""
    from mctl.transport import SSHConfig, run_sync

    results = run_sync(SSHConfig.from_site(site), _targets(site, hosts), _fetch_command(conf_dir, names))
    out = []
    for r in results:
        if r.status.reached:
            out.append(parse_fetch(r.host, r.stdout, names))
        else:
            out.append(HostFiles(r.host, {n: None for n in names}, None, error=r.summary()))
    return out


# --------------------------------------------------------------- verification

@dataclass
class Verification:
    ok: bool
    seconds: float
    nodes: dict[str, str]                       # tray -> Slurm state ("" when Slurm does not know it)
    unregistered: list[str]
    drained: list[str]
    blocks_expected: dict[str, str]
    blocks_found: dict[str, str]
    topology_plugin: str | None
    error: str | None = None
    # tray -> what the tray itself says (slurmd's unit state, its log's last line), for trays that did not register
    seen_on_trays: dict[str, str] = field(default_factory=dict)

    @property
    def blocks_match(self) -> bool:
        return self.blocks_expected == self.blocks_found

    def problems(self) -> list[str]:
        out = []
        if self.error:
            out.append(self.error)
        if self.unregistered:
            states = ", ".join(f"{n} {self.nodes.get(n) or 'unknown to Slurm'}" for n in self.unregistered[:6])
            out.append(f"{len(self.unregistered)} tray(s) did not register: {states}")
            out += [f"{n}: {said}" for n, said in list(self.seen_on_trays.items())[:6]]
        if not self.blocks_match:
            out.append(f"scontrol show topology does not match the partitions: expected {self.blocks_expected}, "
                       f"Slurm has {self.blocks_found}")
        return out

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 1), "nodes": self.nodes,
                "unregistered": self.unregistered, "drained": self.drained, "blocks_match": self.blocks_match,
                "blocks_expected": self.blocks_expected, "blocks_found": self.blocks_found,
                "topology_plugin": self.topology_plugin, "seen_on_trays": self.seen_on_trays,
                "problems": self.problems()}


_PART_MARK = "@@mctl-partition"
VERIFY_COMMAND = (f"scontrol show node -o; echo {_TOPO_MARK}; scontrol show topology; echo {_CONF_MARK}; "
                  f"scontrol show config | grep -E '^(TopologyPlugin|SwitchType) '; echo {_PART_MARK}; "
                  "scontrol show partition -o")


def _found_blocks(entries: list[TopologyEntry], plugin: str) -> dict[str, str]:
    if plugin == "block":
        return {e.name: str(NodeSet(e.nodes or "")) for e in entries if e.kind == "block"}
    return {e.name: str(NodeSet(e.nodes)) for e in entries if e.kind == "switch" and e.nodes}


def judge(text: str, config: "SlurmConfig", seconds: float) -> Verification:
    """Compare what the controller reports with what was deployed (pure, so tests can feed real output)."""
    nodes_text, _, rest = text.partition(_TOPO_MARK)
    topo_text, _, rest = rest.partition(_CONF_MARK)
    conf_text, _, part_text = rest.partition(_PART_MARK)
    states = {n.name: n for n in parse_show_nodes(nodes_text)}
    nodes = {t: (states[t].state if t in states else "") for t in config.nodes}
    unregistered = [t for t in config.nodes if t not in states or not states[t].registered]
    drained = [t for t in config.nodes if t in states and states[t].drained]
    expected = {b.name: str(NodeSet(b.nodeset)) for b in config.blocks}
    found = _found_blocks(parse_show_topology(topo_text), config.plugin)
    plugin = None
    for line in conf_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "TopologyPlugin":
            plugin = value.strip()
    error = None
    if plugin is not None and plugin != f"topology/{config.plugin}":
        error = f"slurmctld runs TopologyPlugin={plugin}, not topology/{config.plugin} (restart slurmctld?)"
    if part_text.strip():
        parts = {kv.get("PartitionName"): kv for kv in map(key_values, part_text.splitlines())}
        got = parts.get(config.partition)
        if got is None:
            error = error or f"Slurm has no partition {config.partition!r}"
        elif got.get("State") != "UP" or got.get("TotalNodes") != str(len(config.nodes)):
            error = error or (f"partition {config.partition} is {got.get('State')} with {got.get('TotalNodes')} "
                              f"nodes, expected UP with {len(config.nodes)}")
    ok = not unregistered and expected == found and plugin == f"topology/{config.plugin}" and error is None
    return Verification(ok, seconds, nodes, unregistered, drained, expected, found, plugin, error)


def verify(site: Site, config: "SlurmConfig", timeout: float, interval: float = 2.0) -> Verification:
    """Poll the controller until every tray registered and the blocks match, or *timeout* passed."""
    from mctl.transport import SSHConfig, run_in_pool

    targets = _targets(site, [config.controller])
    started = time.monotonic()

    async def work(pool: "SSHPool") -> Verification:
        last: Verification | None = None
        while True:
            result = await pool.run_one(targets[0], VERIFY_COMMAND)
            elapsed = time.monotonic() - started
            if result.status.reached and "NodeName=" in result.stdout:
                last = judge(result.stdout, config, elapsed)
                if last.ok:
                    return last
            elif last is None or last.error:
                said = _last_word(result)
                last = Verification(False, elapsed, {t: "" for t in config.nodes}, list(config.nodes), [],
                                    {b.name: str(NodeSet(b.nodeset)) for b in config.blocks}, {}, None,
                                    error=f"scontrol on {config.controller.name}: {said}")
            if elapsed >= timeout:
                if last.unregistered and not last.error:
                    last.seen_on_trays = await _look_at_trays(pool, site, last.unregistered)
                return last
            await asyncio.sleep(interval)

    return run_in_pool(SSHConfig.from_site(site), work)


def _tray_look_command(log_dir: str) -> str:
    path = f"{log_dir.rstrip('/')}/slurmd.log"
    # slurmd runs HealthCheckProgram when it starts, before it registers: say so when one is running
    return (f"echo \"slurmd $(systemctl is-active slurmd 2>/dev/null || true)\"; "
            "if pgrep -f '[m]ctl-node-check|[m]ctl.health.node_check' >/dev/null 2>&1; then "
            "echo 'a node check (HealthCheckProgram) is running'; fi; "
            f"tail -n 1 {shlex.quote(path)} 2>/dev/null || echo {shlex.quote('no ' + path)}")


def _last_word(result: "HostResult") -> str:
    """A failed command's last line of stderr, else what the transport says happened."""
    return (result.stderr.strip().splitlines() or [result.summary()])[-1]


async def _look_at_trays(pool: "SSHPool", site: Site, names: Sequence[str]) -> dict[str, str]:
    """Why trays did not register, in their own words: slurmd's unit state and its log's last line (bounded:
    the pool's command deadline; an unreachable tray says so)."""
    from mctl.sched.slurm.render import settings_of

    hosts = [h for h in (site.host(n) for n in names) if h is not None][:6]
    if not hosts:
        return {}
    results = await pool.run(_targets(site, hosts), _tray_look_command(settings_of(site).log_dir))
    out = {}
    for r in results:
        said = " | ".join(line.strip() for line in r.stdout.splitlines() if line.strip()) if r.ok else _last_word(r)
        out[r.host] = said[:300]
    return out
