"""A real etcd v3 on 127.0.0.1 for the failover tests, and a TCP relay in front of it whose cut stands for a
watch losing its network to etcd."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tests.helpers import wait_for

CANDIDATES = (os.environ.get("MCTL_ETCD") or "", "/var/cache/mctl/kube-apiserver/current/bin/etcd", "/usr/bin/etcd")


def etcd_binary() -> str | None:
    for c in CANDIDATES:
        if c and os.access(c, os.X_OK):
            return c
    return shutil.which("etcd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, binary: str, root: Path):
        self.root = root
        self.client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client}"
        self.log = (root / "etcd.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, "--name", "mctl-failover", "--data-dir", str(root / "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
             f"http://127.0.0.1:{peer}", "--initial-cluster", f"mctl-failover=http://127.0.0.1:{peer}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("etcd answering /health", self._healthy, 30, every=0.2)

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, (self.root / "etcd.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return b"true" in r.read()
        except OSError:
            return False

    def stop(self) -> None:
        end(self.proc)
        self.log.close()


def end(proc: subprocess.Popen) -> None:
    """A process of the test's own, ended: SIGTERM (after SIGCONT, should it be paused), SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Relay:
    """127.0.0.1:port -> etcd; cut() closes the listener and every connection through it (the watch's
    network to etcd is gone: connections refused from then on)."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.cut_at: float | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cut_at = time.time()
        self.server.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
