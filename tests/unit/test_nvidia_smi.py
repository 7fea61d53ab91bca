"""Golden tests of the nvidia-smi parsers on the real GB200 capture and on hand-cut variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.errors import MctlError
from mctl.facts import DriverUnavailable, FactsParseError
from mctl.facts.nvidia_smi import parse_list, parse_nvlink_status, parse_number, parse_query_csv, parse_xml
from mctl.model.gpu import ZERO_UUID, pci_key

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_XML = (FIXTURES / "gb200-nvidia-smi-q-x.xml").read_text()
REAL_DOMAIN = "889d2be1-4bbf-69e1-d3f2-97c465ee31aa"


@pytest.fixture(scope="module")
def real():
    return parse_xml(REAL_XML)


def test_real_sample_top_level(real):
    assert real.driver_version == "570.148.08"
    assert real.cuda_version == "12.8"
    assert real.attached_gpus == 4
    assert real.timestamp == "Sat Sep 13 10:52:45 2025"
    assert len(real.gpus) == 4


def test_real_sample_identity(real):
    assert [g.pci_bus_id for g in real.gpus] == ["00000000:29:00.0", "00000000:3F:00.0",
                                                 "00000000:9C:00.0", "00000000:B2:00.0"]
    assert [g.index for g in real.gpus] == [0, 1, 2, 3]
    assert [g.minor_number for g in real.gpus] == [0, 1, 2, 3]
    assert [g.module_id for g in real.gpus] == [2, 1, 4, 3]
    assert real.gpus[0].uuid == "GPU-25e04bdf-6a27-0a2d-f989-a9228a03f373"
    assert real.gpus[3].uuid == "GPU-aa321f5a-5f63-3b42-4217-073fe0b64e2c"
    assert [g.serial for g in real.gpus] == ["1761025346615", "1761025346615", "1761125340953", "1761125340953"]
    assert {g.product_name for g in real.gpus} == {"NVIDIA GB200"}


def test_real_sample_platform(real):
    p = real.gpus[0].platform
    assert (p.chassis_serial_number, p.slot_number, p.tray_index, p.host_id) == ("1821225190819", 15, 5, 1)
    assert p.peer_type == "Switch Connected"
    assert p.gpu_fabric_guid == "0x983400ac35e1fa7e"


def test_real_sample_fabric(real):
    for gpu in real.gpus:
        f = gpu.fabric
        assert (f.state, f.status, f.clique_id, f.cluster_uuid) == ("Completed", "Success", 2, REAL_DOMAIN)
        assert f.health.bandwidth == "Full" and f.health.degraded_bandwidth is False
        assert f.health.route_unhealthy is True
        assert f.health.route_recovery_in_progress is False
        assert f.health.access_timeout_recovery is False
        assert f.health.summary is None  # 570 drivers do not print a summary
        assert f.health.problems() == ("route unhealthy",)
        assert gpu.fabric_attached
        assert gpu.clique_label == f"{REAL_DOMAIN}.2"
    assert real.clique_label == f"{REAL_DOMAIN}.2"
    assert real.cluster_uuids == (REAL_DOMAIN,)
    assert real.clique_ids == (2,)


def test_real_sample_health_counters(real):
    g = real.gpus[0]
    assert g.ecc.volatile_uncorrectable == 0 and g.ecc.aggregate_uncorrectable == 0
    assert g.ecc.volatile_correctable == 0
    assert g.remapped_rows.pending is False and g.remapped_rows.failure is False
    assert g.temperature_c == 28.0
    assert [x.temperature_c for x in real.gpus] == [28.0, 28.0, 29.0, 28.0]
    assert g.power_draw_w == 242.29
    assert g.power_limit_w == 1200.0
    assert g.memory_total_mib == 189471
    assert g.gpu_recovery_action == "None"


def test_to_dict_is_json_ready(real):
    import json
    data = json.loads(json.dumps(real.to_dict()))
    assert data["gpus"][1]["clique_label"] == f"{REAL_DOMAIN}.2"
    assert data["gpus"][1]["fabric"]["health"]["route_unhealthy"] is True
    assert data["clique_label"] == f"{REAL_DOMAIN}.2"


def _edit(xml: str, old: str, new: str, count: int = -1) -> str:
    assert old in xml
    return xml.replace(old, new, count)


def test_all_zero_cluster_uuid_is_no_domain():
    report = parse_xml(_edit(REAL_XML, REAL_DOMAIN, ZERO_UUID))
    for gpu in report.gpus:
        assert gpu.fabric.cluster_uuid is None
        assert not gpu.fabric_attached
        assert gpu.clique_label is None
    assert report.cluster_uuids == ()
    assert report.clique_label is None


def test_na_fields_become_none():
    xml = _edit(REAL_XML, "<cliqueId>2</cliqueId>", "<cliqueId>N/A</cliqueId>")
    xml = _edit(xml, "<gpu_temp>28 C</gpu_temp>", "<gpu_temp>N/A</gpu_temp>")
    xml = _edit(xml, f"<clusterUuid>{REAL_DOMAIN}</clusterUuid>", "<clusterUuid>N/A</clusterUuid>")
    report = parse_xml(xml)
    assert report.gpus[0].fabric.clique_id is None
    assert report.gpus[0].fabric.cluster_uuid is None
    assert report.gpus[0].temperature_c is None
    assert report.gpus[2].temperature_c == 29.0


def test_two_domains_on_one_tray_are_kept_per_gpu():
    other = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    xml = _edit(REAL_XML, f"<clusterUuid>{REAL_DOMAIN}</clusterUuid>", f"<clusterUuid>{other}</clusterUuid>", 1)
    report = parse_xml(xml)
    assert report.gpus[0].fabric.cluster_uuid == other
    assert report.gpus[1].fabric.cluster_uuid == REAL_DOMAIN
    assert report.cluster_uuids == tuple(sorted((other, REAL_DOMAIN)))
    assert len(report.clique_labels) == 2
    assert report.clique_label is None  # disagreement is never collapsed into one label


def test_two_cliques_on_one_tray_are_kept_per_gpu():
    xml = _edit(REAL_XML, "<cliqueId>2</cliqueId>", "<cliqueId>7</cliqueId>", 2)
    report = parse_xml(xml)
    assert [g.fabric.clique_id for g in report.gpus] == [7, 7, 2, 2]
    assert report.clique_ids == (2, 7)
    assert report.clique_label is None


def test_fabric_in_progress_is_not_attached():
    xml = _edit(REAL_XML, "<state>Completed</state>", "<state>In Progress</state>")
    xml = _edit(xml, "<status>Success</status>", "<status>N/A</status>")
    report = parse_xml(xml)
    assert report.gpus[0].fabric.state == "In Progress"
    assert report.gpus[0].fabric.status is None
    assert not any(g.fabric_attached for g in report.gpus)


@pytest.mark.parametrize("text", [
    REAL_XML[: len(REAL_XML) // 2],                 # truncated mid-stream
    REAL_XML.replace("</gpu>", "", 1),               # unbalanced
    "garbage \x00 not xml",
    "<html><body>502</body></html>",                 # wrong root
    '<?xml version="1.0" ?><nvidia_smi_log><timestamp>x</timestamp></nvidia_smi_log>',  # partial
    "",
])
def test_garbled_xml_raises_domain_error(text):
    with pytest.raises(FactsParseError) as info:
        parse_xml(text)
    assert isinstance(info.value, MctlError)
    assert info.value.message


def test_gpu_without_uuid_is_partial():
    xml = _edit(REAL_XML, "<uuid>GPU-25e04bdf-6a27-0a2d-f989-a9228a03f373</uuid>", "")
    with pytest.raises(FactsParseError, match="no UUID"):
        parse_xml(xml)


def test_garbled_number_is_named():
    xml = _edit(REAL_XML, "<gpu_temp>28 C</gpu_temp>", "<gpu_temp>2#8 C</gpu_temp>", 1)
    with pytest.raises(FactsParseError, match="gpu_temp"):
        parse_xml(xml)


def test_entity_declarations_refused():
    xml = REAL_XML.replace('<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
                           '<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaa">]>')
    with pytest.raises(FactsParseError, match="entities"):
        parse_xml(xml)


def test_driver_failure_is_its_own_error():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    for parse in (parse_xml, parse_nvlink_status, parse_list, lambda t: parse_query_csv(t, ["index"])):
        with pytest.raises(DriverUnavailable):
            parse(text)


def test_missing_gpu_keeps_driver_count():
    """A GPU the driver counts but cannot read (XID 79) leaves attached_gpus above len(gpus)."""
    start = REAL_XML.index('<gpu id="00000000:3F:00.0">')
    end = REAL_XML.index("</gpu>", start) + len("</gpu>")
    report = parse_xml(REAL_XML[:start] + REAL_XML[end:])
    assert report.attached_gpus == 4
    assert [g.pci_bus_id for g in report.gpus] == ["00000000:29:00.0", "00000000:9C:00.0", "00000000:B2:00.0"]


# --- CSV ---

FIELDS = ["index", "name", "pci.bus_id", "temperature.gpu", "power.draw", "memory.total",
          "fabric.clusterUuid", "fabric.cliqueId"]


def test_query_csv_with_header_and_units():
    text = ("index, name, pci.bus_id, temperature.gpu, power.draw [W], memory.total [MiB], "
            "fabric.clusterUuid, fabric.cliqueId\n"
            f"0, NVIDIA GB200, 00000008:01:00.0, 34, 242.67 W, 189471 MiB, {REAL_DOMAIN}, 2\n"
            f"1, NVIDIA GB200, 00000009:01:00.0, 35, [N/A], 189471 MiB, {ZERO_UUID}, [N/A]\n")
    rows = parse_query_csv(text, FIELDS)
    assert rows[0] == {"index": "0", "name": "NVIDIA GB200", "pci.bus_id": "00000008:01:00.0",
                       "temperature.gpu": "34", "power.draw": "242.67", "memory.total": "189471",
                       "fabric.clusterUuid": REAL_DOMAIN, "fabric.cliqueId": "2"}
    assert rows[1]["power.draw"] is None and rows[1]["fabric.cliqueId"] is None
    assert parse_number(rows[0]["power.draw"]) == 242.67


def test_query_csv_noheader_nounits():
    text = f"{REAL_DOMAIN}, 2\n{REAL_DOMAIN}, 2\n"
    rows = parse_query_csv(text, ["fabric.clusterUuid", "fabric.cliqueId"])
    assert rows == [{"fabric.clusterUuid": REAL_DOMAIN, "fabric.cliqueId": "2"}] * 2


def test_query_csv_rejects_wrong_width_and_bad_fields():
    with pytest.raises(FactsParseError, match="row 2 has 1 values"):
        parse_query_csv("0, a\n1\n", ["index", "name"])
    with pytest.raises(FactsParseError, match='"bogus"'):
        parse_query_csv('Field "bogus" is not a valid field to query.\n\n', ["bogus"])
    with pytest.raises(FactsParseError, match="printed nothing"):
        parse_query_csv("", ["index"])
    assert parse_query_csv("No devices were found\n", ["index"]) == []


# --- nvlink --status ---

def _nvlink_text(inactive: set[tuple[int, int]] = frozenset()) -> str:
    lines = []
    for gpu in range(2):
        lines.append(f"GPU {gpu}: NVIDIA GB200 (UUID: GPU-0000000{gpu}-0000-0000-0000-000000000000)")
        for link in range(18):
            value = "<inactive>" if (gpu, link) in inactive else "53.125 GB/s"
            lines.append(f"\t Link {link}: {value}")
    return "\n".join(lines) + "\n"


def test_nvlink_status_all_active():
    gpus = parse_nvlink_status(_nvlink_text())
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].uuid == "GPU-00000001-0000-0000-0000-000000000000"
    assert gpus[0].name == "NVIDIA GB200"
    assert len(gpus[0].links) == 18 and all(l.speed_gbps == 53.125 for l in gpus[0].links)
    assert gpus[0].inactive_links == ()


def test_nvlink_status_inactive_link():
    gpus = parse_nvlink_status(_nvlink_text({(1, 3), (1, 17)}))
    assert gpus[0].inactive_links == ()
    assert gpus[1].inactive_links == (3, 17)
    assert gpus[1].links[3].speed_gbps is None and not gpus[1].links[3].active


def test_nvlink_status_garbled():
    with pytest.raises(FactsParseError, match="line 3"):
        parse_nvlink_status("GPU 0: NVIDIA GB200 (UUID: GPU-x)\n\t Link 0: 53.125 GB/s\nSegmentation fault\n")
    with pytest.raises(FactsParseError, match="unexpected link value"):
        parse_nvlink_status("GPU 0: NVIDIA GB200\n\t Link 0: fast\n")
    with pytest.raises(FactsParseError):
        parse_nvlink_status("\t Link 0: 53.125 GB/s\n")  # a link before any GPU


def test_list():
    text = ("GPU 0: NVIDIA GB200 (UUID: GPU-25e04bdf-6a27-0a2d-f989-a9228a03f373)\n"
            "GPU 1: NVIDIA GB200 (UUID: GPU-a0540bed-7ada-8445-a50e-8811bc9ef560)\n")
    assert parse_list(text) == ((0, "NVIDIA GB200", "GPU-25e04bdf-6a27-0a2d-f989-a9228a03f373"),
                                (1, "NVIDIA GB200", "GPU-a0540bed-7ada-8445-a50e-8811bc9ef560"))
    with pytest.raises(FactsParseError):
        parse_list("GPU 0: NVIDIA GB2")


def test_pci_key_matches_kernel_and_smi_forms():
    assert pci_key("00000008:01:00.0") == pci_key("0008:01:00") == (8, 1, 0)
    assert pci_key("00000000:9C:00.0") == pci_key("0000:9c:00")
    with pytest.raises(ValueError):
        pci_key("not-a-bus")
