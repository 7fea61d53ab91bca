"""A provisioned tray's reboot and its verification, over SSH, each under a deadline.

    boot_ids(site, hosts) -> ({host: boot id}, {host: why not read})
    send_reboot(site, hosts) -> {host: why it was not asked}       `systemctl reboot`, the recovery ladder's
    wait_rebooted(site, before, seconds) -> {host: why not}         a new boot id, the tray answering again
    verify(site, hosts, images) -> {host: why it fails}             `mctl image diff`'s comparison and the node
                                                                    check the tray runs (mctl-node-check)

The boot id (/proc/sys/kernel/random/boot_id, new at every boot) tells a reboot that happened from
one still to come, so a rollout resumed after a kill never reboots a tray twice nor takes a tray
that did not reboot for one that did.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from mctl.health.ladder import REBOOT_COMMAND

if TYPE_CHECKING:
    from mctl.model.image import SoftwareImage
    from mctl.model.site import Host, Site
    from mctl.transport.results import HostResult

BOOT_ID = "/proc/sys/kernel/random/boot_id"
SEND_S = 15.0               # `systemctl reboot` returns at once; the connection may drop with the tray
ASK_S = 15.0                # one read of a boot id, or one node check's answer beyond its own deadline
EVERY_S = 3.0               # between two looks at trays that are not back (or not healthy) yet


def _run(site: "Site", hosts: Sequence["Host"], command: str, seconds: float) -> list["HostResult"]:
    from mctl.transport import SSHConfig, run_sync, targets_for

    return run_sync(SSHConfig.from_site(site), targets_for(site, hosts), command, timeout=seconds,
                    deadline=seconds + 10.0) if hosts else []


def boot_ids(site: "Site", hosts: Sequence["Host"]) -> tuple[dict[str, str], dict[str, str]]:
    ids: dict[str, str] = {}
    failed: dict[str, str] = {}
    for r in _run(site, hosts, f"cat {BOOT_ID}", ASK_S):
        text = r.stdout.strip()
        if r.ok and text:
            ids[r.host] = text
        else:
            failed[r.host] = r.summary()
    return ids, failed


def send_reboot(site: "Site", hosts: Sequence["Host"]) -> dict[str, str]:
    """Ask each tray's OS to reboot; {host: why not}. A connection that drops under the command is the reboot
    starting, not a failure: the wait for the new boot id judges it."""
    failed: dict[str, str] = {}
    for r in _run(site, hosts, f"timeout 10 {REBOOT_COMMAND}", SEND_S):
        if not r.ok and r.status.reached and r.exit_code is not None:
            failed[r.host] = r.summary()
    return failed


def wait_rebooted(site: "Site", hosts: Sequence["Host"], before: Mapping[str, str], seconds: float, *,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Until every tray answers with a boot id other than *before*'s, or *seconds* pass; {host: why not}."""
    deadline = clock() + seconds
    waiting = {h.name: h for h in hosts}
    why: dict[str, str] = {}
    while waiting:
        ids, failed = boot_ids(site, list(waiting.values()))
        for name, boot in ids.items():
            if boot != before.get(name):
                waiting.pop(name, None)
                why.pop(name, None)
            else:
                why[name] = f"still boot {boot[:8]} (no reboot yet)"
        why.update({n: f"not answering: {w}" for n, w in failed.items() if n in waiting})
        if not waiting or clock() >= deadline:
            break
        sleep(min(EVERY_S, max(0.1, deadline - clock())))
    return {n: f"did not come back within {seconds:g}s: {why.get(n, 'no answer')}" for n in waiting}


def _drift(tray) -> str:
    if tray.error is not None:
        return f"image diff: {tray.error}"
    bad = [f"{r.component} wants {r.wanted}, found {r.found or 'nothing'}" for r in tray.rows
           if r.status != "match"]
    return "image diff: " + ("; ".join(bad) or tray.status)


def node_check_failures(results: Sequence["HostResult"]) -> dict[str, str]:
    """What `mctl-node-check --no-drain --json` said, per tray: nothing for a tray without a critical finding."""
    out: dict[str, str] = {}
    for r in results:
        if r.ok:
            continue
        if r.exit_code == 1:
            try:
                found = [f"{f['check']}: {f['message']}" for f in json.loads(r.stdout).get("findings", [])
                         if f.get("severity") == "critical"]
            except (ValueError, TypeError, AttributeError, KeyError):
                found = []
            out[r.host] = "node check: " + ("; ".join(found) or "critical findings")
        elif r.exit_code in (126, 127):
            out[r.host] = "node check: not installed on the tray (mctl node install-check)"
        else:
            out[r.host] = f"node check: {r.summary()}"
    return out


def verify(site: "Site", hosts: Sequence["Host"], images: Mapping[str, "SoftwareImage"]) -> dict[str, str]:
    """{host: why it fails} for the trays whose software is not their image's or whose node check finds a
    critical problem; a tray that passes both is absent."""
    from mctl.audit.image_diff import diff

    if not hosts:
        return {}
    report = diff(site, hosts, images=dict(images))
    failed = {t.host: _drift(t) for t in report.trays if t.status != "match"}
    from mctl.model.settings import SlurmSettings

    program = (site.scheduler.slurm if site.scheduler is not None else SlurmSettings()).node_check_program
    asked = [h for h in hosts if h.name not in failed]
    failed.update(node_check_failures(_run(site, asked, f"{shlex.quote(program)} --no-drain --json", 60.0)))
    return failed


def verify_until(site: "Site", hosts: Sequence["Host"], images: Mapping[str, "SoftwareImage"], seconds: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """verify() again for the trays that fail, until all pass or *seconds* pass (a rebooted tray's IMEX and
    slurmd take a moment); {host: why it still fails}."""
    deadline = clock() + seconds
    left = list(hosts)
    failed: dict[str, str] = {}
    while left:
        failed = verify(site, left, images)
        left = [h for h in left if h.name in failed]
        if not left or clock() >= deadline:
            break
        sleep(min(EVERY_S, max(0.1, deadline - clock())))
    return {h.name: failed[h.name] for h in left}
