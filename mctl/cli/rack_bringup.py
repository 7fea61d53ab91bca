"""mctl rack bring-up RACK: the rendering side (the command lives on the `rack` noun)."""

from __future__ import annotations

import time
from typing import Annotated, List, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, ImexWaitOpt, JsonOpt, RackArg, ResumeOpt

PhaseOpt = Optional[str]


def bring_up(
    rack: RackArg,
    from_phase: Annotated[PhaseOpt, typer.Option("--from", help="Start at this phase (preflight, inventory, "
                                                 "provision, partitions, imex, scheduler, health, burn-in, open, validate).")]
    = None,
    until_phase: Annotated[PhaseOpt, typer.Option("--until", help="Stop after this phase.")] = None,
    resume: ResumeOpt = False,
    trust_new_keys: Annotated[bool, typer.Option("--trust-new-keys", help="Record host keys of hosts not in "
                                                 "known_hosts yet (never replaces a changed key).")] = False,
    accept: Annotated[Optional[List[str]], typer.Option("--accept", help="Health finding to accept in the gate: "
                                                        "CHECK or HOST:CHECK, shell patterns allowed; repeatable.")]
    = None,
    reprovision: Annotated[bool, typer.Option("--reprovision", help="Run the site playbook on every host, even "
                                              "those already provisioned.")] = False,
    burn_in: Annotated[str, typer.Option("--burn-in", help="off, quick, medium or long (DCGM level / NCCL size).")]
    = "medium",
    imex_wait: ImexWaitOpt = 60.0,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Bring a rack up: preflight, inventory, provision, partitions and IMEX, Slurm, health gate, burn-in, open, validate.

    Each phase reuses the other commands and changes only what differs, so a bring-up of a rack
    that is already up changes nothing. A journal per run (<state>/bringup/RACK/RUN/journal.json)
    records every phase; after a failure, Ctrl-C or a crash, --resume continues from the first
    phase not finished. Partitions come from the inventory (record them first with
    'mctl partition create RACK --template 2x9 --no-apply'); none means the default partition.
    Exit 0 ok, 1 health gate or IMEX findings, 2 bad input, 3 hosts or a phase failed, 130 interrupted.

    Example: mctl -i inventories/lab rack bring-up lab-r1 --dry-run
    """
    from mctl.bringup.context import Options
    from mctl.bringup.service import bring_up as run, plan_bring_up

    opts = options()
    site = opts.site()
    out = render.output(json_)
    choice = Options(from_phase=from_phase, until_phase=until_phase, trust_new_keys=trust_new_keys,
                     accept=tuple(accept or ()), reprovision=reprovision, burn_in=burn_in, imex_wait=imex_wait)
    if dry_run:
        planned = plan_bring_up(site, rack, opts.state_dir, choice)
        out.result({"dry_run": True, "rack": rack, "phases": [p.to_dict() for p in planned]},
                   lambda: _print_plan(out, rack, planned))
        return
    started = time.monotonic()
    result = run(site, rack, opts.state_dir, choice, resume=resume, report=None if out.json else _Live(out))
    out.result(result.to_dict(), lambda: _print_result(out, result, time.monotonic() - started))
    if result.status == "interrupted":
        out.error(f"interrupted in phase {result.failed_phase}; the journal {result.journal.path} holds every "
                     "finished phase", f"continue with 'mctl rack bring-up {rack} --resume'")
        raise typer.Exit(130)
    if result.error is not None:
        raise result.error


def _print_plan(out: render.Output, rack: str, planned) -> None:
    out.line(f"bring-up plan for rack {rack} (--dry-run: nothing is changed)")
    for i, p in enumerate(planned, start=1):
        out.line(f"[{i}/{len(planned)}] {p.name}: {p.title}")
        for line in p.lines:
            out.line(f"      {line}")
        if p.error:
            out.line(f"      cannot tell yet: {p.error}")


def _print_result(out: render.Output, result, seconds: float) -> None:
    from mctl.model.site import fold

    data = result.to_dict()
    rack = data["rack"]
    if result.status == "failed":
        phase = next(p for p in data["phases"] if p["phase"] == result.failed_phase)
        out.line(f"bring-up of rack {rack} stopped at phase {result.failed_phase} after {seconds:.0f}s "
                 f"(run {data['run_id']})")
        for line in phase["details"]:
            out.line(f"  {line}")
        out.line(f"journal: {data['journal']}")
        return
    if result.status != "succeeded":
        return
    if result.already_up:
        out.line(f"rack {rack} is already up: nothing changed ({len(result.ran)} phases checked in {seconds:.0f}s)")
    else:
        out.line(f"bring-up of rack {rack} succeeded in {_duration(seconds)} (run {data['run_id']})")
    s = data["summary"]
    trays = s["trays"]
    if trays["total"]:
        extra = f"; drained by others: {fold(trays['drained_by_others'])}" if trays["drained_by_others"] else ""
        out.line(f"  trays ready:   {trays['open']}/{trays['total']} open in Slurm{extra}")
    parts = s["partitions"]
    if parts is not None:
        out.line("  partitions:    " + (", ".join(f"{p['name']} {p['trays']} (ID {p['partition_id']})" for p in parts)
                                        if parts else "none declared: the rack is NMX-M's default partition"))
    if s["imex_domains"]:
        out.line("  IMEX domains:  " + ", ".join(f"{d['name']} {d['state']}" for d in s["imex_domains"]))
    if s["scheduler"]["blocks"]:
        out.line("  Slurm blocks:  " + ", ".join(f"{b['name']}={b['trays']}" for b in s["scheduler"]["blocks"]))
    health = s["health"]
    if health["checks_passed"] is not None:
        found = health["findings"] or []
        out.line(f"  health:        {health['checks_passed']} checks passed; "
                 + (f"{len(found)} findings ({len(health['accepted'] or [])} accepted)" if found else "no findings"))
    for p in data["phases"]:
        if p["status"] == "skipped":
            out.line(f"  {p['phase']}: skipped: {p['summary']}")
    out.line(f"  journal:       {data['journal']}")


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.0f}s"


class _Live:
    """Phase lines as they happen; per-host progress inside provisioning and the Slurm deploy."""

    def __init__(self, out: render.Output) -> None:
        self.out = out
        self._progress: render.HostProgress | None = None
        self._task: str | None = None
        self._counts: dict[str, int] = {}
        self._index = ""

    def phase_started(self, index: int, total: int, name: str) -> None:
        from mctl.bringup.context import TITLES

        self._index = f"[{index}/{total}]"
        self.out.line(f"{self._index} {name}: {TITLES[name]} ...")

    def line(self, text: str) -> None:
        self.out.line(f"      {text}")

    def hosts_started(self, what: str, hosts: list[str]) -> None:
        from mctl.model.site import fold

        self._task, self._counts = None, {}
        self.out.line(f"      {what} {len(hosts)} hosts: {fold(hosts)}")
        self._progress = self.out.hosts(hosts).start()

    def host_event(self, ev) -> None:
        from mctl.cli.provision import host_failure

        host_failure(self.out, ev, indent="      ")
        if self._progress is not None and self._progress.update(ev.host, f"{ev.host}: {ev.kind:<9} {ev.task}"):
            return
        if ev.task != self._task:
            self._flush()
            self._task = ev.task
        self._counts[ev.kind] = self._counts.get(ev.kind, 0) + 1

    def _flush(self) -> None:
        """Tasks run in lock step on every host: a new task's first event closes the previous task."""
        if self._task is not None and self._counts:
            done = ", ".join(f"{n} {k}" for k, n in sorted(self._counts.items()))
            self.out.line(f"      task '{self._task}': {done}")
        self._task = None
        self._counts = {}

    def hosts_ended(self) -> None:
        self._flush()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def phase_ended(self, name: str, status: str, summary: str, seconds: float) -> None:
        word = {"failed": "FAILED", "interrupted": "INTERRUPTED"}.get(status, status)
        self.out.line(f"{self._index} {name}: {word} ({seconds:.1f}s): {summary}")
