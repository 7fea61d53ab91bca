"""mctl provision TARGET: run the site playbook on trays through ansible-runner."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options, want_json
from mctl.cli.options import DryRunOpt, JsonOpt
from mctl.cli.provision_rollout import DrainOpt, ForceOpt, ResumeOpt, RollingOpt, WaitOpt, YesOpt
from mctl.errors import EXIT_PARTIAL

COMMAND_SETTINGS: dict = {}


def command(
    target: Annotated[str, typer.Argument(help="Node set, rack name or @group.")],
    image: Annotated[Optional[str], typer.Option("--image", help="Use this image instead of the inventory's.")] = None,
    tags: Annotated[Optional[str], typer.Option("--tags", help="Only these roles: base,nvidia,imex,health.")] = None,
    limit: Annotated[Optional[str], typer.Option("--limit", help="Further restrict to this node set.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Ansible check mode: report, change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
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
                                               ("--check", check), ("--diff", diff), ("--retry-failed", retry_failed),
                                               ("--drain", drain), ("--wait", wait is not None), ("--force", force),
                                               ("--yes", yes), ("--rolling", rolling is not None),
                                               ("--dry-run", dry_run)) if given])
    req = ProvisionRequest(drain=drain, wait=wait, force=force, yes=yes, rolling=rolling, resume=resume,
                           dry_run=dry_run)
    opts = options()
    site = opts.site()
    plan = plan_provision(site, opts.state_dir, target, image=image,
                          tags=[t.strip() for t in tags.split(",") if t.strip()] if tags else None,
                          limit=limit, check=check, diff=diff, retry_failed=retry_failed)
    from mctl.cli.locking import hold_racks
    from mctl.transport.identity import check_identity_file

    check_identity_file(site.identity_file, must_exist=not dry_run)   # a key others can read is refused

    # Every rack of the hosts, before anything is printed; --dry-run and --check change nothing: no lock.
    racks = [r.name for r in (site.rack_of(h) for h in plan.hosts) if r is not None]
    hold_racks(racks, "provision", dry_run=dry_run or check)
    as_json = want_json(json_)
    if dry_run and not as_json:
        _print_plan(plan)
    from mctl.cli.provision_rollout import TerminalUI, print_rollout
    from mctl.rollout.service import ProvisionRefused, execute

    ui = TerminalUI(yes=yes, quiet=as_json, progress=lambda hosts: _Progress(list(hosts), live=render.interactive()
                                                                             and not as_json))
    try:
        outcome = execute(site, plan, req, opts.state_dir, ui)
    except ProvisionRefused as exc:
        if as_json:
            render.print_json({"refused": True, "disruption": exc.view})
        raise
    if dry_run:
        if as_json:
            render.print_json(outcome.document)
        else:
            render.console().print("nothing changed (--dry-run)", markup=False)
        return
    if outcome.rollout is not None:
        if as_json:
            render.print_json(outcome.document)
        else:
            print_rollout(outcome.document)
        if outcome.error is not None:
            raise outcome.error
        if outcome.done and not as_json:
            render.console().print(outcome.done, markup=False, highlight=False)
        return
    result = outcome.run
    if as_json:
        render.print_json(result.to_dict())
    else:
        _print_recap(result)
    if result.status == "canceled":
        render.error(f"interrupted; the run folder {result.run_dir} holds everything up to the interruption",
                     "re-run the same command, or add --retry-failed to run only the hosts that failed")
        raise typer.Exit(130)
    if result.failed_hosts or result.status != "successful":
        raise typer.Exit(EXIT_PARTIAL)


def _print_plan(plan) -> None:
    from mctl.model.site import fold

    con = render.console()
    con.print(f"plan: run playbook {plan.playbook} on {len(plan.hosts)} hosts: {fold(plan.hosts)}", markup=False)
    con.print(f"  tags: {','.join(plan.tags) if plan.tags else 'all'}"
              f"{'  (check mode)' if plan.check else ''}{'  (diff)' if plan.diff else ''}", markup=False)
    by_image: dict[str, list[str]] = {}
    for host, img in plan.images.items():
        by_image.setdefault(img or "-", []).append(host)
    for img, hosts in by_image.items():
        con.print(f"  image {img}: {fold(hosts)}", markup=False)


def _print_recap(result) -> None:

    con = render.console()
    table = render.data_table(title=f"provision {result.run_id}: {result.status} in {result.ended - result.started:.1f}s",
                  title_justify="left")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped", "status"):
        table.add_column(col, justify="right" if col not in ("host", "status") else "left")
    for name in sorted(result.hosts):
        r = result.hosts[name]
        table.add_row(name, str(r.ok), str(r.changed), str(r.failed), str(r.unreachable), str(r.skipped), r.status)
    con.print(table)
    for name in result.failed_hosts:
        r = result.hosts[name]
        con.print(f"{name}: {r.status} at task '{r.failed_task}': {r.message}", markup=False, highlight=False)
    con.print(f"run folder: {result.run_dir}", markup=False, highlight=False)


class _Progress:
    """Live per-host progress on a terminal; failures as plain lines otherwise."""

    def __init__(self, hosts: list[str], live: bool):
        self.hosts = hosts
        self.live = live
        self._progress = None
        self._tasks: dict[str, int] = {}

    def __enter__(self):
        if self.live:
            from rich.progress import Progress, SpinnerColumn, TextColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), console=render.console(),
                                      transient=True)
            self._progress.__enter__()
            for h in self.hosts:
                self._tasks[h] = self._progress.add_task(render.escape(f"{h}: waiting"))
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False

    def event(self, ev) -> None:
        if self._progress is not None and ev.host in self._tasks:
            self._progress.update(self._tasks[ev.host], description=render.escape(f"{ev.host}: {ev.kind:<9} {ev.task}"))
        elif ev.kind in ("failed", "unreachable"):
            render.err_console().print(f"{ev.host}: {ev.kind} at '{ev.task}': {ev.message}", markup=False,
                                       highlight=False)
