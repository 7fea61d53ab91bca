"""provision: the site playbook (`mctl provision`'s service) on the hosts whose marker says they need it.

A host needs it when its marker (mctl.provision.markers) is missing or records
another digest of the playbooks, its image and its inventory entry
(bringup.digest), when its GPUs report another driver than its image's, or
when --reprovision asks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, names
from mctl.bringup.phases.inventory import collect
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Host


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
        collect(ctx, save=False)
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
    from mctl.provision.markers import read_markers
    from mctl.ansible.runner import PLAYBOOKS_DIR
    from mctl.provision.service import plan_provision

    hosts = ctx.managed
    everything = plan_provision(ctx.site, ctx.state_dir, ",".join(names(hosts)))
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


def plan(ctx: Context) -> list[str]:
    need = _provision_need(ctx)
    if not need.reasons:
        return [f"nothing to provision: all {len(need.hosts)} hosts carry a marker of the current playbooks, "
                "images and inventory"]
    return [f"run playbook site on {len(need.reasons)} hosts: {fold(need.reasons)}"] + \
        [f"  {line}" for line in _reason_lines(need.reasons)]


def run(ctx: Context) -> Outcome:
    from mctl.provision.markers import MARKER, clear_markers, write_markers
    from mctl.provision.service import plan_provision, provision

    need = _provision_need(ctx)
    if not need.reasons:
        summary = f"all {len(need.hosts)} hosts already provisioned with the current playbooks, images and inventory"
        if ctx.cache.get("to_install"):         # tools missing on trays whose marker says provisioned: named
            shape = _shape_gate(ctx)
            return Outcome("done", f"{summary}; {shape.summary}", details=shape.details,
                           artifacts={"inventory_after": shape.artifacts})
        return Outcome("done", summary)
    targets = [h for h in need.hosts if h.name in need.reasons]
    details = _reason_lines(need.reasons)
    for line in details:
        ctx.report.line(line)
    failed = clear_markers(ctx.site, targets)
    if failed:
        raise PhaseFailed(f"could not clear the provisioning marker on {fold(failed)}",
                          details=[f"{h}: {why}" for h, why in failed.items()])
    run_plan = plan_provision(ctx.site, ctx.state_dir, ",".join(names(targets)))
    runs = ctx.state_dir / "provision" / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    noted: list[bool] = []

    def event(ev) -> None:
        if not noted and runs.is_dir():
            new = sorted(set(runs.iterdir()) - before)
            if new:
                noted.append(True)
                ctx.note("provision", run_dir=str(new[-1]), run_id=new[-1].name, hosts=run_plan.hosts)
        ctx.report.host_event(ev)

    ctx.report.hosts_started("provisioning", run_plan.hosts)
    try:
        result = provision(run_plan, ctx.state_dir, on_event=event)
    finally:
        ctx.report.hosts_ended()
    artifacts = {"run_id": result.run_id, "run_dir": result.run_dir, "hosts": run_plan.hosts,
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
    shape = _shape_gate(ctx, artifacts)
    artifacts["inventory_after"] = shape.artifacts
    return Outcome("done", f"provisioned {fold(names(targets))} ({result.changed_total} changes) in "
                   f"{result.ended - result.started:.0f}s, run {result.run_id}; {shape.summary}",
                   changed=result.changed_total > 0, details=details + shape.details, artifacts=artifacts)


def _shape_gate(ctx: Context, artifacts: dict | None = None) -> Outcome:
    """The rack inventoried again after provisioning: the full shape (GPU tools answering on every tray) or
    PhaseFailed naming what is missing, with the provisioning run's artifacts."""
    from mctl.bringup.phases.inventory import gate

    try:
        shape = gate(ctx)
    except PhaseFailed as exc:
        exc.artifacts = {**(artifacts or {}), "inventory_after": exc.artifacts}
        raise
    return Outcome("done", f"inventory again: {shape.summary}", details=shape.details, artifacts=shape.artifacts)


PHASE = Phase("provision", plan, run)
