"""mctl audit on a virtual rack: a clean rack audits clean; four kinds of drift each show in every format.

The audit needs a rack in its desired state first (NMX-M partitions applied, IMEX
files, Slurm with blocks), which the shared lab does not keep, so this module runs
its own small lab (`own_lab`). The site is deployed with the partitions the
session's Slurm has (tests.helpers.PARTITIONS), once per module. Every drift is
undone in a finally block, because the tests share this lab.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers import PARTITIONS, deploy_slurm, write_site
from tests.lab_fixture import TRAYS_ENV, LabHandle

FORMATS = ("table", "json", "junit", "prometheus")


@dataclass
class Audited:
    lab: LabHandle
    site: Path
    tmp: Path

    def audit(self, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
        return self.lab.mctl("-i", str(site or self.site), "audit", *args, timeout=300)

    def audit_json(self, *args: str) -> tuple[int, dict]:
        proc = self.audit("--format", "json", *args)
        assert proc.stdout, proc.stderr
        return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def audited(own_lab, tmp_path_factory) -> Audited:
    if int(os.environ.get(TRAYS_ENV) or 4) < 4:
        pytest.skip("needs 4 trays")
    with own_lab(tmp_path_factory.mktemp("mctl-audit-state"), trays=4, label="audit lab") as lab:
        tmp = tmp_path_factory.mktemp("audit")
        site = write_site(lab, tmp / "site", PARTITIONS)
        for args in (("partition", "apply", lab.rack), ("imex", "apply", lab.rack, "--imex-wait", "30")):
            proc = lab.mctl("-i", str(site), *args, timeout=300)
            assert proc.returncode == 0, f"{args}: {proc.stderr}\n{proc.stdout}"
        proc, _ = deploy_slurm(lab, site)
        assert proc.returncode == 0, f"deploy failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-3000:]}"
        yield Audited(lab, site, tmp)


def test_a_rack_in_its_desired_state_audits_clean(audited):
    audited.lab.settle_slurm()
    code, report = audited.audit_json("--fail-on", "warn")
    assert report["findings"] == [], report["findings"]
    assert code == 0 and report["complete"] and report["incomplete"] == []
    assert set(report["coverage"]) == {"versions", "firmware", "imex", "slurm", "nmx", "layers", "drains",
                                       "hostkeys", "health"}
    # every tray's BMC read, its firmware the image's (the capture's), one version across the rack
    assert report["coverage"]["firmware"]["hosts"] == "lab-r1,lab-r1-tray[01-04]"
    assert report["coverage"]["hostkeys"]["hosts"] == "lab-r1-head,lab-r1-tray[01-04]"
    assert report["coverage"]["imex"]["hosts"] == "lab-r1-tray[01-04]"


# ------------------------------------------------------------------ drift, one kind at a time

@dataclass
class Drift:
    name: str
    inject: Callable[[LabHandle], object]          # returns what restore needs
    restore: Callable[[LabHandle, object], None]
    check: str
    host: str
    args: tuple[str, ...] = ()                     # extra audit options
    code: int = 1
    also: tuple[tuple[str, str], ...] = ()         # more (check, host) the JSON report must name


NODES = "/etc/nvidia-imex/nodes_config.cfg"
GPUS = "/var/lib/mctl-lab/gpus.json"


def _edit_nodes_config(lab: LabHandle) -> str:
    before = lab.run("lab-r1-tray02", f"cat {NODES}").stdout
    lab.run("lab-r1-tray02", f"echo {lab.addresses['lab-r1-tray03']} >> {NODES}")     # a tray of the other domain
    return before


def _put(lab: LabHandle, host: str, path: str, text: str) -> str:
    data = base64.b64encode(text.encode()).decode()
    return lab.run(host, f"echo {data} | base64 -d > {path}").stdout


def _restore_nodes_config(lab: LabHandle, before: str) -> None:
    _put(lab, "lab-r1-tray02", NODES, before)


_SET_DRIVER = ("python3 -c \"import json, os, sys; p = '{path}'; d = json.load(open(p)); "
               "print(d['driver_version']); d['driver_version'] = sys.argv[1]; "
               "open(p + '.tmp', 'w').write(json.dumps(d)); os.replace(p + '.tmp', p)\" {version}")


def _set_driver(lab: LabHandle, version: str) -> str:
    return lab.run("lab-r1-tray03", _SET_DRIVER.format(path=GPUS, version=version)).stdout.strip()


def _swap_blocks(lab: LabHandle) -> str:
    before = lab.run(lab.head, "cat /etc/slurm/topology.conf").stdout
    lab.run(lab.head, "sed -i -e 's/^BlockName=lab-r1-p0 Nodes=.*/BlockName=lab-r1-p0 Nodes=lab-r1-tray[01,03]/' "
                      "-e 's/^BlockName=lab-r1-p1 Nodes=.*/BlockName=lab-r1-p1 Nodes=lab-r1-tray[02,04]/' "
                      "/etc/slurm/topology.conf && scontrol reconfigure")
    _wait_topology(lab, "Nodes=lab-r1-tray[01,03]")
    return before


def _restore_blocks(lab: LabHandle, before: str) -> None:
    _put(lab, lab.head, "/etc/slurm/topology.conf", before)
    lab.run(lab.head, "scontrol reconfigure")
    _wait_topology(lab, "Nodes=lab-r1-tray[01-02]")


def _wait_topology(lab: LabHandle, wanted: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        topo = lab.run(lab.head, "scontrol show topology", check=False).stdout
        if f"BlockName=lab-r1-p0 BlockIndex=0 {wanted}" in topo:
            return
        assert time.monotonic() < deadline, f"slurmctld did not take the topology: {topo}"
        time.sleep(1)


def _drain(lab: LabHandle) -> None:
    lab.run(lab.head, "scontrol update NodeName=lab-r1-tray04 State=DRAIN Reason='audit test: left drained'")
    time.sleep(2.5)           # Slurm stamps drains to the second: make it older than --drain-age 1s


def _resume(lab: LabHandle, _: object) -> None:
    lab.run(lab.head, "scontrol update NodeName=lab-r1-tray04 State=RESUME")


def _update_bmc_firmware(lab: LabHandle) -> None:
    """tray02's BMC now reports another BMC firmware build (the lab's firmware file, read by its emulator)."""
    from mctl.lab import bmcs

    bmcs.set_firmware(lab.dir, "lab-r1-tray02", "FW_BMC_0", "GB200Nvl-24.12-9")


def _restore_bmc_firmware(lab: LabHandle, _: object) -> None:
    from mctl.lab import bmcs

    bmcs.reset_firmware(lab.dir, "lab-r1-tray02")


DRIFTS = [
    Drift("nodes_config edited by hand", _edit_nodes_config, _restore_nodes_config, "imex.nodes_config",
          "lab-r1-tray02"),
    Drift("another driver", lambda lab: _set_driver(lab, "570.172.08"), lambda lab, v: _set_driver(lab, v),
          "image.driver", "lab-r1-tray03"),
    Drift("Slurm block no longer matches", _swap_blocks, _restore_blocks, "slurm.topology", "lab-r1"),
    Drift("drained longer than the threshold", _drain, _resume, "drain.age", "lab-r1-tray04",
          ("--drain-age", "1s", "--fail-on", "warn")),
    Drift("BMC firmware updated on one tray", _update_bmc_firmware, _restore_bmc_firmware, "firmware.version",
          "lab-r1-tray02", ("--fail-on", "warn"), also=(("firmware.rack", "lab-r1"),)),
]


def _seen_in(fmt: str, text: str, check: str, host: str) -> bool:
    if fmt == "table":
        return any(check in line.split() and host in line for line in text.splitlines())
    if fmt == "json":
        return any(f["check"] == check and f["host"] == host for f in json.loads(text)["findings"])
    if fmt == "junit":
        case = ET.fromstring(text).find(f".//testcase[@name='{host}: {check}']")
        return case is not None and case.find("failure") is not None
    return any(line.startswith("mctl_audit_findings{") and f'check="{check}"' in line and not line.endswith(" 0")
               for line in text.splitlines())


@pytest.mark.parametrize("drift", DRIFTS, ids=lambda d: d.name)
def test_drift_shows_in_every_format_and_resolves(audited, drift):
    lab = audited.lab
    saved = drift.inject(lab)
    try:
        for fmt in FORMATS:
            out = audited.tmp / f"audit.{fmt}"
            args = ("--format", fmt, *drift.args) + (("--output", str(out)) if fmt in ("junit", "prometheus") else ())
            proc = audited.audit(*args)
            assert proc.returncode == drift.code, f"{fmt}: exit {proc.returncode}\n{proc.stderr}\n{proc.stdout}"
            text = out.read_text() if fmt in ("junit", "prometheus") else proc.stdout
            if fmt in ("junit", "prometheus"):
                assert proc.stdout == ""
            assert _seen_in(fmt, text, drift.check, drift.host), f"{drift.check} on {drift.host} not in {fmt}:\n{text}"
            if fmt == "json":
                fingerprints = [f["fingerprint"] for f in json.loads(text)["findings"]
                                if f["check"] == drift.check and f["host"] == drift.host]
                for check, host in drift.also:
                    assert _seen_in(fmt, text, check, host), f"{check} on {host} not in {fmt}:\n{text}"
        if drift.args:         # the drain is a warning: below the default --fail-on it does not fail the run
            code, report = audited.audit_json("--drain-age", "1s", "--no-history")
            assert code == 0 and any(f["check"] == drift.check for f in report["findings"])
    finally:
        drift.restore(lab, saved)
    # Resolved means clean again: wait for the state the audit judges (every slurmd heard from, every tray
    # idle; a resumed tray or a slurmd ping lost on a loaded machine shows "idle*" for a moment).
    lab.settle_slurm()
    code, report = audited.audit_json(*drift.args)
    assert code == 0 and report["findings"] == [], report["findings"]
    assert set(fingerprints) <= set(report["history"]["resolved_fingerprints"])
    proc = audited.lab.mctl("audit", "history", "--since", "1h", "--json")
    assert proc.returncode == 0, proc.stderr
    lives = {f["fingerprint"]: f for f in json.loads(proc.stdout)["findings"]}
    for fp in fingerprints:
        assert lives[fp]["status"] == "resolved" and lives[fp]["resolved_at"]
    table = audited.lab.mctl("audit", "history", "--since", "1h")
    assert any(line.startswith("resolved") and drift.check in line for line in table.stdout.splitlines())


def test_a_stale_imex_node_list_is_one_finding_per_partition_naming_the_imex_layer(audited):
    lab = audited.lab
    saved = _edit_nodes_config(lab)          # tray02 (p0) also lists tray03 (p1)
    try:
        code, report = audited.audit_json("--no-history")
        assert code == 1, report
        crossed = [f for f in report["findings"] if f["check"] == "partition.layers"]
        assert len(crossed) == 1, crossed
        (finding,) = crossed
        assert finding["subject"] == "p0" and finding["severity"] == "critical"
        assert finding["details"]["behind"] == ["imex"]
        # every other layer was read and follows the plan
        assert finding["details"]["in_step"] == ["nmx", "cliques", "topology.conf", "topology"]
        assert "IMEX node lists behind (lab-r1-tray02 lists lab-r1-tray[01-03])" in finding["message"]
        assert finding["action"] == f"run 'mctl imex apply {lab.rack}'"
    finally:
        _restore_nodes_config(lab, saved)
    lab.settle_slurm()
    code, report = audited.audit_json("--no-history")
    assert code == 0 and report["findings"] == [], report["findings"]


# ------------------------------------------------------------------ incomplete runs

def test_unreachable_tray_changed_host_key_and_nmx_down_are_exit_3_with_the_rest_reported(audited):
    import yaml

    from mctl.lab import control
    from mctl.lab.faults import FaultRequest

    lab = audited.lab
    doc = yaml.safe_load((audited.site / "mctl.yml").read_text())
    down = audited.tmp / "nmx-down"
    down.mkdir(exist_ok=True)
    doc["racks"][lab.rack]["nmx"]["url"] = f"http://{lab.addresses[lab.head]}:9"        # nothing listens there
    # tray03 "reinstalled": known_hosts records another key for it (the head's)
    lines = Path(doc["ssh"]["known_hosts"]).read_text().splitlines()
    head_key = next(l.split(None, 1)[1] for l in lines if l.startswith(lab.head + ","))
    (down / "known_hosts").write_text("".join(
        (l.split(None, 1)[0] + " " + head_key if l.startswith("lab-r1-tray03,") else l) + "\n" for l in lines))
    doc["ssh"]["known_hosts"] = str(down / "known_hosts")
    (down / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    control.fault(lab.dir, "lab-r1-tray04", FaultRequest(unreachable=True))
    try:
        proc = audited.audit("--format", "json", "--no-history", site=down)
        assert proc.returncode == 3, proc.stderr
        report = json.loads(proc.stdout)
        gaps = {(g["family"], g["scope"]) for g in report["incomplete"]}
        assert gaps == {("reach", "lab-r1-tray03"), ("reach", "lab-r1-tray04"), ("nmx", lab.rack)}
        assert "audit incomplete" in proc.stderr
        (key,) = [f for f in report["findings"] if f["check"] == "ssh.host-key"]
        assert key["host"] == "lab-r1-tray03" and key["severity"] == "critical"
        assert key["message"].startswith("host key changed: presents ssh-ed25519 SHA256:")
        # what could be checked was: the other trays, Slurm, drains, host keys
        assert report["coverage"]["imex"]["hosts"] == "lab-r1-tray[01-02]"
        assert report["coverage"]["drains"]["hosts"] == "lab-r1-tray[01-04]"        # the controller answered
        assert report["coverage"]["hostkeys"]["hosts"] == "lab-r1-head,lab-r1-tray[01-03]"
        junit = ET.fromstring(audited.audit("--format", "junit", "--no-history", site=down).stdout)
        errors = {c.get("name") for c in junit.iter("testcase") if c.find("error") is not None}
        assert errors == {"lab-r1-tray03: checked", "lab-r1-tray04: checked", f"{lab.rack}: checked"}
        prom = audited.audit("--format", "prometheus", "--no-history", site=down).stdout
        assert 'mctl_audit_incomplete{site="lab"} 1' in prom.splitlines()
    finally:
        lab.clear_faults("lab-r1-tray04")


# ------------------------------------------------------------------ beside the health watch and locks

def test_audit_takes_no_lock_and_runs_beside_a_health_watch(audited):
    from mctl.health import store
    from mctl.state.lock import rack_lock

    lab = audited.lab
    state = lab.state_dir
    # the test before this one made tray04 unreachable: Slurm marks it not responding until its slurmd
    # answers again (ReturnToService=1), which the audit rightly reports; start from the clean rack
    end = time.monotonic() + 180
    while True:
        code, report = audited.audit_json("--fail-on", "warn")
        if code == 0 and report["complete"]:
            break
        if time.monotonic() > end:
            raise AssertionError("the rack did not audit clean again within 180 s: "
                                 f"{[f for f in report['findings'] if f['severity'] != 'ok']} "
                                 f"incomplete={report['incomplete']}")
        time.sleep(2)
    with rack_lock(state, lab.rack, purpose="test: a mutating command"), \
            store.watch_lock(state, "test: a health watch"), store.state_lock(state):
        code, report = audited.audit_json("--fail-on", "warn")
    assert code == 0 and report["complete"], report
    watch = subprocess.Popen([sys.executable, "-m", "mctl", "-i", str(audited.site), "health", "watch", lab.rack,
                              "--remediate", "--interval", "1", "--sweeps", "8"],
                             env=lab._env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        assert watch.poll() is None, watch.communicate()
        for _ in range(2):
            code, report = audited.audit_json("--fail-on", "warn")
            assert code == 0 and report["complete"] and report["findings"] == [], report
        out, err = watch.communicate(timeout=120)
        assert watch.returncode == 0, err
    finally:
        if watch.poll() is None:
            watch.send_signal(signal.SIGINT)
            watch.wait(timeout=30)
    nodes = lab.run(lab.head, "sinfo -h -N -o '%N %T'").stdout.split("\n")
    assert {line.split()[1] for line in nodes if line.strip()} == {"idle"}          # nobody drained anything
