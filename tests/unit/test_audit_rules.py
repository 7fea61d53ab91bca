"""Audit rules, one family at a time, on captured Slurm output and mctl's own renderers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from mctl.audit.rules import drains, hostkeys, imex, nmx, slurm, versions
from mctl.fabric.imex import expected_files
from mctl.model.imex import CONFIG_FILE, NODES_CONFIG_FILE, ImexSettings
from mctl.fabric.partitions import map_fabric
from mctl.fabric.reconcile import FabricState
from mctl.images.catalog import load_image
from mctl.images import drift
from mctl.inventory import load_site
from mctl.model.fabric import DEFAULT_PARTITION_ID, NmxPartition
from mctl.model.findings import Severity
from mctl.sched.slurm.facts import parse_show_nodes, parse_show_topology
from mctl.sched.slurm.topology import block_sizes, blocks_for, render_topology
from mctl.transport.results import HostKeyProblem
from tests.helpers import CAPTURED, captured_lab_site, fabric_for, gpus_of

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def site(tmp_path):
    return load_site(captured_lab_site(tmp_path / "site"))


def by_check(findings):
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out


# ------------------------------------------------------------------ drains

def captured_nodes():
    return {n.name: n for n in parse_show_nodes((CAPTURED / "scontrol-show-node-o.txt").read_text())}


def test_drained_for_a_day_from_the_captured_reason_stamp():
    nodes = captured_nodes()
    # tray02: State=IDLE+DRAIN Reason=mctl: test drain [root@2026-11-29T19:51:38]
    day_later = datetime(2026, 11, 30, 19, 51, 39)
    found = drains.check(["lab-r1-tray02"], nodes, day_later)
    age = [f for f in found if f.check == drains.AGE]
    assert len(age) == 1 and age[0].severity is Severity.WARN
    assert age[0].details["age_s"] == 86401 and age[0].details["by"] == "root"
    assert age[0].details["reason"] == "mctl: test drain"
    assert "drained for 1d (since" in age[0].message and "since 2026-11-29T19:51:38 by root" in age[0].message
    assert [f.severity for f in found if f.check == drains.REASON] == [Severity.OK]
    hour_later = datetime(2026, 11, 29, 20, 51, 38)
    assert all(f.severity is Severity.OK for f in drains.check(["lab-r1-tray02"], nodes, hour_later))
    # the same age passes a longer threshold and fails a shorter one
    assert all(f.severity is Severity.OK for f in drains.check(["lab-r1-tray02"], nodes, day_later, 2 * 86400))
    assert any(f.severity is Severity.WARN for f in drains.check(["lab-r1-tray02"], nodes, hour_later, 60))


def test_undrained_tray_with_an_old_reason_is_fine_and_unknown_nodes_are_left_to_the_slurm_rule():
    nodes = captured_nodes()
    # tray01 is IDLE but Slurm still shows the reason of an earlier drain
    found = drains.check(["lab-r1-tray01", "lab-r1-tray09"], nodes, datetime(2030, 1, 1))
    assert [(f.host, f.check, f.severity) for f in found] == [("lab-r1-tray01", drains.AGE, Severity.OK)]
    assert drains.drain_of(nodes["lab-r1-tray01"]) is None


def test_drained_with_no_reason():
    line = (CAPTURED / "scontrol-show-node-o.txt").read_text().splitlines()[2]      # tray03, IDLE, no Reason
    node = parse_show_nodes(line.replace("State=IDLE ", "State=IDLE+DRAIN "))[0]
    found = by_check(drains.check([node.name], {node.name: node}, datetime(2026, 11, 30)))
    assert [f.severity for f in found[drains.REASON]] == [Severity.WARN]
    assert found[drains.AGE][0].severity is Severity.OK and "no time stamp" in found[drains.AGE][0].message
    assert drains.drain_of(node).reason is None


# ------------------------------------------------------------------ IMEX files

def test_imex_files_compared_by_meaning(site):
    rack = site.racks["lab-r1"]
    want = expected_files(rack, ImexSettings())["lab-r1-tray02"]
    held = dict(want)
    ok = imex.check_tray("lab-r1-tray02", "lab-r1", "p0", want, held, {}, nodes_path=NODES_CONFIG_FILE,
                         config_path=CONFIG_FILE)
    assert [(f.check, f.severity) for f in ok] == [(imex.NODES, Severity.OK), (imex.CONFIG, Severity.OK)]
    assert ok[0].details["subject"] == NODES_CONFIG_FILE
    # a comment changed by hand is not drift
    held[CONFIG_FILE] = "# edited by hand\n" + want[CONFIG_FILE]
    assert all(f.severity is Severity.OK for f in imex.check_tray(
        "lab-r1-tray02", "lab-r1", "p0", want, held, {}, nodes_path=NODES_CONFIG_FILE, config_path=CONFIG_FILE))


def test_hand_edited_nodes_config(site):
    want = expected_files(site.racks["lab-r1"], ImexSettings())["lab-r1-tray02"][NODES_CONFIG_FILE]
    assert want == "127.83.1.1\n127.83.1.2\n"
    (f,) = imex.check_nodes_config("lab-r1-tray02", "lab-r1", "p0", NODES_CONFIG_FILE, want,
                                   "127.83.1.1\n127.83.1.2\n127.83.1.3\n")
    assert f.severity is Severity.CRITICAL and "extra 127.83.1.3" in f.message
    assert f.action == "run 'mctl imex apply lab-r1' (it rewrites the tray's files and restarts its daemon)"
    (f,) = imex.check_nodes_config("t", "lab-r1", "p0", NODES_CONFIG_FILE, want, "127.83.1.2\n127.83.1.1\n")
    assert f.severity is Severity.CRITICAL and "another order" in f.message
    (f,) = imex.check_nodes_config("t", "lab-r1", "p0", NODES_CONFIG_FILE, want, "127.83.1.1\n")
    assert "missing 127.83.1.2" in f.message
    (f,) = imex.check_nodes_config("t", "lab-r1", "p0", NODES_CONFIG_FILE, want, None)
    assert f.severity is Severity.CRITICAL and "is missing" in f.message
    (f,) = imex.check_nodes_config("t", "lab-r1", "p0", NODES_CONFIG_FILE, want, None, "Permission denied")
    assert "could not be read: Permission denied" in f.message
    (f,) = imex.check_nodes_config("t", "lab-r1", "p0", NODES_CONFIG_FILE, want, "127.83.1.1 127.83.1.2\n")
    assert f.severity is Severity.CRITICAL and "not a node list" in f.message


def test_config_cfg_severity_depends_on_the_key(site):
    want = expected_files(site.racks["lab-r1"], ImexSettings())["lab-r1-tray01"][CONFIG_FILE]
    (f,) = imex.check_config("t", "lab-r1", "p0", CONFIG_FILE, want, want.replace("LOG_LEVEL=4", "LOG_LEVEL=1"))
    assert f.severity is Severity.WARN and "LOG_LEVEL=1 (want 4)" in f.message and f.details["keys"] == ["LOG_LEVEL"]
    (f,) = imex.check_config("t", "lab-r1", "p0", CONFIG_FILE, want, want.replace("SERVER_PORT=50000",
                                                                                   "SERVER_PORT=50001"))
    assert f.severity is Severity.CRITICAL and "SERVER_PORT=50001 (want 50000)" in f.message
    (f,) = imex.check_config("t", "lab-r1", "p0", CONFIG_FILE, want, want + "EXTRA_KEY=1\n")
    assert "EXTRA_KEY=1 (want unset)" in f.message


# ------------------------------------------------------------------ versions

def test_versions_against_the_lab_image():
    image = load_image(REPO / "images" / "lab-debian13.yml")
    facts = drift.version_facts("13", "6.1.0", "570.148.08", "12.8", "24.11.5", slurm_expected=True)
    found = versions.check_tray("lab-r1-tray01", image, facts)
    assert {(f.check, f.severity) for f in found} == {
        ("image.os", Severity.OK), ("image.driver", Severity.OK), ("image.cuda", Severity.OK),
        ("image.slurm", Severity.OK)}       # kernel: "host" in the lab image, not compared
    drifted_facts = drift.version_facts("13", "6.1.0", "570.172.08", "12.8", None, slurm_expected=True)
    found = by_check(versions.check_tray("lab-r1-tray03", image, drifted_facts))
    assert found["image.driver"][0].severity is Severity.CRITICAL
    assert found["image.driver"][0].message == "NVIDIA driver: image wants 570.148.08, tray has 570.172.08"
    assert found["image.driver"][0].details["image"] == "lab-debian13"
    assert found["image.slurm"][0].severity is Severity.WARN and "did not report" in found["image.slurm"][0].message
    # a site without Slurm on its trays does not ask for slurmd
    quiet = drift.version_facts("13", "6.1.0", "570.148.08", "12.8", None, slurm_expected=False)
    assert "image.slurm" not in by_check(versions.check_tray("t", image, quiet))


# ------------------------------------------------------------------ Slurm

def lab_blocks(site):
    return blocks_for(site)


def test_nodes_addresses_and_partition_from_captured_output(site):
    nodes = list(captured_nodes().values())
    trays = [(h.name, h.address) for h in site.racks["lab-r1"].compute]
    found = slurm.check_nodes(trays, [t for t, _ in trays], nodes, controller="lab-r1-head")
    assert all(f.severity is Severity.OK for f in found) and len(found) == 8
    moved = [(t, a.replace("127.83", "127.84")) if t == "lab-r1-tray04" else (t, a) for t, a in trays]
    bad = [f for f in slurm.check_nodes(moved, [t for t, _ in trays], nodes, controller="lab-r1-head")
           if f.severity is not Severity.OK]
    assert [(f.host, f.check) for f in bad] == [("lab-r1-tray04", slurm.ADDRESS)]
    few = slurm.check_nodes(trays + [("lab-r1-tray05", "127.83.1.5")], [t for t, _ in trays][:3] + ["lab-r1-tray05"],
                            nodes, controller="lab-r1-head")
    bad = {(f.host, f.severity) for f in few if f.severity is not Severity.OK}
    assert bad == {("lab-r1-tray05", Severity.CRITICAL), ("lab-r1-head", Severity.WARN)}
    from mctl.sched.slurm.facts import key_values
    parts = {kv["PartitionName"]: kv for kv in map(key_values, (CAPTURED / "scontrol-show-partition-o.txt")
                                                     .read_text().splitlines())}
    (ok,) = slurm.check_partition("gpu", [t for t, _ in trays], parts, host="lab-r1-head")
    assert ok.severity is Severity.OK
    down = {"gpu": dict(parts["gpu"], State="DOWN", Nodes="lab-r1-tray[01-03]")}
    assert len(slurm.check_partition("gpu", [t for t, _ in trays], down, host="lab-r1-head")) == 2
    (f,) = slurm.check_partition("batch", [], parts, host="lab-r1-head")
    assert f.severity is Severity.CRITICAL and "no partition 'batch'" in f.message


def test_live_topology_that_no_longer_matches_the_partitions(site):
    expected = lab_blocks(site)
    rack_trays = {"lab-r1": [h.name for h in site.racks["lab-r1"].compute]}
    # captured: p0 = tray[01-03], p1 = tray04; the inventory says 2 + 2
    captured = parse_show_topology((CAPTURED / "scontrol-show-topology.txt").read_text())
    found = slurm.check_topology_live(expected, "block", captured, "topology/block", rack_trays, site_wide=True,
                                      controller="lab-r1-head")
    bad = [f for f in found if f.severity is not Severity.OK]
    assert {f.details["subject"]: f.details["found"] for f in bad} == {"lab-r1-p0": "lab-r1-tray[01-03]",
                                                                       "lab-r1-p1": "lab-r1-tray04"}
    assert all(f.host == "lab-r1" and f.severity is Severity.CRITICAL for f in bad)
    assert "block lab-r1-p0 holds lab-r1-tray[01-03], partition p0 is lab-r1-tray[01-02]" in bad[0].message
    right = parse_show_topology("BlockName=lab-r1-p0 BlockIndex=0 Nodes=lab-r1-tray[01-02] BlockSize=2\n"
                                "BlockName=lab-r1-p1 BlockIndex=1 Nodes=lab-r1-tray[03-04] BlockSize=2\n")
    assert all(f.severity is Severity.OK for f in slurm.check_topology_live(
        expected, "block", right, "topology/block", rack_trays, site_wide=True, controller="lab-r1-head"))
    extra = right + parse_show_topology("BlockName=old BlockIndex=2 Nodes=lab-r1-tray04 BlockSize=2\n")
    (f,) = [f for f in slurm.check_topology_live(expected, "block", extra, "topology/block", rack_trays,
                                                 site_wide=False, controller="lab-r1-head")
            if f.severity is not Severity.OK]
    assert f.details["subject"] == "old" and "that no partition makes" in f.message
    (f,) = slurm.check_topology_live(expected, "block", right, "topology/flat", rack_trays, site_wide=True,
                                     controller="lab-r1-head")
    assert f.severity is Severity.CRITICAL and f.host == "lab-r1-head" and "topology/flat" in f.message


def test_topology_conf_against_the_partitions(site):
    expected = lab_blocks(site)
    rack_trays = {"lab-r1": [h.name for h in site.racks["lab-r1"].compute]}
    sizes = block_sizes(expected)
    text = render_topology(expected, "block")
    assert text == (REPO / "tests" / "fixtures" / "golden" / "slurm" / "lab-24.11" / "topology.conf").read_text()
    args = dict(path="/etc/slurm/topology.conf", site_wide=True, controller="lab-r1-head")
    assert all(f.severity is Severity.OK for f in slurm.check_topology_conf(expected, "block", sizes, text,
                                                                            rack_trays, **args))
    edited = text.replace("Nodes=lab-r1-tray[01-02]", "Nodes=lab-r1-tray[01-03]").replace("BlockSizes=2,4",
                                                                                          "BlockSizes=2")
    bad = [f for f in slurm.check_topology_conf(expected, "block", sizes, edited, rack_trays, **args)
           if f.severity is not Severity.OK]
    assert {(f.details["subject"], f.severity) for f in bad} == {("lab-r1-p0", Severity.CRITICAL),
                                                                 ("BlockSizes", Severity.WARN)}
    (f,) = slurm.check_topology_conf(expected, "block", sizes, None, rack_trays, **args)
    assert f.severity is Severity.CRITICAL and f.message == "/etc/slurm/topology.conf is missing"


# ------------------------------------------------------------------ NMX-M

def test_nmx_partitions_against_the_inventory(site):
    rack = site.racks["lab-r1"]
    in_sync = [NmxPartition("a", 1, "p0", "ID_BASED", "HEALTHY", gpus_of(range(0, 2))),
               NmxPartition("b", 2, "p1", "ID_BASED", "HEALTHY", gpus_of(range(2, 4))),
               NmxPartition("d", DEFAULT_PARTITION_ID, "Default Partition", "ID_BASED", "HEALTHY", ())]
    found = nmx.check_rack(rack, fabric_for(rack, in_sync))
    assert all(f.severity is Severity.OK for f in found) and {f.host for f in found} == {"lab-r1"}
    drifted = [NmxPartition("a", 1, "p0", "ID_BASED", "DEGRADED", gpus_of(range(0, 3))),
               NmxPartition("c", 3, "old", "ID_BASED", "HEALTHY", gpus_of(range(3, 4)))]
    bad = {(f.check, f.details["subject"], f.severity) for f in nmx.check_rack(rack, fabric_for(rack, drifted))
           if f.severity is not Severity.OK}
    assert bad == {(nmx.PARTITION, "p0", Severity.CRITICAL), (nmx.HEALTH, "p0", Severity.WARN),
                   (nmx.PARTITION, "p1", Severity.CRITICAL), (nmx.PARTITION, "old", Severity.WARN)}
    sick = [NmxPartition("a", 1, "p0", "ID_BASED", "UNHEALTHY", gpus_of(range(0, 2)))]
    assert (nmx.HEALTH, "p0", Severity.CRITICAL) in {(f.check, f.details["subject"], f.severity)
                                                     for f in nmx.check_rack(rack, fabric_for(rack, sick))}


# ------------------------------------------------------------------ host keys

def test_host_keys():
    (ok,) = hostkeys.check_host("t1", "ok", None)
    assert ok.severity is Severity.OK
    changed = HostKeyProblem("ssh-ed25519 SHA256:new", ("ssh-ed25519 SHA256:old",), "/inv/known_hosts")
    (f,) = hostkeys.check_host("t1", "host-key-mismatch", changed)
    assert f.severity is Severity.CRITICAL and "presents ssh-ed25519 SHA256:new" in f.message
    assert "records ssh-ed25519 SHA256:old" in f.message and "--replace" in f.action
    (f,) = hostkeys.check_host("t1", "host-key-mismatch", HostKeyProblem("ssh-ed25519 SHA256:x", (), "kh"))
    assert f.severity is Severity.WARN and f.action == "check the fingerprint, then 'mctl ssh trust t1'"
    assert hostkeys.check_host("t1", "unreachable", None) == []


# --- imex.host_service: the host IMEX unit where the DRA driver's ComputeDomains manage IMEX (issue 31.4) ---------

SYSTEMD = """source=systemd
Id=nvidia-imex.service
LoadState={load}
ActiveState={active}
SubState={sub}
UnitFileState={enabled}
MainPID={pid}

Id=slurmd.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
MainPID=0
"""


def _imex_unit(**k):
    from mctl.facts.services import IMEX_UNIT, parse_service_probe

    fields = {"load": "loaded", "active": "inactive", "sub": "dead", "enabled": "disabled", "pid": "0", **k}
    return parse_service_probe(SYSTEMD.format(**fields)).get(IMEX_UNIT)


@pytest.mark.parametrize("fields, severity, said", [
    ({"active": "active", "sub": "running", "enabled": "enabled", "pid": "4242"}, Severity.CRITICAL,
     "running and enabled at boot"),
    ({"active": "active", "sub": "running", "enabled": "disabled", "pid": "4242"}, Severity.CRITICAL, "is running "),
    ({"enabled": "enabled"}, Severity.CRITICAL, "is enabled at boot"),          # stopped, back at the next boot
    ({"active": "activating", "sub": "start", "enabled": "masked"}, Severity.CRITICAL, "is running "),
    ({"enabled": "disabled"}, Severity.OK, "inactive and disabled"),
    ({"enabled": "masked"}, Severity.OK, "inactive and masked"),
    ({"load": "not-found", "enabled": ""}, Severity.OK, "no host nvidia-imex service"),
])
def test_host_imex_service_beside_the_dra_driver(fields, severity, said):
    (f,) = imex.check_host_service("t01", _imex_unit(**fields))
    assert f.check == "imex.host_service" and f.severity is severity and said in f.message, f
    if severity is Severity.CRITICAL:
        assert "systemctl disable --now nvidia-imex.service" in f.action and "mask" in f.action


def test_host_imex_service_from_the_process_table_and_unreadable():
    """Without a systemd PID 1 (the lab's trays) the probe's evidence is the unit file, its .wants link and the
    process table: a running daemon with an enabled unit is the conflict; no answer at all is a warning."""
    from mctl.facts.services import IMEX_UNIT, parse_service_probe

    text = ("source=process-table\nunit=nvidia-imex.service file=/usr/lib/systemd/system/nvidia-imex.service "
            "enabled=yes\nunit=slurmd.service file= enabled=no\n/proc/812/comm:nvidia-imex\n")
    (f,) = imex.check_host_service("t01", parse_service_probe(text)[IMEX_UNIT])
    assert f.severity is Severity.CRITICAL and f.details["active"] == "active" and f.details["enabled"] == "enabled"
    (w,) = imex.check_host_service("t01", None)
    assert w.severity is Severity.WARN and "could not be read" in w.message
