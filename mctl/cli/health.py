"""mctl health: check trays, watch them for days, drain the failed ones, resume them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import (DryRunOpt, FailOnOpt, JsonOpt, NodesArg, PassedOpt, RemediateOpt, TargetArg, TimeoutOpt,
                              finite)
from mctl.errors import EXIT_FINDINGS, UsageError

app = typer.Typer(help="Health checks, the watch that drains failed trays, and mctl's drains.",
                  no_args_is_help=True)
breaker_app = typer.Typer(help="The circuit breaker that stops automatic drains.", no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")
escalation_app = typer.Typer(help="Rack escalation: one hold on a rack whose trays fail together.",
                             no_args_is_help=True)
app.add_typer(escalation_app, name="escalation")

SEVERITIES = ("warn", "critical")


@app.command()
def check(
    target: TargetArg = None,
    fail_on: FailOnOpt = "critical",
    remediate: RemediateOpt = None,
    passed: PassedOpt = False,
    timeout: TimeoutOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """One sweep over the trays: run every check and print the findings.

    Checks: reachability, GPU count, driver against the tray's image, fabric state/status and
    health flags, NVLink domain and clique against the partition plan, XIDs (the drain set is
    health.drain_xids), uncorrectable ECC and row remapping, NVLinks (18 per GPU), temperature and
    power, IMEX daemon and domain, slurmd, disk and memory, a reboot since the last sweep (boot
    id; XIDs from before it no longer count). With --remediate the policy decides
    and drains (reason 'mctl: ...') or resumes, as the watch does; with --dry-run it only says
    what it would do. The trays are every compute tray by default (a rack name: its compute trays).
    --timeout: each tray's whole probe (default: health.tray_deadline, else the interval within
    5..15 s, at most ssh.command_timeout). Exit 0 ok, 1 a finding at or above --fail-on, 2 bad input.

    Example: mctl -i inventories/lab health check lab-r1 --fail-on warn
    """
    from mctl.health.service import run_check

    if fail_on not in SEVERITIES:
        raise UsageError(f"--fail-on {fail_on!r}: expected warn or critical")
    opts = options()
    site = opts.site()
    remediate = bool(remediate)
    if remediate:
        from mctl.cli.locking import hold_racks
        from mctl.health.site_view import resolve_scope

        hold_racks(_racks_of(site, resolve_scope(site, target).names), "health check --remediate", dry_run=dry_run)
    result = run_check(site, target, opts.state_dir, remediate=remediate,
                       dry_run=dry_run, timeout=timeout)
    out = render.output(json_)
    out.result(result.to_dict(), lambda: _print_check(out, result, passed))
    threshold = {"warn": 1, "critical": 2}[fail_on]
    if any(f.severity.rank >= threshold for f in result.findings):
        raise typer.Exit(EXIT_FINDINGS)


def _racks_of(site, hosts) -> list[str]:
    return sorted({r.name for r in (site.rack_of(h) for h in hosts) if r is not None})


def _print_check(out: render.Output, result, passed: bool) -> None:
    from mctl.cli.health_screen import STYLE
    from mctl.health.watch import ESCALATION_ACTION, ISOLATE_ACTIONS, LADDER_ACTIONS
    from mctl.model.drain import NOTES

    rows = []
    for v in result.verdicts:
        status = result.tray_status(v.host)
        node = (result.nodes or {}).get(v.host)
        crit = [f for f in v.findings if f.severity.value == "critical"]
        warns = [f for f in v.findings if f.severity.value == "warn"]
        first = (crit or warns or [None])[0]
        sched = "-" if node is None else node.state + (f" ({node.reason})" if node.reason else "")
        rows.append((v.host, render.Styled(status, STYLE.get(status, "")), sched, str(len(crit)), str(len(warns)),
                     f"{first.check}: {first.message}" if first else ""))
    out.table(f"health sweep #{result.number}: {len(result.verdicts)} trays in {result.elapsed:.2f}s",
              [render.Column(c, fold=True) for c in ("tray", "status", "scheduler", "critical", "warn",
                                                     "first finding")], rows, boxed=True)
    shown = [f for f in result.findings if passed or f.severity.value != "ok"]
    if shown:
        out.line("findings:")
        for f in shown:
            out.line(f"  {f.severity.value.upper():8} {f.host or '-'}  {f.check}: {f.message}")
            if f.action and f.severity.value != "ok":
                out.line(f"           action: {f.action}")
    if result.remediate:
        verb = "would " if result.dry_run else ""
        acts = [d for d in result.decisions if d.action in ("drain", "resume", *NOTES, "power-off", ESCALATION_ACTION,
                                                            *LADDER_ACTIONS, *ISOLATE_ACTIONS)]
        if not acts:
            out.line("remediation: nothing to do")
        for d in acts:
            what = f"{verb}{d.action}" if d.action in ("drain", "resume", "power-off", ESCALATION_ACTION,
                                                       *LADDER_ACTIONS, *ISOLATE_ACTIONS) else d.action
            out.line(f"  {what.upper():13} {d.host}  {d.reason or ''}  ({d.why})")
        for e in result.logged:
            if e.action == "breaker-trip":
                out.line(f"  BREAKER TRIPPED: {e.reason}")
            elif e.action in (*LADDER_ACTIONS, "ladder", "recovered", "repair-hook",      # the recovery ladder
                              *ISOLATE_ACTIONS, "isolate-wait"):                          # isolations
                out.line(f"  {e.action.upper():13} {e.tray}  {e.why or ''}  ({e.result})")
    counts = {s: sum(1 for f in result.findings if f.severity.value == s) for s in ("critical", "warn")}
    out.line(f"{counts['critical']} critical, {counts['warn']} warn" +
             (f"; scheduler: {result.scheduler_error}" if result.scheduler_error else ""))


@app.command()
def watch(
    target: TargetArg = None,
    interval: Annotated[Optional[float], typer.Option("--interval", click_type=finite(min=0.2),
                                                      help="Seconds between sweeps (default: health.interval).")
                        ] = None,
    remediate: RemediateOpt = None,
    metrics_textfile: Annotated[Optional[Path], typer.Option("--metrics-textfile",
                                                             help="Write Prometheus metrics here after each sweep "
                                                                  "(node_exporter textfile collector).")] = None,
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", min=1, max=65535,
                                                        help="Serve /metrics on PORT (address: --metrics-listen).")
                            ] = None,
    metrics_listen: Annotated[Optional[str], typer.Option("--metrics-listen", metavar="ADDRESS",
                                                          help="IP address /metrics listens on (default: "
                                                               "health.metrics_listen, else 127.0.0.1).")] = None,
    sweeps: Annotated[Optional[int], typer.Option("--sweeps", min=1, help="Stop after N sweeps (default: run "
                                                                          "until Ctrl-C).")] = None,
    racks: Annotated[Optional[str], typer.Option("--rack-set", metavar="SET",
                                                 help="Watch these racks only (a rack set, e.g. r[01-08]): one "
                                                      "shard of the site.")] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", metavar="NAME",
                                                 help="Watch the racks of this shard of health.shards.")] = None,
    timeout: TimeoutOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Sweep every interval and drain trays that fail, for as long as it runs (tmux).

    Keeps one SSH connection per tray and one to the Slurm controller open (reopened when they
    drop). A critical tray is drained with a reason starting 'mctl:' (full text in
    <state>/health/actions.jsonl); an unreachable one only after
    health.unreachable_sweeps_before_drain misses; a tray mctl drained is resumed after
    health.resume_after_healthy_sweeps healthy sweeps. Reasons set by others and DOWN nodes are
    never touched; the circuit breaker stops drains beyond health.breaker.max_drained_share.
    On a terminal: a live screen; otherwise one log line per sweep and event. Ctrl-C stops it.

    Every wait has a deadline: each tray's probe gets --timeout (health.tray_deadline; by default
    the interval, within 5..15 s); a tray that misses it is reported in that sweep as hung (timeout)
    or unreachable and its connection is reopened in the background, so a sweep ends within its
    interval plus the time the scheduler's actions take (docs/health.md, "Deadlines").

    A large site runs one watch per shard (--shard NAME of health.shards, or --rack-set SET), each on
    its own head node; the site's safety budget, kept by slurmctld, caps them together. With
    health.failover.etcd two watches of one shard elect a leader through an etcd lease: the standby
    takes over within the lease's TTL and a quarter, and every act is fenced (docs/health.md,
    "Shards and failover").

    Example: mctl -i inventories/lab health watch lab-r1 --interval 10 --metrics-port 9464
    """
    from mctl.health.session import WatchSession

    opts = options()
    out = render.Output()                   # no JSON form: a --json before 'health' is ignored, as always
    session = WatchSession.configure(opts.site(), opts.state_dir, target, interval=interval, remediate=remediate,
                                     racks=racks, shard=shard,
                                     metrics_textfile=metrics_textfile, metrics_port=metrics_port,
                                     metrics_listen=metrics_listen, sweeps=sweeps, timeout=timeout, dry_run=dry_run,
                                     on_warning=out.warn)
    if not out.rich:
        session.run(lambda view, events, swept: _plain_lines(out, view, events, swept))
        return
    from mctl.cli.health_screen import WatchScreen

    screen = WatchScreen(session.view)
    live = out.screen(screen)

    def update(view, events, swept: bool) -> None:
        screen.update(swept)
        live.refresh()

    session.run(update, display=live)
    out.line(f"mctl health watch stopped after {session.sweeps_done} sweeps")


def _plain_lines(out: render.Output, view, events, swept: bool) -> None:
    """Off a terminal: one log line per event and per sweep."""
    from mctl.cli.health_screen import event_lines, sweep_line

    out.lines(event_lines(events))
    if swept:
        out.line(sweep_line(view))
    out.flush()


@app.command()
def catalogue(json_: JsonOpt = False) -> None:
    """Every check mctl judges a tray or rack by: id, severity, purposes, the document it follows, its
    thresholds (and the settings that move them) and the lab fault that makes it fail.

    Example: mctl health catalogue --json
    """
    from mctl.health.service import catalogue as entries

    rows = entries()
    out = render.output(json_)
    out.result({"checks": rows}, lambda: _print_catalogue(out, rows))


def _print_catalogue(out: render.Output, rows: list[dict]) -> None:
    for r in rows:
        tags = [r["severity"]] + (["milder form warns"] if r["milder"] else []) + (
            [f"severity set by health.{r['setting']}"] if r["setting"] else [])
        out.line(f"{r['id']}  ({', '.join(tags)}; {', '.join(r['purposes'])})")
        out.line(f"    {r['about']}")
        out.line(f"    source:     {r['source']}")
        out.line(f"    thresholds: {r['thresholds']}")
        out.line(f"    lab:        {r['lab']}")
    out.line(f"{len(rows)} checks")


@app.command()
def drains(json_: JsonOpt = False) -> None:
    """List the trays mctl holds drained (its own record and every 'mctl:' reason in Slurm).

    Example: mctl -i inventories/lab health drains --json
    """
    from mctl.health.service import list_drains

    opts = options()
    report = list_drains(opts.site(), opts.state_dir)
    out = render.output(json_)
    out.result(report.to_dict(), lambda: _print_drains(out, report))


def _print_drains(out: render.Output, report) -> None:
    from datetime import datetime

    rows = [(r.host, r.rack or "-", r.state or "?", r.reason or "-",
             datetime.fromtimestamp(r.drained_at).strftime("%Y-%m-%d %H:%M:%S") if r.drained_at else "-",
             str(r.healthy_streak), r.owner) for r in report.rows]
    out.table(f"{len(report.rows)} tray(s) drained by mctl",
              [render.Column(c, fold=True) for c in ("tray", "rack", "state", "reason", "since", "healthy sweeps",
                                                     "owner")], rows, boxed=True)
    if report.breaker.get("tripped"):
        out.line(f"circuit breaker TRIPPED: {report.breaker.get('reason')} (mctl health breaker reset)")
    if report.budget is not None:
        out.lines(_budget_lines(report.budget))
    if report.scheduler_error:
        out.warn(f"scheduler not read: {report.scheduler_error}")


@app.command()
def resume(
    target: NodesArg,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Resume trays mctl drained, by hand (only 'mctl:' reasons; never DOWN nodes or others' drains).

    XIDs logged before the resume no longer count against the tray: resuming says they were dealt
    with. Every resume goes to the action log.

    Example: mctl -i inventories/lab health resume lab-r1-tray[03-04]
    """
    from mctl.cli.locking import hold_racks
    from mctl.health.service import resume_by_hand
    from mctl.health.site_view import resolve_scope

    opts = options()
    site = opts.site()
    # the racks' locks first: a bring-up or partition change holds its trays with 'mctl:' reasons too
    hold_racks(_racks_of(site, resolve_scope(site, target).names), "health resume", dry_run=dry_run)
    rows = resume_by_hand(site, target, opts.state_dir, dry_run=dry_run)
    out = render.output(json_)
    out.result({"dry_run": dry_run, "trays": [r.to_dict() for r in rows]},
               lambda: out.lines(f"{r.result.upper():13} {r.host}  {r.reason or ''}  {r.detail}".rstrip() for r in rows))
    if any(r.result in ("refused", "failed") for r in rows):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
def evidence(
    target: TargetArg = None,
    reason: Annotated[str, typer.Option("--reason", help="Why the evidence is taken (part of the bundle's name and "
                                                          "of its action-log line).")] = "on-demand",
    timeout: TimeoutOpt = None,
    max_size: Annotated[str, typer.Option("--max-size", metavar="SIZE",
                                          help="Cap of one tray's bundle (K, M, G); each file has its share and says "
                                               "when it was capped.")] = "32M",
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Collect evidence for a repair: a bundle per tray in the state directory, with an index.

    Each bundle (<state>/evidence/TRAY/TIME-REASON/) holds nvidia-bug-report.sh's report, the kernel
    log's and the IMEX log's tails, the tray's uname, boot id and nvidia-smi -q, its health record and
    recent actions, and bundle.json saying what each file is; <state>/evidence/index.jsonl lists every
    bundle and the action log names each. The recovery ladder takes one before each rung. A tray that
    does not answer still gets a bundle saying so. Nothing on the trays changes. Exit 0, 1 when a
    tray's bundle is incomplete, 2 bad input. --timeout: everything on a tray within it (default 120 s,
    10 to 3600); nvidia-bug-report.sh gets all of it but 15 s.

    Example: mctl -i inventories/lab health evidence lab-r1-tray03 --reason "xid 79 on gpu0"
    """
    from mctl.health.evidence import DEFAULT_DEADLINE_S, parse_size
    from mctl.health.service import evidence_on_demand

    opts = options()
    site = opts.site()
    result = evidence_on_demand(site, target, opts.state_dir, reason=reason,
                                deadline_s=timeout if timeout is not None else DEFAULT_DEADLINE_S,
                                max_bytes=parse_size(max_size), dry_run=dry_run)
    out = render.output(json_)
    out.result(result, lambda: _print_evidence(out, result))
    if not dry_run and any(b["problems"] for b in result["bundles"]):
        raise typer.Exit(EXIT_FINDINGS)


def _print_evidence(out: render.Output, result: dict) -> None:
    for b in result["bundles"]:
        if result["dry_run"]:
            out.line(f"would collect {b['tray']} into {b['path']} (within {b['deadline_s']:g}s, at most "
                     f"{b['max_bytes']} bytes): {', '.join(b['files'])}")
            continue
        out.line(f"{'INCOMPLETE' if b['problems'] else 'OK':10} {b['tray']}  {b['path']}  {b['bytes']} bytes  "
                 f"{b['seconds']:.1f}s")
        for p in b["problems"]:
            out.line(f"           {p}")
    if not result["dry_run"]:
        out.line(f"index: {result['index']}")


@breaker_app.command("status")
def breaker_status(json_: JsonOpt = False) -> None:
    """Whether the circuit breaker has stopped automatic drains, and the drains it counts.

    Example: mctl -i inventories/lab health breaker status
    """
    from mctl.health.service import breaker_status as status

    opts = options()
    data = status(opts.state_dir, opts.site())
    state = f"TRIPPED: {data['reason']}" if data["tripped"] else "closed"
    out = render.output(json_)
    out.result(data, lambda: out.lines([
        f"circuit breaker {state}; {data['recent_drains']} automatic drain(s) in the window "
        f"({data['scope']} share limit {data['max_drained_share']:.0%} per {data['window_s']:g}s)"]
        + (_budget_lines(data["budget"]) if data.get("budget") else [])))
    if data.get("budget_error"):
        out.warn(f"the safety budget was not read: {data['budget_error']}", in_result=True)
    elif data.get("budget") is None and opts.site().scheduler is not None:
        from mctl.health.session import NO_BUDGET
        out.warn(NO_BUDGET, in_result=True)


def _budget_lines(budget: dict) -> list[str]:
    """The site's safety budget for a person: tripped or not, and each rack's grants against its limit."""
    from mctl.model.site import fold

    head = f"safety budget TRIPPED: {budget['tripped']} (mctl health breaker reset)" if budget.get("tripped") \
        else "safety budget open"
    site = budget["site"]
    lines = [f"{head}; site {len(site['held'])}/{site['limit']} trays out of service by mctl"]
    for rack, r in sorted(budget["racks"].items()):
        lines.append(f"  rack {rack}: {len(r['held'])}/{r['limit']}" + (f" ({fold(r['held'])})" if r["held"] else ""))
    lines += [f"  NOT APPLIED: {d} (run 'mctl deploy slurm'; the scheduler's number holds)"
              for d in budget.get("drift") or []]
    return lines


@breaker_app.command("reset")
def breaker_reset(dry_run: DryRunOpt = False, json_: JsonOpt = False) -> None:
    """Close the circuit breaker so automatic drains may happen again (the drain count restarts).

    Example: mctl -i inventories/lab health breaker reset
    """
    from mctl.health.service import breaker_reset as reset

    opts = options()
    data = reset(opts.state_dir, dry_run=dry_run, site=opts.site() if opts.inventory else None)
    if data.get("budget_was_tripped"):
        budget = ("would lift" if dry_run else "lifted") + f" the safety budget's trip ({data['budget_was_tripped']})"
    else:
        budget = None
    if not data["was_tripped"]:
        text = "circuit breaker was not tripped; drain count cleared" if not dry_run else \
            "circuit breaker is not tripped; reset would clear the drain count"
    else:
        text = ("would reset" if dry_run else "reset") + f" the circuit breaker (was: {data['reason']})"
    out = render.output(json_)
    out.result(data, lambda: out.lines([text] + ([budget] if budget else [])))
    if data.get("budget_error"):
        out.warn(f"the safety budget was not read: {data['budget_error']}", in_result=True)


@escalation_app.command("status")
def escalation_status(json_: JsonOpt = False) -> None:
    """The racks held by rack escalation (cause, failed trays, the trays held) and the racks whose trays fail.

    Example: mctl -i inventories/lab health escalation status --json
    """
    from mctl.health.service import escalation_status as status

    opts = options()
    data = status(opts.site(), opts.state_dir)
    out = render.output(json_)
    out.result(data, lambda: out.lines(_escalation_lines(data)))


def _escalation_lines(data: dict) -> list[str]:
    from mctl.model.site import fold

    if not data["enabled"]:
        head = "rack escalation is off (health.escalation.enabled)"
    else:
        head = (f"rack escalation on: more than {data['rack_share']:.0%} of a rack's compute trays (at least "
                f"{data['min_trays']}) failing within {data['window_s']:g}s"
                + (", or a switch tray failing" if data["on_switch_tray"] else "") + ", holds the rack")
    lines = [head]
    for rack, h in data["held"].items():
        lines.append(f"HELD     {rack}: {h['cause']}; {h['result']}; held {fold(h['held']) if h['held'] else '-'}"
                     + (f"; left alone {fold(sorted(h['left']))}" if h["left"] else "")
                     + f" (mctl health escalation lift {rack})")
    for rack, w in data["watching"].items():
        if w["failing"] or w["switch_trays_critical"]:
            lines.append(f"watching {rack}: {len(w['failing'])} of {w['compute_trays']} compute trays failing"
                         + (f" ({fold(w['failing'])})" if w["failing"] else "")
                         + (f"; switch trays critical {fold(w['switch_trays_critical'])}"
                            if w["switch_trays_critical"] else ""))
    if not data["held"]:
        lines.append("no rack held")
    return lines


@escalation_app.command("lift")
def escalation_lift(
    rack: Annotated[str, typer.Argument(help="The rack whose hold is lifted.", metavar="RACK")],
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Lift rack escalation's hold on RACK: resume every tray holding its reason (and no other).

    Only trays whose reason still starts with 'mctl: rack escalated' are resumed, their grants of the
    safety budget given back; the failures seen so far never hold the rack again, new ones may. A
    tray still failing is then drained on its own by the watch, as any tray. Exit 0 (a rack not held
    too), 3 when a tray could not be resumed (the hold stays: run it again), 2 bad input.

    Example: mctl -i inventories/lab health escalation lift lab-r1
    """
    from mctl.cli.locking import hold_racks
    from mctl.health.service import escalation_lift as lift

    opts = options()
    site = opts.site()
    if rack not in site.racks:
        raise UsageError(f"no rack {rack!r} in the inventory", hint=f"racks: {', '.join(sorted(site.racks))}")
    hold_racks([rack], "health escalation lift", dry_run=dry_run)
    data = lift(site, rack, opts.state_dir, dry_run=dry_run)
    out = render.output(json_)

    def text() -> list[str]:
        from mctl.model.site import fold

        if data["result"] == "not held":
            return [f"rack {rack} is not held by rack escalation"]
        if dry_run:
            return [f"would lift the hold on rack {rack}"
                    + (f" ({data['held']['cause']})" if data["held"] else "")
                    + f": resume {fold(data['trays']) if data['trays'] else 'no tray'}"]
        return [f"lifted the hold on rack {rack}: resumed {fold(data['lifted']) if data['lifted'] else 'no tray'}"]

    out.result(data, lambda: out.lines(text()))
