"""A provisioning rolled through a rack a batch of trays at a time, journaled and resumable.

    start_rollout(site, spec, state_dir, ui) -> RolloutRun       a new rollout (the caller holds the rack lock)
    resume_rollout(site, rack, state_dir, ui) -> RolloutRun      the rack's last rollout that did not finish

First the hosts whose changes are all harmless are provisioned at once, held by nobody ("free").
Then the trays with disruptive changes go in batches of N (`--rolling N`; plain `--drain`: one
batch of them all), each batch through the same steps:

    hold       holds.hold: the trays Slurm grants are taken out of service (reason 'mctl: provision
               RUN: ...'); one it refuses (drained by someone else, or beyond the site's safety budget)
               is not taken now: it goes back to the end of the queue, and a batch of which no tray
               can be taken stops the rollout, named
    wait       the jobs on the held trays end, within --wait seconds (else the rollout stops, held)
    provision  the playbook on the batch (mctl_reboot_after: the driver is checked after the reboot)
    reboot     the trays whose change takes effect at the next boot (the check pass or the run says so)
    verify     `mctl image diff`'s comparison with the image and the tray's node check pass
    release    the holds lifted

A tray that fails to provision or verify stays held (no job lands on it); the rest of its batch
goes on to release, then the rollout stops there. The journal (the bring-up's
mctl.bringup.journal.Journal, kind "provision-rollout", <state>/provision-rollout/<rack>/<run-id>/
journal.json) is written before and after every step and keeps the plan, the queue and each
tray's state, so a rollout stopped or killed at any point is finished by `--resume`, which retries
the failed trays first. See docs/decisions.md (D72, D73).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.bringup import journal as jr
from mctl.bringup.journal import Journal
from mctl.change.run import Outcome
from mctl.errors import MctlError, PartialFailure
from mctl.rollout.ui import RolloutUI

if TYPE_CHECKING:
    from mctl.model.site import Host, Site
    from mctl.provision.service import ProvisionPlan

REBOOT_TIMEOUT = 600.0          # seconds for a rebooted tray to answer with a new boot id
VERIFY_TIMEOUT = 300.0          # seconds for a provisioned (rebooted) tray to pass image diff and the node check
EXIT_INTERRUPTED = 130
STEPS = ("hold", "wait", "provision", "reboot", "verify", "release")
FREE = "free"
# A tray's states, in the order a batch moves it; failed: stays held, retried first by --resume.
PENDING, HELD, PROVISIONED, REBOOTED, VERIFIED, DONE, FAILED = (
    "pending", "held", "provisioned", "rebooted", "verified", "done", "failed")


class RolloutJournal(Journal):
    KIND = "provision-rollout"
    FOLDER = "provision-rollout"
    LABEL = "provisioning rollout"


class RolloutStopped(PartialFailure):
    """A step found what stops the rollout here (a wait past its deadline, no tray to take); --resume goes on."""


# ------------------------------------------------------------------ what a rollout is

@dataclass
class RolloutSpec:
    """One rollout as the journal keeps it (enough for a resume in another process)."""

    rack: str
    plan: dict[str, Any]                      # the ProvisionPlan's fields (playbook, hosts, tags, image, images)
    trays: tuple[str, ...]                    # the trays with disruptive changes, in the order they go
    free: tuple[str, ...] = ()                # hosts whose changes are all harmless
    unchanged: tuple[str, ...] = ()           # hosts the check pass found nothing to change on
    reboot: tuple[str, ...] = ()              # trays the check pass says need a reboot
    batch_size: int | None = None             # None: every disruptive tray in one batch (plain --drain)
    wait: float = 600.0
    reboot_timeout: float = REBOOT_TIMEOUT
    verify_timeout: float = VERIFY_TIMEOUT

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "plan": dict(self.plan), "trays": list(self.trays), "free": list(self.free),
                "unchanged": list(self.unchanged), "reboot": list(self.reboot), "batch_size": self.batch_size,
                "wait": self.wait, "reboot_timeout": self.reboot_timeout, "verify_timeout": self.verify_timeout}

    @classmethod
    def from_dict(cls, path: Path, d: Any) -> "RolloutSpec":
        from mctl.state.files import DamagedState

        try:
            names = lambda key: tuple(str(t) for t in d[key])  # noqa: E731
            plan = dict(d["plan"])
            for key, kind in (("playbook", str), ("inventory", str), ("hosts", list), ("images", dict)):
                if not isinstance(plan.get(key), kind):
                    raise TypeError(f"plan.{key} is not a {kind.__name__}")
            size = d["batch_size"]
            return cls(str(d["rack"]), plan, names("trays"), names("free"), names("unchanged"), names("reboot"),
                       None if size is None else int(size), float(d["wait"]), float(d["reboot_timeout"]),
                       float(d["verify_timeout"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DamagedState(path, f"the rollout it records cannot be read ({exc!r})") from None

    def provision_plan(self) -> "ProvisionPlan":
        from mctl.provision.service import ProvisionPlan

        p = self.plan
        return ProvisionPlan(playbook=str(p["playbook"]), inventory=str(p["inventory"]), hosts=list(p["hosts"]),
                             tags=p.get("tags"), image=p.get("image"), images=dict(p["images"]),
                             connect_timeout=float(p.get("connect_timeout", 10)), reboot_after=True)


def plan_fields(plan: "ProvisionPlan") -> dict[str, Any]:
    return {"playbook": plan.playbook, "inventory": plan.inventory, "hosts": list(plan.hosts), "tags": plan.tags,
            "image": plan.image, "images": dict(plan.images), "connect_timeout": plan.connect_timeout}


@dataclass
class RolloutRun:
    journal: RolloutJournal
    status: str                                   # succeeded | failed | interrupted
    exit_code: int
    resumed: bool = False
    error: MctlError | None = None

    def trays(self) -> dict[str, dict[str, Any]]:
        return self.journal.data["rollout"]["state"]

    def to_dict(self) -> dict[str, Any]:
        d = self.journal.data
        ro = d["rollout"]
        return {"rack": d["rack"], "run_id": d["run_id"], "journal": str(self.journal.path), "status": self.status,
                "exit_code": self.exit_code, "resumed": self.resumed, "batch_size": ro["spec"]["batch_size"],
                "free": ro["spec"]["free"], "unchanged": ro["spec"]["unchanged"], "trays": ro["state"],
                "batches": ro["batches"],
                "error": {"message": self.error.message, "hint": self.error.hint} if self.error else None,
                "steps": self.journal.phase_rows()}


# ------------------------------------------------------------------ the run

@dataclass
class _Ctx:
    site: "Site"
    spec: RolloutSpec
    journal: RolloutJournal
    ui: RolloutUI
    state_dir: Path
    cache: dict = field(default_factory=dict)

    @property
    def ro(self) -> dict[str, Any]:
        return self.journal.data["rollout"]

    def state(self, tray: str) -> dict[str, Any]:
        return self.ro["state"][tray]

    def set(self, trays: Sequence[str], status: str, **more: Any) -> None:
        for t in trays:
            self.state(t).update(status=status, **more)
        self.journal.save()

    def hosts(self, names: Sequence[str]) -> list["Host"]:
        by = {h.name: h for h in self.site.hosts()}
        return [by[n] for n in names if n in by]

    def batch(self, number: int) -> dict[str, Any]:
        return self.ro["batches"][number - 1]

    def taking(self, number: int, *states: str) -> list[str]:
        """The batch's trays (those it took) that are in one of *states*."""
        return [t for t in self.batch(number)["trays"] if self.state(t)["status"] in states]

    @property
    def run_id(self) -> str:
        return self.journal.run_id


def start_rollout(site: "Site", spec: RolloutSpec, state_dir: Path, ui: RolloutUI | None = None) -> RolloutRun:
    """Journal a new rollout and run it; the caller holds the rack lock. Never raises for a failed step."""
    ui = ui or RolloutUI()
    phases = [FREE] if spec.free else []
    journal = RolloutJournal.create(Path(state_dir), site.name, str(site.file), spec.rack, phases, phases, {})
    journal.data["rollout"] = {"spec": spec.to_dict(), "queue": list(spec.trays), "batches": [],
                               "state": {t: {"status": PENDING, "batch": None, "reboot": t in spec.reboot,
                                             "boot_id": None, "error": None} for t in spec.trays},
                               "free": {h: PENDING for h in spec.free}}
    journal.save()
    return _run(site, spec, journal, ui, state_dir, resumed=False)


def last_rollout(state_dir: Path, rack: str) -> RolloutJournal | None:
    runs = RolloutJournal.by_time(RolloutJournal.runs(Path(state_dir), rack))
    return runs[-1] if runs else None  # type: ignore[return-value]


def resume_rollout(site: "Site", rack: str, state_dir: Path, ui: RolloutUI | None = None) -> RolloutRun:
    """Finish the last rollout of *rack*: the step it stopped at, its failed trays first, then the rest."""
    ui = ui or RolloutUI()
    last = RolloutJournal.to_resume(state_dir, rack, none_hint=f"start one: mctl provision {rack} --drain [--rolling N]",
                                    finished_hint=f"see 'mctl image diff {rack}'",
                                    damaged_hint=f"then check 'mctl image diff {rack}' and provision again")
    if not isinstance(last.data.get("rollout"), dict):
        from mctl.state.files import DamagedState
        raise DamagedState(last.path, "it records no rollout")
    spec = RolloutSpec.from_dict(last.path, last.data["rollout"].get("spec"))
    _check_state(last)
    last.attempt()
    ro = last.data["rollout"]
    retry = [t for t in ro["queue"] if ro["state"][t]["status"] == FAILED]
    for t in retry:                                # the failed trays go first; they are still held
        ro["state"][t].update(status=PENDING, batch=None, boot_id=None, error=None)
    ro["queue"] = retry + [t for t in ro["queue"] if t not in retry]
    for h, st in ro["free"].items():
        if st == FAILED:
            ro["free"][h] = PENDING
    _hold_again(last)
    last.save()
    done = [t for t, s in ro["state"].items() if s["status"] == DONE]
    ui.note(f"resuming provisioning rollout {last.run_id} of rack {rack}: {len(done)} of {len(ro['state'])} "
            f"trays done" + (f", retrying {', '.join(retry)} first" if retry else ""))
    return _run(site, spec, last, ui, state_dir, resumed=True)


def _hold_again(journal: RolloutJournal) -> None:
    """A batch stopped past its hold takes its trays again and waits for their work before it goes on: a hold
    lifted by hand meanwhile, and a job that landed then, are never run over."""
    unfinished = [p["name"] for p in journal.data["phases"] if p["status"] not in jr.FINISHED and ":" in p["name"]]
    if not unfinished:
        return
    number = _parse_phase(unfinished[0])[0]
    for step in ("hold", "wait"):
        p = journal.phase(f"batch-{number}:{step}")
        if p["status"] in (jr.DONE, jr.SKIPPED) and unfinished[0] != p["name"]:
            p["status"] = jr.PENDING


def _check_state(journal: RolloutJournal) -> None:
    from mctl.state.files import DamagedState

    ro = journal.data["rollout"]
    try:
        states = ro["state"]
        for key in ("queue", "batches"):
            if not isinstance(ro[key], list):
                raise TypeError(key)
        for t in ro["queue"]:
            if states[t]["status"] not in (PENDING, HELD, PROVISIONED, REBOOTED, VERIFIED, DONE, FAILED):
                raise ValueError(f"{t}: {states[t]['status']!r}")
        if not isinstance(ro["free"], dict):
            raise TypeError("free")
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedState(journal.path, f"the rollout's state cannot be read ({exc!r})") from None


def _next_batch(ctx: _Ctx) -> int | None:
    """Append the next batch (its trays and steps) to the journal; its number, or None when no tray waits."""
    pending = [t for t in ctx.ro["queue"] if ctx.state(t)["status"] == PENDING]
    if not pending:
        return None
    size = ctx.spec.batch_size or len(pending)
    number = len(ctx.ro["batches"]) + 1
    trays = pending[:size]
    ctx.ro["batches"].append({"number": number, "asked": trays, "trays": trays, "refused": {}})
    for step in STEPS:
        ctx.journal.data["phases"].append({"name": f"batch-{number}:{step}", "status": jr.PENDING, "started": None,
                                           "ended": None, "summary": None, "changed": False, "details": [],
                                           "artifacts": {}, "error": None})
    ctx.journal.save()
    ctx.ui.batch(number, trays)
    return number


def _run(site: "Site", spec: RolloutSpec, journal: RolloutJournal, ui: RolloutUI, state_dir: Path, *,
         resumed: bool) -> RolloutRun:
    ctx = _Ctx(site, spec, journal, ui, Path(state_dir))
    while True:
        todo = [p for p in journal.phase_names() if journal.phase(p)["status"] not in jr.FINISHED]
        if not todo:
            stop = _failed_in_last_batch(ctx)
            if stop is not None:
                journal.close(jr.RUN_FAILED, {"error": stop.message, "hint": stop.hint})
                return RolloutRun(journal, jr.RUN_FAILED, stop.exit_code, resumed, stop)
            if _next_batch(ctx) is None:
                break
            continue
        name = todo[0]
        number, step = _parse_phase(name)
        trays = ctx.batch(number)["trays"] if number else list(spec.free)
        ui.step_started(number, step, trays)
        journal.start(name)
        started = time.monotonic()
        try:
            outcome = _STEPS[step](ctx, number)
        except KeyboardInterrupt:
            journal.finish(name, jr.INTERRUPTED, "interrupted")
            journal.close(jr.RUN_INTERRUPTED)
            ui.step_ended(number, step, jr.INTERRUPTED, "interrupted", time.monotonic() - started)
            err = MctlError(f"rack {spec.rack}: the provisioning rollout {journal.run_id} was interrupted at {name}",
                            hint=_resume_hint(ctx), exit_code=EXIT_INTERRUPTED)
            return RolloutRun(journal, jr.RUN_INTERRUPTED, EXIT_INTERRUPTED, resumed, err)
        except MctlError as exc:
            journal.finish(name, jr.FAILED, exc.message, error={"message": exc.message, "hint": exc.hint,
                                                                  "exit_code": exc.exit_code})
            ui.step_ended(number, step, jr.FAILED, exc.message, time.monotonic() - started)
            hint = (exc.hint + "; " if exc.hint else "") + _resume_hint(ctx)
            err = RolloutStopped(f"rack {spec.rack}: the provisioning rollout stopped at {name}: {exc.message}",
                                 hint=hint)
            journal.close(jr.RUN_FAILED, {"error": err.message, "hint": err.hint})
            return RolloutRun(journal, jr.RUN_FAILED, err.exit_code, resumed, err)
        except BaseException as exc:
            journal.crashed(name, exc)
            raise
        journal.finish(name, outcome.status, outcome.summary, changed=outcome.changed, details=outcome.details,
                       artifacts=outcome.artifacts)
        ui.step_ended(number, step, outcome.status, outcome.summary, time.monotonic() - started)
    journal.close(jr.RUN_SUCCEEDED, None)
    return RolloutRun(journal, jr.RUN_SUCCEEDED, 0, resumed, None)


def _parse_phase(name: str) -> tuple[int, str]:
    if name == FREE:
        return 0, FREE
    head, step = name.split(":", 1)
    return int(head.split("-", 1)[1]), step


def _resume_hint(ctx: _Ctx) -> str:
    held = [t for t, s in ctx.ro["state"].items() if s["status"] in (HELD, PROVISIONED, REBOOTED, VERIFIED, FAILED)
            and s.get("batch")]
    from mctl.model.site import fold

    return (f"{fold(held)} stay held in Slurm meanwhile; " if held else "") + \
        f"once fixed, finish it with 'mctl provision {ctx.spec.rack} --resume' (journal {ctx.journal.path})"


def _failed_in_last_batch(ctx: _Ctx) -> PartialFailure | None:
    """The stop after a batch in which some trays failed (the others were released)."""
    from mctl.model.site import fold

    if not ctx.ro["batches"]:
        return None
    number = ctx.ro["batches"][-1]["number"]
    failed = ctx.taking(number, FAILED)
    if not failed:
        return None
    said = "; ".join(f"{t}: {ctx.state(t)['error']}" for t in failed)
    done = ctx.taking(number, DONE)
    return RolloutStopped(f"rack {ctx.spec.rack}: batch {number} failed on {fold(failed)} ({said}); "
                          f"{fold(done) + ' released, ' if done else ''}{fold(failed)} stay held; the rollout "
                          "stops here", hint=f"fix the trays, then finish it with 'mctl provision {ctx.spec.rack} "
                                              f"--resume' (it retries them first; journal {ctx.journal.path})")


# ------------------------------------------------------------------ the steps

def _slurm_why_not(ctx: _Ctx) -> str | None:
    """Why holds do not apply to this site (None: they do)."""
    import shlex

    from mctl.sched.slurm.control import controller_run
    from mctl.sched.slurm.render import settings_of

    site = ctx.site
    if site.scheduler is None:
        return "the site names no scheduler, so no job can run on the trays"
    if site.scheduler.type != "slurm":
        return f"the site's scheduler is {site.scheduler.type}: holds are Slurm's"
    if "slurm" not in ctx.cache:
        conf = shlex.quote(settings_of(site).conf_dir.rstrip("/") + "/slurm.conf")
        result = controller_run(site, f"if [ -e {conf} ]; then echo deployed; else echo absent; fi")
        ctx.cache["slurm"] = result.stdout.strip() == "deployed"
    return None if ctx.cache["slurm"] else "Slurm is not deployed yet (no slurm.conf on the controller)"


def _playbook(ctx: _Ctx, hosts: Sequence[str], *, reboot_after: bool):
    """Run the plan on *hosts*; (the run, {host: why it failed}, {host: whether a change needs a reboot})."""
    from dataclasses import replace

    from mctl.ansible.runner import PLAYBOOKS_DIR, run_playbook
    from mctl.provision.disruption import declarations, judge

    plan = replace(ctx.spec.provision_plan().only(hosts), reboot_after=reboot_after)
    changes: list = []
    result = run_playbook(plan.request(), ctx.state_dir, on_event=ctx.ui.event,
                          on_change=changes.append)
    if result.status == "canceled":
        raise KeyboardInterrupt
    failed = {h: f"{r.status} at task '{r.failed_task}': {r.message}" for h, r in result.hosts.items()
              if r.status in ("failed", "unreachable")}
    if result.status != "successful":
        failed.update({h: f"the run ended {result.status} (rc {result.rc}) before it reached the host"
                       for h in hosts if h not in result.hosts})
    report = judge(changes, list(hosts), {}, declarations(PLAYBOOKS_DIR))
    return result, failed, {h: report.trays[h].reboot for h in hosts}


def _free(ctx: _Ctx, _number: int) -> Outcome:
    from mctl.model.site import fold

    todo = [h for h, st in ctx.ro["free"].items() if st != DONE]
    if not todo:
        return Outcome(jr.DONE, "nothing left to provision")
    result, failed, _reboot = _playbook(ctx, todo, reboot_after=False)
    for h in todo:
        ctx.ro["free"][h] = FAILED if h in failed else DONE
    ctx.journal.save()
    artifacts = {"run_id": result.run_id, "run_dir": result.run_dir}
    if failed:
        raise PartialFailure(f"provisioning {fold(failed)} (harmless changes only, held by nobody) failed: "
                             + "; ".join(f"{h}: {w}" for h, w in failed.items()),
                             hint=f"run folder {result.run_dir}")
    return Outcome(jr.DONE, f"provisioned {fold(todo)} (harmless changes only: nothing held)", True,
                   artifacts=artifacts)


def _hold(ctx: _Ctx, number: int) -> Outcome:
    from mctl.model.site import fold
    from mctl.sched.slurm import holds

    b = ctx.batch(number)
    # a resume holds the batch again (a tray released by hand meanwhile is taken back before anything runs)
    asked = [t for t in b["asked"] if ctx.state(t)["status"] not in (DONE, FAILED)
             and ctx.state(t)["batch"] in (None, number)]
    why = _slurm_why_not(ctx)
    if why is not None:
        b["trays"] = asked
        ctx.set([t for t in asked if ctx.state(t)["status"] == PENDING], HELD, batch=number)
        return Outcome(jr.SKIPPED, f"not applicable: {why}")
    held, refused = holds.hold(ctx.site, asked, holds.PROVISION, holds.provision_reason(ctx.run_id))
    b["trays"], b["refused"] = list(held), dict(refused)
    ctx.set([t for t in held if ctx.state(t)["status"] == PENDING], HELD, batch=number)
    if refused:                               # not taken now: back to the end of the queue, still pending
        ctx.ro["queue"] = [t for t in ctx.ro["queue"] if t not in refused] + list(refused)
        ctx.set(list(refused), PENDING, batch=None, boot_id=None)
    details = [f"{t} not taken now: {w}" for t, w in refused.items()]
    if not held:
        raise PartialFailure(f"no tray of batch {number} could be taken out of service now: "
                             + "; ".join(f"{t}: {w}" for t, w in refused.items()) + "; nothing was changed on them",
                             hint="once they can be held (a drain lifted, the safety budget free again)")
    return Outcome(jr.DONE, f"held {fold(held)} in Slurm" + (f"; not taken now: {fold(refused)}" if refused else ""),
                   True, details, {"held": list(held), "refused": dict(refused)})


def _wait(ctx: _Ctx, number: int) -> Outcome:
    from mctl.model.change import work_on
    from mctl.model.site import fold
    from mctl.sched.slurm.holds import release_command
    from mctl.sched.work import slurm_jobs, wait_for_jobs

    trays = ctx.taking(number, HELD, PROVISIONED, REBOOTED, VERIFIED)
    if not trays:
        return Outcome(jr.SKIPPED, "no tray held in this batch")
    if _slurm_why_not(ctx) is not None:
        return Outcome(jr.SKIPPED, f"not applicable: {_slurm_why_not(ctx)}")
    seen = work_on(slurm_jobs(ctx.site), trays)
    started = time.monotonic()
    left = wait_for_jobs(ctx.site, trays, ctx.spec.wait, on_wait=ctx.ui.waiting) if seen else []
    if left:
        raise PartialFailure(f"the jobs on {fold(trays)} did not end within {ctx.spec.wait:g}s: "
                             f"{'; '.join(w.describe() for w in left)}; nothing was changed on those trays, and "
                             f"they stay held", hint=f"--resume goes on waiting; or release them: {release_command(trays)}")
    said = [f"waited for {w.describe()}" for w in seen]
    return Outcome(jr.DONE, (f"the work on {fold(trays)} ended after {time.monotonic() - started:.0f}s" if seen
                             else f"no work on {fold(trays)}"), False, said,
                   {"jobs": [w.to_dict() for w in seen]})


def _provision(ctx: _Ctx, number: int) -> Outcome:
    trays = ctx.taking(number, HELD, PROVISIONED)
    if not trays:
        return Outcome(jr.SKIPPED, "no tray held in this batch")
    result, failed, reboot = _playbook(ctx, trays, reboot_after=True)
    for t in trays:
        st = ctx.state(t)
        st["reboot"] = bool(st.get("reboot")) or reboot.get(t, False)
    out = _settle(ctx, trays, {t: f"provisioning {w}" for t, w in failed.items()}, PROVISIONED, "provisioned")
    out.artifacts = {"run_id": result.run_id, "run_dir": result.run_dir}
    return out


def _settle(ctx: _Ctx, trays: Sequence[str], failed: dict[str, str], status: str, verb: str, *,
            changed: bool = True, said: str = "") -> Outcome:
    """The step's end for each tray: *status*, or failed with why (it stays held); the step's outcome."""
    from mctl.model.site import fold

    for t in trays:
        if t in failed:
            ctx.state(t).update(status=FAILED, error=failed[t])
        else:
            ctx.state(t).update(status=status)
    ctx.journal.save()
    good = [t for t in trays if t not in failed]
    return Outcome(jr.DONE, f"{verb} {fold(good) if good else 'no tray'}{said}"
                   + (f"; failed: {fold(failed)} (stay held)" if failed else ""), changed and bool(good),
                   [f"{t}: {w}" for t, w in failed.items()])


def _reboot(ctx: _Ctx, number: int) -> Outcome:
    from mctl.rollout import tray

    need = [t for t in ctx.taking(number, PROVISIONED) if ctx.state(t).get("reboot")]
    if not need:
        return Outcome(jr.SKIPPED, "no change of this batch needs a reboot")
    unknown = [t for t in need if not ctx.state(t).get("boot_id")]
    ids, unreadable = tray.boot_ids(ctx.site, ctx.hosts(unknown))
    for t in unknown:
        if t in ids:
            ctx.state(t)["boot_id"] = ids[t]          # before the reboot is asked: a resume can tell it happened
        else:
            ctx.state(t).update(status=FAILED, error=f"boot id not read before the reboot: {unreadable.get(t)}")
    ctx.journal.save()
    need = [t for t in need if ctx.state(t)["status"] == PROVISIONED]
    now, _ = tray.boot_ids(ctx.site, ctx.hosts(need))
    ask = [t for t in need if now.get(t) == ctx.state(t)["boot_id"]]      # not rebooted yet (nor going down)
    refused = tray.send_reboot(ctx.site, ctx.hosts(ask))
    waiting = [t for t in need if t not in refused]
    late = tray.wait_rebooted(ctx.site, ctx.hosts(waiting), {t: ctx.state(t)["boot_id"] for t in waiting},
                              ctx.spec.reboot_timeout)
    return _settle(ctx, need, {**{t: f"reboot not asked: {w}" for t, w in refused.items()},
                               **{t: f"reboot: {w}" for t, w in late.items()}}, REBOOTED, "rebooted")


def _verify(ctx: _Ctx, number: int) -> Outcome:
    from mctl.images import ImageCatalog
    from mctl.rollout import tray

    trays = ctx.taking(number, PROVISIONED, REBOOTED, VERIFIED)
    if not trays:
        return Outcome(jr.SKIPPED, "no tray of this batch left to verify")
    catalog = ImageCatalog(ctx.site.images_dir)
    images = {t: catalog.get(name) for t, name in ctx.spec.plan["images"].items() if t in trays and name}
    failed = tray.verify_until(ctx.site, ctx.hosts(trays), images, ctx.spec.verify_timeout)
    return _settle(ctx, trays, {t: f"not verified: {w}" for t, w in failed.items()}, VERIFIED, "verified",
                   changed=False, said=" (image diff matches, node check passes)")


def _release(ctx: _Ctx, number: int) -> Outcome:
    from mctl.model.site import fold
    from mctl.sched.slurm import holds
    from mctl.sched.slurm.control import controller_run

    trays = ctx.taking(number, VERIFIED)
    if not trays:
        return Outcome(jr.SKIPPED, "no verified tray to release")
    if _slurm_why_not(ctx) is not None:
        ctx.set(trays, DONE)
        return Outcome(jr.SKIPPED, f"not applicable: {_slurm_why_not(ctx)}")
    nodes = holds.classify(controller_run(ctx.site, holds.show_command(trays)).stdout, trays, holds.PROVISION)
    ours = [t for t in trays if t in nodes.held]
    failed = holds.release(ctx.site, ours, holds.PROVISION)
    gone = [t for t in trays if t not in ours and t in nodes.open]       # someone lifted the hold already
    ctx.set([t for t in ours if t not in failed] + gone, DONE)
    stuck = {**failed, **{t: f"no longer held by mctl provision and not open: {nodes.states.get(t, 'unknown')}"
                          for t in trays if t not in ours and t not in gone}}
    if stuck:
        raise PartialFailure(f"{fold(stuck)} provisioned and verified but not released: "
                             + "; ".join(f"{t}: {w}" for t, w in stuck.items()),
                             hint=holds.release_command(list(stuck)))
    return Outcome(jr.DONE, f"released {fold(trays)} in Slurm", True)


_STEPS: dict[str, Callable[[_Ctx, int], Outcome]] = {
    FREE: _free, "hold": _hold, "wait": _wait, "provision": _provision, "reboot": _reboot, "verify": _verify,
    "release": _release}
