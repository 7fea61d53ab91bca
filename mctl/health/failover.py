"""Two watches for the same racks, one acting: the leader lease in etcd v3 and the fencing token.

A watch configured with `health.failover.etcd` (docs/health.md, "Failover") campaigns for one key,
`<key_prefix>/<site>/watch/<shard>`, before it sweeps:

- **campaign**: a lease of `ttl` seconds is granted and the key created under it in one transaction that
  succeeds only if the key is absent (etcd's create revision 0). The watch that created it leads; its
  **fencing token** is the key's create revision, which etcd never hands out twice. The other watch is
  the standby: it asks again every `ttl / 4` (a watch of etcd would be quicker by a few hundred
  milliseconds and is a stream to keep open: not worth it at these TTLs). When the leader stops (killed,
  paused, cut off) its lease is not renewed, etcd deletes the key at the lease's end, and the standby's
  next campaign creates it: takeover within `ttl + ttl/4` of the leader's last renewal.
- **renew**: the leader keeps its lease alive from a thread every `ttl / 3`, beside the sweep (a sweep may
  be longer than the TTL). A renewal etcd answers with TTL 0 (the lease is gone) or none answered for a
  whole TTL ends the leadership: the watch goes back to campaigning.
- **fence**: right before the actuator writes the intents of a batch of acts (the first durable step of
  an act), it asks etcd in one transaction whether the key still has the leader's create revision
  (`Elector.fence`). Only etcd can say that for this instant: a leader paused past its TTL still believes
  it leads when it resumes, and its renewal thread has not run yet. When the answer is no, or etcd does
  not answer, the acts are refused (one `fenced` line each in the action log, with the token) and the
  sweep ends there, its state not saved. Every intent and result line carries the token (`fence`).

What the fence cannot do: Slurm and the BMCs do not check tokens, so the window between etcd's answer
and the act reaching them (the intent's fsync, the scheduler script's SSH round trip) stays open; it is
milliseconds to a few seconds against a TTL of seconds to a minute (D122).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from mctl.errors import MctlError
from mctl.model.settings import FailoverSettings
from mctl.state.etcd import EtcdClient, EtcdUnreachable

FENCED = "fenced"              # the action-log line of an act refused by the fence


class Fenced(MctlError):
    """This watch does not hold the lease (or cannot tell): it must not act."""

    def __init__(self, message: str, token: int | None):
        super().__init__(message, hint="another watch leads these racks, or etcd is out of reach: this one waits "
                                       "as the standby")
        self.token = token


def lease_key(settings: FailoverSettings, site: str, shard: str) -> str:
    return f"{settings.key_prefix.rstrip('/')}/{site}/watch/{shard}"


@dataclass(frozen=True)
class Holder:
    """Who leads, as the key's value says."""

    who: str
    token: int
    since: float | None = None

    def describe(self) -> str:
        return f"{self.who} (token {self.token})"


class Elector:
    """One watch's side of the lease. campaign() and fence() block on etcd (each request under its
    timeout); call them from a thread when in an event loop."""

    def __init__(self, client: EtcdClient, key: str, who: str, ttl: int, *,
                 on_change: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.client, self.key, self.who, self.ttl = client, key, who, int(ttl)
        self.on_change = on_change or (lambda text: None)
        self.clock = clock
        self.token: int | None = None
        self.lease: int | None = None
        self.holder: Holder | None = None          # the other watch, while standby
        self._renewed = 0.0                        # the clock when the last renewal was sent and answered
        self._said = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def configure(cls, settings: FailoverSettings, site: str, shard: str, interval: float, *,
                  who: str | None = None, on_change: Callable[[str], None] | None = None) -> "Elector":
        client = EtcdClient(settings.etcd, timeout=settings.timeout_s)
        return cls(client, lease_key(settings, site, shard), who or default_who(), settings.ttl_for(interval),
                   on_change=on_change)

    @property
    def leading(self) -> bool:
        return self.token is not None

    @property
    def poll(self) -> float:
        """How often a standby campaigns."""
        return max(0.25, self.ttl / 4)

    # ------------------------------------------------------------------ campaign, renew, give up

    def campaign(self) -> bool:
        """Lead if nobody does; True while this watch leads."""
        if self.leading:
            return True
        try:
            lease = self.client.grant(self.ttl)
            value = json.dumps({"who": self.who, "since": time.time()})
            sent = self.clock()
            created, kv = self.client.create(self.key, value, lease)
        except MctlError as exc:                    # out of reach, or an answer that is not a lease
            self._standby(None, f"etcd out of reach: {exc.message}" if isinstance(exc, EtcdUnreachable)
                          else exc.message)
            return False
        if not created:
            try:
                self.client.revoke(lease)
            except MctlError:
                pass                # it ends with its TTL anyway
            self._standby(_holder(kv), None)
            return False
        with self._lock:
            self.token, self.lease, self._renewed, self.holder, self._said = kv.create_revision, lease, sent, None, ""
        self.on_change(f"leading (fencing token {self.token}, lease TTL {self.ttl}s, key {self.key})")
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="mctl-lease", daemon=True)
        self._thread.start()
        return True

    def _standby(self, holder: Holder | None, why: str | None) -> None:
        text = f"standby: {why}" if why else (f"standby: {holder.describe()} leads" if holder
                                              else "standby: the lease is free, asking again")
        if text != self._said:              # said once per change, not every poll
            self.on_change(text)
        self._said, self.holder = text, holder

    def _renew_loop(self) -> None:
        every = max(0.2, self.ttl / 3)
        while not self._stop.wait(every):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Keep the lease alive; False once it is lost (etcd says so, or no renewal answered for a TTL)."""
        with self._lock:
            lease, token = self.lease, self.token
        if lease is None:
            return False
        sent = self.clock()
        try:
            left = self.client.keepalive(lease)
        except MctlError as exc:
            if self.clock() - self._renewed >= self.ttl:
                self._lose(token, f"no renewal answered for {self.ttl}s ({exc.message})")
                return False
            return True
        if left <= 0:
            self._lose(token, "etcd says the lease expired")
            return False
        with self._lock:
            if self.token == token:
                self._renewed = sent
        return True

    def _lose(self, token: int | None, why: str) -> None:
        with self._lock:
            if token is None or self.token != token:
                return
            self.token, self.lease = None, None
        self._stop.set()
        self.on_change(f"lost the lease (fencing token {token}): {why}")

    def fence(self) -> int:
        """The token, if etcd says now that this watch still holds the key; else Fenced (and the lease is
        given up locally: the next campaign starts afresh)."""
        token = self.token
        if token is None:
            raise Fenced("this watch does not hold the lease", None)
        try:
            held = self.client.holds(self.key, token)
        except MctlError as exc:                    # no answer (or none that says yes): never act on a guess
            self._lose(token, "etcd out of reach at the fence")
            raise Fenced(f"etcd out of reach: cannot tell that fencing token {token} still holds {self.key} "
                         f"({exc.message})", token) from None
        if not held:
            self._lose(token, "the key is no longer this watch's")
            raise Fenced(f"fencing token {token} no longer holds {self.key}: another watch leads", token)
        return token

    def resign(self) -> None:
        """Stop renewing and end the lease now (a clean stop hands over at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout * len(self.client.endpoints) + 1)
        with self._lock:
            lease, self.token, self.lease = self.lease, None, None
        if lease is not None:
            try:
                self.client.revoke(lease)
            except MctlError:
                pass                # it ends with its TTL


def default_who() -> str:
    import os

    return f"{socket.gethostname()} pid {os.getpid()}"


def _holder(kv) -> Holder | None:
    if kv is None:
        return None
    try:
        data = json.loads(kv.value)
    except ValueError:
        data = {}
    return Holder(str(data.get("who") or kv.value), kv.create_revision, data.get("since"))
