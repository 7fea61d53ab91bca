"""The lab's switch trays (`mctl lab up --switch-trays N`): layout, inventory, and the switch tray BMC
(sushy-tools serving the real switch capture, nvidia_gbswitch) over Flask's test client."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import yaml

from mctl.lab import bmc_emulator as emu
from mctl.lab import bmcs
from mctl.lab.layout import LabLayout
from mctl.lab.site import inventory, set_switch_trays

ROOT = "/redfish/v1"


def test_switch_trays_have_names_nvos_and_bmc_addresses_of_their_own():
    layout = LabLayout("lab", 2, 4, net=77, switch_trays=2)
    sws = layout.switches_of("lab-r2")
    assert [sw.name for sw in sws] == ["lab-r2-sw01", "lab-r2-sw02"]
    assert [sw.address for sw in sws] == ["127.77.2.61", "127.77.2.62"]
    assert [layout.switch_bmc_address(sw) for sw in sws] == ["127.77.102.61", "127.77.102.62"]
    assert len(layout.switches()) == 4 and layout.switch("lab-r1-sw02").index == 2
    # no host stands behind a switch tray, and none of its addresses is a tray's or a tray BMC's
    assert not any(h.name.endswith(("sw01", "sw02")) for h in layout.hosts())
    taken = {h.address for h in layout.hosts()} | {layout.bmc_address(h) for h in layout.hosts() if h.kind == "tray"}
    assert not taken & ({sw.address for sw in layout.switches()} | {layout.switch_bmc_address(sw)
                                                                     for sw in layout.switches()})
    assert LabLayout("lab", 1, 4).switches() == [] and LabLayout("lab", 1, 4).switches_of("lab-r9") == []
    with pytest.raises(ValueError, match="switch trays"):
        LabLayout("lab", 1, 4, switch_trays=10)
    units = bmcs.bmc_units(LabLayout("lab", 1, 2, switch_trays=1))
    assert [(u["tray"], u["kind"], u["address"]) for u in units] == [
        ("lab-r1-tray01", "compute", "127.77.101.1"), ("lab-r1-tray02", "compute", "127.77.101.2"),
        ("lab-r1-sw01", "switch", "127.77.101.61")]


def _site(tmp_path: Path, layout: LabLayout) -> Path:
    text = inventory(layout, identity_file=tmp_path / "k", known_hosts=tmp_path / "h",
                     bmc={"credentials_file": str(tmp_path / "cred"), "verify_tls": str(tmp_path / "ca.pem")})
    (tmp_path / "cred").write_text("root:pw\n")
    (tmp_path / "cred").chmod(0o600)
    (tmp_path / "mctl.yml").write_text(text)
    return tmp_path


def test_the_lab_inventory_lists_switch_trays_and_mctl_loads_them(tmp_path):
    from mctl.inventory.loader import load_site

    site = load_site(_site(tmp_path, LabLayout("lab", 1, 3, switch_trays=2)))
    rack = site.racks["lab-r1"]
    assert rack.switch_trays == 2 and [h.role for h in rack.switches] == ["switch", "switch"]
    assert [(h.name, h.address, h.bmc) for h in rack.switches] == [
        ("lab-r1-sw01", "127.77.1.61", "127.77.101.61"), ("lab-r1-sw02", "127.77.1.62", "127.77.101.62")]
    one = yaml.safe_load(inventory(LabLayout("lab", 1, 3, switch_trays=1), identity_file=Path("/k"),
                                   known_hosts=Path("/h")))
    assert one["racks"]["lab-r1"]["switches"] == {"nodes": "lab-r1-sw01", "addresses": "127.77.1.61"}
    none = yaml.safe_load(inventory(LabLayout("lab", 1, 3), identity_file=Path("/k"), known_hosts=Path("/h")))
    assert "switches" not in none["racks"]["lab-r1"] and none["racks"]["lab-r1"]["shape"]["switch_trays"] == 0


def test_switch_trays_added_to_and_removed_from_an_inventory_leave_the_rest_as_it_was():
    kw = dict(identity_file=Path("/k"), known_hosts=Path("/h"), bmc={"credentials_file": "/c", "verify_tls": "/ca"},
              rack_extra={"lab-r1": {"nmx": {"url": "https://127.77.1.200:8443"}}})
    plain = inventory(LabLayout("lab", 1, 3), **kw)
    wanted = inventory(LabLayout("lab", 1, 3, switch_trays=2), **kw)
    added = set_switch_trays(plain, LabLayout("lab", 1, 3, switch_trays=2))
    assert yaml.safe_load(added) == yaml.safe_load(wanted)
    assert set_switch_trays(added, LabLayout("lab", 1, 3)) == plain


def test_switch_tree_is_the_switch_capture_with_its_reset_action_info():
    tree = emu.load_tree(emu.SWITCH_CAPTURE)
    emu.add_missing(tree, "switch")
    assert tree[ROOT]["Product"] == "P3809"
    assert f"{ROOT}/UpdateService/FirmwareInventory/MGX_FW_NVSwitch_0" in tree
    info = tree[f"{ROOT}/Systems/System_0/ResetActionInfo"]["Parameters"][0]["AllowableValues"]
    assert "Nmi" not in info and {"On", "ForceOff", "GracefulShutdown", "PowerCycle"} <= set(info)
    # the compute tray's detectors are not added; the switch tray's own are the capture's, on MGX_BMC_0
    assert not any("Chassis_0" in p for p in tree)
    detectors = tree[f"{ROOT}/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors"]["Members"]
    assert sorted(m["@odata.id"].rsplit("/", 1)[-1] for m in detectors) == [
        "leakage1", "leakage2", "leakage3", "leakage4", "leakage5", "leakage6", "leakage_aggr"]
    assert all(tree[m["@odata.id"]]["DetectorState"] == "OK" for m in detectors)
    # one captured serial, shared by the tray's chassis and its system, stays shared per lab tray
    a = emu.personalize(tree[f"{ROOT}/Chassis/SYS_eeprom"], tray_id="lab/sw1", tray_index=0, slot=1, power="Off",
                        serial_by_value=True)
    s = emu.personalize(tree[f"{ROOT}/Systems/System_0"], tray_id="lab/sw1", tray_index=0, slot=1, power="Off",
                        serial_by_value=True)
    b = emu.personalize(tree[f"{ROOT}/Chassis/SYS_eeprom"], tray_id="lab/sw2", tray_index=1, slot=2, power="On",
                        serial_by_value=True)
    assert a["SerialNumber"] == s["SerialNumber"] != b["SerialNumber"]
    assert (a["PowerState"], s["PowerState"], b["PowerState"]) == ("Off", "Off", "On")
    bmc = emu.personalize(tree[f"{ROOT}/Chassis/MGX_BMC_0"], tray_id="x", tray_index=0, slot=1, power="Off")
    assert bmc["PowerState"] == tree[f"{ROOT}/Chassis/MGX_BMC_0"]["PowerState"]     # standby power


@pytest.fixture
def switch_bmc(tmp_path, monkeypatch):
    """A switch tray's BMC app (no socket): the lab files it needs under tmp_path."""
    bcrypt = pytest.importorskip("bcrypt")
    pytest.importorskip("sushy_tools")
    monkeypatch.setattr(emu, "SWITCH_STEP_S", 0.05)
    (tmp_path / "bmc").mkdir()
    (tmp_path / "bmc" / "htpasswd").write_text("root:" + bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode() + "\n")
    td = bmcs.tray_bmc_dir(tmp_path, "lab-r1-sw01")
    td.mkdir(parents=True)
    config = {"lab": "lab", "lab_dir": str(tmp_path), "tray": "lab-r1-sw01", "kind": "switch", "tray_index": 0,
              "slot": 1, "auth_file": str(tmp_path / "bmc" / "htpasswd"), "firmware_file": str(td / "firmware.json")}
    app = emu.build_app(config)
    auth = {"Authorization": "Basic " + base64.b64encode(b"root:pw").decode()}
    client = app.test_client()

    def get(path):
        r = client.get(path, headers=auth)
        return r.status_code, r.get_json()

    def reset(kind):
        return client.post(f"{ROOT}/Systems/System_0/Actions/ComputerSystem.Reset", headers=auth,
                           json={"ResetType": kind}).status_code

    return get, reset, td


def _wait_power(get, want, timeout=10.0):
    end = time.monotonic() + timeout
    while True:
        state = get(f"{ROOT}/Systems/System_0")[1]["PowerState"]
        if state == want or time.monotonic() > end:
            return state
        time.sleep(0.02)


def test_switch_bmc_serves_the_capture_and_its_power_follows_reset(switch_bmc):
    get, reset, td = switch_bmc
    code, root = get(ROOT)
    assert code == 200 and root["Product"] == "P3809"
    code, fw = get(f"{ROOT}/UpdateService/FirmwareInventory/MGX_FW_NVSwitch_0")
    assert code == 200 and fw["Version"] == "35_2014_4652"
    code, members = get(f"{ROOT}/Managers")
    assert code == 200 and [m["@odata.id"] for m in members["Members"]] == [f"{ROOT}/Managers/BMC_0"]
    assert _wait_power(get, "On") == "On"
    assert reset("Nmi") == 400                             # not one of the switch tray's ResetTypes
    assert reset("ForceOff") == 204
    assert _wait_power(get, "Off") == "Off"
    assert get(f"{ROOT}/Chassis/SYS_eeprom")[1]["PowerState"] == "Off"
    assert get(f"{ROOT}/Chassis/MGX_BMC_0")[1]["PowerState"] == "On"      # the BMC keeps standby power
    assert emu.switch_powered_off(td.parents[2], "lab-r1-sw01")
    assert reset("On") == 204 and _wait_power(get, "On") == "On"
    assert reset("GracefulShutdown") == 204 and _wait_power(get, "Off") == "Off"
    events = [json.loads(line) for line in (td / bmcs.POWER_EVENTS).read_text().splitlines()]
    assert [(e["reset"], e["step"], e["phase"]) for e in events] == [
        ("ForceOff", "off", "start"), ("ForceOff", "off", "done"), ("On", "on", "start"), ("On", "on", "done"),
        ("GracefulShutdown", "off", "start"), ("GracefulShutdown", "off", "done")]
    assert all(a["t"] <= b["t"] for a, b in zip(events, events[1:]))


def test_nmx_emulator_takes_a_powered_off_switch_trays_node_and_links_down(tmp_path):
    from mctl.lab.nmx_emulator import Config, NMXState

    files = [tmp_path / f"sw{i}" / "power.json" for i in range(1, 10)]
    cfg = Config.from_dict({"username": "u", "password": "p", "domain_uuid": "5b0c7f0e-6d7a-5d8e-9b51-3f3c1d2e4a10",
                            "trays": [{"name": "t1", "tray_index": 0}],
                            "switch_power_files": [str(f) for f in files]})
    state = NMXState(cfg)
    assert {n["Health"] for n in state.switch_nodes_json()} == {"HEALTHY"}
    assert {p["PhysicalState"] for p in state.ports_json()} == {"LINKUP"}
    files[1].parent.mkdir()
    files[1].write_text(json.dumps({"state": "Off"}))          # as the lab's second switch tray BMC writes it
    nodes = state.switch_nodes_json()
    assert [n["Health"] for n in nodes] == ["HEALTHY", "UNHEALTHY"] + ["HEALTHY"] * 7
    down = [p for p in state.ports_json() if p["PhysicalState"] == "DISABLED"]
    assert down and all(p["PeerPortDeviceUID"] in (state.asic_uid(1, 0), state.asic_uid(1, 1)) for p in down)
    assert all(p["LogicalState"] == "STATE_DOWN" for p in down)
    files[1].write_text(json.dumps({"state": "On"}))
    assert {p["PhysicalState"] for p in state.ports_json()} == {"LINKUP"}


def test_cli_up_dry_run_lists_switch_tray_bmcs_and_refuses_too_many(capsys, tmp_path):
    from tests.unit.cli_helpers import run_cli

    res = run_cli(capsys, "lab", "up", "--compute-trays", "2", "--switch-trays", "2", "--dir", str(tmp_path / "lab"),
                  "--dry-run", "--json")
    assert res.code == 0, res.err
    plan = json.loads(res.out)["plan"]
    assert plan["switch_trays"] == [{"name": "lab-r1-sw01", "address": "127.77.1.61", "bmc": "127.77.101.61"},
                                    {"name": "lab-r1-sw02", "address": "127.77.1.62", "bmc": "127.77.101.62"}]
    assert [h["name"] for h in plan["hosts"]] == ["lab-r1-head", "lab-r1-tray01", "lab-r1-tray02"]  # no host
    text = run_cli(capsys, "lab", "up", "--compute-trays", "1", "--switch-trays", "1", "--dir", str(tmp_path / "lab"),
                   "--dry-run")
    assert text.code == 0 and "lab-r1-sw01" in text.out and "BMC 127.77.101.61 (no host)" in text.out
    for bad in ("10", "-1", "x"):
        r = run_cli(capsys, "lab", "up", "--switch-trays", bad, "--dir", str(tmp_path / "lab"), "--dry-run")
        assert r.code == 2 and "Traceback" not in r.err, bad
    assert not (tmp_path / "lab").exists()


def test_switch_trays_added_later_get_a_ca_of_their_own_listed_beside_the_labs(tmp_path):
    pytest.importorskip("bcrypt")
    from cryptography import x509

    bmcs.prepare(tmp_path, LabLayout("lab", 1, 1))
    d = bmcs.lab_bmc_dir(tmp_path)
    lab_ca = (d / "ca.pem").read_text()
    assert (d / bmcs.TRAYS_CA).read_text() == lab_ca and not bmcs.tray_bmc_dir(tmp_path, "lab-r1-sw01").exists()
    bmcs.prepare_switches(tmp_path, LabLayout("lab", 1, 1, switch_trays=2))
    bundle = x509.load_pem_x509_certificates((d / "ca.pem").read_bytes())
    assert len(bundle) == 2 and (d / "ca.pem").read_text().startswith(lab_ca)
    for name in ("lab-r1-sw01", "lab-r1-sw02"):
        cert = x509.load_pem_x509_certificate((bmcs.tray_bmc_dir(tmp_path, name) / "cert.pem").read_bytes())
        assert cert.issuer == bundle[1].subject
        config = json.loads((bmcs.tray_bmc_dir(tmp_path, name) / "bmc.json").read_text())
        assert config["kind"] == "switch" and config["tray"] == name
    tray = json.loads((bmcs.tray_bmc_dir(tmp_path, "lab-r1-tray01") / "bmc.json").read_text())
    assert tray["kind"] == "compute"
    bmcs.prepare_switches(tmp_path, LabLayout("lab", 1, 1))
    assert (d / "ca.pem").read_text() == lab_ca and not (d / bmcs.SWITCHES_CA).exists()


def test_switch_trays_cannot_be_set_on_a_lab_that_is_not_up(tmp_path):
    from mctl.errors import UsageError
    from mctl.lab import control

    with pytest.raises(UsageError, match="no lab is up"):
        control.set_switch_trays(tmp_path, 2)
