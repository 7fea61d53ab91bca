"""Fleet mode (`mctl lab up --fleet`, docs/lab.md "Fleet mode") on a small fleet: 2 racks of 3 trays.

Per rack one host with one sshd answering as every tray and the head node (by the address the client
reached), and one BMC process answering as every BMC. The product's commands run on it unchanged: the
inventory of every rack, a health sweep, and faults (`mctl lab fault gpu`, `bmc`) that reach exactly
the tray they name. Its own lab (the slow tier): the shared lab is a full one.
"""

from __future__ import annotations

import json

import pytest

RACKS, TRAYS = 2, 3


@pytest.fixture(scope="module")
def fleet(own_lab, tmp_path_factory):
    with own_lab(tmp_path_factory.mktemp("mctl-fleet-state"), trays=TRAYS, racks=RACKS, fleet=True,
                 label="fleet lab") as lab:
        yield lab


def _trays(lab) -> list[str]:
    return sorted(n for n in lab.addresses if "-tray" in n)


def _status(lab) -> dict:
    st = lab.mctl("lab", "status", "--dir", str(lab.dir), "--json")
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)


def _health(lab) -> dict[str, set[str]]:
    """Each tray's checks that failed (critical or warn) in one `mctl health check` sweep."""
    run = lab.mctl("health", "check", "--json", timeout=180)
    assert run.returncode in (0, 1), run.stderr
    doc = json.loads(run.stdout)
    out: dict[str, set[str]] = {t: set() for t in _trays(lab)}
    for f in doc["findings"]:
        if f.get("host") in out and f.get("severity") in ("critical", "warn"):
            out[f["host"]].add(f["check"])
    return out


def test_one_sshd_and_one_bmc_process_per_rack_answer_as_every_host(fleet):
    st = _status(fleet)
    assert st["fleet"] is True
    assert st["hosts_total"] == RACKS * (TRAYS + 1) and st["hosts_running"] == st["hosts_total"]
    assert all(h["ssh"] == "ok" for h in st["hosts"]), [(h["name"], h["ssh"]) for h in st["hosts"]]
    racks = st["fleet_racks"]
    assert [r["rack"] for r in racks] == ["lab-r1", "lab-r2"]
    assert all(r["running"] and r["sshd"] == "running" and r["bmc_pid"] for r in racks), racks
    assert len({r["bmc_pid"] for r in racks}) == RACKS
    assert all(r["processes"] <= 3 for r in racks), racks        # the rack host's init and its one sshd
    # each address answers as its own host: hostname, /etc/hostname and its own GPU identities
    seen_uuids: dict[str, str] = {}
    for name in sorted(fleet.addresses):
        out = fleet.run(name, "hostname; cat /etc/hostname").stdout.split()
        assert out == [name, name], (name, out)
        if "-tray" in name:
            uuid = fleet.run(name, "nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0").stdout.strip()
            assert uuid.startswith("GPU-") and uuid not in seen_uuids, (name, uuid, seen_uuids.get(uuid))
            seen_uuids[uuid] = name


def test_rack_inventory_all_reads_every_tray_of_every_rack(fleet):
    run = fleet.mctl("rack", "inventory", "--all", "--json", timeout=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    doc = json.loads(run.stdout)
    assert doc["summary"]["racks"] == RACKS and doc["summary"]["trays"] == RACKS * TRAYS
    assert doc["summary"]["unreached"] == 0
    by_host = {t["host"]: t for r in doc["racks"] for t in r["trays"]}
    assert sorted(by_host) == _trays(fleet)
    assert all(t["hostname"] == name and t["nvidia_smi"]["attached_gpus"] == 4 for name, t in by_host.items())
    domains = {r["rack"]: {g["fabric"]["cluster_uuid"] for t in r["trays"] for g in t["nvidia_smi"]["gpus"]}
               for r in doc["racks"]}
    assert all(len(d) == 1 for d in domains.values()) and domains["lab-r1"] != domains["lab-r2"]


def test_faults_reach_the_tray_they_name_and_clear(fleet):
    gpu_tray, bmc_tray = "lab-r2-tray02", "lab-r1-tray03"
    try:
        run = fleet.mctl("lab", "fault", "gpu", gpu_tray, "--dir", str(fleet.dir), "--xid", "79", "--gpu", "0")
        assert run.returncode == 0, run.stderr
        run = fleet.mctl("lab", "fault", "bmc", bmc_tray, "--dir", str(fleet.dir), "--leak", "critical")
        assert run.returncode == 0, run.stderr
        # the XID is in that tray's own kernel log only
        assert "Xid" in fleet.run(gpu_tray, "cat /var/log/kern.log").stdout
        assert "Xid" not in fleet.run("lab-r1-tray02", "cat /var/log/kern.log").stdout
        failed = _health(fleet)
        assert "gpu.xid" in failed[gpu_tray] and "gpu.count" in failed[gpu_tray], failed[gpu_tray]
        assert "leak.detectors" in failed[bmc_tray], failed[bmc_tray]
        others = {t: c for t, c in failed.items() if t not in (gpu_tray, bmc_tray)}
        assert not any(c & {"gpu.xid", "gpu.count", "leak.detectors"} for c in others.values()), others
        faults = {h["name"]: h["faults"] for h in _status(fleet)["hosts"]}
        assert any("xid 79" in f for f in faults[gpu_tray]) and any("leak" in f for f in faults[bmc_tray])
        assert not faults["lab-r1-tray02"]
    finally:
        for tray in (gpu_tray, bmc_tray):
            fleet.mctl("lab", "fault", "clear", tray, "--dir", str(fleet.dir))
    failed = _health(fleet)
    assert not any(c & {"gpu.count", "leak.detectors"} for c in failed.values()), failed


def test_host_faults_are_refused_with_the_reason(fleet):
    run = fleet.mctl("lab", "fault", "host", "lab-r1-tray01", "--dir", str(fleet.dir), "--hang")
    assert run.returncode == 2
    assert "fleet" in run.stderr and "full lab" in run.stderr
    assert fleet.run("lab-r1-tray01", "echo alive", timeout=30).stdout.strip() == "alive"
