"""mctl power: tray power through the BMCs (docs/bmc.md, "Power"); `mctl rack power` is here too."""

from __future__ import annotations

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DeadlineOpt, DryRunOpt, ForceOpt, GracefulOpt, JsonOpt, NodesArg, RackArg, YesOpt
from mctl.errors import EXIT_PARTIAL, UsageError

app = typer.Typer(help="Tray power through the BMCs (Redfish): status, on, off, cycle.", no_args_is_help=True)
rack_power_app = typer.Typer(help="A whole rack's power in order: shelves, switch trays, compute trays "
                                  "(off: the reverse).", no_args_is_help=True)

def _hosts(site, target: str):
    from mctl.cli.bmc import _hosts as bmc_hosts

    return bmc_hosts(site, target)


def _run(action: str, hosts, *, force: bool, dry_run: bool, json_: bool, graceful: float | None,
         deadline: float | None, whole_rack: bool = False, rack: str | None = None, yes: bool = False) -> None:
    from mctl.bmc import power
    from mctl.bmc.inventory import settings_for
    from mctl.cli.locking import hold_racks
    from mctl.sched.work import discover

    opts = options()
    site = opts.site()
    settings = settings_for(site)
    out = render.output(json_)
    what = f"power {action} " + (f"rack {rack}" if rack else _named(hosts))
    if action in ASKS and not dry_run:
        # before the lock and the BMCs: a refusal changes nothing, and nobody waits on an open question
        out.confirm(f"{what} ({len(hosts)} tray{'s' if len(hosts) != 1 else ''}): {ASKS[action]}. Go ahead?",
                    yes=yes, what=what)
    if action != "status":
        racks = sorted({h.rack for h in hosts if h.rack})
        hold_racks(racks, f"power {action}" if not rack else f"rack power {action} {rack}", dry_run=dry_run)
    granted: list[str] = []
    report = power.run(site, action, power.groups_of(hosts), settings=settings, force=force, dry_run=dry_run,
                       stage_s=deadline or power.DEFAULT_STAGE_S, graceful_s=power.DEFAULT_GRACEFUL_S
                       if graceful is None else graceful, all_or_nothing=whole_rack, progress=out.line,
                       work_lookup=lambda names: discover(site, names),
                       admit=lambda names: _ask_budget(site, action, [h for h in hosts if h.name in names],
                                                       force=force, out=out, granted=granted))
    _give_back(site, action, hosts, granted, dry_run=dry_run)
    out.result(report.to_dict(), lambda: _print(out, report))
    if report.exit_code == EXIT_PARTIAL:
        from mctl.cli.bmc import partial_failure

        raise partial_failure(report.failed, "tray", "not read" if action == "status" else "not done",
                              hint="every other tray went on; see the errors above",
                              kinds_hint={"refused": "--force acts on busy trays"})


ASKS = {"off": "whatever runs there stops", "cycle": "whatever runs there is cut off"}     # asked unless --yes
BUDGET_WORD = "mctl power"            # the grants a power command asks start so (its power on gives them back)


def _ask_budget(site, action: str, hosts, *, force: bool, out, granted: list[str]) -> dict[str, str]:
    """Power off and cycle take compute trays out of service: the trays the running work leaves ask the
    site's safety budget (mctl.sched.slurm.budget) before anything is sent. A person's command never trips
    it: a refusal gives back what this command was granted and refuses the command (the trays refused, with
    why), unless --force (then it is counted where it fits). Fills *granted*; returns the refusals."""
    import getpass
    import socket

    from mctl.sched.slurm import holds

    trays = [h.name for h in hosts if h.role == "compute"]
    if action not in ("off", "cycle") or not trays:
        return {}
    if site.scheduler is None or site.scheduler.type != "slurm":
        out.warn("no Slurm keeps the site's safety budget here: this power command is not counted in it")
        return {}
    got, refused = holds.grant_budget(site, trays, f"{BUDGET_WORD} {action} by {getpass.getuser()}@"
                                                   f"{socket.gethostname()}", count_only=True)
    if refused and not force:
        holds.release_budget(site, got)
        return {t: f"{w}; nothing was powered (--force goes beyond it, counted where it fits)"
                for t, w in refused.items()}
    for t, w in sorted(refused.items()):
        out.warn(f"{t}: beyond the safety budget (--force): {w}")
    granted.extend(got)
    return {}


def _give_back(site, action: str, hosts, granted: list[str], *, dry_run: bool) -> None:
    """A cycle's grants go back once it is done; a power on gives back the grants a power off asked."""
    from mctl.sched.slurm import holds

    if dry_run or site.scheduler is None or site.scheduler.type != "slurm":
        return
    if action == "cycle" and granted:
        holds.release_budget(site, granted)
    elif action == "on":
        holds.release_own_budget(site, [h.name for h in hosts if h.role == "compute"], BUDGET_WORD)


def _named(hosts) -> str:
    from mctl.model.site import fold

    return fold([h.name for h in hosts])


def _print(out: render.Output, report) -> None:
    rows = []
    for s in report.stages:
        if not s.trays:
            rows.append((s.name, "-", "-", "-", "-", "-", s.note or s.state))
        for t in s.trays:
            if report.dry_run:
                what = t.error if t.error else {"status": "read", "on": "On", "off": "GracefulShutdown if the OS "
                                                "answers, else ForceOff", "cycle": "PowerCycle (On if off)"}[report.action]
                rows.append((s.name, t.host, t.bmc or "-", "-", "-", "-", ("would: " if not t.error else "") + what))
                continue
            os_word = {True: "up", False: "down", None: "-"}
            rows.append((s.name, t.host, t.bmc or "-", t.before or "-", t.after or "-",
                         f"{os_word[t.os_answered]} -> {os_word[t.os_after]}" if report.action != "status"
                         else os_word[t.os_answered],
                         ", ".join(t.sent) + (" " if t.sent else "") + ("ok" if t.ok else f"{t.error_kind}: {t.error}")))
    title = f"power {report.action}" + (" (dry run)" if report.dry_run else "")
    out.table(title, ("stage", "tray", "bmc", "before", "after", "OS (ssh)", "result"), rows)
    if report.work_error:
        out.line(f"work: cannot be read: {report.work_error}")
    for w in report.work:
        out.line(f"work: {w['kind']} {w['id']} ({w['state']}) on {','.join(w['nodes'])}")
    stages = "; ".join(f"{s.name} {s.state}" + (f" {s.elapsed:.1f}s" if s.elapsed else "") for s in report.stages)
    out.line(f"{len(report.trays)} trays, {len(report.failed)} not done; stages: {stages} "
                f"({report.elapsed:.1f}s)")


@app.command()
def status(nodes: NodesArg, json_: JsonOpt = False) -> None:
    """Each tray's power as its BMC reports it (Redfish PowerState of System_0) and whether the OS answers SSH.

    Exit 0 every BMC read, 2 bad input, 3 some BMCs refused the credentials, timed out, answered an
    error or a malformed document (every other tray was read).

    Example: mctl power status lab-r1
    """
    site = options().site()
    _run("status", _hosts(site, nodes), force=False, dry_run=False, json_=json_, graceful=None, deadline=None)


@app.command()
def on(nodes: NodesArg, dry_run: DryRunOpt = False, deadline: DeadlineOpt = None, json_: JsonOpt = False) -> None:
    """Power trays on through their BMCs (ResetType On), switch trays before compute trays.

    Waits until Redfish says On and each compute tray's OS answers SSH (--deadline). Under the
    rack lock; a reset is sent once and never again if its answer is lost.

    Exit 0 done, 2 bad input, 3 some trays failed (BMC refused, timed out, error, or no state by
    the deadline; every other tray went on).

    Example: mctl power on lab-r1-tray[01-04]
    """
    site = options().site()
    _run("on", _hosts(site, nodes), force=False, dry_run=dry_run, json_=json_, graceful=None, deadline=deadline)


@app.command()
def off(nodes: NodesArg, force: ForceOpt = False, yes: YesOpt = False, dry_run: DryRunOpt = False,
        graceful_wait: GracefulOpt = None, deadline: DeadlineOpt = None, json_: JsonOpt = False) -> None:
    """Power trays off through their BMCs: GracefulShutdown where the OS answers, ForceOff otherwise.

    A tray still on after --graceful-wait gets ForceOff. Compute trays before switch trays. Trays
    with running Slurm jobs (or GPU pods) are refused unless --force; drain them and let the work
    end first. Waits until Redfish says Off and SSH no longer reaches the tray.

    Asks before anything is sent (on the terminal, default no) unless --yes; without a terminal
    it is refused unless --yes, --force or not. --dry-run never asks.

    Exit 0 done, 2 bad input or not confirmed (nothing sent), 3 some trays refused or failed
    (every other tray went on).

    Example: mctl power off lab-r1-tray03 --dry-run
    """
    site = options().site()
    _run("off", _hosts(site, nodes), force=force, dry_run=dry_run, json_=json_, graceful=graceful_wait,
         deadline=deadline, yes=yes)


@app.command()
def cycle(nodes: NodesArg, force: ForceOpt = False, yes: YesOpt = False, dry_run: DryRunOpt = False,
          deadline: DeadlineOpt = None, json_: JsonOpt = False) -> None:
    """Power-cycle trays through their BMCs (PowerCycle; On for a tray that is off).

    Waits until Redfish says On and the OS answers SSH with a new boot id. Busy trays are refused
    unless --force. Asks first, as 'power off' does (--yes: do not ask; needed without a terminal).

    Exit 0 done, 2 bad input or not confirmed (nothing sent), 3 some trays refused or failed
    (every other tray went on).

    Example: mctl power cycle lab-r1-tray02 --yes
    """
    site = options().site()
    _run("cycle", _hosts(site, nodes), force=force, dry_run=dry_run, json_=json_, graceful=None, deadline=deadline,
         yes=yes)


def _rack_hosts(site, rack: str):
    name = rack.strip()
    if name not in site.racks:
        raise UsageError(f"unknown rack {rack!r}", hint="racks: " + ", ".join(sorted(site.racks)))
    r = site.racks[name]
    hosts = list(r.switches + r.compute)
    if not hosts:
        raise UsageError(f"rack {name} has no compute or switch trays")
    return name, hosts


@rack_power_app.command("on")
def rack_on(rack: RackArg, dry_run: DryRunOpt = False, deadline: DeadlineOpt = None, json_: JsonOpt = False) -> None:
    """Power a rack on in order: power shelves, switch trays, compute trays; each stage waits for its state.

    A stage starts when every tray of the one before reports On (compute trays: and the OS answers
    SSH); a failed stage stops the rest. Under the rack lock.

    Exit 0 done, 2 bad input, 3 a tray failed (the later stages were not started).

    Example: mctl rack power on lab-r1
    """
    site = options().site()
    name, hosts = _rack_hosts(site, rack)
    _run("on", hosts, force=False, dry_run=dry_run, json_=json_, graceful=None, deadline=deadline, rack=name)


@rack_power_app.command("off")
def rack_off(rack: RackArg, force: ForceOpt = False, yes: YesOpt = False, dry_run: DryRunOpt = False,
             graceful_wait: GracefulOpt = None, deadline: DeadlineOpt = None, json_: JsonOpt = False) -> None:
    """Power a rack off in order: compute trays, switch trays, power shelves; each stage waits for its state.

    Compute trays get GracefulShutdown where the OS answers, ForceOff otherwise or after
    --graceful-wait. A tray with running jobs refuses the whole rack unless --force. Under the
    rack lock. Asks first, as 'power off' does (--yes: do not ask; needed without a terminal).

    Exit 0 done, 2 bad input or not confirmed (nothing sent), 3 refused or a tray failed (the
    later stages were not started).

    Example: mctl rack power off lab-r1 --dry-run
    """
    site = options().site()
    name, hosts = _rack_hosts(site, rack)
    _run("off", hosts, force=force, dry_run=dry_run, json_=json_, graceful=graceful_wait, deadline=deadline,
         whole_rack=True, rack=name, yes=yes)
