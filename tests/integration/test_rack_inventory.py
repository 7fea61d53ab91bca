"""`mctl rack inventory` against the lab: real sshd, real trays, emulated GPUs and lab faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def inventory(lab, *args, timeout=120):
    proc = lab.mctl("rack", "inventory", lab.rack, "--json", *args, timeout=timeout)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}, not JSON: {proc.stdout[:500]!r} {proc.stderr[-2000:]!r}")
    return proc, data


def trays_by_name(data):
    return {t["host"]: t for t in data["racks"][0]["trays"]}


def test_full_inventory(lab):
    proc, data = inventory(lab)
    assert proc.returncode == 0, proc.stderr
    rack = data["racks"][0]
    assert rack["rack"] == lab.rack and rack["expected"]["gpus_per_tray"] == 4
    trays = trays_by_name(data)
    assert sorted(trays) == sorted(lab.trays)
    domain = rack["expected"]["nvlink_domain"]
    for name, t in trays.items():
        assert t["reach"] == "ok" and t["hostname"] == name
        assert t["gpu_count"] == 4 and t["nvidia_smi"]["driver_version"]
        assert t["nvidia_smi"]["cluster_uuids"] == [domain]
        assert len(t["nvidia_smi"]["clique_ids"]) == 1
        assert all(g["fabric"]["state"] == "Completed" and g["fabric"]["status"] == "Success"
                   for g in t["nvidia_smi"]["gpus"])
        assert t["os"]["id"] == "debian" and t["kernel"]
        assert t["slurmd"]["unit"] == "slurmd.service" and t["imex"]["service"]["unit"] == "nvidia-imex.service"
    assert not [f for f in data["findings"] if f["severity"] == "critical"]
    gpus = [g for t in trays.values() for g in t["nvidia_smi"]["gpus"]]
    assert len({g["uuid"] for g in gpus}) == 4 * len(lab.trays)
    # as on real GB200 trays, the two GPUs of one board share the board's serial
    assert len({g["serial"] for g in gpus}) == 2 * len(lab.trays)
    assert Path(rack["snapshot_path"]).is_file()
    assert json.loads(Path(rack["snapshot_path"]).read_text())["trays"][0]["host"] == lab.trays[0]


def test_table_output(lab):
    proc = lab.mctl("rack", "inventory", lab.rack, "--no-save")
    assert proc.returncode == 0, proc.stderr
    for col in ("tray", "address", "GPUs", "driver", "cluster", "clique", "fabric", "findings"):
        assert col in proc.stdout
    for name in lab.trays:
        line = next(l for l in proc.stdout.splitlines() if name in l)
        assert lab.addresses[name] in line and "4/4" in line and "Completed" in line


def test_unknown_rack_lists_known_racks(lab):
    proc = lab.mctl("rack", "inventory", "no-such-rack")
    assert proc.returncode == 2
    assert "unknown rack no-such-rack" in proc.stderr and f"known racks: {lab.rack}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def faulted(lab):
    """One inventory run with three lab faults at once, after a clean baseline for --diff."""
    assert len(lab.trays) >= 4, "needs 4 trays"
    base, _ = inventory(lab)
    assert base.returncode == 0, base.stderr
    dark, hung, short = lab.trays[1], lab.trays[2], lab.trays[3]
    try:
        for tray, (target, *args) in ((dark, ["host", "--unreachable"]), (hung, ["host", "--hang"]),
                                      (short, ["gpu", "--gpu-missing", "1"])):
            p = lab.mctl("lab", "fault", target, tray, *args, "--dir", str(lab.dir))
            assert p.returncode == 0, p.stderr
        proc, data = inventory(lab, "--diff", "--timeout", "8")
    finally:
        lab.clear_faults()
    return {"proc": proc, "data": data, "dark": dark, "hung": hung, "short": short}


def test_unreachable_and_hung_trays_reported_others_inventoried(lab, faulted):
    proc, data = faulted["proc"], faulted["data"]
    assert proc.returncode == 3
    trays = trays_by_name(data)
    assert trays[faulted["dark"]]["reach"] == "unreachable"
    assert trays[faulted["hung"]]["reach"] == "timeout" and "8s" in trays[faulted["hung"]]["error"]
    assert trays[lab.trays[0]]["reach"] == "ok" and trays[lab.trays[0]]["gpu_count"] == 4
    checks = {(f["host"], f["check"]) for f in data["findings"] if f["severity"] == "critical"}
    assert (faulted["dark"], "ssh.unreachable") in checks and (faulted["hung"], "ssh.timeout") in checks
    assert "not inventoried" in proc.stderr and faulted["dark"] in proc.stderr


def test_missing_gpu_is_a_critical_finding(faulted):
    data = faulted["data"]
    short = trays_by_name(data)[faulted["short"]]
    assert short["reach"] == "ok" and short["gpu_count"] == 3
    f = [f for f in data["findings"] if f["host"] == faulted["short"] and f["check"] == "gpu.count"]
    assert len(f) == 1 and f[0]["severity"] == "critical" and "3 GPUs visible, expected 4" in f[0]["message"]


def test_diff_after_lab_faults(faulted):
    diff = faulted["data"]["racks"][0]["diff"]
    assert diff["previous_snapshot"]
    changes = {(c["host"], c["kind"]) for c in diff["changes"]}
    assert (faulted["dark"], "reach") in changes and (faulted["hung"], "reach") in changes
    assert (faulted["short"], "gpu-missing") in changes
    assert (faulted["short"], "finding-new") in changes


def test_diff_text_after_recovery(lab, faulted):
    # faults are cleared now: the next run reports the trays back and the GPU returned
    proc = lab.mctl("rack", "inventory", lab.rack, "--diff")
    assert proc.returncode == 0, proc.stderr
    assert "diff since" in proc.stdout
    assert f"{faulted['dark']}  reach: was unreachable, now ok" in proc.stdout
    assert f"{faulted['short']}  gpu-added" in proc.stdout
