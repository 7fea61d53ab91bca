"""Provisioning as a service function: resolve targets, plan, run, summarise; and the check pass that tells
a plan's disruptive changes from its harmless ones before it runs (check_disruption)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from mctl.errors import UsageError
from mctl.model.disruption import DisruptionReport
from mctl.model.site import Site
from mctl.ansible.runner import (HostEvent, PlaybookRequest, RunResult, TaskChange, last_run, playbook_path,
                                 run_playbook)

CHECK_KIND = "provision-check"      # the check pass's run folders (<state>/provision-check/runs): never the
                                    # last provisioning run that --retry-failed reads

KNOWN_TAGS = ("base", "nvidia", "imex", "health")   # the plays of playbooks/site.yml


@dataclass
class ProvisionPlan:
    playbook: str
    inventory: str
    hosts: list[str]
    tags: list[str] | None
    image: str | None
    images: dict[str, str | None] = field(default_factory=dict)
    check: bool = False
    diff: bool = False
    connect_timeout: float = 10
    reboot_after: bool = False      # mctl reboots the trays after the run when a change needs it (D71)

    def request(self) -> PlaybookRequest:
        extravars: dict = {"mctl_image": self.image} if self.image else {}
        if self.reboot_after:
            extravars["mctl_reboot_after"] = True
        return PlaybookRequest(playbook=self.playbook, inventory=self.inventory, limit=self.hosts,
                               tags=self.tags, check=self.check, diff=self.diff, extravars=extravars,
                               forks=max(5, min(100, len(self.hosts))), connect_timeout=self.connect_timeout)

    def only(self, hosts: Sequence[str]) -> "ProvisionPlan":
        """The same plan on *hosts* only (in the plan's order)."""
        keep = set(hosts)
        return replace(self, hosts=[h for h in self.hosts if h in keep],
                       images={h: i for h, i in self.images.items() if h in keep})

    def to_dict(self) -> dict:
        return {"playbook": self.playbook, "inventory": self.inventory, "hosts": self.hosts, "tags": self.tags,
                "image_override": self.image, "images": self.images, "check": self.check, "diff": self.diff}


def plan_provision(site: Site, state_dir: Path, target: str, *, image: str | None = None,
                   tags: list[str] | None = None, limit: str | None = None, check: bool = False,
                   diff: bool = False, retry_failed: bool = False, playbook: str = "site") -> ProvisionPlan:
    from mctl.images import ImageCatalog
    from mctl.transport.targets import resolve_hosts

    hosts = [h for h in resolve_hosts(site, target) if h.role in ("compute", "head")]
    if limit:
        allowed = {h.name for h in resolve_hosts(site, limit)}
        hosts = [h for h in hosts if h.name in allowed]
    if tags:
        unknown = [t for t in tags if t not in KNOWN_TAGS]
        if unknown:
            raise UsageError(f"unknown tag {', '.join(unknown)}", hint=f"known tags: {', '.join(KNOWN_TAGS)}")
    if image:
        ImageCatalog(site.images_dir).get(image)   # raises with the known images
    if retry_failed:
        last = last_run(state_dir)
        if last is None:
            raise UsageError("no earlier provisioning run to retry", hint="run 'mctl provision TARGET' first")
        failed = set(last.failed_hosts)
        if not failed:
            raise UsageError(f"the last run ({last.run_id}) had no failed hosts", hint="nothing to retry")
        hosts = [h for h in hosts if h.name in failed]
    if not hosts:
        raise UsageError(f"{target!r} names no compute trays or head nodes to provision")
    playbook_path(playbook)
    return ProvisionPlan(playbook=playbook, inventory=str(site.file), hosts=[h.name for h in hosts], tags=tags,
                         image=image, images={h.name: image or h.image for h in hosts}, check=check, diff=diff,
                         connect_timeout=site.ssh.connect_timeout)


def provision(plan: ProvisionPlan, state_dir: Path, on_event: Callable[[HostEvent], None] | None = None) -> RunResult:
    return run_playbook(plan.request(), state_dir, on_event=on_event)


def check_disruption(plan: ProvisionPlan, state_dir: Path, *, reboot_after: bool = False) -> DisruptionReport:
    """Run *plan* in Ansible's check mode and judge what each host's changes would do to running work
    (mctl.provision.disruption). A host that fails or does not answer in the pass is unknown, which counts
    as disruptive. The pass changes nothing; its run folder is kept under <state>/provision-check."""
    from mctl.ansible.runner import PLAYBOOKS_DIR
    from mctl.provision.disruption import declarations, judge

    changes: list[TaskChange] = []
    checked = replace(plan, check=True, diff=False, reboot_after=reboot_after)
    result = run_playbook(checked.request(), state_dir, kind=CHECK_KIND, on_change=changes.append)
    failed = {h: f"the check pass {r.status} at task '{r.failed_task}': {r.message}"
              for h, r in result.hosts.items() if r.status in ("failed", "unreachable")}
    if result.status == "canceled":
        raise KeyboardInterrupt
    if result.status != "successful":           # a host the run never reached is not known to be unchanged
        for h in plan.hosts:
            if h not in result.hosts:
                failed.setdefault(h, f"the check pass ended {result.status} (rc {result.rc}) before it reached "
                                     "the host")
    return judge(changes, plan.hosts, failed, declarations(PLAYBOOKS_DIR), result.run_dir)
