"""mctl provision TARGET: run the site playbook on trays through ansible-runner."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DrainOpt, DryRunOpt, ForceOpt, JsonOpt, NodesArg, ResumeOpt, WaitOpt, YesOpt
from mctl.cli.provision_rollout import RollingOpt
from mctl.errors import EXIT_PARTIAL

COMMAND_SETTINGS: dict = {}


def command(
    target: NodesArg,
    image: Annotated[Optional[str], typer.Option("--image", help="Use this image instead of the inventory's.")] = None,
    tags: Annotated[Optional[str], typer.Option("--tags", help="Only these roles: base,nvidia,imex,health.")] = None,
    limit: Annotated[Optional[str], typer.Option("--limit", help="Further restrict to this node set.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Ansible check mode: report, change nothing.")] = False,
    file_diff: Annotated[bool, typer.Option("--file-diff", help="Show the changes in each file the run makes "
                                                                "(Ansible's diff mode).")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Only the hosts that failed last time.")] = False,
    drain: DrainOpt = False,
    wait: WaitOpt = None,
    force: ForceOpt = False,
    yes: YesOpt = False,
    rolling: RollingOpt = None,
    resume: ResumeOpt = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Provision trays with the site playbook through ansible-runner.

    Every run keeps its folder (command, events, stdout, recap) under the state directory.
    A provisioning whose changes disrupt running work (a new driver, IMEX, slurmd, MUNGE) on trays
    with jobs is refused, the jobs named (exit 2, nothing changed), unless --drain (hold those trays,
    wait for their jobs, provision, reboot where needed, verify, release; --rolling N: N trays at a
    time) or --force; harmless changes go ahead (docs/provisioning.md). --dry-run shows each tray's
    changes and the work on it. Exit 3 when some hosts failed or a rollout stopped.

    Example: mctl -i inventories/lab provision lab-r1 --image lab-debian13-580 --rolling 2 --drain
    """
    from mctl.provision.service import plan_provision
    from mctl.rollout.request import ProvisionRequest, check_resume

    if resume:
        check_resume([name for name, given in (("--image", image), ("--tags", tags), ("--limit", limit),
                                               ("--check", check), ("--file-diff", file_diff), ("--retry-failed", retry_failed),
                                               ("--drain", drain), ("--wait", wait is not None), ("--force", force),
                                               ("--yes", yes), ("--rolling", rolling is not None),
                                               ("--dry-run", dry_run)) if given])
    req = ProvisionRequest(drain=drain, wait=wait, force=force, yes=yes, rolling=rolling, resume=resume,
                           dry_run=dry_run)
    opts = options()
    site = opts.site()
    plan = plan_provision(site, opts.state_dir, target, image=image,
                          tags=[t.strip() for t in tags.split(",") if t.strip()] if tags else None,
                          limit=limit, check=check, diff=file_diff, retry_failed=retry_failed)
    from mctl.cli.locking import hold_racks
    from mctl.transport.identity import check_identity_file

    check_identity_file(site.identity_file, must_exist=not dry_run)   # a key others can read is refused

    # Every rack of the hosts, before anything is printed; --dry-run and --check change nothing: no lock.
    racks = [r.name for r in (site.rack_of(h) for h in plan.hosts) if r is not None]
    hold_racks(racks, "provision", dry_run=dry_run or check)
    out = render.output(json_)
    if dry_run and not out.json:
        _print_plan(out, plan)
    from mctl.cli.provision_rollout import TerminalUI, print_rollout
    from mctl.rollout.service import ProvisionRefused, execute

    ui = TerminalUI(out, yes=yes)
    try:
        outcome = execute(site, plan, req, opts.state_dir, ui)
    except ProvisionRefused as exc:
        if out.json:
            out.result({"refused": True, "disruption": exc.view})
        raise
    if dry_run:
        out.result(outcome.document, lambda: out.line("nothing changed (--dry-run)"))
        return
    if outcome.rollout is not None:
        out.result(outcome.document, lambda: print_rollout(out, outcome.document))
        if outcome.error is not None:
            raise outcome.error
        if outcome.done and not out.json:
            out.line(outcome.done)
        return
    result = outcome.run
    out.result(result.to_dict(), lambda: _print_recap(out, result))
    if result.status == "canceled":
        out.error(f"interrupted; the run folder {result.run_dir} holds everything up to the interruption",
                     "re-run the same command, or add --retry-failed to run only the hosts that failed")
        raise typer.Exit(130)
    if result.failed_hosts or result.status != "successful":
        raise typer.Exit(EXIT_PARTIAL)


def _print_plan(out: render.Output, plan) -> None:
    from mctl.model.site import fold

    out.line(f"plan: run playbook {plan.playbook} on {len(plan.hosts)} hosts: {fold(plan.hosts)}")
    out.line(f"  tags: {','.join(plan.tags) if plan.tags else 'all'}"
             f"{'  (check mode)' if plan.check else ''}{'  (diff)' if plan.diff else ''}")
    by_image: dict[str, list[str]] = {}
    for host, img in plan.images.items():
        by_image.setdefault(img or "-", []).append(host)
    for img, hosts in by_image.items():
        out.line(f"  image {img}: {fold(hosts)}")


def _print_recap(out: render.Output, result) -> None:
    cols = [render.Column(c, right=c not in ("host", "status"))
            for c in ("host", "ok", "changed", "failed", "unreachable", "skipped", "status")]
    rows = [(name, str(r.ok), str(r.changed), str(r.failed), str(r.unreachable), str(r.skipped), r.status)
            for name, r in sorted(result.hosts.items())]
    out.table(f"provision {result.run_id}: {result.status} in {result.ended - result.started:.1f}s", cols, rows,
              boxed=True)
    for name in result.failed_hosts:
        r = result.hosts[name]
        out.line(f"{name}: {r.status} at task '{r.failed_task}': {r.message}")
    out.line(f"run folder: {result.run_dir}")


def host_event(out: render.Output, progress: render.HostProgress, ev, indent: str = "") -> None:
    """A playbook event: the host's progress line on a terminal; a failure as a line where none is shown."""
    if not progress.update(ev.host, f"{ev.host}: {ev.kind:<9} {ev.task}"):
        host_failure(out, ev, indent)


def host_failure(out: render.Output, ev, indent: str = "") -> None:
    """Hosts that fail show up while the playbook still runs on the others (on stderr, --json or not)."""
    if ev.kind in ("failed", "unreachable"):
        out.event(f"{indent}{ev.host}: {ev.kind} at '{ev.task}': {ev.message}")
