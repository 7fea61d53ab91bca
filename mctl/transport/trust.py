"""Record SSH host keys on purpose (`mctl ssh trust`).

The key a host presents is fetched with a bare key exchange (no login), shown
by fingerprint, and written to the inventory's known_hosts. A host whose key
differs from the recorded one is refused unless the operator says --replace:
a changed key is how an intercepted connection looks, and also how a
reinstalled tray looks, and only a person can tell which.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mctl.state.lock import file_lock
from mctl.transport.known_hosts import HostKey, KnownHosts, check_entry
from mctl.transport.ssh import SSHConfig
from mctl.transport.targets import SSHTarget

# Host key algorithms in the order mctl prefers a new host's key.
PREFERRED_ALGS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                  "rsa-sha2-512", "rsa-sha2-256")
_ALGS_FOR_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}

ADDED = "added"
UNCHANGED = "unchanged"
REPLACED = "replaced"
REFUSED = "refused-changed"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class TrustOutcome:
    host: str
    address: str
    port: int
    action: str                        # added | unchanged | replaced | refused-changed | unreachable
    key: HostKey | None = None         # what the host presented
    previous: tuple[HostKey, ...] = ()  # what known_hosts held before
    error: str | None = None

    @property
    def trusted(self) -> bool:
        return self.action in (ADDED, UNCHANGED, REPLACED)

    def to_dict(self) -> dict:
        return {"host": self.host, "address": self.address, "port": self.port, "action": self.action,
                "key_type": self.key.key_type if self.key else None,
                "fingerprint": self.key.fingerprint if self.key else None,
                "previous": [k.describe() for k in self.previous], "error": self.error}


async def fetch_host_key(target: SSHTarget, *, timeout: float, algs: Sequence[str] = PREFERRED_ALGS) -> HostKey:
    """The host key *target* presents during key exchange (no authentication happens)."""
    import asyncssh

    async with asyncio.timeout(timeout):
        key = await asyncssh.get_server_host_key(target.address, target.port, server_host_key_algs=list(algs),
                                                 config=[])
    if key is None:
        raise ValueError("the server presented no host key")
    return HostKey.from_openssh(key.export_public_key("openssh").decode())


def _algs_for(recorded: Sequence[HostKey]) -> list[str]:
    algs: list[str] = []
    for key in recorded:
        for alg in _ALGS_FOR_TYPE.get(key.key_type, (key.key_type,)):
            if alg not in algs:
                algs.append(alg)
    return algs


async def _scan(target: SSHTarget, recorded: list[HostKey], timeout: float) -> HostKey:
    import asyncssh

    if recorded:
        # Ask for the recorded key types first, so an unchanged host is not mistaken
        # for a changed one merely because it also has a key of another type.
        try:
            return await fetch_host_key(target, timeout=timeout, algs=_algs_for(recorded))
        except (asyncssh.KeyExchangeFailed, asyncssh.DisconnectError):
            pass
    return await fetch_host_key(target, timeout=timeout)


def _error_text(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no SSH answer within {timeout:g}s"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)  # asyncio's text embeds the address; this groups across hosts
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


async def scan(config: SSHConfig, targets: Sequence[SSHTarget], known: KnownHosts) -> list[HostKey | str]:
    """The presented key per target, or the reason it could not be fetched."""
    sem = asyncio.Semaphore(config.concurrency)

    async def one(t: SSHTarget) -> HostKey | str:
        async with sem:
            try:
                return await _scan(t, known.keys_for(t.name, t.address, t.port), config.connect_timeout)
            except Exception as exc:  # noqa: BLE001 - every failure becomes that host's outcome
                return _error_text(exc, config.connect_timeout)

    return list(await asyncio.gather(*(one(t) for t in targets)))


def decide(known: KnownHosts, target: SSHTarget, presented: HostKey | str, *, replace: bool) -> TrustOutcome:
    """Pure decision for one host; applies the change to *known* (the caller saves it)."""
    recorded = tuple(known.keys_for(target.name, target.address, target.port))
    base = dict(host=target.name, address=target.address, port=target.port, previous=recorded)
    if isinstance(presented, str):
        return TrustOutcome(action=UNREACHABLE, error=presented, **base)
    if presented in recorded:
        return TrustOutcome(action=UNCHANGED, key=presented, **base)
    if not recorded:
        known.add(target.name, target.address, target.port, presented)
        return TrustOutcome(action=ADDED, key=presented, **base)
    if not replace:
        was = ", ".join(k.describe() for k in recorded)
        return TrustOutcome(action=REFUSED, key=presented, error=(
            f"host key changed: presented {presented.describe()}, recorded {was}; not replaced "
            f"(verify the tray was reinstalled, then rerun with --replace)"), **base)
    known.forget(target.name, target.address, target.port)
    known.add(target.name, target.address, target.port, presented)
    return TrustOutcome(action=REPLACED, key=presented, **base)


def trust_hosts(config: SSHConfig, targets: Sequence[SSHTarget], *, replace: bool = False,
                dry_run: bool = False, lock_path: Path | None = None) -> list[TrustOutcome]:
    """Fetch, compare and (unless dry_run) record host keys; one outcome per target, in order.

    *lock_path* (under the state directory) serialises concurrent trust runs so
    neither loses the other's keys.
    """
    for t in targets:               # before any connection: every line this run may write is a plain one
        check_entry(t.name, t.address, t.port)
    lock = file_lock(lock_path, purpose="mctl ssh trust", timeout=30, label=f"known_hosts {config.known_hosts}") \
        if lock_path is not None else nullcontext()
    with lock:
        known = KnownHosts.load(config.known_hosts)
        presented = asyncio.run(scan(config, targets, known))
        outcomes = [decide(known, t, p, replace=replace) for t, p in zip(targets, presented)]
        if not dry_run and any(o.action in (ADDED, REPLACED) for o in outcomes):
            known.save()
    return outcomes
