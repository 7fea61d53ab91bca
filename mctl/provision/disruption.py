"""Disruptive changes told from harmless ones, from the plan, before provisioning runs.

Every task of the roles in playbooks/ that can change something declares with a tag what a change
of it does to running work (docs/decisions.md D71):

    disruptive   it replaces, removes or restarts something work uses (the driver, IMEX, slurmd, MUNGE)
    harmless     it touches nothing work uses live (a file read at the next start, a unit enabled)
    reboot       beside either: the change takes effect at the next boot (the driver, kernel parameters)

A task's module may narrow its declaration by what it reports: `disrupts` and `reboot` (lists of
what it changed, in mctl_apt_components: the components) say which of its changes disrupt and need
a reboot; empty lists mean none. A task that changed and declares nothing counts as disruptive,
named as undeclared, so a new task can never slip under running work unseen.

    declarations(playbooks_dir) -> {(role, task): Declaration}     the tags, read from the YAML
    undeclared(playbooks_dir) -> [(file, task)]                    tasks that can change and declare nothing
    judge(changes, failed, declared) -> DisruptionReport           pure: the check pass's changes, judged

The check pass itself (ansible-runner in check mode) is mctl.provision.service.check_disruption.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import yaml

from mctl.model.disruption import (DECLARATIONS, DISRUPTIVE, HARMLESS, REBOOT, Change, Declaration,
                                   DisruptionReport, TrayDisruption)

if TYPE_CHECKING:
    from mctl.ansible.runner import TaskChange

# Modules whose task changes nothing, and the keywords of a task that are not its module.
READ_ONLY = {"assert", "set_fact", "include_vars", "stat", "debug", "fail", "meta", "include_role", "import_role",
             "include_tasks", "import_tasks", "pause", "wait_for", "find", "slurp", "setup"}
KEYWORDS = {"name", "tags", "when", "register", "vars", "notify", "loop", "loop_control", "changed_when",
            "failed_when", "check_mode", "delegate_to", "run_once", "no_log", "retries", "delay", "until",
            "become", "become_user", "ignore_errors", "environment", "args", "listen", "with_items", "diff",
            "block", "rescue", "always", "any_errors_fatal", "throttle", "timeout", "module_defaults"}


def _tags(task: Mapping[str, Any]) -> set[str]:
    raw = task.get("tags") or []
    if isinstance(raw, str):
        raw = raw.split(",")
    return {str(t).strip() for t in raw}


def _module(task: Mapping[str, Any]) -> str:
    for key in task:
        if key not in KEYWORDS:
            return str(key).rsplit(".", 1)[-1]
    return ""


def _walk(tasks: Any) -> Iterator[Mapping[str, Any]]:
    """Every task of a task list, those inside blocks included."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if "block" in task:
            for part in ("block", "rescue", "always"):
                yield from _walk(task.get(part))
        else:
            yield task


def _task_files(playbooks_dir: Path) -> Iterator[tuple[str, Path, list]]:
    """(role, file, tasks) for every task file of every role, and ("", playbook, tasks) for each play's own."""
    for path in sorted((playbooks_dir / "roles").glob("*/*/*.yml")):
        if path.parent.name in ("tasks", "handlers"):
            yield path.parent.parent.name, path, yaml.safe_load(path.read_text()) or []
    for path in sorted(playbooks_dir.glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            if isinstance(play, dict):
                for part in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                    yield "", path, play.get(part) or []


def can_change(task: Mapping[str, Any]) -> bool:
    """Whether a run of *task* can report a change (so it must declare what the change does)."""
    return _module(task) not in READ_ONLY and task.get("changed_when") is not False


@functools.lru_cache(maxsize=8)
def declarations(playbooks_dir: Path) -> dict[tuple[str, str], Declaration]:
    """{(role, task name): what a change of it does}, for every task that declares it."""
    out: dict[tuple[str, str], Declaration] = {}
    for role, _path, tasks in _task_files(Path(playbooks_dir)):
        for task in _walk(tasks):
            tags = _tags(task)
            if tags & set(DECLARATIONS) and task.get("name"):
                out[(role, str(task["name"]))] = Declaration(DISRUPTIVE in tags, REBOOT in tags)
    return out


def undeclared(playbooks_dir: Path) -> list[tuple[str, str]]:
    """(file, task) of every task that can change something and declares neither or both of
    disruptive and harmless, or has no name (a declaration is found by the task's name)."""
    out = []
    for _role, path, tasks in _task_files(Path(playbooks_dir)):
        for task in _walk(tasks):
            if not can_change(task):
                continue
            said = _tags(task) & set(DECLARATIONS)
            if len(said) != 1 or not task.get("name"):
                out.append((str(path.relative_to(playbooks_dir)), str(task.get("name") or _module(task))))
    return out


def _detail(result: Mapping[str, Any]) -> str:
    """What a task changed, in one line, from the keys its module reports."""
    comps = result.get("components")
    if isinstance(comps, dict):
        parts = []
        for name, rec in comps.items():
            if not isinstance(rec, dict):
                continue
            moved = [f"installs {', '.join(map(str, rec.get('installed') or []))}" if rec.get("installed") else "",
                     f"removes {', '.join(map(str, rec.get('removed') or []))}" if rec.get("removed") else ""]
            moved = [m for m in moved if m]
            if moved:
                parts.append(f"{name}: {'; '.join(moved)}")
        if parts:
            return " | ".join(parts)
    files = result.get("changed_files")
    if isinstance(files, list) and files:
        return "writes " + ", ".join(map(str, files))
    return ""


def _names(value: Any) -> tuple[str, ...] | None:
    return tuple(str(v) for v in value) if isinstance(value, list) else None


def judge_change(change: "TaskChange", declared: Mapping[tuple[str, str], Declaration]) -> Change:
    """One task's change, judged by its declaration (narrowed by what its module reports)."""
    label = f"{change.role}: {change.task}" if change.role else change.task
    detail = _detail(change.result)
    decl = declared.get((change.role, change.task))
    if decl is None:
        return Change(label, (f"undeclared task {label!r}",), False, detail, undeclared=True)
    disrupts: tuple[str, ...] = (label,) if decl.disruptive else ()
    narrowed = _names(change.result.get("disrupts"))
    if decl.disruptive and narrowed is not None:
        disrupts = narrowed
    reboot = decl.reboot
    reboots = _names(change.result.get("reboot"))
    if decl.reboot and reboots is not None:
        reboot = bool(reboots)
    return Change(label, disrupts, reboot, detail)


def judge(changes: Iterable["TaskChange"], hosts: Sequence[str], failed: Mapping[str, str],
          declared: Mapping[tuple[str, str], Declaration], run_dir: str | None = None) -> DisruptionReport:
    """The check pass's changes per host, judged; a host in *failed* ({host: why}) is unknown."""
    by_host: dict[str, list[Change]] = {h: [] for h in hosts}
    for c in changes:
        by_host.setdefault(c.host, []).append(judge_change(c, declared))
    return DisruptionReport({h: TrayDisruption(h, tuple(by_host.get(h, ())), failed.get(h)) for h in hosts}, run_dir)
