"""The lab BMC's resource tree (pure parts): the real GB200 capture, personalised per tray."""

from __future__ import annotations

from pathlib import Path

import yaml

from mctl.lab import bmc_emulator as emu
from mctl.lab.layout import LabLayout
from mctl.lab.site import inventory


def test_tree_is_the_capture_plus_leak_detection_and_reset_action_info():
    tree = emu.load_tree()
    assert tree["/redfish/v1"]["Vendor"] == "NVIDIA" and tree["/redfish/v1"]["Product"] == "GB200 NVL"
    assert "/redfish/v1/UpdateService/FirmwareInventory/FW_BMC_0" in tree
    emu.add_missing(tree)
    leak = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection"
    assert tree["/redfish/v1/Chassis/Chassis_0/ThermalSubsystem"]["LeakDetection"]["@odata.id"] == leak
    members = [m["@odata.id"] for m in tree[f"{leak}/LeakDetectors"]["Members"]]
    # the capture's detectors (its 1_ColdPlate read Critical); the lab's trays serve them dry (bmc_faults)
    from mctl.lab import bmc_faults
    assert len(members) == 4 and [tree[m]["DetectorState"] for m in members] == ["OK", "OK", "Critical", "OK"]
    assert all(bmc_faults.overlay(m, dict(tree[m]), {})["DetectorState"] == "OK" for m in members)
    info = tree["/redfish/v1/Systems/System_0/ResetActionInfo"]["Parameters"][0]["AllowableValues"]
    assert set(info) == set(emu.RESET_TYPES) and "PushPowerButton" not in info
    # the capture's System_0 links exactly that ActionInfo
    action = tree["/redfish/v1/Systems/System_0"]["Actions"]["#ComputerSystem.Reset"]
    assert action["@Redfish.ActionInfo"] == "/redfish/v1/Systems/System_0/ResetActionInfo"


def test_personalize_serials_tray_index_and_power_per_tray():
    tree = emu.load_tree()
    c0 = tree["/redfish/v1/Chassis/Chassis_0"]
    a = emu.personalize(c0, tray_id="lab/lab-r1-tray01", tray_index=0, slot=1, power="Off")
    b = emu.personalize(c0, tray_id="lab/lab-r1-tray02", tray_index=1, slot=2, power="On")
    assert a["SerialNumber"] != b["SerialNumber"] != c0["SerialNumber"]
    assert a["SerialNumber"] == emu.personalize(c0, tray_id="lab/lab-r1-tray01", tray_index=0, slot=1,
                                                power="On")["SerialNumber"]
    assert (a["PowerState"], b["PowerState"]) == ("Off", "On") and c0["PowerState"] == "On"   # capture untouched
    cbc = emu.personalize(tree["/redfish/v1/Chassis/CBC_0"], tray_id="x", tray_index=6, slot=7, power="On")
    assert cbc["Oem"]["Nvidia"]["ComputeTrayIndex"] == 6 and cbc["Oem"]["Nvidia"]["ChassisPhysicalSlotNumber"] == 7
    bmc = emu.personalize(tree["/redfish/v1/Chassis/BMC_0"], tray_id="x", tray_index=0, slot=1, power="Off")
    assert bmc["PowerState"] == tree["/redfish/v1/Chassis/BMC_0"]["PowerState"]      # standby power


def test_lab_inventory_names_bmc_addresses_and_section():
    layout = LabLayout("lab", 2, 3, net=77)
    assert layout.bmc_address(layout.trays_of("lab-r2")[2]) == "127.77.102.3"
    doc = yaml.safe_load(inventory(layout, identity_file=Path("/k"), known_hosts=Path("/h"),
                                   bmc={"credentials_file": "/lab/bmc/credentials", "verify_tls": "/lab/bmc/ca.pem"}))
    assert doc["racks"]["lab-r1"]["compute"]["bmc"] == "127.77.101.[1-3]"
    assert doc["racks"]["lab-r2"]["compute"]["bmc"] == "127.77.102.[1-3]"
    assert doc["bmc"]["credentials_file"] == "/lab/bmc/credentials"
    plain = yaml.safe_load(inventory(layout, identity_file=Path("/k"), known_hosts=Path("/h")))
    assert "bmc" not in plain and "bmc" not in plain["racks"]["lab-r1"]["compute"]
