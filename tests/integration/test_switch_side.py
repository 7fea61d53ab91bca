"""The switch side in the sweep, on the lab (issue 30.4): the lab rack's NMX-M emulator (tests.helpers.lab_nmx)
with a switch port down, a switch tray UNHEALTHY, or NMX-M hung; one `mctl health check` sweep each.

A switch port down reaches the one tray whose GPU is cabled to it in that sweep (nmx.switch_port, a warning on
that tray only); a switch tray UNHEALTHY reaches every tray (each GPU is cabled to every switch tray); a hung
NMX-M is the rack's nmx.switch_side finding and the sweep still ends within its deadline.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from mctl.lab import nmx_faults
from tests.helpers import HEALTH, lab_nmx, sinfo


@pytest.fixture
def switch_site(slurm_lab, tmp_path):
    """The lab's inventory with its rack's NMX-M (the lab's own rack service, faults through `mctl lab fault nmx`;
    else one started here, faults set on it directly)."""
    lab = slurm_lab.lab
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["health"] = dict(HEALTH)
    emulator = lab_nmx(lab, doc, tmp_path)
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def check(*args):
        t0 = time.monotonic()
        proc = lab.mctl("-i", str(folder), "--state-dir", str(tmp_path / "state"), "health", "check", lab.rack,
                        "--json", *args, timeout=180)
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(proc.stdout), time.monotonic() - t0

    def fault(kind, *args):
        if emulator is not None:
            doc = nmx_faults.merged(emulator.state.faults, kind, **_options(args))
            emulator.state.set_faults(doc, replace=True)
            return
        res = lab.mctl("lab", "fault", "nmx", lab.rack, kind, *args, "--dir", str(lab.dir))
        assert res.returncode == 0, res.stderr

    check.fault = fault
    check.doc = doc
    check.lab = lab
    try:
        yield check
    finally:
        fault("clear")
        if emulator is not None:
            emulator.stop()


def _options(args):
    out, it = {}, iter(args)
    for flag in it:
        out[flag.lstrip("-").replace("nmx-", "")] = next(it)
    return {k: (int(v) if k in ("switch", "port") else v) for k, v in out.items()}


def _link(doc, lab, tray, device, link):
    """(switch tray number from 1, its name, the switch port number) of *tray*'s GPU *device*'s NVLink *link*,
    as the rack's NMX-M lists them (the GPU's PortIDList, the port's peer, the ASIC's switch node)."""
    from mctl.fabric.nmx import NMXClient, load_credentials

    nmx = doc["racks"][lab.rack]["nmx"]
    client = NMXClient(nmx["url"], load_credentials(nmx["credentials_file"]), allow_http=True)
    gpu = next(g for g in client.inventory("gpus") if g["Name"] == f"{tray}/GPU{device}")
    port = next(p for p in client.inventory("ports") if p["ID"] == gpu["PortIDList"][link])
    asic = next(s for s in client.inventory("switches") if s["DeviceUID"] == port["PeerPortDeviceUID"])
    nodes = client.inventory("switch-nodes")
    index, node = next((i, n) for i, n in enumerate(nodes) if asic["ID"] in n["SwitchIDList"])
    return index + 1, node["Name"], port["PeerPortNum"]


def _by(doc, check_id):
    return {f["host"]: f for f in doc["findings"] if f["check"] == check_id}


def test_a_switch_port_down_reaches_its_tray_in_one_sweep(switch_site):
    lab = switch_site.lab
    tray = lab.trays[2]
    switch, name, number = _link(switch_site.doc, lab, tray, 1, 2)
    healthy, _ = switch_site()
    assert {f["severity"] for f in _by(healthy, "nmx.switch_port").values()} == {"ok"}
    assert _by(healthy, "nmx.switch_side")[lab.rack]["severity"] == "ok"
    switch_site.fault("port-down", "--switch", str(switch), "--port", str(number))
    doc, _ = switch_site()
    ports = _by(doc, "nmx.switch_port")
    assert ports[tray]["severity"] == "warn", ports[tray]
    assert f"{name} port {number} ({tray}:1) DISABLED/STATE_DOWN" in ports[tray]["message"]
    assert all(ports[t]["severity"] == "ok" for t in lab.trays if t != tray)
    (side,) = doc["switch_side"]
    (fault,) = side["faults"]
    assert fault["trays"] == [tray] and fault["partitions"]
    assert not [f for f in doc["findings"] if f["severity"] == "critical" and f["check"].startswith("nmx.")]


def test_an_unhealthy_switch_tray_reaches_every_tray_it_serves_and_clears(switch_site):
    lab = switch_site.lab
    switch_site.fault("switch-unhealthy", "--switch", "5")
    doc, _ = switch_site()
    trays = _by(doc, "nmx.switch_tray")
    assert {t: f["severity"] for t, f in trays.items()} == {t: "warn" for t in lab.trays}
    assert all("nvsw05 UNHEALTHY" in f["message"] for f in trays.values())
    switch_site.fault("clear")
    doc, _ = switch_site()
    assert {f["severity"] for f in _by(doc, "nmx.switch_tray").values()} == {"ok"}


def test_a_hung_nmx_m_is_the_racks_finding_and_never_stretches_the_sweep(switch_site):
    """A hung NMX-M costs the sweep at most its deadline (4 s here), beside the probes: a fresh `health check`
    waits for its one read that long; the watch's later sweeps do not wait at all (tests/unit/test_switch_side.py)."""
    lab = switch_site.lab
    healthy, _ = switch_site("--timeout", "4")
    switch_site.fault("timeout")
    doc, _ = switch_site("--timeout", "4")
    side = _by(doc, "nmx.switch_side")[lab.rack]
    assert side["severity"] == "warn" and "not read" in side["message"], side
    assert not _by(doc, "nmx.switch_port")          # nothing judged from no answer
    assert doc["elapsed"] <= max(healthy["elapsed"], 4) + 2.5, (doc["elapsed"], healthy["elapsed"])


def _features(lab):
    """node -> AvailableFeatures, from the controller."""
    out = lab.run(lab.head, "scontrol show node -o", check=False).stdout
    feats = {}
    for line in out.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "NodeName" in words:
            feats[words["NodeName"]] = words.get("AvailableFeatures", "")
    return feats


def test_a_degraded_partition_gets_the_slurm_feature_and_loses_it_when_healthy(switch_site):
    lab = switch_site.lab
    # the partition that holds the first tray, as NMX-M has it now (earlier tests on the shared lab may have
    # split the rack: then only that partition's trays are marked)
    healthy, _ = switch_site("--timeout", "30")
    (side,) = healthy["switch_side"]
    (part,) = [p for p in side["partitions"] if lab.trays[0] in p["trays"]]
    trays = sorted(t for t in part["trays"] if t in lab.trays)
    before = _features(lab)
    assert all("nvl_degraded" not in before[t] for t in lab.trays), before
    try:
        switch_site.fault("partition-degraded", "--nmx-partition", part["name"])
        doc, _ = switch_site("--remediate", "--timeout", "30")
        marks = [a for a in doc["actions"] if a["action"] == "fabric-mark"]
        # a generous deadline: this test is about the mark, not the deadline (a loaded machine's NMX-M emulator
        # may miss a short one; the hung-NMX-M test above covers that), and the switch side's view is in the message
        assert sorted(a["tray"] for a in marks) == trays, (part, doc["actions"], _by(doc, "nmx.switch_side"))
        after = _features(lab)
        for t in trays:                             # the rack's own feature is kept, mctl's added
            assert after[t].split(",") == [f for f in before[t].split(",") if f and f != "(null)"] + ["nvl_degraded"], \
                after
        assert all(f["severity"] == "warn" for t, f in _by(doc, "nmx.tray_partition").items() if t in trays)
        switch_site.fault("clear")
        doc, _ = switch_site("--remediate", "--timeout", "30")         # one healthy sweep of the two (resume_after_healthy_sweeps)
        assert not [a for a in doc["actions"] if a["action"] == "fabric-clear"]
        assert all("nvl_degraded" in _features(lab)[t] for t in trays)
        doc, _ = switch_site("--remediate", "--timeout", "30")
        clears = [a for a in doc["actions"] if a["action"] == "fabric-clear"]
        assert sorted(a["tray"] for a in clears) == trays, doc["actions"]
        assert _features(lab) == before
    finally:
        switch_site.fault("clear")
        for t in lab.trays:
            if "nvl_degraded" in _features(lab).get(t, ""):
                lab.run(lab.head, f"scontrol update NodeName={t} AvailableFeatures={before[t]} "
                                  f"ActiveFeatures={before[t]}", check=False)
        for node, (st, reason) in sinfo(lab).items():
            if "drain" in st and reason.startswith("mctl:"):
                lab.run(lab.head, f"scontrol update NodeName={node} State=RESUME", check=False)
