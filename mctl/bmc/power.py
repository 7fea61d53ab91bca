"""Tray power through the BMCs: `mctl power status|on|off|cycle` and `mctl rack power on|off` (docs/bmc.md).

One Redfish `ComputerSystem.Reset` per tray and step, POSTed once (mctl.bmc.client: the library's
retries are off; a reset whose answer is lost is never sent again: the state is read instead).

    off    GracefulShutdown where the OS answers (SSH reaches the tray), then ForceOff if the
           tray is still on after the graceful wait; ForceOff at once where the OS does not
           answer. Done when Redfish says Off and SSH no longer reaches the tray.
    on     On. Done when Redfish says On and SSH reaches the tray (the OS booted).
    cycle  PowerCycle of a tray that is on (On of one that is off). Done when Redfish says On and
           SSH reaches the tray with a new boot id.

Rack order (DGX GB200 and Mission Control bring-up; NICo's rack power): power shelves, then switch
trays, then compute trays for on; the reverse for off. A stage starts only when every tray of the
previous one reported its state; a stage with a failed tray stops the sequence (the later stages
are reported as not started). mctl has no power-shelf model in the inventory, so that stage says so
and acts on nothing.

Work: a tray with running Slurm jobs or GPU pods (mctl.sched.work) is refused for off and cycle
unless --force; a queue that cannot be read refuses every tray (unknown work is work, D24). Drain
the tray and let its jobs end, or give --force.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.bmc.client import ROOT, BMCError, RedfishClient, base_url, clean, link, warn_once
from mctl.errors import EXIT_OK, EXIT_PARTIAL

if TYPE_CHECKING:
    from mctl.bmc.inventory import Settings
    from mctl.model.site import Host, Site

ACTIONS = ("status", "on", "off", "cycle")
ON_ORDER = ("power_shelf", "switch", "compute")
POLL_S = 0.5
DEFAULT_GRACEFUL_S = 60.0
DEFAULT_STAGE_S = 600.0
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@dataclass
class TrayPower:
    host: str
    role: str
    bmc: str | None
    url: str | None = None
    before: str | None = None                 # Redfish PowerState when mctl looked first
    after: str | None = None                  # ... when mctl finished with the tray
    os_answered: bool | None = None           # SSH reached the tray before the action
    os_after: bool | None = None              # ... after it
    sent: list[str] = field(default_factory=list)       # ResetType values POSTed, in order, once each
    ok: bool = False
    refused: str | None = None                # not touched: running work (no --force)
    error_kind: str | None = None
    error: str | None = None
    elapsed: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stage:
    name: str                                 # power_shelf | switch | compute
    trays: list[TrayPower]
    state: str = "pending"                    # pending, done, failed, skipped (nothing to do), not-started
    note: str | None = None
    elapsed: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "note": self.note, "elapsed": round(self.elapsed, 3),
                "trays": [t.to_dict() for t in self.trays]}


@dataclass
class PowerReport:
    action: str
    stages: list[Stage]
    dry_run: bool = False
    work: list[dict[str, Any]] = field(default_factory=list)
    work_error: str | None = None
    elapsed: float = 0.0

    @property
    def trays(self) -> list[TrayPower]:
        return [t for s in self.stages for t in s.trays]

    @property
    def failed(self) -> list[TrayPower]:
        return [t for t in self.trays if not self.dry_run and not t.ok]

    @property
    def exit_code(self) -> int:
        return EXIT_PARTIAL if self.failed else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "dry_run": self.dry_run, "elapsed": round(self.elapsed, 3),
                "stages": [s.to_dict() for s in self.stages], "work": self.work, "work_error": self.work_error,
                "failed": [t.host for t in self.failed]}


# ------------------------------------------------------------------ Redfish: one tray's host system

@dataclass
class HostSystem:
    path: str
    power_state: str | None
    reset_target: str | None
    reset_types: tuple[str, ...] | None       # None: the BMC did not say


def host_system(client: RedfishClient) -> HostSystem:
    """The tray's host ComputerSystem (System_0 on GB200 trays, else the first with a Reset action)."""
    root = client.get(ROOT)
    systems = root.get("Systems")
    if systems is None:
        raise BMCError("malformed", "the service root links no Systems")
    members = client.members(link(systems, "root Systems"))
    if not members:
        raise BMCError("malformed", "the BMC lists no system")
    members.sort(key=lambda p: (p.rsplit("/", 1)[-1] != "System_0", p))
    first: HostSystem | None = None
    for path in members:
        doc = client.get(path)
        state = doc.get("PowerState")
        state = clean(state, 32) if isinstance(state, str) else None
        action = (doc.get("Actions") or {}).get("#ComputerSystem.Reset") if isinstance(doc.get("Actions"), dict) \
            else None
        target = action.get("target") if isinstance(action, dict) else None
        if not isinstance(target, str):
            first = first or HostSystem(path, state, None, None)
            continue
        return HostSystem(path, state, target, _reset_types(client, action))
    assert first is not None
    return first


def _reset_types(client: RedfishClient, action: dict[str, Any]) -> tuple[str, ...] | None:
    inline = action.get("ResetType@Redfish.AllowableValues")
    if isinstance(inline, list):
        return tuple(str(v) for v in inline if isinstance(v, str))
    info = action.get("@Redfish.ActionInfo")
    if isinstance(info, str):
        try:
            doc = client.get(info)
        except BMCError as exc:
            if exc.kind == "http" and exc.status == 404:
                return None
            raise
        for p in doc.get("Parameters") or []:
            if isinstance(p, dict) and p.get("Name") == "ResetType" and isinstance(p.get("AllowableValues"), list):
                return tuple(str(v) for v in p["AllowableValues"] if isinstance(v, str))
    return None


def send_reset(client: RedfishClient, system: HostSystem, reset_type: str, tray: TrayPower) -> None:
    if system.reset_target is None:
        raise BMCError("malformed", f"{system.path} has no ComputerSystem.Reset action")
    if system.reset_types is not None and reset_type not in system.reset_types:
        raise BMCError("unsupported", f"the BMC does not allow ResetType {reset_type} "
                                      f"(allowed: {', '.join(system.reset_types) or 'none'})")
    tray.sent.append(reset_type)            # before the POST: a lost answer still counts as sent
    client.post_action(system.reset_target, {"ResetType": reset_type})


# ------------------------------------------------------------------ the OS side (SSH)

class OSProbe:
    """Whether each tray's OS answers SSH, and its boot id; one short fan-out per call."""

    def __init__(self, site: "Site", *, timeout: float = 10.0):
        self.site, self.timeout = site, timeout

    def boot_ids(self, hosts: Sequence["Host"]) -> dict[str, str | None]:
        """host -> boot id (None: SSH did not reach it, or it did not answer)."""
        from mctl.transport import SSHConfig, run_sync, targets_for

        if not hosts:
            return {}
        results = run_sync(SSHConfig.from_site(self.site), targets_for(self.site, hosts), BOOT_ID,
                           timeout=self.timeout, deadline=self.timeout + 5.0)
        out: dict[str, str | None] = {}
        for h, r in zip(hosts, results):
            out[h.name] = r.stdout.strip() or None if r.status.reached and r.ok else None
        return out


# ------------------------------------------------------------------ one tray

def _wait_state(client: RedfishClient, system: HostSystem, want: tuple[str, ...], until: float,
                tray: TrayPower) -> str | None:
    """Poll PowerState until it is one of *want* or *until* passes; the last state read."""
    state = tray.after
    while True:
        if time.monotonic() >= until:
            return state
        try:
            doc = client.get(system.path)
            if isinstance(doc.get("PowerState"), str):
                state = tray.after = clean(doc["PowerState"], 32)
        except BMCError as exc:
            if exc.kind not in ("timeout", "unreachable", "http"):
                raise
            # a BMC busy with the reset: read again (the last state read stands)
        if state in want:
            return state
        time.sleep(min(POLL_S, max(0.0, until - time.monotonic())))


def _wait_os(probe: OSProbe, host: "Host", up: bool, until: float, old_boot: str | None = None) -> bool:
    """Until SSH reaches (up) or no longer reaches (not up) the tray, or *until* passes."""
    while True:
        boot = probe.boot_ids([host]).get(host.name)
        done = (boot is not None and (old_boot is None or boot != old_boot)) if up else boot is None
        if done or time.monotonic() >= until:
            return done
        time.sleep(min(2.0, max(0.0, until - time.monotonic())))


def act_on_tray(action: str, host: "Host", tray: TrayPower, client: RedfishClient, probe: OSProbe, *,
                stage_until: float, graceful_s: float, boot_id: str | None) -> None:
    """One tray: read, act, wait for the state. Raises BMCError; fills *tray*."""
    system = host_system(client)
    tray.before = tray.after = system.power_state
    tray.os_answered = boot_id is not None if host.role == "compute" else None
    if action == "status":
        tray.os_after = tray.os_answered
        tray.ok = True
        return
    if action == "off":
        if system.power_state != "Off":
            if boot_id is not None and (system.reset_types is None or "GracefulShutdown" in system.reset_types):
                send_reset(client, system, "GracefulShutdown", tray)
                state = _wait_state(client, system, ("Off",), min(stage_until, time.monotonic() + graceful_s), tray)
                if state != "Off":
                    send_reset(client, system, "ForceOff", tray)
            else:
                send_reset(client, system, "ForceOff", tray)
            if _wait_state(client, system, ("Off",), stage_until, tray) != "Off":
                raise BMCError("timeout", f"PowerState still {tray.after} at the deadline (sent {', '.join(tray.sent)})")
        if host.role == "compute":              # a switch tray's NVOS is not reached over mctl's SSH
            gone = _wait_os(probe, host, False, stage_until)
            tray.os_after = not gone
            if not gone:
                raise BMCError("timeout", "Redfish says Off but SSH still reaches the tray")
    elif action in ("on", "cycle"):
        old = boot_id
        if system.power_state == "Off" or action == "on":
            if system.power_state != "On":
                send_reset(client, system, "On", tray)
        else:
            send_reset(client, system, "PowerCycle", tray)
            # The state may never read Off (a cycle is quick on a real BMC): the new boot id says it happened.
            time.sleep(POLL_S)
        if _wait_state(client, system, ("On",), stage_until, tray) != "On":
            raise BMCError("timeout", f"PowerState still {tray.after} at the deadline (sent {', '.join(tray.sent)})")
        if host.role == "compute":              # a switch tray's NVOS is not reached over mctl's SSH
            up = _wait_os(probe, host, True, stage_until, old if action == "cycle" else None)
            tray.os_after = up
            if not up:
                raise BMCError("timeout", "Redfish says On but the OS did not answer SSH by the deadline"
                               + (" with a new boot id" if action == "cycle" and old else ""))
    tray.ok = True


# ------------------------------------------------------------------ the run

def _client(tray: TrayPower, settings: "Settings", until: float, warn) -> RedfishClient:
    return RedfishClient(tray.url or "", settings.credentials, verify_tls=settings.verify_tls,
                         timeout_s=settings.timeout_s, deadline=until, warn=warn)


def run_stage(action: str, hosts: Sequence["Host"], trays: list[TrayPower], settings: "Settings", probe: OSProbe,
              *, stage_s: float, graceful_s: float, warn: Callable[[str], None] | None = None) -> None:
    """Every tray of one stage in parallel, each bounded by the stage deadline (enforced from outside too)."""
    start = time.monotonic()
    until = start + stage_s
    todo = [(h, t) for h, t in zip(hosts, trays) if t.refused is None and t.error is None]
    boot = probe.boot_ids([h for h, _t in todo if h.role == "compute"])      # mctl never logs in to NVOS
    once = warn_once(warn or _stderr)

    results: dict[str, TrayPower] = {}

    def work(h: "Host", template: TrayPower, done: threading.Event) -> None:
        mine = TrayPower(template.host, template.role, template.bmc, template.url)
        t0 = time.monotonic()
        client = None
        try:
            client = _client(mine, settings, until, once)
            act_on_tray(action, h, mine, client, probe, stage_until=until, graceful_s=graceful_s,
                        boot_id=boot.get(h.name))
        except BMCError as exc:
            mine.error_kind, mine.error = exc.kind, exc.message
        except Exception as exc:            # a document shape mctl did not expect: that tray, not the run
            mine.error_kind, mine.error = "malformed", f"unexpected answer ({type(exc).__name__}: {clean(exc, 120)})"
        finally:
            if client is not None:
                client.close()
            mine.elapsed = round(time.monotonic() - t0, 3)
            results[h.name] = mine
            done.set()

    events = []
    for h, t in todo:
        ev = threading.Event()
        threading.Thread(target=work, args=(h, t, ev), name=f"power-{h.name}", daemon=True).start()
        events.append((h, t, ev))
    for h, t, ev in events:
        ev.wait(max(0.0, until + 5.0 - time.monotonic()))
        got = results.get(h.name)
        if got is None:
            t.error_kind, t.error = "timeout", f"no answer within the stage deadline ({stage_s:g}s)"
            t.elapsed = round(time.monotonic() - start, 3)
            continue
        for k, v in got.__dict__.items():
            setattr(t, k, v)


def _stderr(message: str) -> None:
    import sys
    sys.stderr.write(f"mctl: warning: {message}\n")


def plan(action: str, groups: dict[str, list["Host"]], settings: "Settings | None") -> list[Stage]:
    """The stages in the order they run (on: shelves, switches, compute; off: the reverse)."""
    order = list(ON_ORDER) if action in ("on", "cycle", "status") else list(reversed(ON_ORDER))
    stages = []
    for name in order:
        hosts = groups.get(name, [])
        trays = []
        for h in hosts:
            t = TrayPower(h.name, h.role, h.bmc)
            if not h.bmc:
                t.error_kind, t.error = "config", "no BMC address in the inventory"
            elif settings is not None:
                t.url = base_url(h.bmc, scheme=settings.scheme, port=settings.port)
            trays.append(t)
        stage = Stage(name, trays)
        if name == "power_shelf" and not hosts:
            stage.state, stage.note = "skipped", "mctl's inventory has no power shelves: none switched"
        elif not hosts:
            stage.state, stage.note = "skipped", f"no {name} trays in the target"
        stages.append(stage)
    return stages


def refuse_busy(stages: list[Stage], work: list[Any], work_error: str | None, *, force: bool) -> None:
    if force:
        return
    busy: dict[str, list[str]] = {}
    for w in work:
        for n in w.nodes:
            busy.setdefault(n, []).append(f"{w.kind} {w.id}")
    for t in (t for s in stages for t in s.trays):
        if t.error:
            continue
        if work_error:
            t.refused = f"the running work cannot be read ({work_error}); --force to go ahead"
        elif t.host in busy:
            t.refused = f"running {', '.join(busy[t.host][:3])}{' ...' if len(busy[t.host]) > 3 else ''}; " \
                        "drain it and let the work end, or --force"
        if t.refused:
            t.error_kind, t.error = "refused", t.refused


def run(site: "Site", action: str, groups: dict[str, list["Host"]], *, settings: "Settings", force: bool = False,
        dry_run: bool = False, stage_s: float = DEFAULT_STAGE_S, graceful_s: float = DEFAULT_GRACEFUL_S,
        all_or_nothing: bool = False,
        work_lookup: Callable[[list[str]], tuple[list[Any], str | None]], probe: OSProbe | None = None,
        admit: Callable[[list[str]], dict[str, str]] | None = None,
        progress: Callable[[str], None] | None = None) -> PowerReport:
    """Plan, check the work, ask *admit* (the site's safety budget: the trays it refuses, with why) for the
    trays the work leaves, then run the stages in order; a failed stage stops the later ones."""
    start = time.monotonic()
    stages = plan(action, groups, settings)
    report = PowerReport(action, stages, dry_run=dry_run)
    probe = probe or OSProbe(site)
    if action in ("off", "cycle"):
        names = [t.host for s in stages for t in s.trays]
        work, err = work_lookup(names)
        report.work = [w.to_dict() for w in work if set(w.nodes) & set(names)]
        report.work_error = err
        refuse_busy(stages, work, err, force=force)
        refused = [t.host for s in stages for t in s.trays if t.refused]
        if refused and all_or_nothing:          # a rack goes off whole or not at all
            for t in (t for s in stages for t in s.trays if not t.error):
                t.error_kind, t.error = "refused", f"not acted on: {', '.join(refused[:4])} refused (busy)"
    if dry_run:
        report.elapsed = time.monotonic() - start
        return report
    if admit is not None and action in ("off", "cycle"):
        _admit(stages, admit)
    stopped = False
    for stage in stages:
        if stage.state == "skipped":
            continue
        if stopped:
            stage.state, stage.note = "not-started", "an earlier stage failed"
            for t in stage.trays:
                if not t.error:
                    t.error_kind, t.error = "not-started", "not acted on: an earlier stage failed"
            continue
        t0 = time.monotonic()
        if progress:
            progress(f"{action}: {stage.name} ({len(stage.trays)} trays)")
        run_stage(action, [h for h in groups[stage.name]], stage.trays, settings, probe,
                  stage_s=stage_s, graceful_s=graceful_s)
        stage.elapsed = time.monotonic() - t0
        bad = [t for t in stage.trays if not t.ok]
        stage.state = "failed" if bad else "done"
        if bad and action != "status" and len(stages) > 1:
            stopped = True
    report.elapsed = time.monotonic() - start
    return report


def _admit(stages: list[Stage], admit: Callable[[list[str]], dict[str, str]]) -> None:
    """The trays still to act on, asked of *admit* together: those it refuses, and with them every other
    tray of the command (a person's power command goes within the budget whole or not at all), are refused."""
    left = [t for s in stages for t in s.trays if not t.error]
    over = admit([t.host for t in left]) if left else {}
    if not over:
        return
    for t in left:
        t.error_kind = "refused"
        t.error = over.get(t.host) or f"not acted on: the safety budget refuses {', '.join(sorted(over)[:4])}"


def groups_of(hosts: Sequence["Host"]) -> dict[str, list["Host"]]:
    out: dict[str, list["Host"]] = {name: [] for name in ON_ORDER}
    for h in hosts:
        out["switch" if h.role == "switch" else "compute"].append(h)
    return out
