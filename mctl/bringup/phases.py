"""The phases of `mctl rack bring-up`, each built on the service functions of the other commands.

Every phase has a plan (read-only; `--dry-run` prints it) and a run. A run
discovers first and changes only what differs, so a phase that finds its part
in place changes nothing and says so; re-running a finished bring-up is
therefore a no-op. A phase that cannot finish raises PhaseFailed with what it
found, per host, and the run stops there.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Host
    from mctl.transport.results import HostResult


def _names(hosts) -> list[str]:
    return [h.name for h in hosts]


def _slurm(ctx: Context) -> bool:
    return ctx.site.scheduler is not None and ctx.site.scheduler.type == "slurm"


def _controller(ctx: Context) -> "Host":
    from mctl.sched.slurm.render import controller_of

    return controller_of(ctx.site)


def _on_controller(ctx: Context, command: str, timeout: float = 60) -> "HostResult":
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(ctx.site), targets_for(ctx.site, [_controller(ctx)]), command,
                    timeout=timeout)[0]


# ------------------------------------------------------------------ preflight

def _reach(ctx: Context, hosts: list["Host"], *, trust: bool) -> tuple[list[str], list[str]]:
    """(problems, notes) after one SSH round trip to every host; new host keys trusted when asked."""
    from mctl.transport import SSHConfig, run_sync, targets_for
    from mctl.transport.results import HostStatus
    from mctl.transport.trust import trust_hosts

    config = SSHConfig.from_site(ctx.site)
    results = {r.host: r for r in run_sync(config, targets_for(ctx.site, hosts), "true")}
    notes: list[str] = []
    new = [h for h in hosts if results[h.name].status is HostStatus.HOST_KEY_MISMATCH
           and results[h.name].host_key is not None and not results[h.name].host_key.recorded]
    if new and trust:
        outcomes = trust_hosts(config, targets_for(ctx.site, new),
                               lock_path=ctx.state_dir / "locks" / "known_hosts.lock")
        added = [o.host for o in outcomes if o.trusted]
        notes.append(f"trusted new host keys of {fold(added)} (--trust-new-keys)" if added else
                     "no new host key could be fetched")
        for r in run_sync(config, targets_for(ctx.site, [h for h in new if h.name in added]), "true"):
            results[r.host] = r
    problems = []
    for h in hosts:
        r = results[h.name]
        if r.ok:
            continue
        if r.status is HostStatus.HOST_KEY_MISMATCH and r.host_key is not None and not r.host_key.recorded:
            problems.append(f"{h.name}: host key not trusted yet ({r.host_key.presented}); "
                            f"check it, then 'mctl ssh trust {h.name}' or --trust-new-keys")
        else:
            problems.append(f"{h.name}: {r.summary()}")
    return problems, notes


def _preflight_hosts(ctx: Context) -> list["Host"]:
    hosts = ctx.managed
    if _slurm(ctx):
        controller = _controller(ctx)
        if controller.name not in _names(hosts):
            hosts.append(controller)
    return hosts


def _static_checks(ctx: Context) -> list[str]:
    """What the inventory alone can refuse (UsageError, nothing touched)."""
    from mctl.errors import UsageError
    from mctl.fabric.partitions import desired_from_rack, validate_desired

    rack = ctx.rack
    if not rack.compute:
        raise UsageError(f"rack {rack.name} has no compute trays in the inventory")
    notes = [f"inventory {ctx.site.file}: rack {rack.name}, {rack.model}, {len(rack.compute)} of "
             f"{rack.compute_trays} compute trays, head {rack.head.name if rack.head else 'none'}"]
    if rack.partitions:
        for w in validate_desired(rack, desired_from_rack(rack), site=ctx.site):
            notes.append(f"warning: {w}")
        if rack.nmx is None:
            raise UsageError(f"rack {rack.name} declares partitions but has no NMX-Manager endpoint",
                             hint=f"add racks.{rack.name}.nmx (url, credentials_file) to the inventory")
    if _slurm(ctx):
        notes.append(f"scheduler: Slurm, controller {_controller(ctx).name}")
    return notes


def _nmx_check(ctx: Context) -> str | None:
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover

    if ctx.rack.nmx is None:
        return None
    state = discover(NMXClient.for_rack(ctx.site, ctx.rack), ctx.rack)
    return (f"NMX-M {ctx.rack.nmx.url} answers: {len(state.nodes)} compute nodes, "
            f"{sum(1 for p in state.partitions if not p.is_default)} user partitions")


def run_preflight(ctx: Context) -> Outcome:
    details = _static_checks(ctx)
    hosts = _preflight_hosts(ctx)
    problems, notes = _reach(ctx, hosts, trust=ctx.options.trust_new_keys)
    details += notes
    if problems:
        raise PhaseFailed(f"{len(problems)} of {len(hosts)} hosts cannot be used over SSH",
                          hint="fix reachability or host keys, then 'mctl rack bring-up "
                               f"{ctx.rack.name} --resume'", details=details + problems)
    nmx = _nmx_check(ctx)
    if nmx:
        details.append(nmx)
    return Outcome("done", f"{len(hosts)} hosts answer over SSH with trusted keys"
                   + ("; NMX-M answers" if nmx else ""), details=details)


def plan_preflight(ctx: Context) -> list[str]:
    lines = _static_checks(ctx)
    hosts = _preflight_hosts(ctx)
    problems, _ = _reach(ctx, hosts, trust=False)
    lines.append(f"SSH to {len(hosts)} hosts: " + ("all answer" if not problems else f"{len(problems)} problems"))
    lines += [f"  {p}" for p in problems]
    if ctx.options.trust_new_keys:
        lines.append("new host keys would be trusted (--trust-new-keys)")
    nmx = _nmx_check(ctx)
    if nmx:
        lines.append(nmx)
    return lines


# ------------------------------------------------------------------ inventory

def _inventory(ctx: Context, *, save: bool):
    from mctl.rackinv.service import run_inventory

    report = run_inventory(ctx.site, [ctx.rack], state_dir=ctx.state_dir, save=save)
    rack_report = report.racks[0]
    ctx.cache["facts"] = {t.host: t for t in rack_report.trays}
    return rack_report


def run_inventory_phase(ctx: Context) -> Outcome:
    from mctl.model.findings import Severity

    r = _inventory(ctx, save=True)
    crit = [f for f in r.findings if f.severity is Severity.CRITICAL]
    warn = [f for f in r.findings if f.severity is Severity.WARN]
    lines = [f"{f.severity.value.upper()} {f.host or '-'} {f.check}: {f.message}" for f in crit + warn]
    artifacts = {"snapshot": str(r.snapshot_path) if r.snapshot_path else None,
                 "critical": len(crit), "warn": len(warn)}
    if r.unreached or crit:
        raise PhaseFailed(f"rack {ctx.rack.name} does not have its expected shape: {len(crit)} critical findings"
                          + (f", {len(r.unreached)} trays not inventoried" if r.unreached else ""),
                          hint=f"see 'mctl rack inventory {ctx.rack.name}'; fix, then --resume",
                          exit_code=EXIT_PARTIAL if r.unreached else EXIT_FINDINGS, details=lines,
                          artifacts=artifacts)
    gpus = sum(t.gpu_count or 0 for t in r.trays)
    domain = ctx.rack.nvlink_domain or "undeclared"
    return Outcome("done", f"{len(r.trays)} trays, {gpus} GPUs, NVLink domain {domain}"
                   + (f"; {len(warn)} warnings" if warn else ""), details=lines, artifacts=artifacts)


def plan_inventory(ctx: Context) -> list[str]:
    r = ctx.rack
    return [f"collect facts from {len(r.compute)} trays over SSH (nvidia-smi, OS, IMEX, slurmd, XIDs) and check "
            f"{r.model}: {r.compute_trays} trays x {r.gpus_per_tray} GPUs, one NVLink domain "
            f"({r.nvlink_domain or 'undeclared'}), fabric Completed; save a snapshot"]


# ------------------------------------------------------------------ provision

@dataclass
class ProvisionNeed:
    hosts: list["Host"]
    images: dict[str, str | None]
    digests: dict[str, str]
    reasons: dict[str, str]                   # host -> why it is provisioned (absent: up to date)


def _drift(ctx: Context, hosts: list["Host"], images: dict[str, str | None]) -> dict[str, str]:
    """Hosts whose GPUs report another driver than their image's (the playbook fixes or refuses that)."""
    from mctl.images import ImageCatalog, image_drift
    from mctl.model.findings import Severity

    if ctx.site.images_dir is None:
        return {}
    facts = ctx.cache.get("facts")
    if facts is None:
        _inventory(ctx, save=False)
        facts = ctx.cache["facts"]
    catalog = ImageCatalog(ctx.site.images_dir)
    out: dict[str, str] = {}
    for h in hosts:
        t = facts.get(h.name)
        if t is None or t.gpus is None or not images.get(h.name):
            continue
        image = catalog.get(images[h.name])
        found = image_drift(image, h.name, {"driver_version": t.gpus.driver_version})
        crit = [f.message for f in found if f.severity is Severity.CRITICAL]
        if crit:
            out[h.name] = crit[0]
    return out


def _provision_need(ctx: Context) -> ProvisionNeed:
    from mctl.bringup.digest import provision_digest, tree_digest
    from mctl.bringup.trays import read_markers
    from mctl.provision.runner import PLAYBOOKS_DIR
    from mctl.provision.service import plan_provision

    hosts = ctx.managed
    everything = plan_provision(ctx.site, ctx.state_dir, ",".join(_names(hosts)))
    playbooks = tree_digest(PLAYBOOKS_DIR)
    digests = {h.name: provision_digest(ctx.site, h, everything.images.get(h.name), playbooks) for h in hosts}
    marks = read_markers(ctx.site, hosts)
    if marks.failed:
        raise PhaseFailed(f"{len(marks.failed)} hosts could not be asked whether they are provisioned",
                          details=[f"{h}: {why}" for h, why in marks.failed.items()])
    drift = _drift(ctx, ctx.trays, everything.images)
    reasons: dict[str, str] = {}
    for h in hosts:
        mark = marks.markers.get(h.name)
        if ctx.options.reprovision:
            reasons[h.name] = "asked for (--reprovision)"
        elif h.name in drift:
            reasons[h.name] = drift[h.name]
        elif mark is None:
            reasons[h.name] = "not provisioned by bring-up yet"
        elif mark.get("digest") != digests[h.name]:
            reasons[h.name] = f"playbooks, image or inventory entry changed since run {mark.get('run_id')}"
    return ProvisionNeed(hosts, dict(everything.images), digests, reasons)


def _reason_lines(reasons: dict[str, str]) -> list[str]:
    by: dict[str, list[str]] = {}
    for host, why in reasons.items():
        by.setdefault(why, []).append(host)
    return [f"{fold(hosts)}: {why}" for why, hosts in by.items()]


def plan_provision(ctx: Context) -> list[str]:
    need = _provision_need(ctx)
    if not need.reasons:
        return [f"nothing to provision: all {len(need.hosts)} hosts carry a marker of the current playbooks, "
                "images and inventory"]
    return [f"run playbook site on {len(need.reasons)} hosts: {fold(need.reasons)}"] + \
        [f"  {line}" for line in _reason_lines(need.reasons)]


def run_provision(ctx: Context) -> Outcome:
    from mctl.bringup.trays import MARKER, clear_markers, write_markers
    from mctl.provision.service import plan_provision as plan_run, provision

    need = _provision_need(ctx)
    if not need.reasons:
        return Outcome("done", f"all {len(need.hosts)} hosts already provisioned with the current playbooks, "
                       "images and inventory")
    targets = [h for h in need.hosts if h.name in need.reasons]
    details = _reason_lines(need.reasons)
    for line in details:
        ctx.report.line(line)
    failed = clear_markers(ctx.site, targets)
    if failed:
        raise PhaseFailed(f"could not clear the provisioning marker on {fold(failed)}",
                          details=[f"{h}: {why}" for h, why in failed.items()])
    plan = plan_run(ctx.site, ctx.state_dir, ",".join(_names(targets)))
    runs = ctx.state_dir / "provision" / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    noted: list[bool] = []

    def event(ev) -> None:
        if not noted and runs.is_dir():
            new = sorted(set(runs.iterdir()) - before)
            if new:
                noted.append(True)
                ctx.note("provision", run_dir=str(new[-1]), run_id=new[-1].name, hosts=plan.hosts)
        ctx.report.host_event(ev)

    ctx.report.hosts_started("provisioning", plan.hosts)
    try:
        result = provision(plan, ctx.state_dir, on_event=event)
    finally:
        ctx.report.hosts_ended()
    artifacts = {"run_id": result.run_id, "run_dir": result.run_dir, "hosts": plan.hosts,
                 "changed": result.changed_total}
    if result.status == "canceled":
        raise KeyboardInterrupt
    good = [h for h in targets if h.name in result.hosts and result.hosts[h.name].status in ("ok", "changed")]
    bad = [h.name for h in targets if h not in good]
    if good:
        now = time.time()
        write_failed = write_markers(ctx.site, good, {h.name: {"digest": need.digests[h.name], "run_id": ctx.run_id,
                                                               "provision_run": result.run_id, "time": now,
                                                               "image": need.images.get(h.name)} for h in good})
        bad += [h for h in write_failed if h not in bad]
    if bad:
        lines = []
        for name in bad:
            r = result.hosts.get(name)
            lines.append(f"{name}: {r.status} at task '{r.failed_task}': {r.message}" if r and r.failed_task
                         else f"{name}: {r.status if r else 'no result'} (marker {MARKER} not written)")
        artifacts["failed_hosts"] = bad
        raise PhaseFailed(f"provisioning failed on {len(bad)} of {len(targets)} hosts: {fold(bad)}",
                          hint=f"fix the cause (run folder {result.run_dir}), then 'mctl rack bring-up "
                               f"{ctx.rack.name} --resume': hosts provisioned now keep their marker and are "
                               "not provisioned again", details=lines, artifacts=artifacts)
    return Outcome("done", f"provisioned {fold(_names(targets))} ({result.changed_total} changes) in "
                   f"{result.ended - result.started:.0f}s, run {result.run_id}",
                   changed=result.changed_total > 0, details=details, artifacts=artifacts)


# ------------------------------------------------------------------ partitions

def _partition_ids(ctx: Context) -> list[dict]:
    from mctl.fabric.nmx import NMXClient
    from mctl.fabric.reconcile import discover

    state = discover(NMXClient.for_rack(ctx.site, ctx.rack), ctx.rack)
    ids = {p.name: p.partition_id for p in state.partitions}
    return [{"name": p.name, "trays": p.nodeset, "partition_id": ids.get(p.name)} for p in ctx.rack.partitions]


def _default_partition_text(ctx: Context) -> tuple[str, list[str]]:
    from mctl.fabric.service import plan_partitions_for

    text = (f"no partitions declared for {ctx.rack.name}: the whole rack stays in NMX-M's default partition "
            "(one IMEX domain, one Slurm block)")
    lines: list[str] = []
    if ctx.rack.nmx is not None:
        _, plan = plan_partitions_for(ctx.site, ctx.rack, ())
        if plan.unmanaged:
            lines.append(f"NMX-M holds partitions the inventory does not declare: {', '.join(plan.unmanaged)} "
                         f"(left alone; 'mctl partition apply {ctx.rack.name} --prune' removes them)")
    return text, lines


def plan_partitions(ctx: Context) -> list[str]:
    from mctl.fabric.partitions import describe_change
    from mctl.fabric.service import apply_partitions

    if not ctx.rack.partitions:
        text, lines = _default_partition_text(ctx)
        return [text] + lines
    res = apply_partitions(ctx.site, ctx.rack, dry_run=True)
    declared = "; ".join(f"{p.name}={p.nodeset}" for p in ctx.rack.partitions)
    if res.plan.empty:
        return [f"partitions {declared}: NMX-M already holds them"]
    return [f"partitions {declared}: {len(res.plan.changes)} changes on NMX-M"] + \
        [f"  {i}. {describe_change(c, ctx.rack.gpus_per_tray)}" for i, c in enumerate(res.plan.changes, 1)]


def run_partitions(ctx: Context) -> Outcome:
    from mctl.fabric.partitions import describe_change
    from mctl.fabric.service import apply_partitions, plan_partitions_for

    if not ctx.rack.partitions:
        text, lines = _default_partition_text(ctx)
        return Outcome("done", text, details=lines, artifacts={"partitions": []})

    def step(number: int, change) -> None:
        ctx.report.line(f"[{number}] {describe_change(change, ctx.rack.gpus_per_tray)}")

    res = apply_partitions(ctx.site, ctx.rack, on_step=step)
    _, after = plan_partitions_for(ctx.site, ctx.rack)
    if not after.empty:
        raise PhaseFailed(f"NMX-M does not hold the declared partitions after applying ({len(after.changes)} "
                          "changes still planned)", hint=f"see 'mctl partition list {ctx.rack.name}'")
    parts = _partition_ids(ctx)
    names = ", ".join(f"{p['name']} ({p['trays']}, ID {p['partition_id']})" for p in parts)
    verb = f"applied {len(res.plan.changes)} changes" if res.changed else "already in place"
    return Outcome("done", f"partitions {verb}: {names}", changed=res.changed,
                   details=list(res.warnings), artifacts={"partitions": parts, "plan": res.plan.to_dict()})


# ------------------------------------------------------------------ IMEX

def _k8s_imex(ctx: Context) -> bool:
    return ctx.site.scheduler is not None and ctx.site.scheduler.type == "k8s"


def plan_imex(ctx: Context) -> list[str]:
    from mctl.fabric.imex import imex_domains
    from mctl.fabric.service import apply_imex

    if _k8s_imex(ctx):
        return ["skipped: on Kubernetes sites the DRA driver runs IMEX in pods ('mctl deploy k8s')"]
    doms = ", ".join(f"{d.name} ({fold(d.trays)})" for d in imex_domains(ctx.rack))
    res = apply_imex(ctx.site, ctx.rack, dry_run=True)
    lines = [f"IMEX domains: {doms}"]
    lines += [f"  write {', '.join(files)} on {t}" for t, files in res.changes.items()] or \
        ["  files on every reachable tray already match"]
    if res.restart:
        lines.append(f"  restart nvidia-imex on {fold(res.restart)}")
    if res.unreachable:
        lines.append(f"  cannot reach {fold(res.unreachable)}")
    return lines


def run_imex(ctx: Context) -> Outcome:
    from mctl.fabric.service import apply_imex, wait_for_imex

    if _k8s_imex(ctx):
        return Outcome("skipped", "Kubernetes site: the DRA driver runs IMEX in pods ('mctl deploy k8s')")
    res = apply_imex(ctx.site, ctx.rack)
    if res.not_applied:
        raise PhaseFailed(f"IMEX files could not be applied on {fold(res.not_applied)}",
                          details=[f"{t}: unreachable" for t in res.unreachable]
                          + [f"{t}: {why}" for t, why in res.failed.items()], artifacts=res.to_dict())
    if res.restart:
        ctx.report.line(f"wrote IMEX files and restarted the daemon on {fold(res.restart)}")
    healths = wait_for_imex(ctx.site, [ctx.rack], wait=ctx.options.imex_wait)
    domains = [{"name": h.domain.name, "state": h.state, "trays": fold(h.domain.trays)} for h in healths]
    bad = [h for h in healths if h.state != "UP"]
    if bad:
        raise PhaseFailed(f"IMEX domain{'s' if len(bad) > 1 else ''} not UP after {ctx.options.imex_wait:.0f}s: "
                          + ", ".join(f"{h.domain.name} {h.state}" for h in bad),
                          hint=f"see 'mctl imex status {ctx.rack.name}'", exit_code=EXIT_FINDINGS,
                          details=[f"{h.domain.name}: {r.message}" for h in bad for r in h.reasons],
                          artifacts={"domains": domains})
    names = ", ".join(f"{d['name']} ({d['trays']})" for d in domains)
    return Outcome("done", f"{len(domains)} IMEX domain{'s' if len(domains) > 1 else ''} UP: {names}"
                   + (f"; files changed on {len(res.changes)} trays" if res.changes else "; files unchanged"),
                   changed=res.changed, artifacts={"domains": domains, "changes": res.changes})


# ------------------------------------------------------------------ scheduler

def _scheduler_skip(ctx: Context) -> str | None:
    if ctx.site.scheduler is None:
        return "no scheduler in the inventory"
    if not _slurm(ctx):
        return (f"scheduler {ctx.site.scheduler.type}: deploy it with 'mctl deploy {ctx.site.scheduler.type}' "
                "(bring-up drives Slurm)")
    return None


def _slurm_state(ctx: Context):
    from mctl.sched.slurm import dry_run, plan_slurm
    from mctl.sched.slurm.remote import verify

    plan = plan_slurm(ctx.site, ctx.state_dir)
    diff = dry_run(plan)
    verification = verify(ctx.site, plan.config, timeout=0) if diff.changes == 0 else None
    return plan, diff, verification


def plan_scheduler(ctx: Context) -> list[str]:
    skip = _scheduler_skip(ctx)
    if skip:
        return [f"skipped: {skip}"]
    plan, diff, v = _slurm_state(ctx)
    blocks = ", ".join(f"{b.name}={b.nodeset}" for b in plan.config.blocks)
    lines = [f"Slurm {plan.config.version} on {plan.config.controller.name}; blocks {blocks}"]
    if diff.changes == 0 and v is not None and v.ok:
        lines.append("nothing to deploy: files and MUNGE key in place, every tray registered, blocks match")
    else:
        changed = sorted({f"{f.name} ({f.status})" for f in diff.files if f.status in ("changed", "new")})
        lines.append(f"deploy Slurm to {len(plan.hosts)} hosts ({diff.changes} changes"
                     + (f": {', '.join(changed)}" if changed else "") + "), verify, then hold the rack's trays "
                     "drained until the open phase")
        if v is not None and not v.ok:
            lines += [f"  {p}" for p in v.problems()]
    return lines


def _hold(ctx: Context) -> tuple[list[str], dict[str, str]]:
    """Drain the rack's trays for the rest of the bring-up; trays someone else holds are left alone."""
    from mctl.bringup import slurm_nodes

    trays = _names(ctx.trays)
    res = _on_controller(ctx, slurm_nodes.drain_script(trays, slurm_nodes.reason(ctx.run_id or "dry-run")))
    if not res.status.reached:
        raise PhaseFailed(f"could not drain the trays on {_controller(ctx).name}: {res.summary()}")
    actions = slurm_nodes.parse_actions(res.stdout, trays)
    held = [t for t, (what, _) in actions.items() if what == "done"]
    others = {t: text for t, (what, text) in actions.items() if what != "done"}
    return held, others


def run_scheduler(ctx: Context) -> Outcome:
    from mctl.sched.slurm import apply

    skip = _scheduler_skip(ctx)
    if skip:
        return Outcome("skipped", skip)
    plan, diff, v = _slurm_state(ctx)
    blocks = [{"name": b.name, "trays": b.nodeset} for b in plan.config.blocks]
    if diff.changes == 0 and v is not None and v.ok:
        return Outcome("done", f"Slurm unchanged: {len(v.nodes)} trays registered, {len(blocks)} blocks match the "
                       "partitions", artifacts={"blocks": blocks, "held": []})
    ctx.report.hosts_started("deploying Slurm", _names(plan.hosts))
    try:
        with ctx.lent_lock():
            result = apply(plan, on_event=ctx.report.host_event)
    finally:
        ctx.report.hosts_ended()
    artifacts = {"run_id": result.run.run_id, "run_dir": result.run.run_dir, "blocks": blocks}
    if result.run.status == "canceled":
        raise KeyboardInterrupt
    if not result.ok:
        lines = [f"{n}: {result.run.hosts[n].status} at task '{result.run.hosts[n].failed_task}': "
                 f"{result.run.hosts[n].message}" for n in result.run.failed_hosts]
        lines += result.verification.problems() if result.verification else []
        raise PhaseFailed("Slurm deploy did not finish" + (f": failed on {fold(result.run.failed_hosts)}"
                                                           if result.run.failed_hosts else ""),
                          hint=f"run folder {result.run.run_dir}; 'mctl deploy slurm --dry-run' shows what differs",
                          details=lines, artifacts=artifacts)
    held, others = _hold(ctx)
    artifacts["held"] = held
    details = [f"{t} not held: {why}" for t, why in others.items()]
    return Outcome("done", f"deployed Slurm ({result.run.changed_total} changes), {len(result.verification.nodes)} "
                   f"trays registered, blocks match; {len(held)} trays held drained until open",
                   changed=True, details=details, artifacts=artifacts)


# ------------------------------------------------------------------ health gate

def accepted(finding, patterns) -> bool:
    """CHECK, HOST:CHECK, or shell patterns of either (imex.*, lab-r1-tray03:*)."""
    for pat in patterns:
        host, sep, check = pat.rpartition(":")
        if sep:
            if fnmatch.fnmatchcase(finding.host or "", host) and fnmatch.fnmatchcase(finding.check, check):
                return True
        elif fnmatch.fnmatchcase(finding.check, pat):
            return True
    return False


def plan_health(ctx: Context) -> list[str]:
    accept = ", ".join(ctx.options.accept) or "none"
    return [f"run the health checks on {len(ctx.trays)} trays; the gate passes when every check passes "
            f"(accepted exceptions: {accept})"]


def run_health(ctx: Context) -> Outcome:
    from mctl.health.service import run_check
    from mctl.model.findings import Severity

    sweep = run_check(ctx.site, ctx.rack.name, ctx.state_dir)
    bad = [f for f in sweep.findings if f.severity is not Severity.OK]
    passed = len(sweep.findings) - len(bad)
    ok_list = [f for f in bad if accepted(f, ctx.options.accept)]
    refused = [f for f in bad if f not in ok_list]

    def line(f) -> str:
        return f"{f.severity.value.upper()} {f.host or '-'} {f.check}: {f.message}"

    artifacts = {"checks_passed": passed, "findings": [f.to_dict() for f in bad],
                 "accepted": [f"{f.host}:{f.check}" for f in ok_list]}
    if refused:
        raise PhaseFailed(f"health gate: {len(refused)} finding{'s' if len(refused) > 1 else ''} on "
                          f"{fold(sorted({f.host for f in refused if f.host}))}",
                          hint="fix them and --resume, or accept named exceptions with --accept CHECK "
                               "(or HOST:CHECK) --resume", exit_code=EXIT_FINDINGS,
                          details=[line(f) for f in refused] + [f"accepted: {line(f)}" for f in ok_list],
                          artifacts=artifacts)
    text = f"{passed} checks passed on {len(ctx.trays)} trays"
    if ok_list:
        text += f"; {len(ok_list)} accepted exception{'s' if len(ok_list) > 1 else ''}"
    return Outcome("done", text, details=[f"accepted: {line(f)}" for f in ok_list], artifacts=artifacts)


# ------------------------------------------------------------------ burn-in

def _burn_in_trays(ctx: Context) -> tuple[list["Host"], str | None]:
    """Trays bring-up holds out of service (all of them without Slurm); why none, when none."""
    from mctl.bringup import slurm_nodes

    if not _slurm(ctx):
        return ctx.trays, None
    res = _on_controller(ctx, slurm_nodes.show_command(_names(ctx.trays)))
    if not res.status.reached:
        raise PhaseFailed(f"cannot ask Slurm on {_controller(ctx).name} which trays are held: {res.summary()}")
    nodes = slurm_nodes.classify(res.stdout, _names(ctx.trays))
    held = [h for h in ctx.trays if h.name in nodes.held]
    if not held:
        return [], "every tray is in service (none held by bring-up): burn-in would disturb jobs"
    return held, None


def plan_burn_in(ctx: Context) -> list[str]:
    from mctl.bringup.trays import probe_tools

    if ctx.options.burn_in == "off":
        return ["skipped: --burn-in off"]
    found, failed = probe_tools(ctx.site, ctx.trays)
    with_tools = {t: tools for t, tools in found.items() if tools}
    if not with_tools:
        return ["skipped: no DCGM or NCCL tests on the trays" + (f" ({fold(failed)} not reachable)" if failed else "")]
    return [f"{t}: run {', '.join(sorted(tools))} ({ctx.options.burn_in})" for t, tools in with_tools.items()]


def run_burn_in(ctx: Context) -> Outcome:
    from mctl.bringup import burnin
    from mctl.bringup.trays import probe_tools
    from mctl.transport import SSHConfig, run_sync, targets_for

    if ctx.options.burn_in == "off":
        return Outcome("skipped", "burn-in off (--burn-in off)")
    found, failed = probe_tools(ctx.site, ctx.trays)
    if failed:
        raise PhaseFailed(f"cannot look for burn-in tools on {fold(failed)}",
                          details=[f"{t}: {why}" for t, why in failed.items()])
    if not any(found.values()):
        return Outcome("skipped", "no DCGM or NCCL tests on the trays (dcgmi, all_reduce_perf not found)")
    trays, why_none = _burn_in_trays(ctx)
    if why_none:
        return Outcome("skipped", why_none)
    with_tools = {h.name: found[h.name] for h in trays if found.get(h.name)}
    level = ctx.options.burn_in
    hosts = [h for h in trays if h.name in with_tools]
    results: dict[str, list[burnin.Verdict]] = {h.name: [] for h in hosts}
    ctx.report.line(f"burn-in ({level}) on {fold(_names(hosts))}")
    config = SSHConfig.from_site(ctx.site)
    for tool in ("dcgmi", "all_reduce_perf"):
        users = [h for h in hosts if tool in with_tools[h.name]]
        if not users:
            continue

        def command(t, tool=tool) -> str:
            return burnin.dcgm_command(level) if tool == "dcgmi" else \
                burnin.nccl_command(with_tools[t.name][tool], ctx.rack.gpus_per_tray, level)

        for r in run_sync(config, targets_for(ctx.site, users), command, timeout=4 * 3600):
            if not r.status.reached:
                results[r.host].append(burnin.Verdict(False, f"{tool}: {r.summary()}"))
                continue
            judge = burnin.judge_dcgm if tool == "dcgmi" else burnin.judge_nccl
            results[r.host].append(judge(r.exit_code, r.stdout + r.stderr))
    lines = [f"{t}: {v.text}" for t, vs in results.items() for v in vs]
    bad = sorted(t for t, vs in results.items() if any(not v.ok for v in vs))
    without = [h.name for h in trays if h.name not in with_tools]
    if without:
        lines.append(f"no burn-in tools on {fold(without)}")
    if bad:
        raise PhaseFailed(f"burn-in failed on {fold(bad)}", hint="replace or repair the trays, then --resume",
                          exit_code=EXIT_FINDINGS, details=lines)
    return Outcome("done", f"burn-in passed on {fold(_names(hosts))}", details=lines)


# ------------------------------------------------------------------ open

def _nodes(ctx: Context):
    from mctl.bringup import slurm_nodes

    res = _on_controller(ctx, slurm_nodes.show_command(_names(ctx.trays)))
    if not res.status.reached or "NodeName=" not in res.stdout:
        said = (res.stderr.strip().splitlines() or [res.summary()])[-1]
        raise PhaseFailed(f"cannot read the trays' Slurm state on {_controller(ctx).name}: {said}",
                          exit_code=EXIT_PARTIAL)
    return slurm_nodes.classify(res.stdout, _names(ctx.trays))


def plan_open(ctx: Context) -> list[str]:
    from mctl.bringup import slurm_nodes

    skip = _scheduler_skip(ctx)
    if skip:
        return [f"skipped: {skip}"]
    nodes = _nodes(ctx)
    lines = [f"Slurm now: {slurm_nodes.summary(nodes)}"]
    lines.append(f"resume {fold(nodes.held)} (held by bring-up)" if nodes.held else "nothing to resume")
    lines += [f"left alone: {t} drained by someone else ({why})" for t, why in nodes.operator.items()]
    return lines


def run_open(ctx: Context) -> Outcome:
    from mctl.bringup import slurm_nodes

    skip = _scheduler_skip(ctx)
    if skip:
        return Outcome("skipped", f"{skip}: nothing to open")
    nodes = _nodes(ctx)
    resumed: list[str] = []
    details: list[str] = []
    if nodes.held:
        res = _on_controller(ctx, slurm_nodes.resume_script(nodes.held))
        if not res.status.reached:
            raise PhaseFailed(f"could not resume the trays on {_controller(ctx).name}: {res.summary()}")
        for t, (what, text) in slurm_nodes.parse_actions(res.stdout, nodes.held).items():
            if what == "done":
                resumed.append(t)
            else:
                details.append(f"{t}: {text}")
        nodes = _nodes(ctx)
    details += [f"{t}: left drained (someone else's reason: {why})" for t, why in nodes.operator.items()]
    artifacts = {"nodes": nodes.to_dict(), "resumed": resumed}
    if nodes.down or nodes.unknown or nodes.held:
        raise PhaseFailed(f"not every tray is open: {slurm_nodes.summary(nodes)}",
                          hint="see 'scontrol show node' on the controller", details=details, artifacts=artifacts)
    text = (f"resumed {fold(resumed)}; " if resumed else "") + slurm_nodes.summary(nodes)
    return Outcome("done", text, changed=bool(resumed), details=details, artifacts=artifacts)


# ------------------------------------------------------------------ registry

@dataclass(frozen=True)
class Phase:
    name: str
    plan: Callable[[Context], list[str]]
    run: Callable[[Context], Outcome]


REGISTRY: dict[str, Phase] = {p.name: p for p in (
    Phase("preflight", plan_preflight, run_preflight),
    Phase("inventory", plan_inventory, run_inventory_phase),
    Phase("provision", plan_provision, run_provision),
    Phase("partitions", plan_partitions, run_partitions),
    Phase("imex", plan_imex, run_imex),
    Phase("scheduler", plan_scheduler, run_scheduler),
    Phase("health", plan_health, run_health),
    Phase("burn-in", plan_burn_in, run_burn_in),
    Phase("open", plan_open, run_open),
)}
