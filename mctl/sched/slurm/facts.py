"""Parsers for what Slurm prints (pure): `slurmd -C`, `scontrol show node -o`, `scontrol show topology`.

A node's state is read here once for all of mctl (health, bring-up, audit, deploy):
whether it is drained (DRAIN, DRAINING, DRAINED, FAIL, FAILING), down, its reason
with Slurm's ` [user@time]` stamp split off, and who stamped it when.

The hardware of a tray comes from `slurmd -C` on the tray itself, so the node
lines of slurm.conf say exactly what slurmd will report when it registers (a
mismatch would leave the node INVALID). Memory is rounded down to whole GiB so
trays of one model share a line and a kernel update that costs a few MiB does
not invalidate the fleet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from mctl.model.drain import NodeView

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")
MEMORY_STEP_MIB = 1024
# The drain flags: FAIL is a drain an administrator expects to fail (scontrol(1)), held like DRAIN.
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})
# Slurm stamps a reason with who set it and when (controller local time): `xid 79 [root@2026-11-29T19:51:38]`.
_STAMP = re.compile(r"\s*\[(?P<who>[^@\]\s]*)@(?P<at>[^\]\s]*)\]\s*$")
_NO_REASON = ("", "none", "(null)")


def key_values(line: str) -> dict[str, str]:
    """Slurm's `Key=value Key2=value with spaces` form; a value runs until the next Key=."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


@dataclass(frozen=True)
class NodeHardware:
    """What `slurmd -C` reports, in slurm.conf's terms."""

    cpus: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    real_memory: int              # MiB, rounded down to MEMORY_STEP_MIB

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "sockets": self.sockets, "cores_per_socket": self.cores_per_socket,
                "threads_per_core": self.threads_per_core, "real_memory": self.real_memory}


def parse_slurmd_c(text: str) -> tuple[str, NodeHardware]:
    """(node name, hardware) from `slurmd -C`; ValueError with the reason when it is not that output."""
    line = next((ln for ln in text.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise ValueError("no NodeName= line in the output of slurmd -C")
    kv = key_values(line)
    try:
        cpus = int(kv["CPUs"])
        boards = int(kv.get("Boards", "1"))
        sockets = int(kv.get("SocketsPerBoard", kv.get("Sockets", "1"))) * boards
        cores = int(kv["CoresPerSocket"])
        threads = int(kv["ThreadsPerCore"])
        memory = int(kv["RealMemory"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"slurmd -C output lacks a usable {exc}") from None
    rounded = (memory // MEMORY_STEP_MIB) * MEMORY_STEP_MIB if memory >= MEMORY_STEP_MIB else memory
    return kv["NodeName"], NodeHardware(cpus, sockets, cores, threads, rounded)


@dataclass(frozen=True)
class ReasonStamp:
    """The ` [user@time]` Slurm appends to a reason."""

    who: str | None
    at: str
    since: datetime | None         # None when the time is not ISO 8601 (an older format, a truncation)


def split_reason(raw: str | None) -> tuple[str | None, ReasonStamp | None]:
    """A reason as `scontrol show node` prints it -> (the text without the stamp, the stamp)."""
    text = (raw or "").strip()
    if text in _NO_REASON:
        return None, None
    m = _STAMP.search(text)
    if not m:
        return text, None
    try:
        since = datetime.fromisoformat(m["at"])
    except ValueError:
        since = None
    return text[:m.start()].strip() or None, ReasonStamp(m["who"] or None, m["at"], since)


@dataclass(frozen=True)
class NodeState:
    """One node of `scontrol show node -o`."""

    name: str
    state: str                     # e.g. IDLE, IDLE+DRAIN, DOWN*+NOT_RESPONDING
    reason: str | None = None
    gres: str | None = None
    address: str | None = None
    port: int | None = None
    fields: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def flags(self) -> set[str]:
        return {f.rstrip("*~#!%$@^-") for f in self.state.upper().split("+")}

    @property
    def registered(self) -> bool:
        """slurmd has registered with a configuration the controller accepts.

        CLOUD only says the node is a cloud node: a powered-up one registers and shows
        `IDLE+CLOUD` (a real capture in tests/fixtures/real); a powered-off one shows
        POWERED_DOWN (`~` in sinfo). The suffixes `*` (not responding), `~` (powered off)
        and `#` (powering up) mean slurmd is not registered, on any part of the state.
        """
        bad = {"UNKNOWN", "NOT_RESPONDING", "INVALID_REG", "INVALID", "FUTURE", "POWERED_DOWN", "POWERING_UP"}
        if self.flags & bad or any(part.endswith(("*", "~", "#")) for part in self.state.split("+")):
            return False
        return not ("DOWN" in self.flags and (self.reason or "").lower().startswith("not responding"))

    @property
    def drained(self) -> bool:
        """Held out of scheduling: DRAIN, DRAINING, DRAINED, FAIL or FAILING on any part of the state."""
        return bool(self.flags & DRAIN_FLAGS)

    @property
    def down(self) -> bool:
        return "DOWN" in self.flags

    @property
    def reason_text(self) -> str | None:
        """The reason without Slurm's stamp; None when Slurm holds none."""
        return split_reason(self.reason)[0]

    @property
    def stamp(self) -> ReasonStamp | None:
        return split_reason(self.reason)[1]

    @property
    def current_reason(self) -> str | None:
        """The reason while it counts: Slurm keeps a resumed node's last reason, but like `sinfo -R`
        it is the reason only while the node is drained, down or failing (scontrol(1))."""
        return self.reason_text if (self.drained or self.down) else None

    def owned_by(self, prefix: str) -> bool:
        """Drained or down with a reason that starts with *prefix* (whose hold it is)."""
        return (self.drained or self.down) and (self.current_reason or "").startswith(prefix)

    def view(self) -> NodeView:
        """The node as the remediation policy sees any scheduler's node."""
        st = self.stamp if self.current_reason else None
        return NodeView(self.name, True, self.drained, self.down, self.current_reason, self.state,
                        f"{st.who or ''}@{st.at}" if st else None, "UNKNOWN" in self.flags)


def parse_show_nodes(text: str) -> list[NodeState]:
    """Nodes of `scontrol show node`, one line each (-o) or as printed without -o.

    Without -o, Slurm prints `NodeName=...` and then indented lines (`   State=...`,
    `   Reason=...`), with a blank-looking indented line among them; those lines are
    joined to their node. Any other unindented line ends the node.
    """
    records: list[str] = []
    open_record = False
    for line in text.splitlines():
        if line.startswith("NodeName="):
            records.append(line)
            open_record = True
        elif open_record and line[:1] in (" ", "\t"):
            if line.strip():
                records[-1] += " " + line.strip()
        elif line.strip():
            open_record = False
    out = []
    for line in records:
        kv = key_values(line)
        port = kv.get("Port")
        out.append(NodeState(kv["NodeName"], kv.get("State", "UNKNOWN"),
                             kv.get("Reason") or None, kv.get("Gres") or None, kv.get("NodeAddr") or None,
                             int(port) if port and port.isdigit() else None, kv))
    return out


@dataclass(frozen=True)
class TopologyEntry:
    """A block (BlockName=) or tree switch (SwitchName=) as `scontrol show topology` lists it."""

    name: str
    kind: str                      # block | aggregated | switch
    nodes: str | None
    size: int | None = None
    switches: str | None = None


def parse_show_topology(text: str) -> list[TopologyEntry]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        kv = key_values(line)
        size = int(kv["BlockSize"]) if kv.get("BlockSize", "").isdigit() else None
        if line.startswith("BlockName="):
            out.append(TopologyEntry(kv["BlockName"], "block", kv.get("Nodes"), size))
        elif line.startswith("AggregatedBlock="):
            out.append(TopologyEntry(kv["AggregatedBlock"], "aggregated", kv.get("Nodes"), size))
        elif line.startswith("SwitchName="):
            out.append(TopologyEntry(kv["SwitchName"], "switch", kv.get("Nodes") or None, None,
                                     kv.get("Switches") or None))
    return out
