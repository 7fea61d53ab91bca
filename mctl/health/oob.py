"""The health sweep's out-of-band side: each tray's BMC read over Redfish, and a leak's power-off sent.

`read(hosts, settings, deadline_s)` reads, per tray and in parallel (one worker thread per BMC, at most
`bmc.concurrency`), GET only:

    Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors, and each member   DetectorState
    Chassis/Chassis_0/PowerSubsystem, its PowerSupplies, and each member               Status.Health

into mctl.checks.leak.BmcHealth (7 GETs on a GB200 compute tray). Every tray has its own deadline (the
engine gives the tray deadline, at least 10 s, at most `bmc.deadline_s`), enforced from outside its thread too: a BMC that hangs is reported (`bmc.reachable`),
never taken as healthy, and never holds the sweep. The client is mctl.bmc.client (requests sent once,
TLS verified, origins checked, credentials never logged).

`power_off(host, settings, deadline_s)` sends one `ComputerSystem.Reset` ForceOff to System_0 (none when it
is already Off) and waits, within the deadline, for PowerState Off.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from mctl.checks.leak import (LEAK_DETECTORS, POWER_SUBSYSTEM, BmcHealth, parse_detector,
                              parse_power_subsystem, parse_supply)

if TYPE_CHECKING:
    from mctl.bmc.inventory import Settings
    from mctl.model.site import Host, Site

# BMC errors that mean the BMC itself did not answer (the rest: one resource could not be read)
_SILENT = ("timeout", "unreachable", "auth", "tls", "origin", "config")


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


def read_tray(client) -> BmcHealth:
    """One tray's BMC (raises BMCError when the BMC itself does not answer)."""
    from mctl.bmc.client import BMCError

    start = time.monotonic()
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

    seen: dict = {}                  # the subsystem's health stays known when one of its supplies fails

    def supplies_of():
        seen["health"], link = parse_power_subsystem(client.get(POWER_SUBSYSTEM))
        return tuple(parse_supply(client.get(p)) for p in (client.members(link) if link else ()))

    detectors, leak_error = part(lambda: tuple(parse_detector(client.get(p)) for p in client.members(LEAK_DETECTORS)),
                                 "leak detector")
    supplies, power_error = part(supplies_of, "power supply")
    health = seen.get("health")
    return BmcHealth(detectors=detectors, leak_error=leak_error, power_health=health, supplies=supplies,
                     power_error=power_error, elapsed=round(time.monotonic() - start, 3))


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
            pending.append((h, done, until + 0.5, box))
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
    """host -> what its BMC said (never raises for one tray's trouble)."""
    from mctl.bmc.client import BMCError, RedfishClient, base_url, warn_once
    from mctl.errors import MctlError

    deadline_s = max(1.0, min(deadline_s, settings.deadline_s))
    once = warn_once(warn)

    def work(h: "Host", until: float) -> BmcHealth:
        start = time.monotonic()
        if not h.bmc:
            return BmcHealth(error="no BMC address in the inventory", error_kind="config")
        client = None
        try:
            client = RedfishClient(base_url(h.bmc, scheme=settings.scheme, port=settings.port), settings.credentials,
                                   verify_tls=settings.verify_tls, timeout_s=min(settings.timeout_s, deadline_s),
                                   deadline=until, warn=once, resume_tls=False)
            return read_tray(client)
        except BMCError as exc:
            return BmcHealth(error=exc.message, error_kind=exc.kind, elapsed=round(time.monotonic() - start, 3))
        except MctlError as exc:
            return BmcHealth(error=exc.message, error_kind="config")
        except Exception as exc:  # noqa: BLE001 - a document shape mctl did not expect: that tray, not the sweep
            return BmcHealth(error=f"unexpected answer ({type(exc).__name__})", error_kind="malformed")
        finally:
            if client is not None:
                client.close()

    def late(h: "Host") -> BmcHealth:
        return BmcHealth(error=f"no complete answer within {deadline_s:g}s", error_kind="timeout",
                         elapsed=deadline_s)

    return _parallel(hosts, deadline_s, settings.concurrency, work, late)  # type: ignore[return-value]


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
