"""The IMEX daemon and ctl emulators with real TCP between daemons on 127.77.250.x, read by mctl's parsers.

No lab and no root: each daemon is a process of the host's own /usr/bin/python3
(the emulators must not need mctl), with its config in a temp folder. Every
daemon started here is stopped at the end of its test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mctl.facts.imex import parse_domain_json, parse_domain_text
from mctl.fabric.imex import assess_domain, render_nodes_config
from mctl.model.imex import ImexSettings, render_config
from mctl.fabric.imex_remote import probe_command, report_from
from mctl.model.fabric import ImexDomain, ImexMember
from mctl.transport.results import HostResult, HostStatus

EMULATORS = Path(__file__).resolve().parents[2] / "mctl" / "lab" / "emulators"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
NET = "127.77.250"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class Domain:
    """N emulated trays: their files, processes and a ctl runner."""

    def __init__(self, tmp: Path, n: int, *, quorum: str = "RECOVERY"):
        self.tmp = tmp
        self.addresses = [f"{NET}.{i + 1}" for i in range(n)]
        self.port = free_port(self.addresses[0])
        self.cmd_port = free_port(self.addresses[0])
        self.procs: dict[int, subprocess.Popen] = {}
        self.members = tuple(ImexMember(f"tray{i + 1:02d}", a) for i, a in enumerate(self.addresses))
        self.domain = ImexDomain("p0", "lab-r1", self.members)
        for i, m in enumerate(self.members):
            d = tmp / m.tray
            d.mkdir()
            settings = ImexSettings(server_port=self.port, cmd_port=self.cmd_port, daemonize=False,
                                    log_file=str(d / "nvidia-imex.log"), wait_for_quorum=quorum,
                                    node_config_file=str(d / "nodes_config.cfg"), disconnected_grace_time=1)
            (d / "config.cfg").write_text(render_config(settings, m, self.domain))
            (d / "nodes_config.cfg").write_text(render_nodes_config(self.domain))

    def config(self, i: int) -> Path:
        return self.tmp / self.members[i].tray / "config.cfg"

    def start(self, i: int) -> None:
        env = {"PATH": os.environ["PATH"], "MCTL_LAB_GPUS_JSON": str(self.tmp / "no-gpus.json")}
        self.procs[i] = subprocess.Popen([PYTHON, str(EMULATORS / "imex_daemon.py"), "-c", str(self.config(i))],
                                         cwd=self.tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self, i: int) -> None:
        proc = self.procs.pop(i)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def signal(self, i: int, sig: int) -> None:
        self.procs[i].send_signal(sig)

    def ctl(self, i: int, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, str(EMULATORS / "imex_ctl.py"), "-c", str(self.config(i)), *args],
                              capture_output=True, text=True, timeout=15, cwd=self.tmp)

    def wait_state(self, i: int, want: str, timeout: float = 8.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            res = self.ctl(i, "-N", "-j")
            if res.returncode == 0:
                last = parse_domain_json(res.stdout)
                if last.state == want:
                    return last
            time.sleep(0.2)
        raise AssertionError(f"node {i} never saw domain {want}; last: {last}")

    def close(self) -> None:
        for i in list(self.procs):
            self.stop(i)


def _domain(tmp: Path, n: int, **kw) -> Domain:
    tmp.mkdir(parents=True, exist_ok=True)
    return Domain(tmp, n, **kw)


@pytest.fixture()
def make_domain(tmp_path, processes, sockets):
    made: list[Domain] = []

    def make(n: int, **kw) -> Domain:
        d = _domain(tmp_path / f"domain{len(made)}", n, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def test_domain_forms_over_real_tcp_and_ctl_prints_the_real_formats(make_domain):
    d = make_domain(3)
    for i in range(3):
        d.start(i)
    for i in range(3):          # each daemon sees the domain UP once it has connected to every peer itself
        d.wait_state(i, "UP")
    q = d.ctl(1, "-q")
    assert q.returncode == 0 and q.stdout == "READY\n"
    text = d.ctl(2, "-N")
    status = parse_domain_text(text.stdout)
    assert status.state == "UP" and status.addresses == tuple(d.addresses)
    assert all(n.links == ("C", "C", "C") and n.state == "READY" and n.version == "570.172" for n in status.nodes)
    assert text.stdout.startswith("Connectivity Table Legend:\n") and "\nNodes:\nNode #0   - 127.77.250.1    - READY" \
        in text.stdout
    with_names = parse_domain_text(d.ctl(0, "-N", "-H").stdout)
    assert with_names.nodes[1].hostname == socket.gethostname()
    js = json.loads(d.ctl(0, "-N", "-j").stdout)
    assert list(js) == ["nodes", "timestamp", "status"]
    assert js["nodes"]["2"]["connections"]["0"] == {"host": d.addresses[0], "status": "CONNECTED", "changed": False}
    log = (d.tmp / "tray01" / "nvidia-imex.log").read_text()
    assert "Identified this node as ID 0, using bind IP of '127.77.250.1'" in log
    # Real TCP: each daemon holds established connections to its peers' SERVER_PORT.
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( dport = :{d.port} )"], capture_output=True,
                         text=True).stdout if shutil.which("ss") else ""
    if out:
        assert len(out.strip().splitlines()) >= 6


def test_node_map_mismatch_then_reload(make_domain):
    d = make_domain(3)
    odd = d.tmp / "tray03" / "nodes_config.cfg"
    odd.write_text("\n".join([d.addresses[0], d.addresses[2], d.addresses[1]]) + "\n")
    for i in range(3):
        d.start(i)
    time.sleep(1.5)
    status = parse_domain_text(d.ctl(0, "-N").stdout)
    assert status.state != "UP"
    assert status.link(0, 2) == "!M!" and status.link(0, 1) == "C"
    assert status.nodes[2].state == "UNAVAILABLE"
    odd.write_text(render_nodes_config(d.domain))
    d.signal(2, signal.SIGUSR1)
    d.wait_state(0, "UP")
    d.wait_state(2, "UP")


def test_peers_going_away_degrade_then_down_and_come_back(make_domain):
    d = make_domain(4)
    for i in range(4):
        d.start(i)
    d.wait_state(0, "UP")
    d.stop(3)
    degraded = d.wait_state(0, "DEGRADED")
    assert degraded.link(0, 3) in ("R", "D") and degraded.nodes[3].state == "UNAVAILABLE"
    assert set(degraded.nodes[3].links) == {"I"}
    time.sleep(1.2)                                              # past IMEX_NODE_DISCONNECTED_GRACE_TIME=1
    assert parse_domain_text(d.ctl(0, "-N").stdout).link(0, 3) == "D"
    d.stop(2)
    d.stop(1)
    down = d.wait_state(0, "DOWN")
    assert [n.state for n in down.nodes] == ["READY", "UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE"]
    d.start(1)
    d.wait_state(0, "DEGRADED")
    d.start(2)
    d.start(3)
    d.wait_state(0, "UP", timeout=10)


def test_full_quorum_waits_for_every_peer(make_domain):
    d = make_domain(2, quorum="FULL")
    d.start(0)
    time.sleep(0.5)
    assert d.ctl(0, "-q").stdout == "WAITING_FOR_PEERS\n"
    assert parse_domain_text(d.ctl(0, "-N").stdout).state == "DOWN"
    d.start(1)
    d.wait_state(0, "UP")
    assert d.ctl(0, "-q").stdout == "READY\n"


def test_ctl_errors(make_domain):
    d = make_domain(1)
    res = d.ctl(0, "-q")
    assert res.returncode == 1 and res.stdout == "" and "cannot connect" in res.stderr
    bad = d.ctl(0, "-s")
    assert bad.returncode == 2 and "not implemented" in bad.stderr
    assert "Usage: nvidia-imex-ctl" in d.ctl(0, "-h").stdout
    bad_nodes = d.tmp / "tray01" / "nodes_config.cfg"
    bad_nodes.write_text("10.99.0.1\n")
    d.start(0)
    assert d.procs[0].wait(timeout=10) == 1
    assert b"is not in" in d.procs[0].stderr.read()
    d.procs.pop(0)


def test_daemonize_returns_once_listening(make_domain):
    d = make_domain(1)
    cfg = d.config(0)
    cfg.write_text(cfg.read_text().replace("DAEMONIZE=0", "DAEMONIZE=1"))
    pid_file = d.tmp / "run" / "nvidia-imex.pid"
    started = subprocess.run([PYTHON, str(EMULATORS / "imex_daemon.py"), "-c", str(cfg), "--pid-file", str(pid_file)],
                             timeout=15, cwd=d.tmp, env={"PATH": os.environ["PATH"]})
    assert started.returncode == 0
    pid = int(pid_file.read_text())
    try:
        assert d.ctl(0, "-q").stdout == "READY\n"
        assert str(cfg).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and pid_file.exists():
            time.sleep(0.05)
    assert not pid_file.exists()


def test_sighup_rereads_the_config_and_rebinds(make_domain):
    d = make_domain(1)
    d.start(0)
    d.wait_state(0, "UP")
    cfg = d.config(0)
    new_port = free_port(d.addresses[0])
    cfg.write_text(cfg.read_text().replace(f"IMEX_CMD_PORT={d.cmd_port}", f"IMEX_CMD_PORT={new_port}"))
    d.signal(0, signal.SIGHUP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and d.ctl(0, "-q").stdout != "READY\n":
        time.sleep(0.1)
    assert d.ctl(0, "-q").stdout == "READY\n"
    old = subprocess.run([PYTHON, str(EMULATORS / "imex_ctl.py"), "-i", d.addresses[0], str(d.cmd_port), "-q"],
                         capture_output=True, text=True, timeout=15)
    assert old.returncode == 1
    assert "IMEX_CMD_PORT = " in (d.tmp / "tray01" / "nvidia-imex.log").read_text()


def test_mctl_status_logic_reads_the_emulated_domain(make_domain):
    """The SSH probe's script, run locally per tray against the emulators, feeds assess_domain."""
    d = make_domain(3)
    for i in range(3):
        d.start(i)
    for i in range(3):                  # every daemon the assertion reads, not only the first
        d.wait_state(i, "UP", timeout=60)
    bin_dir = d.tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-imex-ctl").write_text(f"#!/bin/sh\nexec {PYTHON} {EMULATORS / 'imex_ctl.py'} \"$@\"\n")
    (bin_dir / "nvidia-imex-ctl").chmod(0o755)

    def reports():
        out = {}
        for i, m in enumerate(d.members):
            settings = ImexSettings(node_config_file=str(d.tmp / m.tray / "nodes_config.cfg"))
            script = probe_command(settings).replace("/etc/nvidia-imex/config.cfg", str(d.config(i)))
            res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                                 env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
            out[m.tray] = report_from(HostResult(m.tray, m.address, HostStatus.OK, 0, res.stdout))[0]
        return out

    def assessed(until, what: str, timeout: float = 60.0):
        """assess_domain over fresh reports until *until* holds (a loaded machine is slow, not wrong)."""
        end = time.monotonic() + timeout
        while True:
            health = assess_domain(d.domain, reports())
            if until(health):
                return health
            if time.monotonic() > end:
                raise AssertionError(f"not within {timeout:g}s: {what}; last: {health}")
            time.sleep(0.3)

    health = assessed(lambda h: h.state == "UP" and not h.reasons, "the domain UP with no reasons on all three")
    assert health.state == "UP" and not health.reasons, health
    (d.tmp / "tray02" / "nodes_config.cfg").write_text(f"{d.addresses[0]}\n{d.addresses[1]}\n")
    d.signal(1, signal.SIGUSR1)

    def mismatch_seen(h) -> bool:
        texts = [r.message for r in h.reasons]
        return (h.state in ("DEGRADED", "DOWN") and any("node map mismatch on tray tray02" in m for m in texts)
                and any("node map mismatch between tray" in m for m in texts))

    health = assessed(mismatch_seen, "tray02's reloaded node map seen as a mismatch")
    assert health.state in ("DEGRADED", "DOWN")
    messages = [r.message for r in health.reasons]
    assert any(m.startswith("node map mismatch on tray tray02: nodes_config.cfg differs from the partition "
                            "(missing 127.77.250.3)") for m in messages), messages
    assert any("node map mismatch between tray" in m for m in messages), messages


# ------------------------------------------------------------------ the lab

def test_imex_apply_and_status_on_the_lab(lab, tmp_path):
    """mctl imex apply/status over real SSH to lab trays; the daemon runs as the nvidia-imex unit under the image's
    systemctl (emulator, ctl and unit are installed here when the lab does not install them itself)."""
    import base64

    import yaml

    from mctl.lab.emulators.imex_daemon import SYSTEMD_UNIT

    for tray in lab.trays:
        if lab.run(tray, "test -x /usr/bin/nvidia-imex-ctl -a -f /lib/systemd/system/nvidia-imex.service",
                   check=False).returncode != 0:
            for data, dest, mode in (((EMULATORS / "imex_daemon.py").read_bytes(), "/usr/bin/nvidia-imex", 755),
                                     ((EMULATORS / "imex_ctl.py").read_bytes(), "/usr/bin/nvidia-imex-ctl", 755),
                                     (SYSTEMD_UNIT.encode(), "/lib/systemd/system/nvidia-imex.service", 644)):
                encoded = base64.b64encode(data).decode()
                lab.run(tray, f"echo {encoded} | base64 -d > {dest} && chmod {mode} {dest}")
    doc = yaml.safe_load(lab.inventory.read_text())
    half = len(lab.trays) // 2
    doc["racks"][lab.rack]["partitions"] = [
        {"name": "p0", "trays": ",".join(lab.trays[:half])}, {"name": "p1", "trays": ",".join(lab.trays[half:])}]
    inv = tmp_path / "mctl.yml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        plan = lab.mctl("-i", str(inv), "imex", "apply", lab.rack, "--dry-run")
        assert plan.returncode == 0, plan.stderr
        applied = lab.mctl("-i", str(inv), "imex", "apply", lab.rack, "--imex-wait", "30", "--json")
        assert applied.returncode == 0, applied.stderr + applied.stdout
        domains = {d["domain"]: d for d in json.loads(applied.stdout)["domains"]}
        assert {n: d["state"] for n, d in domains.items()} == {"p0": "UP", "p1": "UP"}
        nodes = lab.run(lab.trays[0], "cat /etc/nvidia-imex/nodes_config.cfg").stdout.split()
        assert nodes == [lab.addresses[t] for t in lab.trays[:half]]

        again = lab.mctl("-i", str(inv), "imex", "apply", lab.rack, "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["racks"][0]["changes"] == {}

        victim = lab.trays[1] if half > 1 else lab.trays[0]
        lab.run(victim, f"echo {lab.addresses[victim]} > /etc/nvidia-imex/nodes_config.cfg && "
                        "kill -USR1 $(cat /run/nvidia-imex/nvidia-imex.pid)")
        time.sleep(2)
        status = lab.mctl("-i", str(inv), "imex", "status", lab.rack, "--json")
        assert status.returncode == 1, status.stderr
        p0 = next(d for d in json.loads(status.stdout)["domains"] if d["domain"] == "p0")
        assert p0["state"] != "UP"
        assert any(r["tray"] == victim and r["message"].startswith(f"node map mismatch on tray {victim}")
                   for r in p0["reasons"]), p0
        fixed = lab.mctl("-i", str(inv), "imex", "apply", lab.rack, "--imex-wait", "30")
        assert fixed.returncode == 0, fixed.stderr + fixed.stdout
        assert lab.mctl("-i", str(inv), "imex", "status", lab.rack).returncode == 0
    finally:
        for tray in lab.trays:
            lab.run(tray, "systemctl stop nvidia-imex", check=False)
