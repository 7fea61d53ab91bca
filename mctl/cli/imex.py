"""mctl imex render|status|apply: IMEX domains that follow the NVLink partitions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, ImexWaitOpt, JsonOpt, OneRackArg, RackArg, finite
from mctl.errors import EXIT_FINDINGS, PartialFailure, UsageError

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

app = typer.Typer(help="IMEX domains derived from the NVLink partitions: render, check, apply.\n\n"
                       "Example: mctl -i inventories/lab imex status lab-r1",
                  no_args_is_help=True)


def _racks(site: "Site", rack: str | None) -> list["Rack"]:
    if rack is None:
        return list(site.racks.values())
    if rack not in site.racks:
        raise UsageError(f"unknown rack {rack!r}", hint=f"known racks: {', '.join(site.racks)}")
    return [site.racks[rack]]


def _settings(site: "Site"):
    from mctl.model.imex import ImexSettings
    return ImexSettings.from_vars((site.vars or {}).get("imex"))


@app.command("render")
def render_(rack: RackArg,
            tray: Annotated[Optional[str], typer.Option("--tray", help="Only this tray's files.")] = None,
            scope: Annotated[str, typer.Option("--scope", help="'partition': static domains, one per partition; "
                                               "'job': Slurm prolog/epilog that scope IMEX to each exclusive job.")]
            = "partition",
            folder: Annotated[Optional[Path], typer.Option("--out", help="Write files under this folder "
                                                        "(<out>/<tray>/etc/nvidia-imex/... or <out>/prolog.d/...) "
                                                        "instead of printing them.")] = None,
            json_: JsonOpt = False) -> None:
    """Render IMEX files: nodes_config.cfg and config.cfg per tray, or the per-job prolog/epilog.

    nodes_config.cfg lists the addresses of the partition's trays sorted by tray name, the same
    on every tray; config.cfg binds the daemon to the tray's address. Settings come from the
    inventory's vars.imex (server_port, cmd_port, log_level, wait_for_quorum, tls, ...).

    Example: mctl -i inventories/lab imex render lab-r1 --tray lab-r1-tray01
    """
    from mctl.fabric.imex import domains_summary, imex_domains, local_path, render_rack
    from mctl.sched.slurm.imex_job import EPILOG_NAME, PROLOG_NAME, JobScopeSettings, render_epilog, render_prolog
    from mctl.state.files import atomic_write

    site = options().site()
    out = render.output(json_)
    r = _racks(site, rack)[0]
    if scope not in ("partition", "job"):
        raise UsageError(f"unknown scope {scope!r}", hint="use --scope partition or --scope job")
    if scope == "job":
        job = JobScopeSettings.from_imex(_settings(site))     # what `mctl deploy slurm` installs (imex_scope: job)
        scripts = {PROLOG_NAME: render_prolog(job), EPILOG_NAME: render_epilog(job)}
        if folder is not None:
            for rel, text in scripts.items():
                atomic_write(folder / rel, text, mode=0o755)
        wrote = f"wrote {', '.join(str(folder / rel) for rel in scripts)}" if folder is not None else None
        out.result({"rack": rack, "scope": "job", "files": scripts, "written_to": str(folder) if folder else None},
                   lambda: _print_files(out, wrote, ((rel, text) for rel, text in scripts.items())))
        return
    trays = render_rack(r, _settings(site))
    if tray is not None:
        trays = tuple(t for t in trays if t.tray == tray)
        if not trays:
            raise UsageError(f"{tray} is not a compute tray of rack {rack}",
                             hint=f"trays: {', '.join(h.name for h in r.compute[:3])}, ...")
    if folder is not None:
        writes = [(local_path(folder, t.tray, path), text) for t in trays for path, text in t.files]  # all checked first
        for dest, text in writes:
            atomic_write(dest, text, mode=0o644)
    out.result({"rack": rack, "scope": "partition", "domains": domains_summary(imex_domains(r)),
                "trays": [{"tray": t.tray, "address": t.address, "domain": t.domain, "files": dict(t.files)}
                          for t in trays],
                "written_to": str(folder) if folder else None},
               lambda: _print_files(out, f"wrote files for {len(trays)} trays under {folder}" if folder is not None
                                    else None, ((f"{t.tray}:{path} (IMEX domain {t.domain})", text)
                                                for t in trays for path, text in t.files)))


def _print_files(out: render.Output, wrote: str | None, files) -> None:
    """What was written where (--out), else each file under a ==> NAME <== line, as tail prints them."""
    if wrote is not None:
        out.line(wrote)
        return
    for name, text in files:
        out.line(f"==> {name} <==")
        out.line(text.rstrip("\n"))


@app.command()
def status(rack: OneRackArg = None,
           json_: JsonOpt = False) -> None:
    """Check every IMEX domain over SSH: node lists as rendered, daemons READY, every link connected.

    Each tray is asked for nvidia-imex-ctl -N -j and the text -N; the two must agree
    (state, nodes, links), and a disagreement is a reason of the domain.

    Exit 0 when every domain is UP, 1 when one is DEGRADED or DOWN (the reasons name trays),
    3 when trays could not be reached.

    Example: mctl -i inventories/lab imex status lab-r1
    """
    from mctl.fabric.service import imex_status

    site = options().site()
    from mctl.model.site import fold

    healths, unreachable = imex_status(site, _racks(site, rack), _settings(site))
    out = render.output(json_)
    out.result({"domains": [h.to_dict() for h in healths]}, lambda: out.table(
        None, ("rack", "domain", "state", "trays", "reasons"),
        [(h.domain.rack, h.domain.name, h.state, fold(h.domain.trays), "\n".join(r.message for r in h.reasons) or "-")
         for h in healths], boxed=True))
    if unreachable:
        raise PartialFailure(f"{len(unreachable)} trays could not be reached: {fold(unreachable)}",
                             hint="see 'mctl exec TRAYS -- true' for the SSH error of each")
    if any(h.state != "UP" for h in healths):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
def apply(rack: OneRackArg = None,
          restart: Annotated[bool, typer.Option("--restart", help="Restart the daemon on every tray, also where "
                                                "the files are already right.")] = False,
          imex_wait: ImexWaitOpt = 0,
          reach_wait: Annotated[float, typer.Option("--reach-wait", click_type=finite(min=0, max=3600),
                                                    help="Seconds to keep asking a tray that cannot be reached "
                                                    "before its domain is left unchanged.")] = 15,
          dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Push each tray's rendered config.cfg and nodes_config.cfg where they differ, and restart its daemon.

    Trays whose files already match are left alone (unless --restart), so a second run changes
    nothing. A replaced file is kept beside it as <file>.mctl-bak (the previous version). A
    domain with a tray that cannot be reached is not touched at all (no file written, no daemon
    restarted): apply asks that tray again for up to --reach-wait seconds, then leaves the
    domain as it is and names the tray. The restart command is vars.imex.restart_command
    (default: systemctl restart nvidia-imex). --imex-wait then waits for every domain to be UP.
    Exit 3 when some trays or domains could not be updated.

    Example: mctl -i inventories/lab imex apply lab-r1 --dry-run
    """
    from mctl.fabric.service import ImexApplyResult, apply_imex, wait_for_imex
    from mctl.model.site import fold

    from mctl.cli.locking import hold_racks

    site = options().site()
    settings = _settings(site)
    racks = _racks(site, rack)
    hold_racks([r.name for r in racks], "imex apply", dry_run=dry_run)   # before anything is printed or pushed
    out = render.output(json_)
    done: list[dict] = []
    failed: list[str] = []

    def show(plan: ImexApplyResult) -> None:
        if plan.changes:
            for t, files in plan.changes.items():
                out.line(f"{plan.rack}: {'would write' if dry_run else 'writing'} {', '.join(files)} on {t}")
        else:
            out.line(f"{plan.rack}: IMEX files on every reachable tray match the partitions")
        if plan.restart:
            out.line(f"{plan.rack}: {'would restart' if dry_run else 'restarting'} IMEX on {fold(plan.restart)}")
        if plan.unreachable:
            out.warn(f"{plan.rack}: cannot reach {fold(plan.unreachable)}", in_result=True)
        for domain, lost in plan.held.items():
            out.warn(f"{plan.rack}: IMEX domain {domain} {'would be' if dry_run else 'is'} left unchanged "
                     f"(no file written, no daemon restarted): {fold(lost)} cannot be reached", in_result=True)

    def waiting(blocked: dict[str, list[str]], left: float) -> None:
        lost = sorted({t for trays in blocked.values() for t in trays})
        out.warn(f"{fold(lost)} cannot be reached: asking again for up to {left:.0f}s before leaving IMEX "
                    f"domain{'s' if len(blocked) > 1 else ''} {', '.join(blocked)} unchanged")

    held: list[str] = []
    for r in racks:
        result = apply_imex(site, r, settings, restart=restart, dry_run=dry_run, on_plan=show,
                            reach_wait=reach_wait, on_wait=waiting)
        failed += result.unreachable + list(result.failed)
        held += [f"{r.name}/{d} ({fold(lost)} unreachable)" for d, lost in result.held.items()]
        for host, why in result.failed.items():
            out.warn(f"{host}: {why}")
        done.append(result.to_dict())
    healths = []
    if imex_wait and not dry_run:
        healths = wait_for_imex(site, racks, settings, wait=imex_wait)
        for h in healths:
            out.line(f"{h.domain.rack}/{h.domain.name}: {h.state}"
                     + (f" ({'; '.join(r.message for r in h.reasons)})" if h.reasons else ""))
    out.result({"dry_run": dry_run, "racks": done, "domains": [h.to_dict() for h in healths]})
    if held:
        raise PartialFailure(f"IMEX domain{'s' if len(held) > 1 else ''} left unchanged: {', '.join(held)}",
                             hint="bring the tray back (or move it out of the partition), then run "
                                  "'mctl imex apply' again")
    if failed:
        raise PartialFailure(f"IMEX was not applied on {len(set(failed))} trays: {fold(sorted(set(failed)))}")
    if healths and any(h.state != "UP" for h in healths):
        raise typer.Exit(EXIT_FINDINGS)
