"""mctl rack validate RACK: the rendering side (the command lives on the `rack` noun; the work is
mctl.bringup.validate)."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, JsonOpt, NoHistoryOpt, RackArg, finite
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL


def validate(
    rack: RackArg,
    partition: Annotated[Optional[List[str]], typer.Option(
        "--partition", metavar="NAME", help="Only this NVLink partition (repeatable; default: every partition "
                                            "of the rack).")] = None,
    job_deadline: Annotated[Optional[float], typer.Option(
        "--job-deadline", click_type=finite(min=5.0), metavar="SECONDS",
        help="Seconds each validation job may run before it is killed and cancelled (default 300).")] = None,
    place_wait: Annotated[int, typer.Option(
        "--place-wait", min=1, max=3600, metavar="SECONDS",
        help="Seconds a job waits for Slurm to place it before Slurm's refusal is reported (srun --immediate).")]
    = 30,
    method: Annotated[str, typer.Option(
        "--method", metavar="auto|mndiag|all-reduce",
        help="auto: DCGM's mndiag on a partition whose every tray has DCGM >= 4.3, else the all-reduce; "
             "mndiag or all-reduce: that one on every partition.")] = "auto",
    no_history: NoHistoryOpt = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Rack-scale NVLink validation: an all-reduce across every tray of each NVLink partition, through Slurm.

    A partition whose every tray has DCGM >= 4.3 runs DCGM's multi-node diagnostic (dcgmi mndiag
    --run mnubergemm, from the block's first tray, the whole block allocated), judged from its per-host
    results, which name the failing trays; the report says which method each partition ran (--method).
    Otherwise each partition (its Slurm block) runs nccl-tests' all_reduce_perf as one srun job, one task per
    tray with all its GPUs, every partition at once; each is judged as burn-in judges NCCL (the
    NVLink 5 bus-bandwidth floor, out-of-bounds values, the tool's own words). A partition below the
    floor is searched for the tray that drags it: its trays in pairs, then each suspect beside a good
    tray (one dragging tray is named in 3 rounds). Every srun runs under a deadline and the round's
    jobs are cancelled after it, so nothing stays allocated; a job Slurm cannot place is named with
    Slurm's reason. Takes the rack's lock; the run is recorded in the audit history ('mctl audit history').

    Exit 0 every partition passed, 1 a partition failed, 2 bad input, 3 a job Slurm could not place.

    Example: mctl -i inventories/lab rack validate lab-r1 --dry-run
    """
    from mctl.bringup.mndiag import METHODS
    from mctl.bringup.validate import DEADLINE_S, choose_methods, dry_lines, plan, run_validation
    from mctl.cli.locking import hold_racks
    from mctl.rackinv.service import select_racks

    if method not in METHODS:
        from mctl.errors import UsageError

        raise UsageError(f"--method {method!r} is not one of {', '.join(METHODS)}", hint="e.g. --method auto")
    opts = options()
    site = opts.site()
    (chosen,) = select_racks(site, [rack], False)
    if site.scheduler is None or site.scheduler.type != "slurm":
        from mctl.errors import UsageError

        raise UsageError(f"rack validate launches its jobs through Slurm; this site's scheduler is "
                         f"{site.scheduler.type if site.scheduler else 'none'}",
                         hint="deploy Slurm ('mctl deploy slurm'), or run burn-in per tray (rack bring-up --burn-in)")
    vplan = plan(site, chosen, partitions=tuple(partition or ()), deadline=job_deadline or DEADLINE_S,
                 place=place_wait)
    out = render.output(json_)
    hold_racks([chosen.name], "rack validate", dry_run=dry_run)
    vplan = choose_methods(site, vplan, method)
    if dry_run:
        out.result(dict(vplan.to_dict(), dry_run=True, plan=dry_lines(vplan)), lambda: out.lines(dry_lines(vplan)))
        return

    def on_round(n: int, results) -> None:
        if not json_:
            out.line(f"round {n}: " + "; ".join(f"{r.job.label} {'ok' if r.ok else 'FAIL'}"
                                                + (f" {r.busbw:.0f} GB/s" if r.busbw is not None else "")
                                                for r in results))

    result = run_validation(site, vplan, state_dir=opts.state_dir, record=not no_history, on_round=on_round)
    out.result(result.to_dict(), lambda: (out.lines(result.lines()), out.line(
        f"rack {chosen.name}: validation {result.status} in {len(result.rounds)} round(s), {result.elapsed:.1f}s"
        + (f"; history run {result.history_id}" if result.history_id else ""))))
    if result.status == "failed":
        raise typer.Exit(EXIT_FINDINGS)
    if result.status == "unplaced":
        raise typer.Exit(EXIT_PARTIAL)
