#!/usr/bin/python3
"""nvidia-imex-ctl for the trays of the mctl virtual rack (installed as /usr/bin/nvidia-imex-ctl).

Standalone, standard library only. It asks the local IMEX daemon emulator
(imex_daemon.py) over its command port and prints what the real tool prints:
`-q` the daemon state alone (READY when ready); `-N` the domain status with the
real layout (legend, timestamp, `Node #i - address - STATE - Version: v` lines,
the `Nodes From\\To` matrix, `Domain State:`); `-H` adds each node's host name
after its address; `-j` prints the JSON form; `-n` repeats `-N` every second
(for `-t` milliseconds, or until interrupted).

Where the command service is: `-i IP PORT`, or IMEX_CMD_BIND_INTERFACE_IP and
IMEX_CMD_PORT of the config file given with `-c` (default
/etc/nvidia-imex/config.cfg), as the real tool does.
"""

from __future__ import annotations

import _socket
import marshal
import sys
import time

DEFAULT_CONFIG = "/etc/nvidia-imex/config.cfg"
LEGEND = """Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
R - Recovering - Connection was lost, but clean up has not yet been triggered.
D - Disconnected - Connection was lost, and clean up has been triggreed.
A - Authenticating - If GSSAPI enabled, client has initiated mutual authentication.
!V! - Version mismatch, communication disabled.
!M! - Node map mismatch, communication disabled.
C - Connected - Ready for operation
"""
WORDS = {"C": "CONNECTED", "N": "NEVER_CONNECTED", "R": "RECOVERING", "D": "DISCONNECTED", "A": "AUTHENTICATING",
         "I": "INVALID", "!V!": "VERSION_MISMATCH", "!M!": "NODE_MAP_MISMATCH"}
USAGE = """Usage: nvidia-imex-ctl [-i <IP> <PORT>|-u <unix domain socket path>|-c <nvidia-imex config.cfg path>] \
<-n|-N|-q|-s|-d|-m> [-t <timeout>]
Where:
       -c <nvidia-imex config path>: Path to nvidia-imex configuration file.  Default value is \
/etc/nvidia-imex/config.cfg
NOTE:  If none of -i, -u, -c are provided, -c is assumed with default value.
       -i <IP> <PORT>: IP address and port of the IMEX command service.
       -q: Query the status of the local IMEX daemon; prints READY when it is ready.
       -n: Continuously monitor the entire IMEX domain status.  Requires config file (default or via -c)
       -N: Gets the full status of the entire IMEX domain.  Requires config file (default or via -c)
       -H: Show hostname alongside node IP, only works with -n/-N
       -t: Timeout (in milliseconds) for -n.  Unspecified means it will run until interrupted.
       -j: Output of the -n/-N command will be in JSON, rather than formatted.
NOTE: only one of -i, -u, or -c can be specified.
"""


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> dict:
    opts = {"mode": None, "config": None, "ip": None, "port": None, "hostnames": False, "json": False,
            "timeout_ms": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            opts["mode"] = "help"
        elif a == "-c":
            if i + 1 >= len(argv):
                raise UsageError("-c needs a config file path")
            opts["config"] = argv[i + 1]
            i += 1
        elif a == "-i":
            if i + 2 >= len(argv):
                raise UsageError("-i needs an IP and a port")
            opts["ip"], opts["port"] = argv[i + 1], argv[i + 2]
            i += 2
        elif a == "-u":
            raise UsageError("-u (unix domain socket) is not served by the lab's IMEX emulator; use -c or -i")
        elif a == "-t":
            if i + 1 >= len(argv):
                raise UsageError("-t needs a timeout in milliseconds")
            opts["timeout_ms"] = int(argv[i + 1])
            i += 1
        elif a == "-H":
            opts["hostnames"] = True
        elif a == "-j":
            opts["json"] = True
        elif a in ("-q", "-N", "-n"):
            if opts["mode"] not in (None, "help"):
                raise UsageError("give only one of -n, -N, -q, -s, -d, -m")
            opts["mode"] = a[1]
        elif a in ("-s", "-d", "-m"):
            raise UsageError(f"{a} is not implemented by the lab's IMEX emulator")
        else:
            raise UsageError(f"unknown argument {a}")
        i += 1
    if opts["config"] and opts["ip"]:
        raise UsageError("only one of -i, -u, or -c can be specified")
    if opts["mode"] is None:
        raise UsageError("give one of -n, -N, -q")
    return opts


def endpoint(opts: dict) -> tuple[str, int]:
    if opts["ip"]:
        try:
            return opts["ip"], int(opts["port"])
        except ValueError:
            raise UsageError(f"bad port {opts['port']!r}") from None
    path = opts["config"] or DEFAULT_CONFIG
    cfg = {}
    try:
        with open(path) as fh:
            for raw in fh:
                line = raw.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, _, v = line.partition("=")
                    cfg[k.strip()] = v.strip()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if cfg.get("IMEX_CMD_ENABLED", "1") == "0":
        raise UsageError(f"the IMEX command service is disabled in {path} (IMEX_CMD_ENABLED=0)")
    return cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or "127.0.0.1", int(cfg.get("IMEX_CMD_PORT") or 50005)


def query(addr: tuple[str, int]) -> dict:
    """The daemon's view of the domain. Built-in modules only (_socket, marshal): every health
    sweep runs this twice on every tray, and importing socket and json cost half of each call."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.settimeout(3.0)
        sock.connect(addr)
        sock.sendall(b"MSTATUS\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    try:
        view = marshal.loads(b"".join(chunks))
    except (EOFError, TypeError) as exc:
        raise ValueError(f"bad answer from the daemon: {exc}") from None
    if not isinstance(view, dict):
        raise ValueError("bad answer from the daemon")
    return view


def _json(value, indent: int = 2, level: int = 0) -> str:
    """json.dumps(value, indent=2) for what -N -j prints (dicts, lists, strings, numbers, booleans)."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        pad = " " * (indent * (level + 1))
        items = ",\n".join(f"{pad}{_json(str(k))}: {_json(v, indent, level + 1)}" for k, v in value.items())
        return "{\n" + items + "\n" + " " * (indent * level) + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        pad = " " * (indent * (level + 1))
        items = ",\n".join(pad + _json(v, indent, level + 1) for v in value)
        return "[\n" + items + "\n" + " " * (indent * level) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    out = ['"']
    for ch in str(value):
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code > 0x7E:
            if code > 0xFFFF:
                code -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 | (code >> 10), 0xDC00 | (code & 0x3FF)))
            else:
                out.append("\\u%04x" % code)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def render_json(view: dict) -> str:
    nodes = {}
    for i, n in enumerate(view["nodes"]):
        nodes[str(i)] = {"status": n["status"], "host": n["host"], "hostName": n.get("hostName", ""),
                         "connections": {str(j): {"host": view["nodes"][j]["host"], "status": WORDS[c],
                                                  "changed": False} for j, c in enumerate(n["row"])},
                         "changed": False, "version": n.get("version", "")}
    return _json({"nodes": nodes, "timestamp": view["timestamp"], "status": view["status"]})


def render_text(view: dict, hostnames: bool) -> str:
    """The layout of the real captures (tests/fixtures/golden/imex/samples/), field by field.

    With versions (IMEX 570.172): the full legend, a `Version:` field, a blank line
    before `Domain State:`. Without (the 570.00 captures): no `!V!`/`!M!` legend
    lines and `Domain State:` right after the matrix.
    """
    nodes = view["nodes"]
    n = len(nodes)
    versioned = any(node.get("version") for node in nodes)
    legend = [ln for ln in LEGEND.splitlines() if versioned or not ln.startswith("!")]
    lines = legend + ["", view["timestamp"], "Nodes:"]
    for i, node in enumerate(nodes):
        fields = [f"Node #{i:<4}", f"{node['host']:<16}"]
        if hostnames:
            fields.append(f"{node.get('hostName') or '-':<21}")
        fields.append(f"{node['status']:<21}" if node.get("version") else node["status"])
        if node.get("version"):
            fields.append(f"Version: {node['version']}")
        lines.append("- ".join(fields).rstrip())
    width = len(str(n - 1)) + 2
    if any(len(c) > width - 1 for node in nodes for c in node["row"]):
        width = max(width, 4)
    lines.append("")
    lines.append((" Nodes From\\To  " + "".join(f"{j:<{width}}" for j in range(n))).rstrip())
    for i, node in enumerate(nodes):
        lines.append((f"{i:>8}        " + "".join(f"{c:<{width}}" for c in node["row"])).rstrip())
    lines += ["", f"Domain State: {view['status']}"] if versioned else [f"Domain State: {view['status']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        if opts["mode"] == "help":
            sys.stdout.write(USAGE)
            return 0
        addr = endpoint(opts)
    except (UsageError, ValueError) as exc:
        sys.stderr.write(f"nvidia-imex-ctl: {exc}\n{USAGE}")
        return 2
    deadline = None if opts["timeout_ms"] is None else time.monotonic() + opts["timeout_ms"] / 1000
    while True:
        try:
            view = query(addr)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            sys.stderr.write(f"nvidia-imex-ctl: cannot connect to the IMEX command service at {addr[0]}:{addr[1]}: "
                             f"{reason}\n")
            return 1
        if opts["mode"] == "q":
            sys.stdout.write(view["local"]["state"] + "\n")
            return 0
        sys.stdout.write((render_json(view) if opts["json"] else render_text(view, opts["hostnames"])) + "\n")
        sys.stdout.flush()
        if opts["mode"] == "N" or (deadline is not None and time.monotonic() >= deadline):
            return 0
        try:
            time.sleep(1.0)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
