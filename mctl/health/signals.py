"""What the health engine remembers of each tray's counters from sweep to sweep: NVLink error counters
and clock-event streaks.

NVLink error counters are cumulative since the driver loaded; a rate needs an earlier reading. Per
tray the memory keeps readings of the window (`health.nvlink_error_window`): the oldest, then one every
window/SPACING, and the newest, each holding only its counters that are not zero (a tray of 4 GPUs has
~1,400 judged counters, nearly all zero: 64 full readings were 5.5 MiB a tray, these are ~2 KiB). On each
new facts it puts the growth of every judged counter since the oldest reading still in the window
(mctl.model.gpu.NvLinkWindow); mctl.checks.nvlink_errors judges it. A counter that went backwards
(driver reload, counter reset, wrap), a tray that rebooted, or a GPU that changed restarts that
counter's baseline: never a negative rate, never a huge one. Times are the tray's own clock (the
probe's clock section), so a slow SSH answer does not stretch the window.

Clock-event streaks: per GPU and reason, how many sweeps in a row it was active (mctl.checks.clocks).

The watch keeps all of this in memory; after each sweep the latest reading of every tray (the
counters that are not zero, and the streaks) is written to `health/signals.json`, so a later `mctl
health check` compares against it (within the window) instead of starting from nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from mctl.checks.nvlink_errors import judged
from mctl.model.gpu import LinkRate, NvLinkWindow
from mctl.model.tray import TrayFacts

FILE = "signals.json"
MAX_READINGS = 64                 # per tray: bounded whatever the interval and window
SPACING = 8                       # readings kept at least window/SPACING apart (the newest always): ~9 a tray


@dataclass
class Reading:
    epoch: float
    boot_id: str | None
    counters: dict[tuple[str, int, str], int]            # (GPU key, link, counter) -> value, the non-zero ones
    index: dict[str, int] = field(default_factory=dict)  # GPU key -> its index in that reading


# host -> (the counters object last read, its non-zero judged counters, its GPU index): the same object as last
# sweep (mctl.facts.probe.LastParse: `nvlink -e` printed the same) is not walked again. The dicts are never changed
# once made (_rebase copies), so readings may share them.
_LAST: dict[str, tuple[object, dict, dict]] = {}


def reading_of(facts: TrayFacts) -> Reading | None:
    """The judged counters of *facts* that are not zero (a GPU in `index` reads zero on every counter it lacks:
    a healthy tray's reading is its GPU index and nothing else, whatever its number of links)."""
    if not facts.nvlink_counters:
        return None
    epoch = facts.clock.epoch if facts.clock is not None else time.time()
    last = _LAST.get(facts.host)
    if last is not None and last[0] is facts.nvlink_counters:
        return Reading(epoch, facts.boot_id, last[1], last[2])
    counters: dict[tuple[str, int, str], int] = {}
    index: dict[str, int] = {}
    for g in facts.nvlink_counters:
        index[g.key] = g.index
        for link, values in g.links.items():
            for name, value in values.items():
                if value and judged(name):
                    counters[(g.key, link, name)] = value
    _LAST[facts.host] = (facts.nvlink_counters, counters, index)
    return Reading(epoch, facts.boot_id, counters, index)


def compare(old: Reading, new: Reading) -> NvLinkWindow:
    """The growth of each counter from *old* to *new* (zero or more: a counter that went down is a reset)."""
    seconds = new.epoch - old.epoch
    if seconds <= 0 or (old.boot_id and new.boot_id and old.boot_id != new.boot_id):
        return NvLinkWindow()
    rates, resets = [], []
    for key, value in new.counters.items():
        before = old.counters.get(key, 0 if key[0] in old.index else None)
        if before is None:
            continue                                    # a GPU the earlier reading did not have: its baseline now
        gpu, link, name = key
        if value < before:
            resets.append(f"gpu{new.index.get(gpu, -1)} link{link} {name}")
        elif value > before:
            rates.append(LinkRate(new.index.get(gpu, -1), link, name, value - before, seconds))
    for key in old.counters.keys() - new.counters.keys():
        gpu, link, name = key
        if gpu in new.index:                            # back to zero: the counter restarted
            resets.append(f"gpu{new.index[gpu]} link{link} {name}")
    return NvLinkWindow(seconds=seconds, rates=tuple(rates), resets=tuple(sorted(resets)))


@dataclass
class SignalMemory:
    window_s: float = 600.0
    readings: dict[str, list[Reading]] = field(default_factory=dict)
    streaks: dict[str, dict[tuple[int, str], int]] = field(default_factory=dict)
    _dirty: bool = False

    def see(self, facts: TrayFacts) -> TrayFacts:
        """*facts* with the window's NVLink counter growth and the clock-event streaks; remembers this sweep."""
        if not facts.reached or facts.gpus is None:
            return facts
        host = facts.host
        out = facts
        new = reading_of(facts)
        if new is not None:
            kept = [r for r in self.readings.get(host, []) if 0 < new.epoch - r.epoch <= self.window_s
                    and (not r.boot_id or not new.boot_id or r.boot_id == new.boot_id)]
            window = compare(kept[0], new) if kept else NvLinkWindow()
            if window.resets:                          # a counter that restarted: its baseline is this reading
                kept = [_rebase(r, new) for r in kept]
            out = replace(out, nvlink_window=window)
            self.readings[host] = (_thinned(kept, self.window_s / SPACING) + [new])[-MAX_READINGS:]
            self._dirty = True
        before = self.streaks.get(host, {})
        now: dict[tuple[int, str], int] = {}
        for g in facts.gpus.gpus:
            for reason in g.clock_events.active:
                now[(g.index, reason)] = before.get((g.index, reason), 0) + 1
        if now != before:
            self._dirty = True
        self.streaks[host] = now
        return replace(out, clock_streaks=tuple(sorted((g, r, n) for (g, r), n in now.items())))

    # -- the file: the latest reading of each tray ---------------------------------------------------

    @classmethod
    def load(cls, state_dir: Path, window_s: float) -> "SignalMemory":
        mem = cls(window_s=window_s)
        try:
            data = json.loads((Path(state_dir) / "health" / FILE).read_text())
            for host, t in (data.get("trays") or {}).items():
                r = t.get("reading")
                if r:
                    counters = {(str(k[0]), int(k[1]), str(k[2])): int(v) for k, v in
                                ((key.split("|"), value) for key, value in (r.get("counters") or {}).items())}
                    mem.readings[str(host)] = [Reading(float(r["epoch"]), r.get("boot_id"), counters,
                                                       {str(k): int(v) for k, v in (r.get("index") or {}).items()})]
                mem.streaks[str(host)] = {(int(g), str(n)): int(c) for g, n, c in t.get("streaks") or []}
        except (OSError, ValueError, AttributeError, KeyError, TypeError, IndexError):
            return cls(window_s=window_s)
        return mem

    def save(self, state_dir: Path) -> None:
        """Best effort, after a sweep that read something: a state folder that cannot be written costs only the
        next check's baseline."""
        from mctl.errors import EnvironmentProblem
        from mctl.state.files import write_json

        if not self._dirty:
            return
        trays = {}
        for host in sorted(set(self.readings) | set(self.streaks)):
            last = (self.readings.get(host) or [None])[-1]
            t: dict = {"streaks": [[g, n, c] for (g, n), c in sorted(self.streaks.get(host, {}).items())]}
            if last is not None:
                t["reading"] = {"epoch": last.epoch, "boot_id": last.boot_id, "index": last.index,
                                "counters": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in sorted(last.counters.items())
                                             if v}}
            trays[host] = t
        try:
            write_json(Path(state_dir) / "health" / FILE, {"version": 1, "trays": trays})
            self._dirty = False
        except (OSError, EnvironmentProblem):
            pass


def _thinned(readings: list[Reading], spacing: float) -> list[Reading]:
    """*readings* (oldest first) with those closer than *spacing* to the one kept before them left out: the
    oldest stays (the window's rate is taken from it), and a tray keeps ~SPACING readings whatever the
    interval. The window a rate covers is then between (1 - 1/SPACING) and 1 of `nvlink_error_window`."""
    out: list[Reading] = []
    for r in readings:
        if not out or r.epoch - out[-1].epoch >= spacing:
            out.append(r)
    return out


def _rebase(old: Reading, new: Reading) -> Reading:
    """*old* with every counter that went down since taken from *new* (its baseline restarts)."""
    counters = dict(old.counters)
    for key, value in new.counters.items():
        if key in counters and value < counters[key]:
            counters[key] = value
    for key in old.counters.keys() - new.counters.keys():
        if key[0] in new.index:                         # restarted at zero
            del counters[key]
    return replace(old, counters=counters)
