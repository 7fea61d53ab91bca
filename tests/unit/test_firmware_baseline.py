"""Firmware baselines (issue 20.2): the image's FirmwareInventory ids and versions against the real GB200
compute-tray capture (tests/fixtures/real/redfish/nvidia_gb200, NVIDIA/libredfish), read over TLS
through mctl's Redfish client from the static mockup server; the audit rule and the rack rule (pure)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redfish_mockup import MockupServer, throwaway_ca  # noqa: E402

from mctl.audit.model import tag  # noqa: E402
from mctl.audit.rules import firmware  # noqa: E402
from mctl.bmc.client import BMCCredentials, RedfishClient  # noqa: E402
from mctl.bmc.inventory import TrayBMC, read_firmware  # noqa: E402
from mctl.errors import UsageError  # noqa: E402
from mctl.images.catalog import load_image  # noqa: E402
from mctl.model.findings import Severity  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GB200 = REPO / "tests" / "fixtures" / "real" / "redfish" / "nvidia_gb200"
CRED = BMCCredentials("root", "0penBmc")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The capture's FirmwareInventory as mctl reads it, and the client's TLS counters."""
    ca, cert, key = throwaway_ca(tmp_path_factory.mktemp("pki"), ["127.0.0.1"])
    with MockupServer(GB200, tls=(cert, key)) as srv:
        client = RedfishClient(f"https://{srv.host}:{srv.port}", CRED, verify_tls=str(ca), timeout_s=5)
        tray = TrayBMC("t1", "compute", "127.0.0.1")
        read_firmware(client, tray)
        gets = [p for m, p, _a in srv.requests if m == "GET"]
        # a new connection for each GET, as on a BMC that closes every connection
        again = []
        for _ in range(3):
            client._client._session.get_adapter("https://x").poolmanager.clear()
            again.append(client.get("/redfish/v1")["RedfishVersion"])
        return tray, gets, client, again


def test_the_capture_lists_every_firmware_item_with_its_version(captured):
    tray, gets, _client, _ = captured
    assert tray.firmware_listed and len(tray.firmware) == 30
    assert tray.firmware["FW_BMC_0"] == "GB200Nvl-24.12-8" and tray.firmware["UEFI"] == "buildbrain-gcid-38635631"
    assert tray.firmware["HGX_FW_GPU_1"] == "97.00.72.00.00" and tray.firmware["CX7_0"] == "28.42.1234"
    # the capture's root says ExpandQuery Levels: asked once with $expand; a static mockup answers links
    # only, so each member is then read by its own GET
    assert gets[2].startswith("/redfish/v1/UpdateService/FirmwareInventory?$expand=.($levels=1)")
    assert len(gets) == 3 + 30


def test_later_connections_resume_the_tls_session_still_verified(captured):
    _tray, _gets, client, again = captured
    assert again == ["1.17.0"] * 3
    assert client.tls_handshakes >= 1 and client.tls_resumed >= 3


@pytest.mark.parametrize("name", ["lab-debian13", "lab-debian13-bootparams", "gb200-ubuntu24.04"])
def test_every_image_matches_the_capture_it_was_written_from(captured, name):
    tray = captured[0]
    image = load_image(REPO / "images" / f"{name}.yml")
    found = firmware.check_tray("t1", image, tray.firmware)
    assert {f.details["subject"] for f in found} >= {"FW_BMC_0", "UEFI", "HGX_FW_BMC_0", "HGX_FW_GPU_0", "CX7_0"}
    assert [f for f in found if f.severity is not Severity.OK] == []
    tag(firmware.FAMILY, found, rack_of={})          # catalogued for the audit


def test_drift_and_an_item_the_bmc_does_not_list(captured):
    tray = captured[0]
    image = load_image(REPO / "images" / "lab-debian13.yml")
    listed = {**tray.firmware, "FW_BMC_0": "GB200Nvl-25.01-1"}
    del listed["CX7_0"]
    bad = {f.details["subject"]: f for f in firmware.check_tray("t1", image, listed) if f.severity is not Severity.OK}
    assert set(bad) == {"FW_BMC_0", "CX7_0"}
    assert bad["FW_BMC_0"].severity is Severity.WARN and bad["FW_BMC_0"].check == "firmware.version"
    assert bad["FW_BMC_0"].message == ("BMC firmware FW_BMC_0: image wants GB200Nvl-24.12-8, "
                                      "the BMC reports GB200Nvl-25.01-1")
    assert "does not list it" in bad["CX7_0"].message
    entries = tag(firmware.FAMILY, list(bad.values()), rack_of={"t1": "r1"})
    assert {e.subject for e in entries} == {"FW_BMC_0", "CX7_0"} and all(e.rack == "r1" for e in entries)


def test_the_rack_check_names_each_version_and_its_trays(captured):
    tray = captured[0]
    listed = {f"t{i}": dict(tray.firmware) for i in range(1, 5)}
    listed["t3"]["UEFI"] = "buildbrain-gcid-99999999"
    found = firmware.check_rack("r1", listed, ["FW_BMC_0", "UEFI"])
    (bad,) = [f for f in found if f.severity is not Severity.OK]
    assert bad.check == "firmware.rack" and bad.host == "r1" and bad.details["subject"] == "UEFI"
    assert bad.message == "UEFI: the rack's trays differ: buildbrain-gcid-38635631 on t[1-2,4]; " \
                          "buildbrain-gcid-99999999 on t3"
    assert [f.details["subject"] for f in found if f.severity is Severity.OK] == ["FW_BMC_0"]


def test_an_image_firmware_section_is_checked_at_load(tmp_path):
    text = (REPO / "images" / "lab-debian13.yml").read_text()
    for bad, said in (('  cx: {CX7_0: "28.42.1234"}', "  cx: {CX7_0: 28421234}"),
                      ('  cx: {CX7_0: "28.42.1234"}', '  firmwares: {CX7_0: "1"}'),
                      ('  cx: {CX7_0: "28.42.1234"}', '  cx: {"CX7 0": "1"}')):
        (tmp_path / "lab-debian13.yml").write_text(text.replace(bad, said))
        with pytest.raises(UsageError) as exc:
            load_image(tmp_path / "lab-debian13.yml")
        assert "firmware" in exc.value.message


def test_playbooks_do_not_get_the_firmware_section():
    image = load_image(REPO / "images" / "lab-debian13.yml")
    assert "firmware" not in image.ansible_vars() and image.firmware["bmc"] == {"FW_BMC_0": "GB200Nvl-24.12-8"}


def _probed(tmp_path):
    from tests.helpers import probe_here

    return probe_here(tmp_path, smi=None)


def test_image_diff_shows_each_firmware_item_wanted_and_found(captured, tmp_path, processes):
    from dataclasses import replace

    from mctl.audit.image_diff import diff_tray

    tray = captured[0]
    image = load_image(REPO / "images" / "lab-debian13.yml")
    state = _probed(tmp_path)
    bmc = replace(tray, ok=True, firmware={**tray.firmware, "UEFI": "buildbrain-gcid-1"})
    d = diff_tray("lab-r1-tray01", image, state, slurm_expected=False, bmc=bmc)
    rows = {r["component"]: r for r in d.to_dict()["components"]}
    assert rows["firmware:FW_BMC_0"]["status"] == "match" and rows["firmware:FW_BMC_0"]["found"] == "GB200Nvl-24.12-8"
    assert (rows["firmware:UEFI"]["wanted"], rows["firmware:UEFI"]["found"], rows["firmware:UEFI"]["status"]) == (
        "buildbrain-gcid-38635631", "buildbrain-gcid-1", "drift")
    assert rows["firmware:UEFI"]["label"] == "BIOS/UEFI firmware UEFI" and d.status == "drift"
    # a BMC that could not be read: every firmware row unreported, with the reason
    down = replace(tray, ok=False, firmware={}, error="GET /redfish/v1 timed out")
    d = diff_tray("lab-r1-tray01", image, state, slurm_expected=False, bmc=down)
    fw = [r for r in d.to_dict()["components"] if r["component"].startswith("firmware:")]
    assert fw and all(r["status"] == "unreported" and "timed out" in r["note"] for r in fw)
    # a site without a bmc section: said, not compared
    d = diff_tray("lab-r1-tray01", image, state, slurm_expected=False, bmc_missing="no bmc section")
    fw = [r for r in d.to_dict()["components"] if r["component"].startswith("firmware:")]
    assert fw and all(r["status"] == "not-checked" and r["note"] == "no bmc section" for r in fw)
