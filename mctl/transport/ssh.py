"""SSH fan-out over asyncssh: one connection per host, kept open and reused.

A pool outlives single commands: the health watch keeps one open for days, an
inventory run sends all its probes down the connections it opened once. Every
call returns a HostResult per host (never raises for a host's trouble), so one
dead tray cannot hide the answers of the other 71.

Policies, fixed here so every caller gets them:
- strict host keys from the inventory's known_hosts (never trust on first use);
  a refused key is reported with the fingerprint that was presented;
- bounded concurrency (Site.ssh.concurrency) over connects and commands;
- every wait has a deadline, here and nowhere else: a per-host deadline covers
  the whole of one host's work (waiting for a slot, connecting, opening the
  session on a kept connection, the command, its output), and inside it the
  connect timeout and the command timeout still apply; closing the pool is
  bounded too (CLOSE_TIMEOUT, then the connection is aborted);
- a host that misses its deadline is reported (timeout or unreachable, by the
  phase it was in) and its connection is aborted, never closed gracefully, since
  a frozen host would not answer a close either; a new one is opened in the
  background so the next command finds it ready;
- a host that gave no SSH answer in time (no banner, or a kept connection that
  opened no session: frozen, powered off, panicked) is *away*: it is reconnected
  in the background, attempt after attempt, and until it is back every command
  for it is answered at once as unreachable with the failed connect's error, so
  it costs one deadline, not one per command (docs/health.md, "Deadlines");
- retries (tenacity) only while connecting, and only for transient network
  errors; a command is never re-run, because it may not be idempotent;
- a connection storm is not a dead host (D124): the hosts at work at
  once are a window (_Window, at most ssh.concurrency) that halves when a
  connect or session open misses connect_timeout while others were in
  flight (the machine or network is saturated) and grows back by one per
  window of successes; such a connect is tried again within the host's
  deadline, such a session open waited for longer, instead of the host
  being reported unreachable (and away). A host that times out alone is
  dead (or frozen) and is reported as before;
- a pool made with waves=True (the one-shot commands: inventory, audit,
  health check) gives each host its deadline from when it gets its slot, and
  the fan-out as a whole deadline x waves (fanout_deadline); the watch's pool
  keeps every host within its deadline of the call, so a sweep ends within
  its interval.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

from mctl.errors import UsageError
from mctl.transport.known_hosts import HostKey, KnownHosts
from mctl.transport.results import HostKeyProblem, HostResult, HostStatus
from mctl.transport.targets import SSHTarget

if TYPE_CHECKING:
    import asyncssh

    from mctl.model.site import Site

# AES-GCM first: hardware-accelerated in OpenSSL, so a fan-out spends less CPU per byte.
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
           "aes128-ctr", "aes256-ctr")

CLOSE_TIMEOUT = 2.0          # seconds a pool waits for its connections to close before aborting them
RECONNECT_WAIT_MAX = 2.0     # seconds between two background reconnects of a host that is away, at most
DEFAULT_TRAY_DEADLINE = 15.0  # seconds a tray's probe may take when nothing else is set (health, inventory, audit)
# A deadline derived from a short interval is never below this: a whole probe (nvidia-smi included)
# on a busy tray needs a few seconds, and one cut short reads as a hung tray.
MIN_TRAY_DEADLINE = 5.0
MIN_WINDOW = 4                # a saturated window never shrinks below this many hosts at once
MIN_RETRY_LEFT = 0.5          # seconds of a host's deadline a storm retry needs to be worth starting


def fanout_deadline(deadline: float, hosts: int, concurrency: int) -> float:
    """The whole fan-out's deadline when each host gets *deadline* from its slot: one per wave of
    *concurrency* hosts (a one-shot command: it ends when its last wave could have)."""
    waves = max(1, -(-int(hosts) // max(1, int(concurrency))))
    return float(deadline) * waves


def per_tray_deadline(*, configured: float | None = None, interval: float | None = None,
                      command_timeout: float | None = None, override: float | None = None) -> float:
    """The seconds one tray's whole probe may take (connect, session, command, output).

    *override* (a --timeout flag) wins as given, then *configured* (health.tray_deadline), at most
    the command timeout; otherwise the sweep interval, at most DEFAULT_TRAY_DEADLINE and the
    command timeout, at least MIN_TRAY_DEADLINE, so a sweep ends within its interval (or
    MIN_TRAY_DEADLINE for a shorter one).
    """
    if override is not None:
        return float(override)
    if configured is not None:
        value = float(configured)
        return min(value, float(command_timeout)) if command_timeout is not None else value
    value = min(float(interval), DEFAULT_TRAY_DEADLINE) if interval else DEFAULT_TRAY_DEADLINE
    if command_timeout is not None:
        value = min(value, float(command_timeout))
    return max(min(MIN_TRAY_DEADLINE, float(command_timeout) if command_timeout is not None else MIN_TRAY_DEADLINE),
               value)


@dataclass(frozen=True)
class SSHConfig:
    """Everything the pool needs, resolved from the Site (paths absolute)."""

    known_hosts: Path
    user: str = "root"
    port: int = 22
    identity_file: Path | None = None
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    concurrency: int = 64
    connect_attempts: int = 3
    retry_wait: float = 0.2                # first back-off; doubles up to 2 s
    keepalive_interval: float = 30.0

    @classmethod
    def from_site(cls, site: "Site", *, concurrency: int | None = None, connect_timeout: float | None = None,
                  command_timeout: float | None = None) -> "SSHConfig":
        """The inventory's ssh settings; a non-None argument overrides its setting (CLI flags)."""
        s = site.ssh
        return cls(known_hosts=site.known_hosts, user=s.user, port=s.port, identity_file=site.identity_file,
                   connect_timeout=float(connect_timeout if connect_timeout is not None else s.connect_timeout),
                   command_timeout=float(command_timeout if command_timeout is not None else s.command_timeout),
                   concurrency=int(concurrency if concurrency is not None else s.concurrency))


class _ConnectFailed(Exception):
    def __init__(self, status: HostStatus, error: str, *, attempts: int, host_key: HostKeyProblem | None = None,
                 silent: bool = False):
        super().__init__(error)
        self.status = status
        self.error = error
        self.attempts = attempts
        self.host_key = host_key
        self.silent = silent          # no SSH answer at all in time (a frozen or dead host), not a refusal


@dataclass
class _Away:
    """A host that gave no SSH answer in time, reconnected in the background until it is back."""

    since: float                      # time.monotonic() when it went away
    error: str                        # why: the missed deadline, then each failed reconnect's error
    attempts: int = 0                 # background reconnects that failed so far


def _transient(exc: BaseException) -> bool:
    """Worth another connect attempt: the network or sshd hiccuped, nothing was refused on purpose."""
    import asyncssh

    if isinstance(exc, (asyncssh.HostKeyNotVerifiable, asyncssh.PermissionDenied)):
        return False
    if isinstance(exc, asyncio.TimeoutError):
        return False  # a hung host would multiply the wait; report it instead
    return isinstance(exc, (OSError, asyncssh.ConnectionLost, asyncssh.DisconnectError))


def _describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)  # asyncio's text embeds the address; this groups across hosts
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _Window:
    """How many hosts are at work at once (connect, session, command): AIMD, as TCP's congestion window.

    It starts at ssh.concurrency (nothing changes while nothing times out), halves when a connect or a session
    open misses connect_timeout while others were in flight (at most once per *hold* seconds, connect_timeout:
    a burst of timeouts from one saturated window is one signal), never below MIN_WINDOW, and grows by one per
    window's worth of connects and session opens that succeed, back to the cap. Places are served in the order
    asked for."""

    def __init__(self, cap: int, hold: float):
        self.cap = max(1, int(cap))
        self.floor = min(MIN_WINDOW, self.cap)
        self.limit = float(self.cap)
        self.hold = hold
        self.active = 0                  # hosts at work
        self.smallest = self.cap         # the least the window was (tests, bench)
        self.shrinks = 0
        self.retries = 0                 # connects and session opens tried again after a storm timeout
        self._shrunk_at = -1e9
        self.waiting: "list[asyncio.Future]" = []     # hosts waiting for a place

    def _wake(self) -> None:
        while self.waiting and self.active < int(self.limit):
            fut = self.waiting.pop(0)
            if not fut.done():
                fut.set_result(None)
                self.active += 1

    async def acquire(self) -> None:
        if self.active < int(self.limit) and not self.waiting:
            self.active += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()           # woken, then cancelled: hand the place on
            elif fut in self.waiting:
                self.waiting.remove(fut)
            raise

    def release(self) -> None:
        self.active -= 1
        self._wake()

    async def __aenter__(self) -> "_Window":
        await self.acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()

    def success(self) -> None:
        self.limit = min(float(self.cap), self.limit + 1.0 / self.limit)
        self._wake()

    def congested(self) -> None:
        now = time.monotonic()
        if now - self._shrunk_at < self.hold:
            return
        self._shrunk_at = now
        self.limit = max(float(self.floor), self.limit / 2)
        self.smallest = min(self.smallest, int(self.limit))
        self.shrinks += 1


class _Storm(Exception):
    """A connect missed connect_timeout in a storm (SSHPool._storm): saturation, not a dead host."""


class SSHPool:
    """Open connections keyed by host name; async-first, see run_sync() for the CLI."""

    def __init__(self, config: SSHConfig, *, waves: bool = False):
        self.config = config
        # waves: each host's deadline counts from its slot, the fan-out's is fanout_deadline (one-shot commands)
        self.waves = waves
        self.window = _Window(config.concurrency, hold=config.connect_timeout)
        # host -> the latest instant (time.monotonic()) a caller waits for its connect: storm retries stop there
        self._until: dict[str, float] = {}
        self._opening = 0                # session opens in flight (a timeout beside others is a storm)
        self._connects = 0               # connects in flight (likewise)

        # Hosts whose last command never got a slot before its deadline: the next fan-out starts them first, so a
        # watch whose sweep cannot reach every tray in one interval still reaches each within a few.
        self._starved: set[str] = set()
        self.known_hosts = KnownHosts.load(config.known_hosts)
        self._conns: dict[str, "asyncssh.SSHClientConnection"] = {}
        # One connect in flight per host, shared by every caller that needs that host; it is
        # shielded, so a caller whose deadline passes leaves it running (the background reopen).
        self._connecting: dict[str, asyncio.Task] = {}
        # Hosts that gave no SSH answer in time: answered at once as unreachable until a background reconnect
        # (the task in _connecting) brings them back.
        self._away: dict[str, _Away] = {}
        self.dropped = 0                 # connections aborted after a missed deadline (tests, metrics)
        self._options: "asyncssh.SSHClientConnectionOptions | None" = None

    @classmethod
    def from_site(cls, site: "Site") -> "SSHPool":
        return cls(SSHConfig.from_site(site))

    @staticmethod
    def _storm(in_flight: int) -> bool:
        """A timeout in a storm, not on a dead host: others were in flight beside it (*in_flight* counts it).
        From outside a dead host in a storm looks the same: it is tried again, and named at its deadline."""
        return in_flight > 1

    async def __aenter__(self) -> "SSHPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- connection handling ----------------------------------------------------------------

    def _base_options(self) -> "asyncssh.SSHClientConnectionOptions":
        if self._options is None:
            import asyncssh

            keys = None
            agent: object = ()
            if self.config.identity_file is not None:
                from mctl.transport.identity import check_identity_file
                check_identity_file(self.config.identity_file)   # a group/world-readable key is refused
                try:
                    keys = [asyncssh.read_private_key(str(self.config.identity_file))]
                except (OSError, asyncssh.KeyImportError) as exc:
                    raise UsageError(f"cannot load SSH identity {self.config.identity_file}: "
                                     f"{getattr(exc, 'strerror', None) or exc}",
                                     hint="set ssh.identity_file in the inventory to a readable private key") from None
                agent = None
            try:
                known = self.known_hosts.as_asyncssh()
            except (ValueError, asyncssh.KeyImportError) as exc:
                raise UsageError(f"cannot read known_hosts {self.config.known_hosts}: {exc}",
                                 hint="fix or remove the bad line, then run 'mctl ssh trust'") from None
            extra = {} if agent == () else {"agent_path": agent}
            self._options = asyncssh.SSHClientConnectionOptions(
                config=[], known_hosts=known, client_keys=keys, compression_algs=None,
                encryption_algs=list(CIPHERS), keepalive_interval=self.config.keepalive_interval,
                keepalive_count_max=3, login_timeout=self.config.connect_timeout, **extra)
        return self._options

    def reload_known_hosts(self) -> None:
        """Pick up keys recorded by `mctl ssh trust` since the pool was opened (new connections only)."""
        self.known_hosts = KnownHosts.load(self.config.known_hosts)
        self._options = None

    def _semaphore(self) -> "_Window":
        """The hosts at work at once: ssh.concurrency at most, fewer while the machine or network is saturated."""
        return self.window

    async def _connect_once(self, target: SSHTarget) -> "asyncssh.SSHClientConnection":
        """One connect within the window; _Storm if it missed connect_timeout while others were in flight."""
        import asyncssh

        client = _client_class()()
        self._connects += 1
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                conn = await asyncssh.connect(target.address, target.port, options=self._base_options(),
                                              username=target.user, client_factory=lambda: client)
        except asyncssh.HostKeyNotVerifiable:
            raise _HostKeyRefused(client.refused_key) from None
        except TimeoutError:
            if self._storm(self._connects):
                self.window.congested()
                raise _Storm() from None
            raise
        finally:
            self._connects -= 1
        self.window.success()
        return conn

    async def _connection(self, target: SSHTarget) -> tuple["asyncssh.SSHClientConnection", int, bool]:
        """(connection, connect attempts used, reused?) or _ConnectFailed.

        The connect runs as a task of its own, shared by every caller for that host and shielded
        from their cancellation: a caller whose deadline passes stops waiting, the connect goes
        on (bounded by connect_timeout per attempt) and the next caller finds its result.
        """
        conn = self._conns.get(target.name)
        if conn is not None and not conn.is_closed():
            return conn, 0, True
        self._conns.pop(target.name, None)
        task = self._start_connect(target)
        conn, attempts = await asyncio.shield(task)
        return conn, attempts, False

    def _start_connect(self, target: SSHTarget) -> asyncio.Task:
        task = self._connecting.get(target.name)
        if task is not None and not task.done():
            return task
        task = asyncio.get_running_loop().create_task(self._open(target), name=f"mctl-ssh-connect-{target.name}")
        self._connecting[target.name] = task

        def done(t: asyncio.Task) -> None:
            if self._connecting.get(target.name) is t:
                self._connecting.pop(target.name, None)
            if not t.cancelled():
                t.exception()        # retrieved here: a background reopen that failed is not an error to log

        task.add_done_callback(done)
        return task

    async def _open(self, target: SSHTarget) -> tuple["asyncssh.SSHClientConnection", int]:
        import asyncssh
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        attempts = storms = 0
        while True:
            try:
                async for attempt in AsyncRetrying(
                        stop=stop_after_attempt(max(1, self.config.connect_attempts)),
                        wait=wait_exponential(multiplier=self.config.retry_wait, max=2.0),
                        retry=retry_if_exception(_transient), reraise=True):
                    with attempt:
                        attempts += 1
                        conn = await self._connect_once(target)
                break
            except _Storm:
                # Timed out in a saturated window: tried again (behind the smaller window) while a caller waits.
                storms += 1
                if self._until.get(target.name, 0.0) - time.monotonic() >= MIN_RETRY_LEFT:
                    self.window.retries += 1
                    continue
                raise _ConnectFailed(HostStatus.UNREACHABLE,
                                     f"no SSH answer within {self.config.connect_timeout:g}s ({storms} connect"
                                     f"{'s' if storms > 1 else ''} timed out in a saturated window of "
                                     f"{self.config.concurrency}, the last at {int(self.window.limit)})",
                                     attempts=attempts, silent=True) from None
            except _HostKeyRefused as exc:
                raise _ConnectFailed(HostStatus.HOST_KEY_MISMATCH, self._host_key_text(target, exc.presented),
                                     attempts=attempts, host_key=self._host_key_problem(target, exc.presented)) from None
            except asyncio.TimeoutError:
                # No banner in time, alone in the window: from outside, a dead host and a stopped sshd look the same.
                raise _ConnectFailed(HostStatus.UNREACHABLE, f"no SSH answer within {self.config.connect_timeout:g}s",
                                     attempts=attempts, silent=True) from None
            except asyncssh.PermissionDenied:
                raise _ConnectFailed(HostStatus.UNREACHABLE,
                                     f"authentication failed for user {target.user} (publickey)",
                                     attempts=attempts) from None
            except (OSError, asyncssh.Error) as exc:
                reason = getattr(exc, "reason", None) or _describe_os_error(exc)
                raise _ConnectFailed(HostStatus.UNREACHABLE, reason, attempts=attempts) from None
        old = self._conns.get(target.name)
        if old is not None and old is not conn:
            old.abort()
        self._conns[target.name] = conn
        return conn, attempts

    def drop(self, target: SSHTarget, conn: "asyncssh.SSHClientConnection | None" = None, *,
             reopen: bool = True) -> None:
        """Abort the host's connection (*conn*, the one a caller gave up on; default the current
        one) without a graceful close, which a frozen host never answers, and with *reopen* start
        a new one in the background. A newer connection opened meanwhile is left alone."""
        current = self._conns.get(target.name)
        conn = current if conn is None else conn
        if conn is not None and conn is current:
            self._conns.pop(target.name, None)
        if conn is not None and not conn.is_closed():
            self.dropped += 1
            try:
                conn.abort()
            except Exception:  # noqa: BLE001 - an already broken transport is what we are getting rid of
                pass
        if reopen and target.name not in self._conns:
            self._start_connect(target)

    def away(self, name: str) -> bool:
        """Whether *name* gave no SSH answer in time and is being reconnected in the background."""
        return name in self._away

    def _go_away(self, target: SSHTarget, conn: "asyncssh.SSHClientConnection | None", error: str) -> None:
        """The host gave no SSH answer in time: abort *conn* (if any) and reconnect it in the background, attempt
        after attempt; until one succeeds, every command for it is answered at once (_away_result)."""
        self.drop(target, conn, reopen=False)
        if target.name in self._conns:          # a newer connection came up meanwhile: it is not away
            return
        if target.name not in self._away:
            self._away[target.name] = _Away(time.monotonic(), error)
        task = self._connecting.get(target.name)
        if task is not None and not task.done() and task.get_name().startswith("mctl-ssh-reconnect-"):
            return
        first = task if task is not None and not task.done() else None
        loop_task = asyncio.get_running_loop().create_task(self._reconnect(target, first),
                                                           name=f"mctl-ssh-reconnect-{target.name}")
        self._connecting[target.name] = loop_task

        def done(t: asyncio.Task) -> None:
            if self._connecting.get(target.name) is t:
                self._connecting.pop(target.name, None)
            if not t.cancelled():
                t.exception()

        loop_task.add_done_callback(done)

    async def _reconnect(self, target: SSHTarget, first: asyncio.Task | None):
        """Reconnect an away host until it answers (each attempt bounded by connect_timeout, RECONNECT_WAIT_MAX
        at most between two); a refused host key ends it (the next command reports the key)."""
        wait = self.config.retry_wait
        while True:
            try:
                result = await (first if first is not None else self._open(target))
            except _ConnectFailed as exc:
                away = self._away.get(target.name)
                if away is None:
                    raise
                away.error, away.attempts = exc.error, away.attempts + 1
                if exc.status is HostStatus.HOST_KEY_MISMATCH:
                    self._away.pop(target.name, None)
                    raise
                first = None
                await asyncio.sleep(wait)
                wait = min(wait * 2, RECONNECT_WAIT_MAX)
                continue
            self._away.pop(target.name, None)
            return result

    def _away_result(self, target: SSHTarget, away: _Away, start: float) -> HostResult:
        age = time.monotonic() - away.since
        return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect",
                          elapsed=time.monotonic() - start, attempts=0,
                          error=f"{away.error} (away {age:.0f}s, {away.attempts} reconnects failed: reconnecting in "
                                f"the background, not waited for)")

    def _host_key_problem(self, target: SSHTarget, presented: HostKey | None) -> HostKeyProblem:
        recorded = tuple(k.describe() for k in self.known_hosts.keys_for(target.name, target.address, target.port))
        return HostKeyProblem(presented.describe() if presented else None, recorded, str(self.config.known_hosts))

    def _host_key_text(self, target: SSHTarget, presented: HostKey | None) -> str:
        recorded = self.known_hosts.keys_for(target.name, target.address, target.port)
        shown = presented.describe() if presented else "an unreadable key"
        if not recorded:
            return (f"host key not trusted: {target.name} presented {shown}, which is not in "
                    f"{self.config.known_hosts}; if that is the right key run 'mctl ssh trust {target.name}'")
        was = ", ".join(k.describe() for k in recorded)
        return (f"HOST KEY CHANGED, refusing {target.name}: it presented {shown} but {self.config.known_hosts} "
                f"records {was}. Someone may be intercepting the connection, or the tray was reinstalled; "
                f"verify out of band, then run 'mctl ssh trust {target.name} --replace'")

    async def close(self) -> None:
        """Close every connection, waiting at most CLOSE_TIMEOUT for them, then abort what is left."""
        pending = list(self._connecting.values())
        self._connecting = {}
        self._away = {}
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT)
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail a report
                pass
        waits = [asyncio.ensure_future(conn.wait_closed()) for conn in conns]
        if waits:
            done, late = await asyncio.wait(waits, timeout=CLOSE_TIMEOUT)
            for w in done:
                if not w.cancelled():
                    w.exception()
            for w in late:
                w.cancel()
            for conn in conns:
                if not conn.is_closed():
                    conn.abort()    # a frozen host never acknowledges the close

    # --- commands ---------------------------------------------------------------------------

    async def run_one(self, target: SSHTarget, command: str, *, timeout: float | None = None,
                      deadline: float | None = None, whole: float | None = None) -> HostResult:
        """Run *command* on one host; never raises for the host's trouble.

        *timeout*: seconds the command itself may run once its session is open (default
        ssh.command_timeout; with a *deadline* and no timeout, the command may run until the
        deadline). *deadline*: seconds from now within which this host's whole work ends:
        waiting for a slot, connecting, opening the session, the command and its output. With
        *whole* too (a pool made with waves=True, see run): seconds from now the wait for a slot
        may take, and *deadline* counts from the slot (never past *whole*). Without a deadline,
        the host gets connect_timeout for its connection, connect_timeout for its session
        and *timeout* for the command, counted from when it got its slot.
        """
        start = time.monotonic()
        if deadline is not None:
            at = start + max(0.0, float(deadline))
            if whole is not None and whole > deadline:
                return await self._bounded(target, command, timeout, start + float(whole), start, float(deadline),
                                           queued=True, own=float(deadline), whole=float(whole))
            return await self._bounded(target, command, timeout, at, start, float(deadline), queued=True)
        command_timeout = self.config.command_timeout if timeout is None else timeout
        async with self._semaphore():
            budget = 2 * self.config.connect_timeout + command_timeout
            return await self._bounded(target, command, command_timeout, time.monotonic() + budget, start, budget,
                                       queued=False)

    async def _bounded(self, target: SSHTarget, command: str, timeout: float | None, at: float, start: float,
                       budget: float, *, queued: bool, own: float | None = None,
                       whole: float | None = None) -> HostResult:
        """_run_one under the absolute deadline *at*; a miss is reported by the phase it struck in. With *own*,
        *at* bounds the wait for a slot (the fan-out's deadline, *whole* seconds) and the host's work gets
        *own* seconds from its slot, never past *at*."""
        away = self._away.get(target.name)
        if away is not None:
            return self._away_result(target, away, start)
        state = {"phase": "queue" if queued else "connect", "attempts": 0, "proc": None, "reused": False,
                 "conn": None}
        try:
            async with asyncio.timeout_at(_loop_time(at)) as cm:
                if queued:
                    async with self._semaphore():
                        state["phase"] = "connect"
                        self._starved.discard(target.name)
                        if own is not None:
                            at = min(at, time.monotonic() + own)
                            budget = own
                            cm.reschedule(_loop_time(at))
                        self._until[target.name] = max(self._until.get(target.name, 0.0), at)
                        return await self._run_one(target, command, timeout, start, state)
                self._until[target.name] = max(self._until.get(target.name, 0.0), at)
                return await self._run_one(target, command, timeout, start, state)
        except TimeoutError:
            if state["phase"] == "queue" and whole is not None:
                budget = whole
            return self._missed(target, state, start, budget)

    async def _session(self, target: SSHTarget, conn: "asyncssh.SSHClientConnection", command: str):
        """Open the command's session within connect_timeout; while other session opens are in flight (a storm,
        not a frozen host) it is waited for longer, up to the host's deadline."""
        import asyncssh

        self._opening += 1
        task = asyncio.ensure_future(conn.create_process(command, encoding="utf-8", errors="replace",
                                                         stdin=asyncssh.DEVNULL))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.connect_timeout)
                if done:
                    proc = task.result()
                    self.window.success()
                    return proc
                storm = self._storm(self._opening)
                if storm:
                    self.window.congested()
                if storm and self._until.get(target.name, 0.0) - time.monotonic() >= MIN_RETRY_LEFT:
                    self.window.retries += 1
                    continue
                raise TimeoutError
        finally:
            self._opening -= 1
            if not task.done():
                task.cancel()

    def _missed(self, target: SSHTarget, state: dict, start: float, budget: float) -> HostResult:
        phase = state["phase"]
        elapsed = time.monotonic() - start
        attempts = state["attempts"]
        if phase == "queue":
            self._starved.add(target.name)
            return HostResult(target.name, target.address, HostStatus.TIMEOUT, phase="connect", elapsed=elapsed,
                              error=f"not started within the {budget:g}s deadline: every SSH slot "
                                    f"(ssh.concurrency {self.config.concurrency}) stayed busy", attempts=0)
        if phase == "connect":
            if self._storm(self._connects):
                # Cut in a storm (other connects in flight): not known dead. Its connect goes on in the background
                # (shared with the next command) and it is not marked away.
                return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect",
                                  elapsed=elapsed, attempts=max(1, attempts),
                                  error=f"no SSH connection within the {budget:g}s deadline in a saturated window "
                                        f"({self._connects} connects in flight, window {int(self.window.limit)} of "
                                        f"{self.config.concurrency}); still connecting in the background")
            # No connection yet: the connect goes on in the background, and the host is away until it succeeds.
            error = f"no SSH answer within the {budget:g}s deadline"
            self._go_away(target, None, error)
            return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect", elapsed=elapsed,
                              error=error, attempts=max(1, attempts))
        if phase == "session":
            if self._storm(self._opening + 1):
                # Other sessions were still opening when the deadline struck: a storm, not a frozen host; the
                # connection is kept for the next command.
                return HostResult(target.name, target.address, HostStatus.TIMEOUT, phase="connect", elapsed=elapsed,
                                  attempts=attempts,
                                  error=f"no session within the {budget:g}s deadline beside {self._opening} other "
                                        f"session opens (a saturated window); connection kept")
            error = (f"no answer within the {budget:g}s deadline: the {'kept ' if state['reused'] else ''}"
                     f"connection opened no session (frozen host?); connection dropped")
            self._go_away(target, state["conn"], error)
            return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect", elapsed=elapsed,
                              error=error, attempts=attempts)
        self.drop(target, state["conn"])
        stdout = stderr = ""
        proc = state["proc"]
        if proc is not None:
            try:
                stdout, stderr = proc.collect_output()
            except Exception:  # noqa: BLE001 - partial output is a courtesy
                pass
        return HostResult(target.name, target.address, HostStatus.TIMEOUT, stdout=stdout or "", stderr=stderr or "",
                          phase="command", elapsed=elapsed, attempts=attempts,
                          error=f"command did not finish within the {budget:g}s deadline; connection dropped")

    async def _run_one(self, target: SSHTarget, command: str, timeout: float | None, start: float,
                       state: dict) -> HostResult:
        import asyncssh

        attempts_total = 0
        for _ in range(2):  # a second go only when a reused connection turned out dead
            state["phase"] = "connect"
            try:
                conn, attempts, reused = await self._connection(target)
            except _ConnectFailed as exc:
                if exc.silent:
                    self._go_away(target, None, exc.error)
                return HostResult(target.name, target.address, exc.status, error=exc.error, phase="connect",
                                  elapsed=time.monotonic() - start, host_key=exc.host_key,
                                  attempts=attempts_total + exc.attempts)
            attempts_total += attempts
            state["attempts"] = attempts_total
            state["phase"] = "session"
            state["reused"] = reused
            state["conn"] = conn
            try:
                # Bounded: a kept connection to a frozen host takes the request and never answers it.
                proc = await self._session(target, conn, command)
            except TimeoutError:
                error = (f"no session within {self.config.connect_timeout:g}s on the "
                         f"{'kept ' if reused else ''}connection (frozen host?); connection dropped")
                self._go_away(target, conn, error)
                return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect",
                                  error=error, elapsed=time.monotonic() - start, attempts=attempts_total)
            except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as exc:
                self._conns.pop(target.name, None)
                if reused:
                    continue  # the command never started: reconnecting is a connect retry
                return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect",
                                  error=f"could not open a session: {getattr(exc, 'reason', None) or exc}",
                                  elapsed=time.monotonic() - start, attempts=attempts_total)
            state["phase"] = "command"
            state["proc"] = proc
            return await self._finish(target, proc, timeout, start, attempts_total)
        return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="connect",
                          error="connection lost", elapsed=time.monotonic() - start, attempts=attempts_total)

    async def _finish(self, target: SSHTarget, proc, timeout: float | None, start: float,
                      attempts: int) -> HostResult:
        import asyncssh

        try:
            async with asyncio.timeout(timeout):
                stdout, stderr = await proc.communicate()
        except TimeoutError:
            stdout, stderr = proc.collect_output()
            proc.close()        # sends the channel close, waits for nothing
            return HostResult(target.name, target.address, HostStatus.TIMEOUT, stdout=stdout or "",
                              stderr=stderr or "", phase="command",
                              error=f"command did not finish within {timeout:g}s",
                              elapsed=time.monotonic() - start, attempts=attempts)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as exc:
            self._conns.pop(target.name, None)
            return HostResult(target.name, target.address, HostStatus.UNREACHABLE, phase="command",
                              error=f"connection lost while the command ran: {getattr(exc, 'reason', None) or exc}",
                              elapsed=time.monotonic() - start, attempts=attempts)
        code = proc.exit_status
        signal = proc.exit_signal
        if code == 0:
            status, error = HostStatus.OK, None
        elif code is None or code < 0:
            status = HostStatus.FAILED
            error = f"killed by signal {signal[0]}" if signal else "exited without a status"
        else:
            status, error = HostStatus.FAILED, None
        return HostResult(target.name, target.address, status, exit_code=code if code is not None and code >= 0 else None,
                          stdout=stdout or "", stderr=stderr or "", error=error, phase="command" if error else None,
                          elapsed=time.monotonic() - start, attempts=attempts)


    async def run(self, targets: Sequence[SSHTarget], command: str | Callable[[SSHTarget], str], *,
                  timeout: float | None = None, deadline: float | None = None,
                  on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
        """Run *command* (or a per-target command) on every target; results in target order.

        With *deadline*, every host's result is in within that many seconds of the call, whatever
        the hosts do (see run_one); on a pool made with waves=True, each host gets *deadline* from
        its slot and the fan-out ends within fanout_deadline(deadline, hosts, ssh.concurrency)."""
        whole = (fanout_deadline(deadline, len(targets), self.config.concurrency)
                 if self.waves and deadline is not None else None)

        async def one(t: SSHTarget) -> HostResult:
            result = await self.run_one(t, command(t) if callable(command) else command, timeout=timeout,
                                        deadline=deadline, whole=whole)
            if on_result is not None:
                on_result(result)
            return result

        # The hosts that starved last time take the first slots (the semaphore serves in the order asked).
        order = sorted(range(len(targets)), key=lambda i: targets[i].name not in self._starved)
        results = await asyncio.gather(*(one(targets[i]) for i in order))
        by_index = dict(zip(order, results))
        return [by_index[i] for i in range(len(targets))]


def _loop_time(monotonic_at: float) -> float:
    """time.monotonic() instant -> the running loop's clock (the same clock in CPython, kept explicit)."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


class _HostKeyRefused(Exception):
    def __init__(self, key: "asyncssh.SSHKey | None"):
        super().__init__("host key refused")
        self.presented = HostKey.from_openssh(key.export_public_key("openssh").decode()) if key is not None else None


_CLIENT_CLASS = None


def _client_class():
    """An asyncssh client that remembers the host key it refused (built once, on first use)."""
    global _CLIENT_CLASS
    if _CLIENT_CLASS is None:
        import asyncssh

        class _Client(asyncssh.SSHClient):
            def __init__(self) -> None:
                self.refused_key = None

            # asyncssh asks only about keys known_hosts does not vouch for: note it, refuse it.
            def validate_host_public_key(self, host, addr, port, key):
                self.refused_key = key
                return False

        _CLIENT_CLASS = _Client
    return _CLIENT_CLASS


def run_sync(config: SSHConfig, targets: Sequence[SSHTarget], command: str | Callable[[SSHTarget], str], *,
             timeout: float | None = None, deadline: float | None = None,
             on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    """One fan-out from synchronous code (the CLI): open a pool, run, close."""

    async def main() -> list[HostResult]:
        async with SSHPool(config) as pool:
            return await pool.run(targets, command, timeout=timeout, deadline=deadline, on_result=on_result)

    return asyncio.run(main())


def run_in_pool(config: SSHConfig, work: Callable[[SSHPool], Awaitable]):
    """Run an async function that uses one pool for several fan-outs, from sync code."""

    async def main():
        async with SSHPool(config) as pool:
            return await work(pool)

    return asyncio.run(main())
