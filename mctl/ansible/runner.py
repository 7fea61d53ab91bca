"""Run playbooks through ansible-runner, one inspectable folder per run.

Each run gets `<state>/provision/runs/<id>/` (ansible-runner's private data dir):
`request.json` (what was asked), ansible-runner's `artifacts/<id>/` (exact
command, stdout, one JSON file per event, status, rc) and `recap.json` (per-host
result and, for failed hosts, the failing task and message). The inventory given
to Ansible is the site's own mctl.yml, read through mctl's inventory plugin, so
Ansible and mctl cannot disagree about hosts.

This is the one adapter that starts Ansible, for every service that runs a playbook
(provisioning, the Slurm deployment, the node check's install, bring-up): it sits in
layer 1 beside the inventory plugin Ansible loads, so no service reaches into another
service's package to run one (docs/decisions.md D58).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from mctl.errors import EnvironmentProblem, UsageError
from mctl.state import DamagedState, check_shape, ensure_dir, read_json, write_json

PACKAGE_DIR = Path(__file__).resolve().parents[1]
PLAYBOOKS_DIR = Path(os.environ.get("MCTL_PLAYBOOKS") or PACKAGE_DIR.parent / "playbooks")
CONTROL_BASE = Path("/tmp")              # where the ControlPath folder mctl-ssh-UID lives
KEEP_RUNS = 20                          # run folders kept per kind; MCTL_KEEP_RUNS overrides
# The operator's variables Ansible (and ssh under it) may see; everything else of mctl's environment
# (tokens, passwords, proxies, an operator's ANSIBLE_* overrides) stays out of the run and of the
# run folder, where ansible-runner records the environment it ran with.
ENV_ALLOW = ("HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "SSH_AUTH_SOCK",
             "VIRTUAL_ENV")                # and the locale's LC_* variables


@dataclass
class PlaybookRequest:
    playbook: str                      # name under playbooks/ or a path
    inventory: str                     # the site's mctl.yml
    limit: list[str] | None = None     # host names
    tags: list[str] | None = None
    skip_tags: list[str] | None = None
    check: bool = False
    diff: bool = False
    extravars: dict[str, Any] = field(default_factory=dict)
    forks: int = 50
    connect_timeout: float = 10


@dataclass
class HostRecap:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    failed_task: str | None = None
    message: str | None = None

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "changed" if self.changed else "ok"


@dataclass
class RunResult:
    run_id: str
    run_dir: str
    status: str                        # successful | failed | timeout | canceled
    rc: int | None
    started: float
    ended: float
    hosts: dict[str, HostRecap]
    check: bool = False

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, r in self.hosts.items() if r.status in ("failed", "unreachable"))

    @property
    def changed_total(self) -> int:
        return sum(r.changed for r in self.hosts.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failed_hosts"] = self.failed_hosts
        d["duration_s"] = round(self.ended - self.started, 2)
        for name, recap in self.hosts.items():
            d["hosts"][name]["status"] = recap.status
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        hosts = {h: HostRecap(**{k: v for k, v in r.items() if k != "status"}) for h, r in data["hosts"].items()}
        return cls(data["run_id"], data["run_dir"], data["status"], data["rc"], data["started"], data["ended"],
                   hosts, data.get("check", False))


@dataclass
class HostEvent:
    """A per-host event from the stream, for live progress."""

    host: str
    kind: str          # ok | changed | failed | unreachable | skipped | task
    task: str
    message: str | None = None


# The keys of a module's result that say what it changed (mctl_files, mctl_apt_components); a TaskChange keeps
# only these, so a change carries no file content or secret out of the run.
CHANGE_KEYS = ("changed_files", "components", "disrupts", "reboot")


@dataclass(frozen=True)
class TaskChange:
    """A task that changed something on a host (in check mode: would change it), as its event says: the
    role and task that declare what such a change does to running work (mctl.provision.disruption)."""

    host: str
    role: str                          # "" for a task of the playbook itself
    task: str
    action: str                        # the module (mctl_files, ansible.builtin.systemd_service, ...)
    result: dict[str, Any] = field(default_factory=dict)    # the CHANGE_KEYS the module reported


def playbook_path(name: str) -> Path:
    p = Path(name)
    if not p.is_absolute() and not p.exists():
        p = PLAYBOOKS_DIR / (name if name.endswith((".yml", ".yaml")) else f"{name}.yml")
    if not p.is_file():
        known = sorted(x.stem for x in PLAYBOOKS_DIR.glob("*.yml"))
        raise UsageError(f"unknown playbook {name!r}", hint=f"playbooks in {PLAYBOOKS_DIR}: {', '.join(known)}")
    return p.resolve()


def control_path_dir() -> Path:
    """The private folder for OpenSSH ControlMaster sockets (/tmp/mctl-ssh-UID, 0700, owned by this user).

    The name is predictable, so another user could make it first (and read or replace the sockets):
    a folder that is a link, not a folder, owned by someone else or open to others is refused.
    """
    uid = os.getuid()
    path = CONTROL_BASE / f"mctl-ssh-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create the SSH control folder {path}: {exc.strerror or exc}") from None
    hint = f"remove {path} (it must be a folder of yours with mode 0700) and run again"
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot check the SSH control folder {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise EnvironmentProblem(f"SSH control folder {path} is not a folder (a link or a file)", hint=hint)
    if st.st_uid != uid:
        raise EnvironmentProblem(f"SSH control folder {path} belongs to uid {st.st_uid}, not to this user ({uid})",
                                 hint=hint)
    if stat.S_IMODE(st.st_mode) != 0o700:
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise EnvironmentProblem(f"SSH control folder {path} is open to others "
                                     f"(mode {stat.S_IMODE(st.st_mode):04o})", hint=f"chmod 700 {path}")
        os.chmod(path, 0o700)
    return path


def ansible_env(connect_timeout: float = 10) -> dict[str, str]:
    """Environment that makes Ansible read mctl inventories and find the roles."""
    bindir = str(Path(sys.executable).parent)
    control_dir = control_path_dir()
    return {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_INVENTORY_PLUGINS": str(PACKAGE_DIR / "ansible" / "inventory_plugins"),
        "ANSIBLE_INVENTORY_ENABLED": "mctl,host_list,yaml,ini",
        "ANSIBLE_ROLES_PATH": str(PLAYBOOKS_DIR / "roles"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        # ServerAlive: a tray that stops answering mid-run must not hang the run on a shared master.
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=5 -o ServerAliveCountMax=2",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_TIMEOUT": str(max(1, int(connect_timeout))),
    }


def runner_env(prepared: dict[str, str], ours: dict[str, str],
               environ: "os._Environ[str] | dict[str, str] | None" = None) -> dict[str, str]:
    """The environment the ansible-playbook process gets: mctl's own settings, what ansible-runner itself
    added or changed (its callback plugin, artifact folder), and the allow-listed operator variables."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for key, value in prepared.items():
        if key in ours or key in ENV_ALLOW or key.startswith("LC_") or environ.get(key) != value:
            out[key] = value
    return out


def keep_runs() -> int:
    raw = os.environ.get("MCTL_KEEP_RUNS")
    if raw is None or raw == "":
        return KEEP_RUNS
    try:
        n = int(raw)
    except ValueError:
        raise UsageError(f"MCTL_KEEP_RUNS={raw!r} is not a whole number",
                         hint=f"set it to how many run folders to keep (default {KEEP_RUNS}, 0 keeps all)") from None
    if n < 0:
        raise UsageError(f"MCTL_KEEP_RUNS={raw!r} is negative", hint="0 keeps every run folder")
    return n


def prune_runs(state_dir: Path, kind: str = "provision", *, keep: int | None = None,
               protect: tuple[str, ...] = ()) -> list[Path]:
    """Delete the oldest finished run folders beyond *keep* (0: keep all). A folder without recap.json may
    belong to a run still going on (another rack), so it is pruned only once it is a day old."""
    keep = keep_runs() if keep is None else keep
    folder = Path(state_dir) / kind / "runs"
    if keep <= 0 or not folder.is_dir():
        return []
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    removed = []
    now = time.time()
    for old in runs[:-keep] if len(runs) > keep else []:
        if old.name in protect:
            continue
        finished = (old / "recap.json").is_file()
        try:
            stale = now - old.stat().st_mtime > 86400
        except OSError:
            continue
        if finished or stale:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


def check_ansible() -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "ansible-playbook").exists() and not shutil.which("ansible-playbook"):
        raise EnvironmentProblem("ansible-playbook is not installed",
                                 hint="install mctl with its dependencies (./scripts/install), which brings ansible-core")
    try:
        import ansible_runner  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(f"ansible-runner cannot be imported: {exc}",
                                 hint="reinstall mctl's dependencies: ./scripts/install") from None


def new_run_dir(state_dir: Path, kind: str = "provision") -> tuple[str, Path]:
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    run_dir = ensure_dir(Path(state_dir) / kind / "runs" / run_id)
    return run_id, run_dir


def run_playbook(req: PlaybookRequest, state_dir: Path, *, kind: str = "provision",
                 on_event: Callable[[HostEvent], None] | None = None,
                 on_change: Callable[[TaskChange], None] | None = None) -> RunResult:
    """Run *req* and return the per-host recap. Ctrl-C cancels the run cleanly. *on_change* is told every
    task that changed something (or, in check mode, would)."""
    check_ansible()
    from ansible_runner.interface import init_runner

    keep = keep_runs()                  # a bad MCTL_KEEP_RUNS is refused before anything runs
    playbook = playbook_path(req.playbook)
    run_id, run_dir = new_run_dir(state_dir, kind)
    write_json(run_dir / "request.json", {**asdict(req), "playbook": str(playbook)})
    hosts: dict[str, HostRecap] = {}
    cancel = threading.Event()

    def handle(event: dict[str, Any]) -> bool:
        _absorb(event, hosts, on_event, on_change)
        return True

    cmdline = []
    if req.check:
        cmdline.append("--check")
    if req.diff:
        cmdline.append("--diff")
    previous = signal.getsignal(signal.SIGINT)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGINT, lambda *_: cancel.set())
    started = time.time()
    ours = ansible_env(req.connect_timeout)
    try:
        runner = init_runner(
            private_data_dir=str(run_dir), ident=run_id, playbook=str(playbook), inventory=str(req.inventory),
            limit=",".join(req.limit) if req.limit else None, tags=",".join(req.tags) if req.tags else None,
            skip_tags=",".join(req.skip_tags) if req.skip_tags else None, extravars=req.extravars or None,
            cmdline=" ".join(cmdline) or None, forks=req.forks, envvars=ours, quiet=True,
            event_handler=handle, cancel_callback=cancel.is_set, project_dir=str(PLAYBOOKS_DIR),
        )
        # ansible-runner seeds the run with all of os.environ; keep only what Ansible needs.
        runner.config.env = runner_env(runner.config.env, ours)
        runner.run()
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    status = "canceled" if cancel.is_set() else runner.status
    result = RunResult(run_id, str(run_dir), status, runner.rc, started, time.time(), hosts, req.check)
    write_json(run_dir / "recap.json", result.to_dict())
    write_json(Path(state_dir) / kind / "last.json", {"run_id": run_id, "run_dir": str(run_dir)})
    prune_runs(state_dir, kind, keep=keep, protect=(run_id,))
    return result


def last_run(state_dir: Path, kind: str = "provision") -> RunResult | None:
    pointer = Path(state_dir) / kind / "last.json"
    if not pointer.is_file():
        return None
    data = read_json(pointer, expect=dict, what="the last-run pointer")
    check_shape(pointer, data.get("run_dir"), str, "run_dir")
    recap = Path(data["run_dir"]) / "recap.json"
    if not recap.is_file():
        return None
    return load_recap(recap)


_RECAP_TYPES = {"run_id": (str,), "run_dir": (str,), "status": (str,), "rc": (int, type(None)),
                "started": (int, float), "ended": (int, float), "hosts": (dict,), "check": (bool,)}
_HOST_TYPES = {"ok": (int,), "changed": (int,), "failed": (int,), "unreachable": (int,), "skipped": (int,),
               "failed_task": (str, type(None)), "message": (str, type(None)), "status": (str,)}


def load_recap(path: Path) -> RunResult:
    """A provisioning run's recap.json, its shape checked (a damaged one is named, exit 2)."""
    data = read_json(path, expect=dict, what="a provisioning recap")
    for key, types in _RECAP_TYPES.items():
        if key in data or key != "check":
            check_shape(path, data.get(key), types, key)
    for host, rec in data["hosts"].items():
        check_shape(path, rec, dict, f"hosts.{host}")
        for key, types in _HOST_TYPES.items():
            if key in rec:
                check_shape(path, rec[key], types, f"hosts.{host}.{key}")
        unknown = set(rec) - set(_HOST_TYPES) - {"host"}
        if unknown:
            raise DamagedState(path, f"hosts.{host} has unknown fields {', '.join(sorted(unknown))}")
    return RunResult.from_dict({**data, "hosts": {h: {**r, "host": h} for h, r in data["hosts"].items()}})


def _absorb(event: dict[str, Any], hosts: dict[str, HostRecap], on_event: Callable[[HostEvent], None] | None,
            on_change: Callable[[TaskChange], None] | None = None) -> None:
    kind = event.get("event", "")
    data = event.get("event_data") or {}
    host = data.get("host")
    task = data.get("task") or ""
    if kind == "playbook_on_stats":
        for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"),
                          ("dark", "unreachable"), ("skipped", "skipped")):
            for h, n in (data.get(key) or {}).items():
                setattr(hosts.setdefault(h, HostRecap(h)), attr, n)
        return
    if not host:
        return
    recap = hosts.setdefault(host, HostRecap(host))
    res = data.get("res") or {}
    if kind == "runner_on_failed" and not data.get("ignore_errors"):
        recap.failed_task = recap.failed_task or task
        recap.message = recap.message or _message(res)
        _emit(on_event, HostEvent(host, "failed", task, _message(res)))
    elif kind == "runner_on_unreachable":
        recap.failed_task = recap.failed_task or task
        recap.message = recap.message or _message(res)
        _emit(on_event, HostEvent(host, "unreachable", task, _message(res)))
    elif kind == "runner_on_ok":
        _emit(on_event, HostEvent(host, "changed" if res.get("changed") else "ok", task))
        if on_change is not None and res.get("changed"):
            on_change(TaskChange(host, str(data.get("role") or ""), task, str(data.get("task_action") or ""),
                                 {k: res[k] for k in CHANGE_KEYS if k in res}))
    elif kind == "runner_on_skipped":
        _emit(on_event, HostEvent(host, "skipped", task))


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
    if isinstance(msg, list):
        msg = "; ".join(map(str, msg))
    msg = str(msg).strip()
    return msg.splitlines()[0][:600] if msg else "failed (no message)"   # room for a component's apt errors


def _emit(cb: Callable[[HostEvent], None] | None, ev: HostEvent) -> None:
    if cb is not None:
        cb(ev)
