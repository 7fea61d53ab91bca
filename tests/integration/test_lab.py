"""The virtual lab as a real site: hosts over real SSH, emulated GPUs read by mctl's parsers, faults, teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from mctl.facts.kernel_log import parse_xid_events
from mctl.facts.nvidia_smi import parse_nvlink_status, parse_xml
from mctl.inventory import load_site
from mctl.lab import control, procs
from mctl.lab.services import RackService
from tests.helpers import fault
from tests.lab_fixture import _free_net
from tests.unit.cli_helpers import run_cli


def test_every_host_answers_ssh_with_its_own_hostname(lab):
    for host in lab.hosts:
        res = lab.run(host, "hostname; cat /etc/hostname; cat /etc/machine-id")
        name, etc_name, machine_id = res.stdout.split()
        assert name == etc_name == host
        assert len(machine_id) == 32


def test_hosts_have_private_roots_and_namespaces(lab):
    a, b = lab.trays[0], lab.trays[1]
    token = uuid.uuid4().hex
    lab.run(a, f"echo {token} > /root/isolation-check")
    try:
        assert lab.run(a, "cat /root/isolation-check").stdout.strip() == token
        assert lab.run(b, "test -e /root/isolation-check", check=False).returncode == 1
    finally:
        lab.run(a, "rm -f /root/isolation-check")
    # PID 1 is the host's own init; no machine processes are visible.
    ps = lab.run(a, "ps -eo pid=,comm=").stdout.split("\n")
    first = ps[0].split()
    assert first == ["1", "init"]
    assert not any("process_api" in line or "pytest" in line for line in ps)
    # The root is an overlay on the shared image; /proc, /sys, /dev are usable; the kernel's sysctls are not writable.
    mounts = lab.run(a, "cat /proc/mounts").stdout
    root_line = next(line for line in mounts.splitlines() if line.split()[1] == "/")
    assert root_line.startswith("overlay / overlay") and "upperdir=" in root_line and f"/{a}/upper" in root_line
    assert lab.run(a, "head -c 4 /dev/urandom | wc -c; ls /sys/class >/dev/null && echo sys-ok").stdout.split() \
        == ["4", "sys-ok"]
    assert lab.run(a, "echo 1 > /proc/sys/vm/drop_caches", check=False).returncode != 0
    # Names of every lab host resolve, as on a real site.
    getent = lab.run(a, f"getent hosts {b} {lab.head}").stdout
    assert lab.addresses[b] in getent and lab.addresses[lab.head] in getent


def test_host_keys_are_known_before_first_connection(lab):
    known = (lab.dir / "known_hosts").read_text().splitlines()
    assert len(known) == len(lab.hosts)
    for host in lab.hosts:
        line = next(entry for entry in known if entry.split()[0].split(",")[0] == host)
        scanned = lab.run(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        assert line.split()[1:3] == scanned[:2]


def test_inventory_is_an_ordinary_site(lab):
    site = load_site(lab.inventory)
    rack = site.racks[lab.rack]
    assert [h.name for h in rack.compute] == lab.trays
    assert [h.address for h in rack.compute] == [lab.addresses[t] for t in lab.trays]
    assert rack.head.name == lab.head and rack.switch_trays == 0
    assert rack.nvlink_domain == str(uuid.uuid5(uuid.NAMESPACE_URL, f"mctl-lab/lab/{lab.rack}"))
    assert {h.image for h in rack.compute} == {"lab-debian13"}
    assert site.scheduler.type == "slurm" and site.scheduler.controller == lab.head
    proc = lab.mctl("inventory", "validate")
    assert proc.returncode == 0, proc.stderr


def test_image_has_slurm_munge_and_systemctl(lab):
    host = lab.trays[0]
    assert lab.run(host, "slurmd -V").stdout.split() == ["slurm-wlm", "24.11.5"]
    plugins = lab.run(host, "ls /usr/lib/x86_64-linux-gnu/slurm-wlm/").stdout.split()
    assert "topology_block.so" in plugins and "switch_nvidia_imex.so" in plugins
    assert "systemctl.py" in lab.run(host, "systemctl --version").stdout
    # Not configured for a site: the image itself holds no munge key, no slurm.conf and no
    # host keys (the playbooks bring them). Read the image, not a host: other tests of this
    # session may already have deployed Slurm onto the shared lab.
    from mctl.lab import image
    from mctl.lab.site import IMAGE_NAME, REPO_IMAGES

    rootfs = image.load_spec(REPO_IMAGES / f"{IMAGE_NAME}.yml").cache_dir / "rootfs"
    # lexists: links inside the image point at absolute paths that only resolve in a host.
    assert os.path.lexists(rootfs / "usr/sbin/slurmd")
    assert not os.path.lexists(rootfs / "etc/munge/munge.key")
    assert not os.path.lexists(rootfs / "etc/slurm/slurm.conf")
    assert not list((rootfs / "etc/ssh").glob("ssh_host_*"))


def test_daemon_started_over_ssh_outlives_the_session(lab):
    # A unit of its own: the session's lab may run Slurm, and its munged must stay as the playbooks left it.
    host = lab.trays[-1]
    unit = "/etc/systemd/system/mctl-test-daemon.service"
    lab.run(host, f"printf '[Service]\\nType=simple\\nExecStart=/bin/sleep 600\\n' > {unit} "
                  "&& systemctl start mctl-test-daemon")
    try:
        time.sleep(0.5)
        later = lab.run(host, "systemctl is-active mctl-test-daemon; "
                              "pid=$(pgrep -f '^/bin/sleep 600$'); echo $pid; ps -o ppid= -p $pid")
        state, pid, ppid = (line.strip() for line in later.stdout.splitlines()[:3])
        assert state == "active" and pid.isdigit()
        assert ppid == "1"       # adopted by the host's init after the session ended
    finally:
        lab.run(host, f"systemctl stop mctl-test-daemon; rm -f {unit}", check=False)


def test_emulated_gpus_parse_with_mctl_parser(lab):
    site = load_site(lab.inventory)
    domain = site.racks[lab.rack].nvlink_domain
    seen: set[str] = set()
    for tray in lab.trays:
        report = parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout)
        assert report.attached_gpus == 4 and len(report.gpus) == 4
        assert report.driver_version == "570.148.08"
        assert report.cluster_uuids == (domain,)
        assert report.clique_ids == (32766,)
        state = json.loads(lab.run(tray, "cat /var/lib/mctl-lab/gpus.json").stdout)
        for gpu, want in zip(report.gpus, state["gpus"]):
            assert gpu.uuid == want["uuid"] and gpu.serial == want["serial"]
            assert gpu.fabric_attached
            assert gpu.platform.slot_number == state["slot_number"] == lab.trays.index(tray) + 1
            assert gpu.platform.chassis_serial_number == state["chassis_serial"]
            seen.add(gpu.uuid)
    assert len(seen) == 4 * len(lab.trays)          # stable per GPU, distinct across trays


def test_lab_status_reads_the_running_system(lab):
    proc = lab.mctl("lab", "status", "--json", "--dir", str(lab.dir))
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["hosts_running"] == st["hosts_total"] == len(lab.hosts)
    for row in st["hosts"]:
        assert row["running"] and row["ssh"] == "ok" and row["faults"] == []
        sshd = next(s for s in row["services"] if s["name"] == "sshd")
        assert sshd["listening"] and procs.read(sshd["pid"]).comm == "sshd"
        assert row["processes"][0]["pid"] == row["init_pid"]


def test_host_init_restarts_a_service_that_dies(lab):
    host = lab.head
    row = next(r for r in control.status(lab.dir)["hosts"] if r["name"] == host)
    old = next(s for s in row["services"] if s["name"] == "sshd")["pid"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 15
    new = None
    while time.monotonic() < deadline:
        row = next(r for r in control.status(lab.dir)["hosts"] if r["name"] == host)
        sshd = next(s for s in row["services"] if s["name"] == "sshd")
        if sshd["pid"] not in (None, old) and sshd["listening"]:
            new = sshd["pid"]
            break
        time.sleep(0.2)
    assert new is not None, "sshd was not restarted"
    assert lab.run(host, "hostname").stdout.strip() == host
    log = lab.run(host, "cat /var/log/mctl-lab/sshd.log; echo; true").stdout
    assert "Server listening on" in log


def test_bad_input(lab, capsys):
    again = run_cli(capsys, "lab", "up", "--compute-trays", "2", "--dir", str(lab.dir))
    assert again.code == 2
    assert "already up" in again.err and "mctl lab status" in again.err and "mctl lab down" in again.err
    unknown = run_cli(capsys, "lab", "fault", "gpu", "lab-r1-tray99", "--xid", "79", "--gpu", "0",
                      "--dir", str(lab.dir))
    assert unknown.code == 2
    assert "unknown lab tray 'lab-r1-tray99'" in unknown.err and f"lab-r1-tray[01-{len(lab.trays):02d}]" in unknown.err
    no_gpu = run_cli(capsys, "lab", "fault", "gpu", lab.trays[0], "--xid", "79", "--dir", str(lab.dir))
    assert no_gpu.code == 2 and "--gpu" in no_gpu.err
    head_gpu = run_cli(capsys, "lab", "fault", "gpu", lab.head, "--fabric", "degraded", "--dir", str(lab.dir))
    assert head_gpu.code == 2 and "has no GPUs" in head_gpu.err


def test_gpu_faults_show_where_real_ones_would(lab):
    tray = lab.trays[-1]
    try:
        # XID: a kernel-log line (parsed by mctl's kernel-log reader) naming the GPU's PCI address.
        cli = lab.mctl("lab", "fault", "gpu", tray, "--xid", "79", "--gpu", "2", "--dir", str(lab.dir))
        assert cli.returncode == 0 and "xid 79 gpu2" in cli.stdout, cli.stderr
        events = parse_xid_events(lab.run(tray, "cat /var/log/kern.log").stdout)
        assert [e.code for e in events] == [79]
        state = json.loads(lab.run(tray, "cat /var/lib/mctl-lab/gpus.json").stdout)
        assert events[0].on_gpu(state["gpus"][2]["pci_bus_id"]) and events[0].host == tray
        # 79 = fallen off the bus: the driver still counts it but cannot read it.
        report = parse_xml(lab.run(tray, "nvidia-smi -q -x", check=False).stdout)
        assert report.attached_gpus == 4 and len(report.gpus) == 3
        fault(lab, tray, clear=True)

        fault(lab, tray, gpu_missing=1)
        assert parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).attached_gpus == 3
        fault(lab, tray, clear=True)

        fault(lab, tray, fabric="in-progress")
        assert {g.fabric.state for g in parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).gpus} == {"In Progress"}
        fault(lab, tray, fabric="unhealthy")
        gpus = parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).gpus
        assert not any(g.fabric_attached for g in gpus) and all(g.fabric.health.route_unhealthy for g in gpus)
        fault(lab, tray, fabric="degraded")
        assert all(g.fabric.health.degraded_bandwidth for g in parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).gpus)
        fault(lab, tray, clear=True)

        fault(lab, tray, nvlink_down="0:3")
        links = parse_nvlink_status(lab.run(tray, "nvidia-smi nvlink --status").stdout)
        gpu0 = links[0]
        assert gpu0.inactive_links == (3,)
        fault(lab, tray, ecc_uncorrectable=5, gpu=1)
        gpu1 = parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).gpu(1)
        assert gpu1.ecc.volatile_dram_uncorrectable == 5 and gpu1.ecc.aggregate_dram_uncorrectable == 5
        # Faults persist (and combine) until cleared, and lab status reports them.
        row = next(r for r in control.status(lab.dir)["hosts"] if r["name"] == tray)
        assert row["faults"] == ["nvlink gpu0:link3 down", "gpu1 ecc uncorrectable 5"]
    finally:
        lab.clear_faults(tray)
    assert all(g.fabric_attached for g in parse_xml(lab.run(tray, "nvidia-smi -q -x").stdout).gpus)


def test_unreachable_and_hang_look_like_real_failures(lab):
    tray = lab.trays[0]
    try:
        fault(lab, tray, unreachable=True)
        started = time.monotonic()
        res = lab.run(tray, "hostname", check=False, connect_timeout=2, timeout=30)
        assert res.returncode == 255 and "timed out" in res.stderr
        assert time.monotonic() - started >= 1.5
        assert next(r for r in control.status(lab.dir)["hosts"] if r["name"] == tray)["ssh"] == "not answering"
        fault(lab, tray, clear=True)
        assert lab.run(tray, "hostname").stdout.strip() == tray

        fault(lab, tray, hang=True)
        with pytest.raises(subprocess.TimeoutExpired):
            lab.run(tray, "hostname", timeout=3)
        fault(lab, tray, clear=True)
        assert lab.run(tray, "hostname").stdout.strip() == tray
        assert lab.run(tray, "pgrep -f /usr/lib/mctl-lab/hang", check=False).returncode == 1
    finally:
        lab.clear_faults(tray)


@pytest.mark.usefixtures("own_lab")
def test_rack_service_and_teardown_leave_nothing(tmp_path):
    """A lab of its own (one tray, one rack service) so the shared one stays up.

    The rack service is a real HTTP server on the rack's service address, prepared,
    added to the inventory and stopped through the registry's hooks; `down` kills
    everything, even a daemon that detached from its SSH session.
    """
    web = RackService(
        "web", port=18080,
        prepare=lambda ctx: (ctx.log_dir / "rack.txt").write_text(ctx.rack),
        argv=lambda ctx: [sys.executable, "-m", "http.server", "--bind", ctx.address, "--directory",
                          str(ctx.log_dir), "18080"],
        inventory=lambda ctx: {"nmx": {"url": f"http://{ctx.address}:18080", "credentials_file": "nmx.cred"}})
    lab_dir = tmp_path / "lab"
    res = control.up(lab_dir, racks=1, trays=1, net=_free_net(), rack_services=[web], os_only=False)
    url = load_site(res.inventory).racks["lab-r1"].nmx.url
    assert url == f"http://{res.layout.service_address(1)}:18080"
    assert urllib.request.urlopen(url + "/rack.txt", timeout=10).read() == b"lab-r1"
    svc = control.status(res.dir)["rack_services"]
    assert [(s["name"], s["running"], s["listening"]) for s in svc] == [("web", True, True)]

    argv = control.ssh_argv(lab_dir, "lab-r1-tray01", ["setsid -f sleep 1000 </dev/null >/dev/null 2>&1; echo ok"],
                            tty=False)
    assert subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip() == "ok"
    pids = [p.pid for p in control.lab_processes(res.dir)]
    assert any(procs.read(pid).comm == "sleep" for pid in pids)
    out = control.down(res.dir)
    assert out.stopped == len(pids)
    assert not lab_dir.exists()
    assert all(procs.read(pid) is None or procs.read(pid).state == "Z" for pid in pids)
    assert procs.mounts_mentioning(str(lab_dir)) == []
    addresses = {(h.address, 22) for h in res.layout.hosts()} | {(res.layout.service_address(1), 18080)}
    assert not addresses & procs.listening_tcp()
    assert control.down(res.dir).stopped == 0          # nothing running: no error
