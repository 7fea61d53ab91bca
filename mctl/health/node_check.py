"""`mctl node check`: the health checks on the tray itself, e.g. as Slurm's HealthCheckProgram.

Runs with the Python standard library only (`python3 -m mctl.health.node_check`
with nothing but a copy of mctl's needed modules on sys.path; see
mctl/health/bundle.py and playbooks/roles/node_check), so trays need no
pydantic, typer or asyncssh. It reads the GPUs through NVML when pynvml loads,
otherwise through `nvidia-smi -q -x`, runs the same probe script and check
catalogue as the watch, and drains its own node with the same conventions:
reason `mctl: ...`, never over someone else's reason, never a DOWN node,
resume only its own drains after N healthy runs, and no drain that would take
mctl's drains above the breaker's share of the rack (read from Slurm, since
trays share no state). slurmd kills the program after 60 s, so every step has
a deadline inside DEADLINE_S.

Exit status: 0 no critical finding, 1 critical findings, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mctl import checks
from mctl.health import policy, store
from mctl.health.breaker import BreakerState
from mctl.health.record import TrayVerdict
from mctl.model.tray import TrayExpectation, TrayFacts, dcgm_timeout_for
from mctl.facts.probe import HEALTH, NODE_CHECK, parse_tray, probe_script
from mctl.model.settings import HealthSettings
from mctl.model.drain import DRAIN, RESUME, SKIP, Decision
from mctl.sched.slurm.drain import apply_script, controller_down, parse_apply, read_nodes, show_node_command
from mctl.model.findings import Severity, sort_findings, worst

if TYPE_CHECKING:
    from mctl.model.budget import BudgetView

DEFAULT_CONFIG = "/etc/mctl/node-check.json"
DEFAULT_STATE_DIR = "/var/lib/mctl-node-check"
DEADLINE_S = 45.0             # slurmd kills HealthCheckProgram at 60 s
SCONTROL_TIMEOUT = 10.0
CONFIG_SCHEMA = 1


@dataclass(frozen=True)
class NodeCheckConfig:
    node: str
    expect: TrayExpectation
    settings: HealthSettings
    rack_nodes: tuple[str, ...] = ()
    state_dir: str = DEFAULT_STATE_DIR
    drain: bool = True
    scheduler: str | None = "slurm"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CONFIG_SCHEMA, "node": self.node, "expect": self.expect.to_dict(),
                "settings": self.settings.to_dict(), "rack_nodes": list(self.rack_nodes),
                "state_dir": self.state_dir, "drain": self.drain, "scheduler": self.scheduler}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeCheckConfig":
        if data.get("schema") != CONFIG_SCHEMA:
            raise ValueError(f"config schema {data.get('schema')!r}, expected {CONFIG_SCHEMA}")
        return cls(node=str(data["node"]), expect=TrayExpectation.from_dict(data["expect"]),
                   settings=HealthSettings.from_dict(data.get("settings") or {}),
                   rack_nodes=tuple(data.get("rack_nodes") or ()), state_dir=str(data.get("state_dir")
                                                                                 or DEFAULT_STATE_DIR),
                   drain=bool(data.get("drain", True)), scheduler=data.get("scheduler", "slurm"))


def default_config(node: str | None = None) -> NodeCheckConfig:
    """Without a config file: this host, NVIDIA's defaults, no inventory expectations."""
    name = node or socket.gethostname().split(".")[0]
    return NodeCheckConfig(node=name, expect=TrayExpectation(host=name, scheduler="slurm"), settings=HealthSettings())


def load_config(path: str | None, node: str | None = None) -> NodeCheckConfig:
    p = Path(path or DEFAULT_CONFIG)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        if path:
            raise ValueError(f"no config file {p}") from None
        return default_config(node)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {p}: {exc}") from None
    config = NodeCheckConfig.from_dict(data)
    if node:
        config = replace(config, node=node, expect=replace(config.expect, host=node))
    return config


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.end - time.monotonic()))


def _run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out, f"timed out after {timeout:g}s"
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def gather(config: NodeCheckConfig, deadline: Deadline, *, use_nvml: bool = True) -> TrayFacts:
    """This tray's facts: NVML when it loads, the probe script for the rest (and nvidia-smi otherwise)."""
    from mctl.health import nvml

    started = time.monotonic()
    gpu_facts = None
    nvml_note = None
    if use_nvml:
        nv, nvml_note = nvml.load()
        if nv is not None:
            try:
                report, links, messages = nvml.read(nv)
                gpu_facts = (report, None, messages, links, None, "nvml")
            finally:
                nvml.shutdown(nv)
    nonce = secrets.token_hex(8)
    probe_timeout = deadline.left(35.0)
    smi_timeout = max(1.0, probe_timeout / 2 - 2)
    dcgm_timeout = None if config.settings.dcgm == "off" else dcgm_timeout_for(probe_timeout)
    paths = config.settings.disk_paths
    purpose = HEALTH if gpu_facts is None else NODE_CHECK       # NVML read the GPUs: no nvidia-smi sections
    body = probe_script(purpose, nonce, smi_timeout=smi_timeout, disk_paths=paths, dcgm_timeout=dcgm_timeout)
    rc, out, err = _run(["/bin/sh", "-c", body], probe_timeout)
    facts = parse_tray(purpose, config.node, out, err, nonce, smi_timeout=smi_timeout, disk_paths=paths,
                        elapsed=time.monotonic() - started, gpu_facts=gpu_facts, dcgm_timeout=dcgm_timeout)
    if rc == 124:
        facts = replace(facts, problems=facts.problems + (f"probe timed out after {probe_timeout:g}s",))
    if nvml_note and gpu_facts is None:
        facts = replace(facts, gpu_source=f"nvidia-smi ({nvml_note})")
    return facts


def _slurm_nodes(deadline: Deadline) -> tuple[dict | None, dict | None, str | None, "BudgetView | None"]:
    """Slurm's nodes and the site's safety budget (its grants, whether it is tripped), in one read."""
    from mctl.sched.slurm.budget import split_reservations, with_reservations

    rc, out, err = _run(["/bin/sh", "-c", with_reservations(show_node_command())], deadline.left(SCONTROL_TIMEOUT))
    if rc != 0:
        said = ((err or out).strip().splitlines() or [f"exit {rc}"])[-1]
        return None, None, ("slurmctld did not answer: " if controller_down(err + out) else "scontrol failed: ") \
            + said, None
    nodes, budget = split_reservations(out)
    views, states = read_nodes(nodes)
    return views, states, None, budget


def _share_guard(config: NodeCheckConfig, views: dict) -> str | None:
    """The node check's breaker: Slurm is the only state trays share, so count mctl drains there now."""
    rack = [n for n in config.rack_nodes if n != config.node]
    if not config.rack_nodes:
        return None
    drained = sum(1 for n in rack if n in views and views[n].mctl_drain)
    size = len(config.rack_nodes)
    share = (drained + 1) / size
    if share > config.settings.breaker_max_share:
        return (f"circuit breaker: {drained} other trays of the rack are drained by mctl; draining this one "
                f"would make {share:.0%} > {config.settings.breaker_max_share:.0%}")
    return None


@dataclass
class NodeCheckResult:
    node: str
    facts: TrayFacts
    findings: list
    decisions: list
    actions: list
    scheduler_error: str | None
    elapsed: float
    dry_run: bool = False

    @property
    def worst(self) -> Severity:
        return worst(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "worst": self.worst.value, "elapsed": round(self.elapsed, 3),
                "gpu_source": self.facts.gpu_source, "scheduler_error": self.scheduler_error,
                "dry_run": self.dry_run, "findings": [f.to_dict() for f in self.findings],
                "decisions": [d.to_dict() for d in self.decisions],
                "actions": [a.to_dict() for a in self.actions]}


def run(config: NodeCheckConfig, *, drain: bool | None = None, dry_run: bool = False, use_nvml: bool = True,
        deadline_s: float = DEADLINE_S) -> NodeCheckResult:
    deadline = Deadline(deadline_s)
    t0 = time.monotonic()
    views = states = budget = None
    sched_error = None
    acting = config.drain if drain is None else drain
    facts = gather(config, deadline, use_nvml=use_nvml)
    if config.scheduler == "slurm":
        views, states, sched_error, budget = _slurm_nodes(deadline)
        facts = facts.with_slurm_node((states or {}).get(config.node))
    state_dir = Path(config.state_dir)
    state = store.HealthState()
    if acting:
        try:
            state = store.load_state(state_dir)
        except Exception as exc:  # noqa: BLE001 - a damaged local file must not stop the check itself
            sched_error = f"{sched_error + '; ' if sched_error else ''}local state unreadable: {exc}"
    rec = state.records.get(config.node)
    facts = facts.without_xids_before(rec.xid_ack if rec else None)
    findings = sort_findings(checks.run_tray(facts, config.expect, config.settings))
    verdict = TrayVerdict(config.node, config.expect.rack, facts.reach, worst(findings), tuple(findings))
    decisions: list = []
    actions: list = []
    if acting and config.scheduler == "slurm":
        outcome = policy.decide(state.records, [verdict], views, config.settings, BreakerState(),
                                {config.expect.rack or "": max(1, len(config.rack_nodes))}, now=time.time(),
                                budget=budget)
        drains = [d for d in outcome.decisions if d.action == DRAIN]
        guard = _share_guard(config, views) if drains and views is not None else None
        if guard:
            outcome.records[config.node] = outcome.records[config.node].released(note=guard)
            skip = Decision(config.node, SKIP, guard, reason=drains[0].reason, full=drains[0].full,
                            rack=config.expect.rack, at=time.time())
            outcome.decisions = [d for d in outcome.decisions if d.action != DRAIN] + [skip]
            if rec is None or rec.note != guard:
                outcome.notes.append(skip)
        decisions = outcome.decisions
        todo = outcome.actions
        who = f"mctl node check on {config.node} (pid {os.getpid()})"
        if not dry_run:
            if todo:
                rc, out, err = _run(["/bin/sh", "-c", apply_script(todo)], deadline.left(SCONTROL_TIMEOUT))
                for r in parse_apply(out, todo):
                    if not r.ok and not r.error and rc:
                        r = replace(r, error=err.strip() or None)
                    policy.settle(outcome, r)
                    actions.append(store.action_entry(r.decision.action, config.node, r.decision.reason, who=who,
                                                      full=r.decision.full, at=r.decision.at, why=r.decision.why,
                                                      result="ok" if r.ok else f"failed: {r.error}"))
            for n in outcome.notes:
                actions.append(store.action_entry(n.action, config.node, n.reason, who=who, full=n.full, at=n.at,
                                                  why=n.why, result="noted"))
            state.records = outcome.records
            state.site = None
            try:
                store.append_actions(state_dir, actions)
                store.save_state(state_dir, state)
            except Exception as exc:  # noqa: BLE001 - the drain happened; say that the record did not
                sched_error = f"{sched_error + '; ' if sched_error else ''}could not record: {exc}"
    return NodeCheckResult(config.node, facts, findings, decisions, actions, sched_error, time.monotonic() - t0,
                           dry_run)


def render_text(result: NodeCheckResult, *, verbose: bool = False) -> str:
    lines = [f"{result.node}: {result.worst.value} ({result.elapsed:.1f}s, GPUs via {result.facts.gpu_source})"]
    for f in result.findings:
        if f.severity is Severity.OK and not verbose:
            continue
        lines.append(f"  {f.severity.value.upper():8} {f.check}: {f.message}")
        if f.action and f.severity is not Severity.OK:
            lines.append(f"           action: {f.action}")
    for d in result.decisions:
        verb = f"would {d.action}" if result.dry_run and d.action in (DRAIN, RESUME) else d.action
        lines.append(f"  {verb.upper()}: {d.reason or ''} ({d.why})".replace(" ()", ""))
    for a in result.actions:
        if not a.ok:                        # a drain the controller refused: the guard, or the safety budget
            lines.append(f"  {a.action.upper()} NOT DONE: {a.result}")
    if result.scheduler_error:
        lines.append(f"  scheduler: {result.scheduler_error}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mctl-node-check",
                                description="mctl's health checks on this tray (Slurm HealthCheckProgram): "
                                            "drains it with an 'mctl:' reason when a check is critical.",
                                epilog="Example: mctl-node-check --no-drain -v",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help=f"JSON written by the node_check role (default {DEFAULT_CONFIG})")
    p.add_argument("--node", help="Slurm node name (default: from the config, else the short hostname)")
    p.add_argument("--no-drain", action="store_true", help="report only; never drain or resume")
    p.add_argument("--dry-run", action="store_true", help="decide and print, change nothing")
    p.add_argument("--no-nvml", action="store_true", help="read the GPUs with nvidia-smi even if NVML loads")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="also list the checks that passed")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, args.node)
    except (ValueError, KeyError) as exc:
        sys.stderr.write(f"mctl-node-check: error: {exc}\n")
        return 2
    result = run(config, drain=False if args.no_drain else None, dry_run=args.dry_run, use_nvml=not args.no_nvml)
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(render_text(result, verbose=args.verbose))
    return 1 if result.worst is Severity.CRITICAL else 0


if __name__ == "__main__":
    sys.exit(main())
