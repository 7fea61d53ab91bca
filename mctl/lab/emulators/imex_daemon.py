#!/usr/bin/python3
"""nvidia-imex for the trays of the mctl virtual rack (installed as /usr/bin/nvidia-imex).

Standalone, standard library only: it runs inside a lab tray under the image's
python3 without mctl. It does what the real daemon does on the network, for
real: it reads /etc/nvidia-imex/config.cfg and the node list, listens on
BIND_INTERFACE_IP:SERVER_PORT, opens a TCP connection to every peer on
SERVER_PORT, exchanges a hello carrying its node map (a hash of the ordered
node list) and version, keeps the links alive with status messages, reconnects
with backoff, and serves `nvidia-imex-ctl` on IMEX_CMD_BIND_INTERFACE_IP:
IMEX_CMD_PORT. What it cannot do is import GPU memory: there are no GPUs.

Connectivity letters, as the real `nvidia-imex-ctl -N` prints them: C connected,
N never connected, R recovering (lost less than the grace time ago), D
disconnected, !M! node map mismatch, !V! version mismatch; a node this daemon
cannot hear from shows UNAVAILABLE with a row of I.

Daemon state: INITIALIZING, then READY. With IMEX_WAIT_FOR_QUORUM=FULL it waits
in WAITING_FOR_PEERS until every peer is connected with an identical node map;
otherwise (NONE, RECOVERY, the default) it goes READY without waiting, as real
IMEX logs "IMEX_WAIT_FOR_QUORUM != FULL, continuing initialization without
waiting for connections to all nodes". Domain state: UP when every node is READY
and every link connected; DOWN when this daemon is not READY or at most one node
is; DEGRADED otherwise.

The version is the tray's driver version from /var/lib/mctl-lab/gpus.json
(MCTL_LAB_GPUS_JSON overrides the path); without that file it runs as a
GPU-less node with version 570.172. Signals: SIGUSR1 re-reads the node list,
SIGHUP re-reads config.cfg and the node list, SIGTERM/SIGINT stop it.

Usage: nvidia-imex [-c CONFIG] [-p SERVER_PORT] [--foreground] [--pid-file FILE]
(--foreground and --pid-file are the emulator's own: a supervisor runs it in the
foreground; a daemonized one records its pid, /run/nvidia-imex/nvidia-imex.pid
unless --pid-file says otherwise, so a restart command can stop or signal it.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import marshal
import os
import signal
import socket
import sys
import threading
import time

# The unit the lab installs as /lib/systemd/system/nvidia-imex.service, shaped like the packaged one
# (Type=forking: the daemon returns once it listens; the PID file lets a systemctl without systemd track it).
SYSTEMD_UNIT = """[Unit]
Description=NVIDIA IMEX service
After=network-online.target
Wants=network-online.target

[Service]
User=root
Type=forking
PIDFile=/run/nvidia-imex/nvidia-imex.pid
TimeoutStartSec=infinity
ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
DEFAULT_CONFIG = "/etc/nvidia-imex/config.cfg"
DEFAULT_PID_FILE = "/run/nvidia-imex/nvidia-imex.pid"
DEFAULT_VERSION = "570.172"
STATUS_INTERVAL_S = 1.0           # a peer is lost after PEER_TIMEOUT_S without one
PEER_TIMEOUT_S = 3.0
DEFAULT_GRACE_S = 3.0
DEFAULTS = {
    "LOG_LEVEL": "4", "LOG_FILE_NAME": "/var/log/nvidia-imex.log", "LOG_APPEND_TO_LOG": "1", "DAEMONIZE": "1",
    "BIND_INTERFACE_IP": "", "SERVER_PORT": "50000", "IMEX_NODE_CONFIG_FILE": "/etc/nvidia-imex/nodes_config.cfg",
    "IMEX_WAIT_FOR_QUORUM": "RECOVERY", "IMEX_NODE_DISCONNECTED_GRACE_TIME": "", "IMEX_CMD_ENABLED": "1",
    "IMEX_CMD_BIND_INTERFACE_IP": "", "IMEX_CMD_PORT": "50005",
}


def read_config(path: str) -> dict[str, str]:
    cfg = dict(DEFAULTS)
    with open(path) as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            cfg[key.strip()] = value.strip()
    return cfg


def read_nodes(path: str) -> list[str]:
    with open(path) as fh:
        return [ln.strip() for ln in fh if ln.strip() and not ln.strip().startswith("#")]


def node_map_hash(nodes: list[str]) -> str:
    return hashlib.sha256("\n".join(nodes).encode()).hexdigest()


def driver_version() -> str:
    path = os.environ.get("MCTL_LAB_GPUS_JSON", "/var/lib/mctl-lab/gpus.json")
    try:
        with open(path) as fh:
            version = json.load(fh).get("driver_version")
        return str(version) if version else DEFAULT_VERSION
    except (OSError, ValueError, AttributeError):
        return DEFAULT_VERSION


def resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def domain_state(local_state: str, nodes: list[dict]) -> str:
    ready = sum(1 for n in nodes if n["status"] == "READY")
    if local_state != "READY":
        return "DOWN"
    if ready == len(nodes) and all(c == "C" for n in nodes for c in n["row"]):
        return "UP"
    if ready <= 1 and len(nodes) > 1:
        return "DOWN"
    return "DEGRADED"


class Link:
    """This daemon's connection towards one peer."""

    def __init__(self) -> None:
        self.state = "N"           # N, C, lost, !M!, !V!
        self.lost_at = 0.0
        self.peer: dict | None = None
        self.heard_at = 0.0


class Daemon:
    def __init__(self, config_path: str, port_override: int | None = None):
        self.config_path = config_path
        self.port_override = port_override
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.generation = 0
        self.state = "INITIALIZING"
        self.hostname = socket.gethostname()
        self.version = driver_version()
        self.listeners: list[socket.socket] = []
        self.bound: tuple = ()
        self.log_fh = None
        self.cfg: dict[str, str] = {}
        self.nodes: list[str] = []
        self.index = -1
        self.map = ""
        self.links: list[Link] = []

    # ---- logging

    def log(self, level: str, message: str) -> None:
        stamp = time.strftime("%b %d %Y %H:%M:%S")
        line = f"[{stamp}] [{level}] [tid {threading.get_native_id()}] {message}\n"
        fh = self.log_fh
        try:
            (fh or sys.stderr).write(line)
            (fh or sys.stderr).flush()
        except (OSError, ValueError):
            pass

    def open_log(self) -> None:
        name = self.cfg.get("LOG_FILE_NAME") or ""
        if not name:
            return
        mode = "a" if self.cfg.get("LOG_APPEND_TO_LOG", "1") != "0" else "w"
        try:
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            self.log_fh = open(name, mode)
        except OSError as exc:
            sys.stderr.write(f"nvidia-imex: cannot open log file {name}: {exc.strerror}\n")

    # ---- configuration

    def load(self) -> None:
        """Read config.cfg and the node list; raise SystemExit with a message when unusable."""
        try:
            cfg = read_config(self.config_path)
        except OSError as exc:
            raise SystemExit(f"nvidia-imex: cannot read {self.config_path}: {exc.strerror}")
        if self.port_override:
            cfg["SERVER_PORT"] = str(self.port_override)
        nodes_file = cfg["IMEX_NODE_CONFIG_FILE"]
        try:
            nodes = read_nodes(nodes_file)
        except OSError as exc:
            raise SystemExit(f"nvidia-imex: cannot read node list {nodes_file}: {exc.strerror}")
        if not nodes:
            raise SystemExit(f"nvidia-imex: {nodes_file} lists no nodes")
        bind = cfg["BIND_INTERFACE_IP"]
        addresses = [resolve(n) for n in nodes]
        if bind:
            if bind not in addresses and bind not in nodes:
                raise SystemExit(f"nvidia-imex: BIND_INTERFACE_IP {bind} is not in {nodes_file}")
            index = addresses.index(bind) if bind in addresses else nodes.index(bind)
        else:
            index = next((i for i, a in enumerate(addresses) if _bindable(a)), -1)
            if index < 0:
                raise SystemExit(f"nvidia-imex: no address of {nodes_file} belongs to this node")
            cfg["BIND_INTERFACE_IP"] = addresses[index]
        with self.lock:
            changed = nodes != self.nodes
            self.cfg, self.nodes, self.index = cfg, nodes, index
            self.addresses = addresses
            self.map = node_map_hash(nodes)
            if changed:
                self.generation += 1
                self.links = [Link() for _ in nodes]
        return None

    @property
    def grace_s(self) -> float:
        raw = self.cfg.get("IMEX_NODE_DISCONNECTED_GRACE_TIME") or ""
        try:
            value = float(raw)
        except ValueError:
            return DEFAULT_GRACE_S
        return float("inf") if value < 0 else value

    # ---- sockets

    def listen(self) -> None:
        want = (self.cfg["BIND_INTERFACE_IP"], int(self.cfg["SERVER_PORT"]),
                self.cfg.get("IMEX_CMD_ENABLED", "1") != "0",
                self.cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or "127.0.0.1", int(self.cfg["IMEX_CMD_PORT"]))
        if want == self.bound:
            return
        for s in self.listeners:
            _close(s)
        self.listeners = []
        peer = _server_socket(want[0], want[1])
        self.listeners.append(peer)
        threading.Thread(target=self.accept_loop, args=(peer, self.serve_peer), daemon=True).start()
        if want[2]:
            cmd = _server_socket(want[3], want[4])
            self.listeners.append(cmd)
            threading.Thread(target=self.accept_loop, args=(cmd, self.serve_command), daemon=True).start()
        self.bound = want

    def accept_loop(self, server: socket.socket, handler) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    def hello(self) -> dict:
        with self.lock:
            return {"type": "hello", "index": self.index, "host": self.addresses[self.index], "map": self.map,
                    "version": self.version, "hostname": self.hostname, "nodes": len(self.nodes)}

    def serve_peer(self, conn: socket.socket) -> None:
        """The server side of a peer link: answer the hello, then push status until the link drops."""
        generation = self.generation
        conn.settimeout(PEER_TIMEOUT_S)
        try:
            reader = conn.makefile("r")
            theirs = json.loads(reader.readline() or "{}")
            mine = self.hello()
            ok = theirs.get("map") == mine["map"] and theirs.get("version") == mine["version"]
            _send(conn, dict(mine, accepted=ok))
            if not ok:
                return
            while not self.stopping.is_set() and generation == self.generation:
                _send(conn, self.status_message())
                time.sleep(STATUS_INTERVAL_S)
        except (OSError, ValueError):
            return
        finally:
            _close(conn)

    def status_message(self) -> dict:
        with self.lock:
            return {"type": "status", "index": self.index, "state": self.state, "version": self.version,
                    "hostname": self.hostname, "row": self.own_row()}

    def own_row(self) -> list[str]:
        now = time.monotonic()
        row = []
        for j, link in enumerate(self.links):
            if j == self.index:
                row.append("C")
            elif link.state == "lost":
                row.append("R" if now - link.lost_at < self.grace_s else "D")
            else:
                row.append(link.state)
        return row

    def dial(self, j: int, generation: int) -> None:
        """The client side of the link to peer j, with reconnects and growing backoff."""
        backoff = 0.2
        while not self.stopping.is_set() and generation == self.generation:
            with self.lock:
                host, port, bind = self.addresses[j], int(self.cfg["SERVER_PORT"]), self.cfg["BIND_INTERFACE_IP"]
                link = self.links[j]
            sock = None
            try:
                sock = socket.create_connection((host, port), timeout=1.0, source_address=(bind, 0))
                sock.settimeout(PEER_TIMEOUT_S)
                _send(sock, self.hello())
                reader = sock.makefile("r")
                reply = json.loads(reader.readline() or "{}")
                if reply.get("type") != "hello":
                    raise OSError("no hello")
                if reply.get("map") != self.map:
                    self._set_link(link, "!M!", f"node map mismatch with node {j} ({host})")
                elif reply.get("version") != self.version:
                    self._set_link(link, "!V!", f"version mismatch with node {j} ({host}): {reply.get('version')}")
                else:
                    self._set_link(link, "C", f"connected to node {j} ({host})")
                    backoff = 0.2
                    self.maybe_ready()
                    while not self.stopping.is_set() and generation == self.generation:
                        line = reader.readline()
                        if not line:
                            raise OSError("peer closed the connection")
                        msg = json.loads(line)
                        with self.lock:
                            link.peer, link.heard_at = msg, time.monotonic()
            except (OSError, ValueError) as exc:
                with self.lock:
                    if link.state == "C":
                        link.state, link.lost_at, link.peer = "lost", time.monotonic(), None
                        self.log("WARN", f"connection to node {j} ({host}) lost: {exc}")
            finally:
                if sock is not None:
                    _close(sock)
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    def _set_link(self, link: Link, state: str, message: str) -> None:
        with self.lock:
            if link.state != state:
                self.log("INFO" if state == "C" else "ERROR", message)
            link.state = state
            if state != "C":
                link.peer = None

    def maybe_ready(self) -> None:
        with self.lock:
            if self.state != "WAITING_FOR_PEERS":
                return
            if all(link.state == "C" for j, link in enumerate(self.links) if j != self.index):
                self.state = "READY"
                self.log("INFO", "all peers connected; IMEX is ready")

    def start_peers(self) -> None:
        with self.lock:
            generation, n = self.generation, len(self.nodes)
            self.state = "INITIALIZING"
            self.log("INFO", f"Identified this node as ID {self.index}, using bind IP of "
                             f"'{self.cfg['BIND_INTERFACE_IP']}', and network interface of lo")
            self.log("INFO", f"Creating gRPC channels to all peers (nPeers = {n}).")
        for j in range(n):
            if j != self.index:
                threading.Thread(target=self.dial, args=(j, generation), daemon=True).start()
        with self.lock:
            if self.cfg.get("IMEX_WAIT_FOR_QUORUM", "RECOVERY").upper() == "FULL" and n > 1:
                self.state = "WAITING_FOR_PEERS"
                self.log("INFO", "IMEX_WAIT_FOR_QUORUM == FULL, waiting for connections to all nodes.")
            else:
                self.log("INFO", "IMEX_WAIT_FOR_QUORUM != FULL, continuing initialization without waiting "
                                 "for connections to all nodes.")
                self.state = "READY"
        self.maybe_ready()

    # ---- command service

    def domain_view(self) -> dict:
        with self.lock:
            now = time.monotonic()
            n = len(self.nodes)
            rows = []
            for j, addr in enumerate(self.nodes):
                link = self.links[j]
                if j == self.index:
                    node = {"status": self.state, "host": self.addresses[j], "hostName": self.hostname,
                            "version": self.version, "row": self.own_row()}
                elif link.state == "C" and link.peer and now - link.heard_at < PEER_TIMEOUT_S \
                        and len(link.peer.get("row", [])) == n:
                    p = link.peer
                    node = {"status": p.get("state", "UNAVAILABLE"), "host": self.addresses[j],
                            "hostName": p.get("hostname", ""), "version": p.get("version", ""), "row": p["row"]}
                else:
                    node = {"status": "UNAVAILABLE", "host": self.addresses[j], "hostName": "", "version": "",
                            "row": ["I"] * n}
                rows.append(node)
            return {"local": {"index": self.index, "state": self.state},
                    "status": domain_state(self.state, rows), "nodes": rows,
                    "timestamp": _timestamp()}

    def serve_command(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        try:
            request = conn.makefile("r").readline()
            if request.startswith("MSTATUS"):       # nvidia-imex-ctl of the lab: marshal, read to EOF
                conn.sendall(marshal.dumps(self.domain_view()))
            else:
                _send(conn, self.domain_view())
        except (OSError, ValueError):
            pass
        finally:
            _close(conn)

    # ---- lifecycle

    def reload(self, full: bool) -> None:
        before = (list(self.nodes), self.generation)
        try:
            if full:
                self.load()
            else:
                nodes = read_nodes(self.cfg["IMEX_NODE_CONFIG_FILE"])
                if nodes != self.nodes:
                    self.load()
        except (SystemExit, OSError) as exc:
            self.log("ERROR", f"reload failed, keeping the previous configuration: {exc}")
            return
        try:
            self.listen()
        except OSError as exc:
            self.log("ERROR", f"cannot listen after reload: {exc.strerror}")
        if self.generation != before[1]:
            self.log("INFO", f"node list changed ({len(before[0])} -> {len(self.nodes)} nodes); reconnecting")
            self.start_peers()
        else:
            self.log("INFO", "reloaded; node list unchanged")

    def shutdown(self) -> None:
        with self.lock:
            self.state = "SHUTTING_DOWN"
        self.log("INFO", "shutting down")
        self.stopping.set()
        for s in self.listeners:
            _close(s)


def _bindable(address: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def _server_socket(address: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, port))
    s.listen(64)
    return s


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _timestamp() -> str:
    now = time.time()
    t = time.localtime(now)
    return f"{t.tm_mon}/{t.tm_mday}/{t.tm_year} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{int(now % 1 * 1000):03d}"


def _daemonize() -> int:
    """Fork into the background; the parent exits once the child listens (systemd Type=forking)."""
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            word = pipe.read()
        os._exit(0 if word.startswith("ok") else 1)
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return write_fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-imex", description="IMEX daemon (mctl lab emulator).")
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    parser.add_argument("-p", "--port", type=int, help="override SERVER_PORT")
    parser.add_argument("--foreground", action="store_true",
                        help="(emulator) stay in the foreground whatever DAEMONIZE says, for a supervisor")
    parser.add_argument("--pid-file", help=f"(emulator) record the pid here (daemonized: {DEFAULT_PID_FILE} "
                                           "unless given)")
    args = parser.parse_args(argv)
    daemon = Daemon(args.config, args.port)
    try:
        daemon.load()
    except SystemExit as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    detach = daemon.cfg.get("DAEMONIZE", "1") != "0" and not args.foreground
    notify = _daemonize() if detach else None
    pid_file = args.pid_file or (DEFAULT_PID_FILE if detach else None)
    if pid_file:
        try:
            os.makedirs(os.path.dirname(pid_file) or ".", exist_ok=True)
            with open(pid_file, "w") as fh:
                fh.write(f"{os.getpid()}\n")
        except OSError as exc:
            sys.stderr.write(f"nvidia-imex: cannot write {pid_file}: {exc.strerror}\n")
    daemon.open_log()
    daemon.log("INFO", f"IMEX version {daemon.version} is running with the following configuration options")
    for key in ("LOG_LEVEL", "LOG_FILE_NAME", "BIND_INTERFACE_IP", "SERVER_PORT", "IMEX_NODE_CONFIG_FILE",
                "IMEX_WAIT_FOR_QUORUM", "IMEX_CMD_ENABLED", "IMEX_CMD_BIND_INTERFACE_IP", "IMEX_CMD_PORT"):
        daemon.log("INFO", f"{key} = {daemon.cfg.get(key, '')}")
    try:
        daemon.listen()
    except OSError as exc:
        daemon.log("ERROR", f"cannot listen: {exc.strerror}")
        sys.stderr.write(f"nvidia-imex: cannot listen: {exc.strerror}\n")
        if notify is not None:
            os.write(notify, b"fail")
        return 1
    if notify is not None:
        os.write(notify, b"ok")
        os.close(notify)
    requests: list[str] = []
    signal.signal(signal.SIGUSR1, lambda *_: requests.append("nodes"))
    signal.signal(signal.SIGHUP, lambda *_: requests.append("full"))
    signal.signal(signal.SIGTERM, lambda *_: requests.append("stop"))
    signal.signal(signal.SIGINT, lambda *_: requests.append("stop"))
    daemon.start_peers()
    while True:
        while requests:
            what = requests.pop(0)
            if what == "stop":
                daemon.shutdown()
                if pid_file:
                    try:
                        os.unlink(pid_file)
                    except OSError:
                        pass
                return 0
            daemon.reload(full=(what == "full"))
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
