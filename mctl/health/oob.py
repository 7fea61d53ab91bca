"""The health sweep's out-of-band side: each tray's BMC read over Redfish, and a leak's power-off sent.

What one read of a BMC is (`read_tray`, GET only, into mctl.checks.leak.BmcHealth):

    the leak detectors, wherever the BMC's tree has them (`discover_leaks`: Chassis -> each chassis'
    ThermalSubsystem -> LeakDetection -> LeakDetectors; found once, kept per BMC, found again when a
    read of them answers 404 or after REDISCOVER_S), each collection read with $expand where the BMC
    supports it (one GET), else a GET per member                                   DetectorState
    a compute tray's Chassis/Chassis_0/PowerSubsystem, its PowerSupplies, each member   Status.Health

The GB200 compute tray's detectors are under Chassis_0, the NVLink switch tray's under MGX_BMC_0 (the
real captures): both are found by the same walk, so a switch tray is read like a compute tray, its
leak detectors only (its BMC lists no tray power subsystem mctl judges).

Who reads, and when:

- `mctl health check` (one sweep, no earlier view): `read(hosts, settings, deadline_s)` reads every
  BMC once, in parallel (a thread per BMC, at most `bmc.concurrency`), each within its own deadline
  enforced from outside its thread, before the sweep judges; a BMC that hangs is reported
  (`bmc.reachable`), never taken as healthy, and never holds the sweep past its deadline.
- `mctl health watch`: a BmcWatch reads every BMC beside the sweep, never in it (issue 27.5): a
  supervisor thread starts each BMC's read on its own cadence (the leak detectors every
  `health.leak_interval`, default every sweep; the BMC health, its power subsystem, every
  `health.bmc_interval`, default 60 s, with a leak read), at most `bmc.concurrency` at once and one per BMC,
  each under its deadline (a read past it is cut: its connections are shut from outside), and keeps
  each BMC's last view with its time (BmcReader, time passed in). The sweep takes the views as they
  are when its probes are in and never waits for a BMC; a view older than `health.bmc_stale_after`
  reads is `bmc.stale`. Each BMC has one client for the whole watch: one kept connection, one TLS
  context per CA file for every BMC (mctl.bmc.client), no TLS session resumption (the ~40 KiB a
  connection leak, docs/bmc.md).

`power_off(host, settings, deadline_s)` sends one `ComputerSystem.Reset` ForceOff to System_0 (none when it
is already Off) and waits, within the deadline, for PowerState Off.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mctl.checks.leak import (POWER_SUBSYSTEM, BmcHealth, LeakDetector, parse_detector, parse_power_subsystem,
                              parse_supply)

if TYPE_CHECKING:
    from mctl.bmc.inventory import Settings
    from mctl.model.site import Host, Site

# BMC errors that mean the BMC itself did not answer (the rest: one resource could not be read)
_SILENT = ("timeout", "unreachable", "auth", "tls", "origin", "config")
ROOT = "/redfish/v1"
CHASSIS = f"{ROOT}/Chassis"
REDISCOVER_S = 3600.0       # the leak detectors' places are walked again after this long (firmware updates)
LATE_S = 0.5                # a read this long past its deadline is cut from outside
BMC_INTERVAL_MIN = 60.0     # the BMC health (power subsystem) is read at most this often by default (health.bmc_interval)


def settings_of(site: "Site"):
    """The site's BMC client settings, or (None, why) when it has none, or (None, problem) when they are bad."""
    from mctl.errors import MctlError

    if getattr(site, "bmc", None) is None:
        return None, None
    from mctl.bmc.inventory import settings_for

    try:
        settings = settings_for(site)
    except MctlError as exc:
        return None, exc.message
    import redfish  # noqa: F401 - the client library's import (~1 s) is paid here, not inside a sweep's deadline
    return settings, None


# ------------------------------------------------------------------ where the leak detectors are

@dataclass(frozen=True)
class LeakPaths:
    """Where one BMC lists its leak detectors, found by walking its tree."""

    collections: tuple[tuple[str, str], ...]    # (chassis id, its LeakDetectors collection path)
    walked: int = 0                             # chassis looked at
    unread: tuple[str, ...] = ()                # "PATH: why" of links the BMC gave but did not answer
    at: float = 0.0                             # time.monotonic() when found


def _link(doc: Any, key: str) -> str | None:
    from mctl.bmc.client import check_path

    value = doc.get(key) if isinstance(doc, dict) else None
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return check_path(value["@odata.id"])
    return None


def discover_leaks(client, now: float | None = None) -> LeakPaths:
    """Walk `Chassis` -> each chassis' ThermalSubsystem -> LeakDetection -> its LeakDetectors collection.

    The real captures link leak detectors only that way (DMTF ThermalSubsystem v1_3_0's LeakDetection,
    GB200 and the switch tray alike; neither shows an older or OEM link to them). A link one chassis
    gives and its BMC does not answer (404, 5xx, a malformed document) is noted and the walk goes on;
    a BMC that does not answer at all raises (BMCError)."""
    from mctl.bmc.client import BMCError

    found: list[tuple[str, str]] = []
    unread: list[str] = []
    chassis = client.member_docs(CHASSIS, need=("Id",))
    for path, doc in chassis:
        if "ThermalSubsystem" in doc and doc["ThermalSubsystem"] is None:
            doc = client.get(path)                  # AMI answers null fields under $expand
        ident = doc.get("Id") if isinstance(doc.get("Id"), str) else path.rsplit("/", 1)[-1]
        step = doc
        for key in ("ThermalSubsystem", "LeakDetection"):
            target = _link(step, key)
            if target is None:
                step = None
                break
            try:
                step = client.get(target)
            except BMCError as exc:
                if exc.kind in _SILENT:
                    raise
                unread.append(f"{target}: {exc.message}")
                step = None
                break
        collection = _link(step, "LeakDetectors") if step is not None else None
        if collection is not None:
            found.append((ident, collection))
    return LeakPaths(tuple(found), len(chassis), tuple(unread), time.monotonic() if now is None else now)


def read_leaks(client, paths: LeakPaths) -> tuple[LeakDetector, ...]:
    """Every detector of every collection in *paths* (BMCError as the client raises it: 404 when moved)."""
    out: list[LeakDetector] = []
    for chassis, collection in paths.collections:
        for _path, doc in client.member_docs(collection, need=("Id", "DetectorState")):
            out.append(parse_detector(doc, chassis))
    return tuple(out)


def read_tray(client, paths: LeakPaths | None = None, *, power: bool = True, now: float | None = None,
              keep: Callable[[LeakPaths], None] | None = None) -> BmcHealth:
    """One BMC's leak detectors (and, with *power*, the tray's power subsystem); raises BMCError when the BMC
    itself does not answer.

    *paths*: where its detectors were found before (None, or older than REDISCOVER_S: walked now); a read
    that answers 404 there is walked again once (the tree changed: a firmware update). *keep* is told the
    paths read, for the next read."""
    from mctl.bmc.client import BMCError

    start = time.monotonic()
    now = start if now is None else now

    def part(read, what: str):
        """(value, None) or (None, why): a BMC that cannot be reached at all still raises (_SILENT)."""
        try:
            return read(), None
        except BMCError as exc:
            if exc.kind in _SILENT:
                raise
            return None, exc.message
        except ValueError as exc:
            return None, f"malformed {what} ({exc})"

    def leaks() -> tuple[LeakDetector, ...]:
        nonlocal paths
        walked = paths is None or now - paths.at > REDISCOVER_S
        if walked:
            paths = discover_leaks(client, now)
        try:
            detectors = read_leaks(client, paths)
        except BMCError as exc:
            if exc.status != 404 or walked:
                raise
            paths = discover_leaks(client, now)         # moved since it was found
            detectors = read_leaks(client, paths)
        if not paths.collections and paths.unread:
            raise BMCError("http", f"no leak detector found: {len(paths.unread)} of the BMC's links could not be "
                                   f"read (first: {paths.unread[0]})")
        return detectors

    seen: dict = {}                  # the subsystem's health stays known when one of its supplies fails

    def supplies_of():
        seen["health"], link = parse_power_subsystem(client.get(POWER_SUBSYSTEM))
        return tuple(parse_supply(client.get(p)) for p in (client.members(link) if link else ()))

    detectors, leak_error = part(leaks, "leak detector")
    if keep is not None and paths is not None:
        keep(paths)
    if not power:
        return BmcHealth(detectors=detectors, leak_error=leak_error, power_asked=False,
                         elapsed=round(time.monotonic() - start, 3))
    supplies, power_error = part(supplies_of, "power supply")
    return BmcHealth(detectors=detectors, leak_error=leak_error, power_health=seen.get("health"), supplies=supplies,
                     power_error=power_error, elapsed=round(time.monotonic() - start, 3))


def _client_for(h: "Host", settings: "Settings", timeout_s: float, until: float | None, warn):
    """A client of *h*'s BMC that knows whether it takes $expand (the service root, read once)."""
    from mctl.bmc.client import RedfishClient, base_url

    client = RedfishClient(base_url(h.bmc, scheme=settings.scheme, port=settings.port), settings.credentials,
                           verify_tls=settings.verify_tls, timeout_s=timeout_s, deadline=until, warn=warn,
                           resume_tls=False)
    try:
        client.use_expand(client.get(ROOT))
    except BaseException:
        client.close()
        raise
    return client


def _guarded(read: Callable[[], BmcHealth], start: float, power: bool) -> BmcHealth:
    """*read*'s answer, or what its trouble says about the BMC (never raises for one BMC's trouble)."""
    from mctl.bmc.client import BMCError
    from mctl.errors import MctlError

    try:
        return read()
    except BMCError as exc:
        return BmcHealth(error=exc.message, error_kind=exc.kind, elapsed=round(time.monotonic() - start, 3),
                         power_asked=power)
    except MctlError as exc:
        return BmcHealth(error=exc.message, error_kind="config", power_asked=power)
    except Exception as exc:  # noqa: BLE001 - a document shape mctl did not expect: that BMC, not the sweep
        return BmcHealth(error=f"unexpected answer ({type(exc).__name__})", error_kind="malformed",
                         power_asked=power)


def _parallel(hosts: Sequence["Host"], deadline_s: float, concurrency: int,
              work: Callable[["Host", float], object], late: Callable[["Host"], object]) -> dict[str, object]:
    """work(host, until) per host in threads, each bounded by deadline_s from its start (late(host) after)."""
    results: dict[str, object] = {}
    queue = list(hosts)
    pending: list[tuple["Host", threading.Event, float, dict]] = []
    while queue or pending:
        while queue and len(pending) < max(1, concurrency):
            h = queue.pop(0)
            done, box = threading.Event(), {}
            until = time.monotonic() + deadline_s

            def run(h=h, done=done, box=box, until=until):
                try:
                    box["value"] = work(h, until)
                finally:
                    done.set()

            threading.Thread(target=run, name=f"oob-{h.name}", daemon=True).start()
            pending.append((h, done, until + LATE_S, box))
        pending[0][1].wait(0.02)
        now = time.monotonic()
        for item in list(pending):
            h, done, until, box = item
            if done.is_set() or now >= until:
                # a worker past its deadline is left behind; its late answer is never used
                results[h.name] = box["value"] if done.is_set() and "value" in box else late(h)
                pending.remove(item)
    return results


def read(hosts: Sequence["Host"], settings: "Settings", deadline_s: float,
         warn: Callable[[str], None] | None = None) -> dict[str, BmcHealth]:
    """host -> what its BMC said, each read once now (never raises for one tray's trouble): `health check`."""
    from mctl.bmc.client import warn_once

    deadline_s = max(1.0, min(deadline_s, settings.deadline_s))
    once = warn_once(warn)

    def work(h: "Host", until: float) -> BmcHealth:
        start = time.monotonic()
        power = h.role == "compute"
        if not h.bmc:
            return BmcHealth(error="no BMC address in the inventory", error_kind="config", power_asked=power)
        box: dict = {}

        def one() -> BmcHealth:
            box["client"] = _client_for(h, settings, min(settings.timeout_s, deadline_s), until, once)
            return read_tray(box["client"], power=power)

        try:
            return _guarded(one, start, power)
        finally:
            if box.get("client") is not None:
                box["client"].close()

    def late(h: "Host") -> BmcHealth:
        return BmcHealth(error=f"no complete answer within {deadline_s:g}s", error_kind="timeout",
                         elapsed=deadline_s, power_asked=h.role == "compute")

    return _parallel(hosts, deadline_s, settings.concurrency, work, late)  # type: ignore[return-value]


# ------------------------------------------------------------------ the watch: reads beside the sweep

@dataclass
class _Slot:
    """One BMC as the reader keeps it between reads."""

    host: "Host"
    power: bool                                 # a compute tray: its power subsystem is read too
    first_asked: float | None = None
    view: BmcHealth | None = None               # the last read that ended, answered or not
    good_at: float | None = None                # when the BMC last answered
    seq: int = 0                                # reads ended so far
    served: int = 0                             # the read the last sweep judged
    started: float | None = None                # the read in flight began (None: none in flight)
    until: float | None = None                  # ... and must end by
    token: int = 0                              # the read in flight; a late worker's answer is dropped
    next_at: float = 0.0
    power_at: float | None = None               # when the power subsystem was last read (answered)
    power_view: BmcHealth | None = None         # ... and what it said
    paths: LeakPaths | None = None
    client: Any = None
    sub: Any = None                             # its EventService subscription (mctl.bmc.eventservice.Subscription)
    sub_tried: float | None = None              # when a subscription was last asked for (none: never)
    sub_error: str | None = None                # why the last one failed (or "not offered")
    event_at: float | None = None               # when its BMC last pushed a leak event
    pushed_in_flight: bool = False              # ... while a read was in flight: read again when it ends


class BmcReader:
    """Each BMC's last view, and when each is read next: the cadence and staleness of the watch's BMC reads,
    with time passed in (no thread, no I/O: BmcWatch runs it; tests drive it with their own clock).

    A read begins `interval` after the one before began (or ended, when that one failed, so a silent BMC
    is not asked back to back), at most `concurrency` at once, one per BMC; the power subsystem is read
    with it when `power_interval` passed since it was last read. A view is stale when its information
    is older than `stale_after` seconds: since the BMC last answered, or since it was first asked."""

    def __init__(self, hosts: Sequence["Host"], *, interval: float, power_interval: float, stale_after: float,
                 deadline: float, concurrency: int, subscribed_interval: float | None = None):
        self.interval = float(interval)
        # a BMC whose leak events the watch receives (its subscription made) is polled this often instead: the
        # poll is the fallback and the truth check of the events (mctl.health.bmc_events)
        self.subscribed_interval = float(subscribed_interval) if subscribed_interval else None
        self.power_interval = float(power_interval)
        self.stale_after = float(stale_after)
        self.deadline = float(deadline)
        self.concurrency = max(1, int(concurrency))
        self.slots: dict[str, _Slot] = {h.name: _Slot(h, h.role == "compute") for h in hosts}

    def in_flight(self) -> list[str]:
        return [n for n, s in self.slots.items() if s.started is not None]

    def due(self, now: float) -> list[str]:
        """The BMCs whose read begins now, earliest first, within the free slots."""
        free = self.concurrency - len(self.in_flight())
        ready = sorted((s.next_at, n) for n, s in self.slots.items() if s.started is None and s.next_at <= now)
        return [n for _at, n in ready[:max(0, free)]]

    def begin(self, name: str, now: float) -> tuple[int, float, bool]:
        """(token, until, power): the read of *name* that begins now."""
        s = self.slots[name]
        s.first_asked = now if s.first_asked is None else s.first_asked
        s.started, s.until, s.token = now, now + self.deadline, s.token + 1
        power = s.power and (s.power_at is None or now - s.power_at >= self.power_interval)
        return s.token, s.until, power

    def overdue(self, now: float) -> list[str]:
        """Reads past their deadline (and LATE_S): cut them (end them with late())."""
        return [n for n, s in self.slots.items() if s.started is not None and now > s.until + LATE_S]

    def end(self, name: str, token: int, health: BmcHealth, now: float, *, power: bool) -> bool:
        """The read *token* of *name* ended with *health* (False: a read already ended or cut, dropped)."""
        s = self.slots[name]
        if s.started is None or token != s.token:
            return False
        began, s.started, s.until = s.started, None, None
        if health.answered and power:
            s.power_at, s.power_view = began, health
        elif health.answered and s.power and s.power_view is not None:
            pv = s.power_view             # leaks read now, power as last read
            health = replace(health, power_asked=True, power_health=pv.power_health, supplies=pv.supplies,
                             power_error=pv.power_error)
        elif health.answered and s.power:
            health = replace(health, power_asked=True, power_error="not read yet")
        s.view, s.seq = health, s.seq + 1
        every = self.every(s)
        if health.answered:
            s.good_at = now
            s.next_at = max(began + every, now)
        else:
            s.next_at = now + self.interval
        if s.pushed_in_flight:                  # the read that ended may have begun before the leak: once more now
            s.pushed_in_flight = False
            s.next_at = now
        return True

    def every(self, s: _Slot) -> float:
        """Seconds between two leak reads of *s*'s BMC: longer when its events come (subscribed)."""
        return self.subscribed_interval if s.sub is not None and self.subscribed_interval else self.interval

    def pushed(self, name: str, at: float) -> bool:
        """*name*'s BMC pushed a leak event: its next read begins now (False: one is in flight already)."""
        s = self.slots.get(name)
        if s is None:
            return False
        s.event_at = at
        if s.started is not None:
            s.pushed_in_flight = True
            return False
        s.next_at = min(s.next_at, at)
        return True

    def late(self, name: str, now: float) -> tuple[int, BmcHealth]:
        """The read in flight of *name*, cut at its deadline: (its token, what the sweep is told)."""
        s = self.slots[name]
        elapsed = now - (s.started or now)
        return s.token, BmcHealth(error=f"no complete answer within {self.deadline:g}s (the read was cut)",
                                  error_kind="timeout", elapsed=round(elapsed, 3), power_asked=s.power)

    def next_event(self, now: float) -> float:
        """Seconds until the reader has something to do (a read due or a deadline), at most 1 s."""
        times = [s.until + LATE_S for s in self.slots.values() if s.started is not None]
        if len(self.in_flight()) < self.concurrency:
            times += [s.next_at for s in self.slots.values() if s.started is None]
        return max(0.0, min([now + 1.0, *times]) - now)

    def view(self, name: str, now: float, *, mark: bool = True) -> BmcHealth:
        """*name*'s view as a sweep judges it now (*mark*: this sweep has seen its reading)."""
        s = self.slots[name]
        in_flight = round(now - s.started, 1) if s.started is not None else None
        if s.view is None:
            waited = now - s.first_asked if s.first_asked is not None else 0.0
            return BmcHealth(error=f"its first read has waited {waited:.1f}s" if s.first_asked is not None
                             else "not asked yet", error_kind="pending", age=round(waited, 1),
                             stale_after=self.stale_after, in_flight=in_flight, power_asked=s.power,
                             never_answered=True)
        since = s.good_at if s.good_at is not None else s.first_asked
        stale_after = self.stale_after * self.every(s) / self.interval
        out = replace(s.view, age=round(now - since, 1) if since is not None else 0.0, stale_after=stale_after,
                      in_flight=in_flight, repeat=s.served == s.seq, never_answered=s.good_at is None)
        if mark:
            s.served = s.seq
        return out

    def views(self, now: float) -> dict[str, BmcHealth]:
        return {name: self.view(name, now) for name in self.slots}


class BmcWatch:
    """The watch's BMC reads: a BmcReader run by a supervisor thread, a worker thread per read, one client
    (one kept connection) per BMC for the whole watch. `views()` never waits for a BMC."""

    def __init__(self, hosts: Sequence["Host"], settings: "Settings", *, interval: float, power_interval: float,
                 stale_after: float, deadline: float, warn: Callable[[str], None] | None = None,
                 events=None, subscribed_interval: float | None = None):
        from mctl.bmc.client import warn_once

        self.settings = settings
        self.reader = BmcReader(hosts, interval=interval, power_interval=power_interval, stale_after=stale_after,
                                deadline=max(1.0, min(deadline, settings.deadline_s)),
                                concurrency=settings.concurrency,
                                subscribed_interval=subscribed_interval if events is not None else None)
        # health.bmc_events: the receiver of the BMCs' leak events (mctl.health.bmc_events), started with the watch
        self.receiver = None
        if events is not None and events.enabled:
            from mctl.health.bmc_events import EventReceiver
            self.receiver = EventReceiver(events)
        self.events_seen = 0                        # leak events taken (tests, bench)
        self._events_thread: threading.Thread | None = None
        self._warn = warn_once(warn)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0                              # reads begun (tests, bench)

    def start(self) -> "BmcWatch":
        if self._thread is None:
            if self.receiver is not None:
                self.receiver.start()
                self._events_thread = threading.Thread(target=self._take_events, name="oob-events", daemon=True)
                self._events_thread.start()
            self._thread = threading.Thread(target=self._supervise, name="oob-reader", daemon=True)
            self._thread.start()
        return self

    def _take_events(self) -> None:
        """Each leak event the receiver accepted: that BMC's read begins now (the read is what is judged)."""
        import queue

        assert self.receiver is not None
        while not self._stop.is_set():
            try:
                got = self.receiver.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._lock:
                self.events_seen += 1
                self.reader.pushed(got.host, time.monotonic())
            self._wake.set()

    def views(self) -> dict[str, BmcHealth]:
        with self._lock:
            return self.reader.views(time.monotonic())

    def close(self, timeout: float = 2.0) -> None:
        """Stop reading; cut what is in flight; close every BMC's connection."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            clients = [s.client for s in self.reader.slots.values() if s.client is not None]
            subs = [(s.client, s.sub) for s in self.reader.slots.values() if s.client is not None and s.sub is not None]
            for s in self.reader.slots.values():
                s.client, s.sub = None, None
        if subs:
            self._unsubscribe(subs, timeout)
        for c in clients:
            c.abort()
            c.close()
        if self.receiver is not None:
            self.receiver.close()

    def _unsubscribe(self, subs: list, timeout: float) -> None:
        """DELETE the subscriptions the watch made (a BMC keeps few: bmcweb 20), in parallel, within *timeout*."""
        from mctl.bmc.client import BMCError

        until = time.monotonic() + timeout

        def one(client, sub) -> None:
            client.deadline = until
            try:
                client.delete(sub.path)
            except (BMCError, Exception):  # noqa: BLE001 - best effort: the BMC drops it after its retries
                pass

        threads = [threading.Thread(target=one, args=pair, name="oob-unsubscribe", daemon=True) for pair in subs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, until - time.monotonic()))

    def _supervise(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            cut = []
            with self._lock:
                for name in self.reader.overdue(now):
                    token, health = self.reader.late(name, now)
                    self.reader.end(name, token, health, now, power=False)
                    slot = self.reader.slots[name]
                    if slot.client is not None:
                        cut.append(slot.client)     # its worker gets an error at once; a new client next read
                        slot.client = None
                starts = [(name, *self.reader.begin(name, now)) for name in self.reader.due(now)]
                wait = self.reader.next_event(now)
            for client in cut:
                client.abort()
            for name, token, until, power in starts:
                self.reads += 1
                threading.Thread(target=self._read, args=(name, token, until, power), name=f"oob-{name}",
                                 daemon=True).start()
            if not starts:
                self._wake.wait(wait)
                self._wake.clear()

    def _subscription(self, slot: _Slot, client, checked: bool) -> None:
        """Make *slot*'s EventService subscription when it has none (asked again every power interval after a
        failure or a BMC without one), and with *checked* (a BMC health read) see it is still there."""
        from mctl.bmc import eventservice
        from mctl.bmc.client import BMCError

        assert self.receiver is not None
        now = time.monotonic()
        sub = slot.sub
        try:
            if sub is not None and checked and not eventservice.still_there(client, sub):
                self.receiver.forget(sub.context)
                sub = None                                  # lost (a BMC reboot): made again below
            if sub is None and (slot.sub_tried is None or now - slot.sub_tried >= self.reader.power_interval):
                slot.sub_tried = now
                token = self.receiver.token_for(slot.host.name)
                sub = eventservice.subscribe(client, self.receiver.url, token)
                if sub is None:
                    self.receiver.forget(token)
                slot.sub_error = None if sub is not None else "the BMC offers no EventService"
        except BMCError as exc:
            slot.sub_error = exc.message
        with self._lock:
            slot.sub = sub

    def _read(self, name: str, token: int, until: float, power: bool) -> None:
        start = time.monotonic()
        with self._lock:
            slot = self.reader.slots[name]
            client, paths, host = slot.client, slot.paths, slot.host

        def current() -> bool:                      # this read is still the slot's (not cut, not replaced)
            return slot.token == token and slot.started is not None

        def keep(found: LeakPaths) -> None:
            with self._lock:
                if current():
                    slot.paths = found

        def one() -> BmcHealth:
            nonlocal client
            if not host.bmc:
                return BmcHealth(error="no BMC address in the inventory", error_kind="config", power_asked=slot.power)
            if client is None:
                client = _client_for(host, self.settings, min(self.settings.timeout_s, self.reader.deadline),
                                     until, self._warn)
                with self._lock:
                    if current():
                        slot.client = client
            client.deadline = until
            out = read_tray(client, paths, power=power, keep=keep)
            if self.receiver is not None and out.answered:
                self._subscription(slot, client, power)
            return out

        health = _guarded(one, start, slot.power)
        with self._lock:
            used = self.reader.end(name, token, health, time.monotonic(), power=power)
            mine = slot.client is client
        if not used and client is not None and not mine:
            client.close()                          # cut at its deadline: this client was replaced
        self._wake.set()


def subscribed_interval(events, leak_every: float, bmc_every: float) -> float:
    """Seconds between two leak polls of a BMC whose leak events the watch receives: `health.bmc_events.leak_interval`,
    else the BMC health's cadence (`health.bmc_interval`, at least BMC_INTERVAL_MIN by default), never below the
    leak interval: the event says a leak within seconds, the poll checks the events were not lost."""
    configured = getattr(events, "leak_interval", None)
    return max(leak_every, float(configured) if configured is not None else bmc_every)


def leak_interval(configured: float | None, watch_interval: float) -> float:
    """Seconds between two reads of a BMC's leak detectors in the watch (the cadence a BMC is asked at):
    `health.leak_interval`, else the watch's interval (every sweep: a leak is critical, and on a kept
    connection it costs a compute tray one $expand GET)."""
    return float(configured) if configured is not None else float(watch_interval)


def bmc_interval(configured: float | None, leak_every: float) -> float:
    """Seconds between two reads of a tray's BMC health (its power subsystem and supplies): `health.bmc_interval`,
    else the leak interval but at least BMC_INTERVAL_MIN (warn-only and slow to change; 3 GETs or more a tray).
    It rides on a leak read: a value below the leak interval reads it at every leak read (the loader refuses one
    below an explicit `health.leak_interval`)."""
    return float(configured) if configured is not None else max(leak_every, BMC_INTERVAL_MIN)


@dataclass
class PowerOffResult:
    host: str
    sent: bool                        # the ForceOff was POSTed (then never again this episode)
    ok: bool                          # PowerState Off at the end
    power_state: str | None
    error: str | None = None
    elapsed: float = 0.0

    @property
    def result(self) -> str:
        if self.ok:
            return "ok" if self.sent else "ok (already off)"
        return f"failed: {self.error}"


def power_off(hosts: Sequence["Host"], settings: "Settings", deadline_s: float) -> dict[str, PowerOffResult]:
    """ForceOff each host's System_0 through its BMC (once), in parallel, each within *deadline_s*."""
    from mctl.bmc.client import BMCError, RedfishClient, base_url
    from mctl.bmc.power import TrayPower, _wait_state, host_system, send_reset

    def work(h: "Host", until: float) -> PowerOffResult:
        start = time.monotonic()
        tray = TrayPower(h.name, h.role, h.bmc)
        client = None
        try:
            if not h.bmc:
                return PowerOffResult(h.name, False, False, None, "no BMC address in the inventory")
            client = RedfishClient(base_url(h.bmc, scheme=settings.scheme, port=settings.port), settings.credentials,
                                   verify_tls=settings.verify_tls, timeout_s=settings.timeout_s, deadline=until,
                                   resume_tls=False)
            system = host_system(client)
            tray.after = system.power_state
            if system.power_state != "Off":
                send_reset(client, system, "ForceOff", tray)
                _wait_state(client, system, ("Off",), until - 0.2, tray)
            state = tray.after
            return PowerOffResult(h.name, bool(tray.sent), state == "Off", state,
                                  None if state == "Off" else f"PowerState still {state} at the deadline",
                                  round(time.monotonic() - start, 3))
        except BMCError as exc:
            return PowerOffResult(h.name, bool(tray.sent), False, tray.after, exc.message,
                                  round(time.monotonic() - start, 3))
        except Exception as exc:  # noqa: BLE001
            return PowerOffResult(h.name, bool(tray.sent), False, tray.after,
                                  f"unexpected answer ({type(exc).__name__})", round(time.monotonic() - start, 3))
        finally:
            if client is not None:
                client.close()

    def late(h: "Host") -> PowerOffResult:
        # the worker may have POSTed: counted as sent, so it is never sent again this episode
        return PowerOffResult(h.name, True, False, None, f"no answer within {deadline_s:g}s (the ForceOff may "
                              "have been sent: it is not sent again)", deadline_s)

    return _parallel(hosts, deadline_s, settings.concurrency, work, late)  # type: ignore[return-value]
