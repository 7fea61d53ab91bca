"""What the health engine remembers of each tray's boots from sweep to sweep.

Per tray: the boot id the last sweep read, and the XID lines that sweep read.
When the boot id changes, the tray rebooted: its earlier lines were all written
before this boot, whatever their stamps say, so they no longer count as current
(the gpu.xid check). Kept in memory by the watch; the boot ids (not the lines)
are also written to `health/boots.json` in the state folder after each sweep, so
a later `mctl health check` sees a reboot that happened since.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mctl.model.tray import TrayFacts, xid_key

FILE = "boots.json"


@dataclass
class BootMemory:
    boot_ids: dict[str, str] = field(default_factory=dict)
    _lines: dict[str, frozenset] = field(default_factory=dict)       # XID lines the last sweep read
    _older: dict[str, frozenset] = field(default_factory=dict)       # lines read under an earlier boot
    _saved: dict[str, str] | None = None                              # what the file holds (None: unknown)

    def see(self, facts: TrayFacts) -> TrayFacts:
        """*facts* with the previous boot id and earlier boots' XIDs marked; remembers this sweep."""
        if not facts.reached or not facts.boot_id:
            return facts
        host = facts.host
        previous = self.boot_ids.get(host)
        keys = frozenset(xid_key(x.event) for x in facts.xids)
        older = self._older.get(host, frozenset())
        if previous is not None and previous != facts.boot_id:
            older |= self._lines.get(host, frozenset())
        older &= keys               # lines rotated out of the log need not be remembered: bounded by the probe's tail
        out = facts.after_sweep(previous, older)
        self.boot_ids[host] = facts.boot_id
        self._lines[host] = keys
        self._older[host] = older
        return out

    @classmethod
    def load(cls, state_dir: Path) -> "BootMemory":
        try:
            data = json.loads((Path(state_dir) / "health" / FILE).read_text())
            ids = {str(h): str(b) for h, b in (data.get("boot_ids") or {}).items()}
        except (OSError, ValueError, AttributeError):
            ids = {}
        return cls(boot_ids=ids, _saved=dict(ids))

    def save(self, state_dir: Path) -> None:
        """Only when a boot id changed (the watch sweeps every few seconds). Best effort: a state folder
        that cannot be written costs only the next check's reboot notice."""
        from mctl.errors import EnvironmentProblem
        from mctl.state.files import write_json

        if self._saved == self.boot_ids:
            return
        try:
            write_json(Path(state_dir) / "health" / FILE, {"boot_ids": dict(sorted(self.boot_ids.items()))})
            self._saved = dict(self.boot_ids)
        except (OSError, EnvironmentProblem):
            pass
