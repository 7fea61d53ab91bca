"""Parsers for what IMEX prints and reads: `nvidia-imex-ctl -q`, `-N` (text), `-N -j`, its config files.

The `-N` text format follows real captures (an 18-node GB200 domain): a legend,
a timestamp, one `Node #i - address - STATE - Version: v` line per node, the
`Nodes From\\To` connectivity matrix, and `Domain State: UP|DEGRADED|DOWN`.
With `-H` a host name field follows the address. Truncated or garbled output
raises FactsParseError rather than yielding a half-read domain.
"""

from __future__ import annotations

import json
import re

from mctl.facts import FactsParseError
from mctl.model.fabric import DAEMON_STATES, DOMAIN_STATES, LINK_LETTERS, LINK_WORDS, ImexDomainStatus, ImexNodeStatus

_NODE = re.compile(r"^Node #\s*(\d+)\s+-\s+(.*)$")
_TIMESTAMP = re.compile(r"^\d{1,2}/\d{1,2}/\d{4} \d{1,2}:\d{2}:\d{2}(\.\d+)?$")
_DOMAIN = re.compile(r"^Domain State:\s*(\S+)\s*$")
_ROW = re.compile(r"^\s*(\d+)\s+(\S.*)$")
_KEY = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*)$")


def parse_query(text: str) -> str:
    """`nvidia-imex-ctl -q` -> the daemon state (READY when ready)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise FactsParseError("nvidia-imex-ctl -q printed nothing", hint="is the nvidia-imex service running?")
    word = lines[-1].split()[0]
    if word not in DAEMON_STATES:
        raise FactsParseError(f"nvidia-imex-ctl -q printed {lines[-1]!r}, not a daemon state",
                              hint=f"expected one of {', '.join(DAEMON_STATES)}")
    return word


def parse_domain(text: str) -> ImexDomainStatus:
    """`-N` in either form (JSON when it starts with '{')."""
    return parse_domain_json(text) if text.lstrip().startswith("{") else parse_domain_text(text)


def parse_domain_text(text: str) -> ImexDomainStatus:
    lines = text.splitlines()
    nodes: list[ImexNodeStatus] = []
    timestamp = None
    state = None
    columns: list[int] | None = None
    rows: dict[int, tuple[str, ...]] = {}
    in_nodes = False
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if _TIMESTAMP.match(stripped):
            timestamp = stripped
            continue
        if stripped == "Nodes:":
            in_nodes = True
            continue
        m = _DOMAIN.match(stripped)
        if m:
            state = m.group(1)
            break
        if stripped.startswith("Nodes From\\To"):
            try:
                columns = [int(c) for c in stripped[len("Nodes From\\To"):].split()]
            except ValueError:
                raise FactsParseError(f"garbled connectivity header {stripped!r}") from None
            in_nodes = False
            continue
        if columns is not None:
            m = _ROW.match(line)
            if not m:
                raise FactsParseError(f"garbled connectivity row {stripped!r}")
            cells = tuple(m.group(2).split())
            bad = [c for c in cells if c not in LINK_WORDS]
            if bad or len(cells) != len(columns):
                raise FactsParseError(f"connectivity row {m.group(1)} has {len(cells)} cells for {len(columns)} "
                                      f"nodes{' and unknown letters ' + ', '.join(bad) if bad else ''}")
            rows[int(m.group(1))] = cells
            continue
        if in_nodes:
            m = _NODE.match(stripped)
            if not m:
                raise FactsParseError(f"garbled node line {stripped!r}")
            nodes.append(_node_line(int(m.group(1)), m.group(2)))
    if state is None:
        raise FactsParseError("nvidia-imex-ctl -N output has no 'Domain State' line (truncated?)")
    if state not in DOMAIN_STATES:
        raise FactsParseError(f"unknown IMEX domain state {state!r}", hint=f"expected {', '.join(DOMAIN_STATES)}")
    if not nodes:
        raise FactsParseError("nvidia-imex-ctl -N output lists no nodes")
    if columns is None:
        raise FactsParseError("nvidia-imex-ctl -N output has no connectivity table")
    indexes = [n.index for n in nodes]
    if sorted(indexes) != list(range(len(nodes))) or sorted(columns) != indexes or sorted(rows) != indexes:
        raise FactsParseError("nvidia-imex-ctl -N output: node list, table columns and rows do not match")
    order = {c: pos for pos, c in enumerate(columns)}
    out = []
    for n in nodes:
        cells = rows[n.index]
        links = tuple(cells[order[j]] for j in range(len(nodes)))
        out.append(ImexNodeStatus(n.index, n.address, n.state, n.version, n.hostname, links))
    return ImexDomainStatus(state, tuple(sorted(out, key=lambda n: n.index)), timestamp)


def _node_line(index: int, rest: str) -> ImexNodeStatus:
    fields = [f.strip() for f in rest.split(" - ")]
    version = None
    if fields and fields[-1].startswith("Version:"):
        version = fields.pop()[len("Version:"):].strip() or None
    if len(fields) == 2:
        address, state = fields
        hostname = None
    elif len(fields) == 3:
        address, hostname, state = fields
    else:
        raise FactsParseError(f"garbled node line 'Node #{index} - {rest}'")
    if state not in DAEMON_STATES:
        raise FactsParseError(f"node {index} has unknown state {state!r}")
    return ImexNodeStatus(index, address, state, version, hostname)


def parse_domain_json(text: str) -> ImexDomainStatus:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FactsParseError(f"nvidia-imex-ctl -N -j printed invalid JSON: {exc}") from None
    if not isinstance(data, dict) or "status" not in data or not isinstance(data.get("nodes"), dict):
        raise FactsParseError("nvidia-imex-ctl -N -j output lacks 'status' or 'nodes'")
    state = str(data["status"])
    if state not in DOMAIN_STATES:
        raise FactsParseError(f"unknown IMEX domain state {state!r}")
    raw_nodes = data["nodes"]
    try:
        indexes = sorted(int(k) for k in raw_nodes)
    except ValueError:
        raise FactsParseError("nvidia-imex-ctl -N -j: node keys are not indexes") from None
    if indexes != list(range(len(indexes))):
        raise FactsParseError("nvidia-imex-ctl -N -j: node indexes are not 0..N-1")
    nodes = []
    for i in indexes:
        node = raw_nodes[str(i)]
        if not isinstance(node, dict):
            raise FactsParseError(f"nvidia-imex-ctl -N -j: node {i} is not an object")
        node_state = str(node.get("status", ""))
        if node_state not in DAEMON_STATES:
            raise FactsParseError(f"node {i} has unknown state {node_state!r}")
        conns = node.get("connections") or {}
        links = []
        for j in indexes:
            c = conns.get(str(j))
            word = (c.get("status") if isinstance(c, dict) else c) or "INVALID"
            letter = word if word in LINK_WORDS else LINK_LETTERS.get(str(word))
            if letter is None:
                raise FactsParseError(f"node {i}: unknown connection status {word!r} towards node {j}")
            links.append(letter)
        nodes.append(ImexNodeStatus(i, str(node.get("host", "")), node_state, node.get("version") or None,
                                    node.get("hostName") or None, tuple(links)))
    ts = data.get("timestamp")
    return ImexDomainStatus(state, tuple(nodes), None if ts is None else str(ts))


def parse_config(text: str) -> dict[str, str]:
    """config.cfg: KEY=VALUE lines; '#' comments and blank lines ignored; the last value of a key wins."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _KEY.match(line)
        if not m:
            raise FactsParseError(f"config.cfg line {number} is not KEY=VALUE: {line!r}")
        out[m.group(1)] = m.group(2).strip()
    return out


def parse_nodes_config(text: str) -> tuple[str, ...]:
    """nodes_config.cfg: one address (or name) per line, in order."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line.split()) != 1:
            raise FactsParseError(f"nodes_config.cfg line {line!r} holds more than an address")
        out.append(line)
    return tuple(out)
