"""The switch side of each rack's NVLink fabric, read from its NMX-M beside every sweep (docs/health.md).

One read per rack and sweep: NMX-M's compute nodes, GPUs, partitions, switch nodes, switches and
ports (each list paged), mapped to the rack's trays by mctl.fabric.switchside. A read runs in a
thread of its own, one attempt per list, each request under the sweep's deadline, and the sweep
waits for it once its probes are in: for a rack never read yet until the sweep's deadline, else at
most GRACE_S more (a read not done by then is judged in the next sweep), and only while the rack's
last read was good and took under half the deadline: a slow or failing NMX-M is read beside the
sweeps and judged by its age, never waited for. A rack whose read is still in flight when a sweep starts gets no second read: a hung
NMX-M holds at most one thread per rack, never a sweep. The sweep judges the last good view
with its age; a failed or malformed read, or a view older than `STALE_INTERVALS` sweep
intervals, is the rack's `nmx.switch_side` finding.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from mctl.errors import MctlError
from mctl.model.fabric import SwitchSideView

if TYPE_CHECKING:
    from mctl.model.site import Rack, Site

PAGE_SIZE = 1000             # items asked per page of each list (the OpenAPI Pagination's limit)
GRACE_S = 0.5                # how long past the probes a sweep waits for a rack read before (D106)
STALE_INTERVALS = 3          # a view older than this many sweep intervals (at least 3 deadlines) is stale


class _Rack:
    def __init__(self, rack: "Rack"):
        self.rack = rack
        self.good: SwitchSideView | None = None     # the last good read
        self.error: str | None = None               # the last read's error (None: it was good)
        self.thread: threading.Thread | None = None
        self.done = threading.Event()
        self.started = 0.0
        self.took: float | None = None              # how long the last read took (None: none ended yet)


class NmxWatch:
    """Each rack's switch-side view, read beside the sweeps (at most one read in flight per rack)."""

    def __init__(self, site: "Site", racks: Sequence["Rack"], *, deadline: float, stale_after_s: float,
                 read: Callable[["Rack"], SwitchSideView] | None = None, clock: Callable[[], float] = time.time):
        self.site = site
        self.deadline = float(deadline)
        self.stale_after_s = float(stale_after_s)
        self.clock = clock
        self._racks = {r.name: _Rack(r) for r in racks}
        self._read = read or self._read_nmx
        self._lock = threading.Lock()

    @property
    def racks(self) -> list[str]:
        return list(self._racks)

    def _read_nmx(self, rack: "Rack") -> SwitchSideView:
        from mctl.fabric.nmx import NMXClient, RetryPolicy
        from mctl.fabric.switchside import read_switch_side

        # 1000 a page: an NVL72 rack lists 72 x 18 = 1296 GPU ports (2 pages, not 13 at the default 100)
        policy = RetryPolicy(attempts=1, timeout_s=self.deadline, call_deadline_s=self.deadline,
                             operation_deadline_s=self.deadline, page_size=PAGE_SIZE)
        return read_switch_side(NMXClient.for_rack(self.site, rack, policy=policy), rack)

    def _run(self, slot: _Rack) -> None:
        try:
            view = self._read(slot.rack)
            with self._lock:
                slot.good, slot.error = view, None
        except MctlError as exc:
            with self._lock:
                slot.error = exc.message
        except Exception as exc:        # noqa: BLE001 - a bug in a read must not kill the watch; it is shown
            with self._lock:
                slot.error = f"{exc.__class__.__name__}: {exc}"
        finally:
            slot.took = time.monotonic() - slot.started
            slot.done.set()

    def start(self) -> list[_Rack]:
        """Start a read for each rack that has none in flight; the slots started."""
        now = time.monotonic()
        started = []
        for slot in self._racks.values():
            if slot.thread is not None and slot.thread.is_alive():
                continue
            started.append(slot)
            slot.done = threading.Event()
            slot.started = now
            slot.thread = threading.Thread(target=self._run, args=(slot,), name=f"nmx-{slot.rack.name}",
                                           daemon=True)
            slot.thread.start()
        return started

    def _worth_waiting(self, slot: _Rack) -> bool:
        """A read is waited for when the rack's last one was good and took under half the deadline (or there was
        none yet): a slow or failing NMX-M is read beside the sweeps and judged by its age, not waited for."""
        return slot.took is None or (slot.error is None and slot.took < self.deadline / 2)

    @staticmethod
    def _wait(slots: list[_Rack], until: float) -> None:
        for slot in slots:
            left = until - time.monotonic()
            if left <= 0:
                return
            slot.done.wait(left)

    def begin(self) -> list[_Rack]:
        """Start the sweep's reads (with its probes); the ones worth waiting for (see `_worth_waiting`)."""
        return [slot for slot in self.start() if self._worth_waiting(slot)]

    async def collect(self, started: list[_Rack], *, until: float, grace: float = GRACE_S) -> dict[str, SwitchSideView]:
        """Each rack's view once the probes are in: a rack never read yet is waited for until *until* (the sweep's
        deadline, monotonic), one read before at most *grace* more (else its last view, one sweep older)."""
        now = time.monotonic()
        first = [s for s in started if s.good is None]
        later = [s for s in started if s.good is not None]
        if first:
            await asyncio.to_thread(self._wait, first, until)
        if later:
            await asyncio.to_thread(self._wait, later, min(until, max(time.monotonic(), now + grace)))
        return self.snapshot()

    async def views(self, wait_s: float | None = None) -> dict[str, SwitchSideView]:
        """Start the reads, wait for them at most *wait_s* (default: the deadline), return each rack's view.

        Only the reads started now are waited for: a read still in flight from an earlier sweep (a hung
        NMX-M) is not, nor one after a read that failed or took half the deadline or more, so a hung or slow
        NMX-M costs at most one sweep its deadline, never every sweep."""
        started = self.begin()
        wait = self.deadline if wait_s is None else max(0.0, wait_s)
        return await self.collect(started, until=time.monotonic() + wait, grace=wait)

    def snapshot(self) -> dict[str, SwitchSideView]:
        now = self.clock()
        out: dict[str, SwitchSideView] = {}
        with self._lock:
            for name, slot in self._racks.items():
                in_flight = not slot.done.is_set()
                error = slot.error
                if in_flight and slot.good is None and error is None:
                    error = f"no answer from NMX-M within {self.deadline:g} s"
                base = slot.good or SwitchSideView(name)
                age = None if base.read_at is None else max(0.0, now - base.read_at)
                out[name] = replace(base, error=error, age_s=age)
        return out


def watch_for(site: "Site", rack_names: Sequence[str], *, deadline: float, interval: float) -> NmxWatch | None:
    """The watch of the scope's racks that have an NMX-M endpoint (None when none has)."""
    racks = [site.racks[r] for r in rack_names if r in site.racks and site.racks[r].nmx is not None]
    if not racks:
        return None
    return NmxWatch(site, racks, deadline=deadline,
                    stale_after_s=max(STALE_INTERVALS * interval, STALE_INTERVALS * deadline))
