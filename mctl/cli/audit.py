"""mctl audit: desired state against actual state, plus health, for cron, dashboards and CI."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import AllRacksOpt, FailOnOpt, JsonOpt, NoHistoryOpt, RacksArg, TimeoutOpt
from mctl.errors import EXIT_FINDINGS, EXIT_PARTIAL, UsageError


class _RunByDefault(TyperGroup):
    """`mctl audit [RACK...]` runs the audit; `mctl audit history` is the only other command."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_RunByDefault, help="Audit desired state against the racks, with health; and its history.")

FORMATS = ("table", "json", "junit", "prometheus")


@app.command("run")
def run(
    racks: RacksArg = None,
    all_racks: AllRacksOpt = False,
    fmt: Annotated[str, typer.Option("--format", help="table, json, junit or prometheus.")] = "table",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to FILE "
                                                   "(atomically) instead of stdout.", dir_okay=False)] = None,
    fail_on: FailOnOpt = "critical",
    drain_age: Annotated[str, typer.Option("--drain-age", help="A tray drained longer than this is a finding "
                                                               "(e.g. 12h, 1d, 90m).")] = "1d",
    timeout: TimeoutOpt = None,
    no_health: Annotated[bool, typer.Option("--no-health", help="Leave out the health check catalogue.")] = False,
    no_history: NoHistoryOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Compare what the inventory wants with what the racks run, and add every health check's findings.

    'mctl audit RACK' and 'mctl audit run RACK' are the same (a rack named 'history' needs the latter).
    No rack (or --all) audits every rack. --timeout: each tray's whole probe (default: health.tray_deadline,
    else 15, at most ssh.command_timeout).

    Rule families: versions (OS, kernel, NVIDIA driver, CUDA, Slurm on each tray against its
    image), imex (nodes_config.cfg and config.cfg per tray against the partition plan), slurm
    (nodes, partition, live topology and topology.conf against the partitions), nmx (NMX-M
    partitions and their health against the inventory), drains (trays drained longer than
    --drain-age or with no reason), hostkeys (the key each host presents against known_hosts)
    and health (the whole health catalogue, without remediation).

    Read-only: takes no lock, drains nothing, safe beside 'mctl health watch'. Each run is
    recorded in <state>/audit/history.sqlite; 'mctl audit history' shows new, persisting and
    resolved findings. No colour or progress unless stdout is a terminal; nothing is asked.

    Exit 0 clean, 1 a finding at or above --fail-on, 2 bad input, 3 incomplete (unreachable
    trays, slurmctld or NMX-M not answering) with what was checked still reported.

    Example: mctl -i inventories/site audit --all --format prometheus --output /var/lib/node_exporter/mctl_audit.prom
    """
    from mctl.audit.model import FAIL_ON, parse_duration
    from mctl.audit.reporters import render as render_report
    from mctl.audit.service import AuditSettings, run_audit, select_racks

    out = render.output(json_)
    if out.json:
        if fmt not in ("table", "json"):
            raise UsageError(f"--json and --format {fmt} contradict each other", hint="give one of them")
        fmt = "json"
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fail_on not in FAIL_ON:
        raise UsageError(f"--fail-on {fail_on!r}: expected warn or critical")
    age = parse_duration(drain_age, option="--drain-age")
    if output is not None and output.is_dir():
        raise UsageError(f"--output {output} is a directory", hint="give a file name, e.g. mctl_audit.prom")
    opts = options()
    site = opts.site()
    chosen = select_racks(site, racks or [], all_racks)
    settings = AuditSettings(fail_on=fail_on, drain_age_s=age, timeout=timeout, health=not no_health)
    with out.status(f"auditing {', '.join(r.name for r in chosen)} ...") if output is None else nullcontext():
        report = run_audit(site, chosen, state_dir=opts.state_dir, settings=settings, record=not no_history)
    text = render_report(report, fmt, verbose=opts.verbose > 0)
    if output is not None:
        from mctl.state.files import atomic_write

        atomic_write(output, text, mode=0o644)
    else:
        out.document(text)
    code = report.exit_code
    if code == EXIT_PARTIAL:
        gaps = "; ".join(f"{g.family} on {g.scope}" for g in report.gaps[:4])
        more = f" (and {len(report.gaps) - 4} more)" if len(report.gaps) > 4 else ""
        out.warn(f"audit incomplete: not checked: {gaps}{more}")
    if code in (EXIT_FINDINGS, EXIT_PARTIAL):
        raise typer.Exit(code)


@app.command()
def history(
    since: Annotated[str, typer.Option("--since", help="How far back (e.g. 24h, 7d, 2w).")] = "7d",
    json_: JsonOpt = False,
) -> None:
    """New, persisting and resolved audit findings from the recorded runs.

    New: first seen within --since and still there. Persisting: there since before --since.
    Resolved: gone since, in a run that looked at that host (an unreachable tray does not
    resolve its findings). The rack-scale NVLink validations of the window ('mctl rack validate',
    bring-up's validate phase) are listed after them: rack, status, dragging trays.

    Example: mctl audit history --since 7d
    """
    import time

    from mctl.audit.history import History
    from mctl.audit.model import parse_duration

    window = parse_duration(since, option="--since")
    opts = options()
    start = time.time() - window
    store = History.open(opts.state_dir, create=False)
    try:
        runs = store.runs(start)
        lives = store.lifecycles(start)
        validations = store.validations(start)
    finally:
        store.close()
    out = render.output(json_)
    out.result({"since": since, "runs": runs, "findings": [l.to_dict() for l in lives],
                "summary": {s: sum(l.status == s for l in lives) for s in ("new", "persisting", "resolved")},
                "validations": validations},
               lambda: _print_history(out, since, runs, lives, validations))


def _short_time(t: float | None) -> str:
    if t is None:
        return "-"
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%MZ")


def _print_history(out: render.Output, since: str, runs: list[dict], lives: list,
                   validations: list[dict] | None = None) -> None:
    text = [f"audit history, last {since}: {len(runs)} run{'s' if len(runs) != 1 else ''}"
           + (f", latest {runs[-1]['started']} (exit {runs[-1]['exit_code']})" if runs else "")]
    if lives:
        rows = [["STATUS", "SEVERITY", "CHECK", "HOST", "FIRST SEEN", "LAST SEEN", "RESOLVED", "MESSAGE"]]
        for l in lives:
            rows.append([l.status, l.severity, l.check, l.host or "-", _short_time(l.first_seen),
                         _short_time(l.last_seen), _short_time(l.resolved_at), l.message])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        text += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:-1])) + "  " + r[-1] for r in rows]
    else:
        text.append("no findings in this window")
    counts = {s: sum(l.status == s for l in lives) for s in ("new", "persisting", "resolved")}
    text.append(f"{counts['new']} new, {counts['persisting']} persisting, {counts['resolved']} resolved")
    for v in validations or []:
        parts = ", ".join(f"{p['name']} {p['status']}" + (f" {p['busbw']:.0f} GB/s" if p.get("busbw") else "")
                          for p in v["partitions"])
        text.append(f"validation {v['started']} {v['rack']}: {v['status']} ({parts})"
                    + (f"; dragging {', '.join(v['dragging'])}" if v["dragging"] else ""))
    out.block("\n".join(text) + "\n")
