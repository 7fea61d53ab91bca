"""The one conductor of `mctl provision`: the work on its trays, the check pass, the jobs rule, then the run.

    execute(site, plan, req, state_dir, ui) -> ProvisionResult

In this order (the caller holds the racks' locks already: the CLI takes them before it prints):

1. `--check` is Ansible's check mode and changes nothing: it runs as it always did, no rule applies;
2. the work on the plan's compute trays (mctl.sched.work.discover: Slurm jobs, pods holding GPUs);
3. the check pass (mctl.provision.service.check_disruption: the playbook in check mode, each change
   judged by its task's declaration), only where its answer matters: on the trays with work (all of
   them when the work cannot be read), and on every host with --dry-run or --drain. No work and no
   --drain: no pass, the plain run as before;
4. the jobs rule (mctl.model.change.work_rule, the partition changes' own) over the trays whose
   changes are disruptive and that run work: none, go (harmless changes go ahead under running
   jobs); else refused, the jobs and the changes named (exit 2, nothing changed), unless --drain or
   --force;
5. --force says what breaks and asks through the UI (no terminal: --yes), then the plain run;
   --drain (with --rolling N or not) the journaled rollout (mctl.rollout.run); --resume finishes the
   rack's last rollout.

The service prints nothing: the UI shows and asks, the caller renders the result. A provisioning
that cannot tell what it would disrupt never goes ahead on trays with work: a host the check pass
could not judge counts as disruptive (docs/decisions.md D71).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mctl.errors import MctlError, UsageError
from mctl.model.change import DRAIN, FORCE, GO, work_on, work_rule
from mctl.rollout.request import ProvisionRequest
from mctl.rollout.ui import RolloutUI

if TYPE_CHECKING:
    from mctl.ansible.runner import RunResult
    from mctl.model.change import RunningWork
    from mctl.model.disruption import DisruptionReport
    from mctl.model.site import Site
    from mctl.provision.service import ProvisionPlan
    from mctl.rollout.run import RolloutRun

# What happens to a tray, in the plan's words (the dry run's "action" per tray).
UNCHANGED, GOES, HELD, REFUSED, BREAKS, NOT_RUN = (
    "unchanged", "goes ahead", "held, drained, provisioned, verified, released", "refused: work runs there",
    "goes ahead and breaks its work", "not run (the provisioning is refused)")


@dataclass
class ProvisionResult:
    """What a provisioning ended with: the --json document, the error to raise after it (None: success), the
    plain run (the CLI prints its recap as before) or the rollout, and a closing line for a person."""

    document: dict[str, Any] | None = None
    error: MctlError | None = None
    run: "RunResult | None" = None
    rollout: "RolloutRun | None" = None
    done: str | None = None


class ProvisionRefused(UsageError):
    """The jobs rule refused the provisioning: disruptive changes on trays with running work, no consent."""

    def __init__(self, message: str, *, hint: str | None, view: dict[str, Any]):
        super().__init__(message, hint=hint)
        self.view = view


def execute(site: "Site", plan: "ProvisionPlan", req: ProvisionRequest, state_dir: Path,
            ui: RolloutUI | None = None) -> ProvisionResult:
    """Run the provisioning *plan* asks for under the rule *req* consents to; the result (never printed here)."""
    ui = ui or RolloutUI()
    state_dir = Path(state_dir)
    if req.resume:
        from mctl.rollout.run import resume_rollout

        return _rollout_result(resume_rollout(site, one_rack(site, plan.hosts, "--resume"), state_dir, ui))
    if plan.check:
        if req.drain or req.force or req.rolling:
            raise UsageError("--check changes nothing: --drain, --force and --rolling do not go with it",
                             hint="--dry-run shows what each tray's changes would do to its work")
        return _plain(plan, state_dir, ui)
    trays = [h for h in plan.hosts if _is_tray(site, h)]
    if (req.drain or req.rolling) and site.scheduler is not None and site.scheduler.type == "k8s":
        raise UsageError("--drain and --rolling hold trays in Slurm; this site runs Kubernetes",
                         hint="cordon and drain the nodes with kubectl first, or give --force")
    from mctl.sched.work import discover

    work, work_error = discover(site, trays)
    busy = {t: work_on(work, [t]) for t in trays if work_on(work, [t])}
    if not (req.dry_run or req.drain or busy or work_error):
        return _plain(plan, state_dir, ui)              # no work anywhere: as before, no check pass
    from mctl.provision.service import check_disruption

    asked = plan if (req.dry_run or req.drain or work_error) else plan.only(list(busy))
    report = check_disruption(asked, state_dir, reboot_after=req.drain)
    breaking = [t for t in (trays if work_error else list(busy)) if t in report.trays and report.trays[t].disruptive]
    hit = work_on(work, breaking)
    verdict = work_rule(bool(breaking), hit, work_error is None, drain=req.drain, force=req.force)
    view = plan_view(site, plan, req, report, work, work_error, breaking, verdict)
    ui.plan(view)
    if req.dry_run:
        return ProvisionResult({"dry_run": True, "plan": plan.to_dict(), "disruption": view})
    if verdict == FORCE:
        breaks = describe_breaking(report, breaking, work, work_error)
        ui.warn(f"--force: provisioning breaks what runs on {_fold(breaking)}: {breaks}")
        if not ui.confirm(breaks):
            raise UsageError("not confirmed; nothing was changed")
        return _plain(plan, state_dir, ui)
    if verdict not in (GO, DRAIN):
        raise refusal(site, plan, req, report, breaking, work, work_error, view)
    if not req.drain:
        return _plain(plan, state_dir, ui)              # nothing disruptive under running work: go
    return _rollout_result(_start(site, plan, req, report, state_dir, ui))


# ------------------------------------------------------------------ the plain run and the rollout

def _plain(plan: "ProvisionPlan", state_dir: Path, ui: RolloutUI) -> ProvisionResult:
    from mctl.provision.service import provision

    with ui.progress(plan.hosts):
        run = provision(plan, state_dir, on_event=ui.event)
    return ProvisionResult(run.to_dict(), run=run)


def _start(site: "Site", plan: "ProvisionPlan", req: ProvisionRequest, report: "DisruptionReport", state_dir: Path,
           ui: RolloutUI) -> "RolloutRun":
    from mctl.rollout.run import RolloutSpec, plan_fields, start_rollout

    rack = one_rack(site, plan.hosts, "--rolling" if req.rolling else "--drain")
    trays = [h for h in plan.hosts if _is_tray(site, h) and report.trays[h].disruptive]
    free = [h for h in plan.hosts if h not in trays and report.trays[h].changed]
    spec = RolloutSpec(rack, plan_fields(plan), tuple(trays), tuple(free), tuple(report.unchanged()),
                       tuple(t for t in trays if report.trays[t].reboot), req.rolling, req.seconds)
    return start_rollout(site, spec, state_dir, ui)


def _rollout_result(run: "RolloutRun") -> ProvisionResult:
    from mctl.model.site import fold

    done = [t for t, s in run.trays().items() if s["status"] == "done"]
    return ProvisionResult(run.to_dict(), run.error, rollout=run,
                           done=f"rack {run.journal.rack}: provisioning rollout {run.journal.run_id} finished: "
                                f"{fold(done) if done else 'no tray'} held, provisioned, verified and released"
                                if run.error is None else None)


# ------------------------------------------------------------------ the plan, the refusal

def _is_tray(site: "Site", name: str) -> bool:
    return any(h.name == name for h in site.compute_trays())


def _fold(names: Sequence[str]) -> str:
    from mctl.model.site import fold

    return fold(names) if names else "no tray"


def one_rack(site: "Site", hosts: Sequence[str], option: str) -> str:
    """The one rack of *hosts* (a rollout is journaled per rack); UsageError for hosts of several racks."""
    racks = sorted({r.name for r in (site.rack_of(h) for h in hosts) if r is not None})
    if len(racks) != 1:
        raise UsageError(f"{option} provisions the trays of one rack at a time; these hosts are in "
                         f"{', '.join(racks) or 'no rack'}", hint="give one rack, or a node set within one")
    return racks[0]


def plan_view(site: "Site", plan: "ProvisionPlan", req: ProvisionRequest, report: "DisruptionReport",
              work: Sequence["RunningWork"], work_error: str | None, breaking: Sequence[str],
              verdict: str) -> dict[str, Any]:
    """Each host's changes (disruptive ones marked), the work on it and what happens to it: the dry run's
    document and what the UI shows."""
    trays: dict[str, Any] = {}
    for h in plan.hosts:
        d = report.trays.get(h)
        on = work_on(work, [h])
        if h in breaking:
            action = {DRAIN: HELD, FORCE: BREAKS, GO: GOES}.get(verdict, REFUSED)
        elif verdict not in (GO, DRAIN, FORCE):
            action = NOT_RUN                # the provisioning is refused as a whole
        elif d is not None and not d.changed:
            action = UNCHANGED
        elif d is not None and d.disruptive and req.drain and _is_tray(site, h):
            action = HELD
        else:
            action = GOES                   # harmless, or no work on it (not checked then)
        trays[h] = {**(d.to_dict() if d is not None else {"host": h, "disruptive": None, "changes": []}),
                    "work": [w.to_dict() for w in on], "action": action}
    return {"verdict": verdict, "scheduler": site.scheduler.type if site.scheduler else None,
            "work_error": work_error, "breaking": list(breaking), "check_run": report.run_dir,
            "rolling": req.rolling, "drain": req.drain, "trays": trays}


def describe_breaking(report: "DisruptionReport", breaking: Sequence[str], work: Sequence["RunningWork"],
                      work_error: str | None) -> str:
    """What the provisioning would disrupt under which work, the trays of one answer folded together:
    'lab-r1-tray[01-02]: nvidia_driver, imex (then a reboot) under job 12 user ... R on lab-r1-tray[01-02]'."""
    groups: dict[str, list[str]] = {}
    for t in breaking:
        d = report.trays[t]
        what = ", ".join(dict.fromkeys(x for c in d.changes for x in c.disrupts)) or "?"
        if d.unknown is not None:
            what = f"unknown changes ({d.unknown})" if what == "?" else f"{what}, and unknown ({d.unknown})"
        on = "; ".join(w.describe() for w in work_on(work, [t])) or f"work unknown ({work_error})"
        groups.setdefault(f"{what}{' (then a reboot)' if d.reboot else ''} under {on}", []).append(t)
    return "; ".join(f"{_fold(trays)}: {text}" for text, trays in groups.items())


def refusal(site: "Site", plan: "ProvisionPlan", req: ProvisionRequest, report: "DisruptionReport",
            breaking: Sequence[str], work: Sequence["RunningWork"], work_error: str | None,
            view: dict[str, Any]) -> ProvisionRefused:
    hit = work_on(work, breaking)
    rack = ", ".join(sorted({r.name for r in (site.rack_of(t) for t in breaking) if r is not None}))
    if work_error is not None:
        hint = "fix the scheduler's answer (the work on the trays must be known), or give --force"
    elif any(w.kind == "k8s" for w in hit):
        hint = "--drain holds trays in Slurm only; move the pods off the trays, or give --force"
    else:
        hint = ("wait for the jobs to end, or give --drain [--wait SECONDS] to hold the trays, wait for their "
                "jobs and provision them (--rolling N: N trays at a time), or --force to break them")
    return ProvisionRefused(f"rack {rack}: provisioning would disrupt running work: "
                            f"{describe_breaking(report, breaking, work, work_error)}; nothing was changed",
                            hint=hint, view=view)
