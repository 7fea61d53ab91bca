"""The lab's nvidia-smi, run as the trays run it (a subprocess on a state file), read by mctl's parsers.

Regenerate the golden outputs after a deliberate format change:
    python tests/unit/test_gpu_emulator.py --regen
"""

from __future__ import annotations

import ast
import json
import re
import sys
import time
from pathlib import Path

import pytest

from mctl.facts import DriverUnavailable, FactsParseError
from mctl.facts.kernel_log import parse_xid_line
from mctl.facts.nvidia_smi import parse_list, parse_nvlink_status, parse_query_csv, parse_xml
from mctl.lab.emulators import nvidia_smi as emu
from tests.helpers import GPU_BUSES, GPU_DOMAIN, SMI_EMULATOR, EmulatedTray, contract_state

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "lab"


@pytest.fixture
def tray(tmp_path):
    def make(faults: dict | None = None, **top) -> EmulatedTray:
        return EmulatedTray(tmp_path, contract_state(**top), faults)
    return make


def _normalize(text: str) -> str:
    """Blank the wall-clock timestamps so outputs compare across runs."""
    text = re.sub(r"<timestamp>[^<]*</timestamp>", "<timestamp>TIMESTAMP</timestamp>", text)
    text = re.sub(r"^(Timestamp\s+: ).*$", r"\1TIMESTAMP", text, flags=re.M)
    return re.sub(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}", "TIMESTAMP", text, flags=re.M)


GOLDEN_CASES = {
    "healthy-q-x.xml": (None, ("-q", "-x")),
    "healthy-q.txt": (None, ("-q",)),
    "healthy-table.txt": (None, ()),
    "healthy-L.txt": (None, ("-L",)),
    "healthy-nvlink-status.txt": (None, ("nvlink", "--status")),
    "healthy-query.csv": (None, ("--query-gpu=index,name,uuid,pci.bus_id,temperature.gpu,power.draw,power.limit,"
                                "memory.total,fabric.state,fabric.status,fabric.clusterUuid,fabric.cliqueId",
                                "--format=csv")),
    "faulted-q-x.xml": ({"ecc_uncorrectable": {"0": 5}, "nvlink_down": [[1, 3]], "gpu_missing": [3],
                         "fabric": "degraded"}, ("-q", "-x")),
    "faulted-table.txt": ({"ecc_uncorrectable": {"0": 5}, "gpu_missing": [3]}, ()),
    "faulted-nvlink-status.txt": ({"nvlink_down": [[0, 3], [2, 17]]}, ("nvlink", "--status")),
}


def _golden_output(tmp: Path, name: str) -> str:
    faults, args = GOLDEN_CASES[name]
    return _normalize(EmulatedTray(tmp, contract_state(), faults).out(*args))


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_outputs(tmp_path, name, processes):
    assert _golden_output(tmp_path, name) == (GOLDEN / name).read_text(), \
        f"emulator output changed; if deliberate, run: python {Path(__file__).relative_to(ROOT)} --regen"


def test_xml_follows_the_real_element_tree(tray, processes):
    """Same root, DOCTYPE, top-level order and per-GPU element paths as the real GB200 capture."""
    import xml.etree.ElementTree as ET

    def paths(elem, prefix=""):
        out = []
        for child in elem:
            out.append(f"{prefix}/{child.tag}")
            out += paths(child, f"{prefix}/{child.tag}")
        return out

    real_text = (ROOT / "tests" / "fixtures" / "gb200-nvidia-smi-q-x.xml").read_text()
    emu_text = tray().out("-q", "-x")
    assert emu_text.splitlines()[:3] == [line.rstrip("\r") for line in real_text.splitlines()[:3]]
    real, ours = ET.fromstring(real_text.encode()), ET.fromstring(emu_text.encode())
    assert [c.tag for c in ours] == [c.tag for c in real]
    assert paths(ours.find("gpu")) == paths(real.find("gpu"))


def test_round_trip_xml_to_state(tray, processes):
    t = tray()
    report = parse_xml(t.out("-q", "-x"))
    st = t.state
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("570.148.08", "12.8", 4)
    for gpu, want in zip(report.gpus, st["gpus"], strict=True):
        assert gpu.index == want["index"]
        assert gpu.uuid == want["uuid"] and gpu.serial == want["serial"]
        assert gpu.pci_bus_id == want["pci_bus_id"] and gpu.module_id == want["module_id"]
        assert gpu.minor_number == want["minor_number"]
        assert gpu.platform.gpu_fabric_guid == want["gpu_fabric_guid"]
        assert gpu.platform.chassis_serial_number == st["chassis_serial"]
        assert (gpu.platform.slot_number, gpu.platform.tray_index, gpu.platform.host_id) == (3, 2, 1)
        assert gpu.platform.peer_type == "Switch Connected"
        assert gpu.memory_total_mib == want["memory_total_mib"]
        assert gpu.power_limit_w == want["power_limit_w"]
        assert gpu.temperature_c == want["temperature_c"]
        assert gpu.product_name == st["product_name"]
        assert (gpu.fabric.state, gpu.fabric.status) == ("Completed", "Success")
        assert (gpu.fabric.cluster_uuid, gpu.fabric.clique_id) == (GPU_DOMAIN, 32766)
        assert gpu.fabric.health.problems() == ()
        assert gpu.ecc.volatile_uncorrectable == 0 and gpu.remapped_rows.pending is False
        assert gpu.gpu_recovery_action == "None"
        assert gpu.fabric_attached
    assert report.clique_label == f"{GPU_DOMAIN}.32766"


QUERY = ["index", "name", "uuid", "serial", "pci.bus_id", "driver_version", "temperature.gpu", "power.draw",
         "power.limit", "memory.total", "ecc.errors.uncorrected.volatile.total",
         "ecc.errors.uncorrected.aggregate.total", "fabric.state", "fabric.status", "fabric.clusterUuid",
         "fabric.cliqueId", "module_id"]


@pytest.mark.parametrize("fmt", ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"])
def test_query_csv_round_trip(tray, fmt, processes):
    t = tray()
    rows = parse_query_csv(t.out(f"--query-gpu={','.join(QUERY)}", f"--format={fmt}"), QUERY)
    assert len(rows) == 4
    for row, want in zip(rows, t.state["gpus"]):
        assert row["index"] == str(want["index"]) and row["uuid"] == want["uuid"]
        assert row["serial"] == want["serial"] and row["pci.bus_id"] == want["pci_bus_id"]
        assert row["name"] == "NVIDIA GB200" and row["driver_version"] == "570.148.08"
        assert row["temperature.gpu"] == str(want["temperature_c"])
        assert float(row["power.limit"]) == want["power_limit_w"]
        assert row["memory.total"] == str(want["memory_total_mib"])
        assert float(row["power.draw"]) > 0
        assert row["ecc.errors.uncorrected.volatile.total"] == "0"
        assert row["ecc.errors.uncorrected.aggregate.total"] == "0"
        assert (row["fabric.state"], row["fabric.status"]) == ("Completed", "Success")
        assert (row["fabric.clusterUuid"], row["fabric.cliqueId"]) == (GPU_DOMAIN, "32766")
        assert row["module_id"] == str(want["module_id"])


def test_query_units_and_header_are_real_style(tray, processes):
    text = tray().out("--query-gpu=index,power.draw,memory.total", "--format=csv")
    lines = text.splitlines()
    assert lines[0] == "index, power.draw [W], memory.total [MiB]"
    assert re.fullmatch(r"0, \d+\.\d\d W, 189471 MiB", lines[1])
    assert tray().out("--query-gpu=memory.total", "--format=csv,noheader,nounits").splitlines() == ["189471"] * 4


def test_unknown_query_field(tray, processes):
    proc = tray().run("--query-gpu=index,bogus.field", "--format=csv")
    assert proc.returncode == 2
    assert proc.stdout.startswith('Field "bogus.field" is not a valid field to query.')
    with pytest.raises(FactsParseError, match="bogus.field"):
        parse_query_csv(proc.stdout, ["index", "bogus.field"])


def test_list_and_nvlink_healthy(tray, processes):
    t = tray()
    assert parse_list(t.out("-L")) == tuple((g["index"], "NVIDIA GB200", g["uuid"]) for g in t.state["gpus"])
    links = parse_nvlink_status(t.out("nvlink", "--status"))
    assert [g.uuid for g in links] == [g["uuid"] for g in t.state["gpus"]]
    assert all(len(g.links) == 18 and g.inactive_links == () for g in links)
    assert {l.speed_gbps for g in links for l in g.links} == {53.125}


def test_select_one_gpu(tray, processes):
    t = tray()
    report = parse_xml(t.out("-q", "-x", "-i", "2"))
    assert [g.uuid for g in report.gpus] == [t.state["gpus"][2]["uuid"]]
    assert report.attached_gpus == 4
    only = parse_nvlink_status(t.out("nvlink", "--status", "-i", "1"))
    assert [g.index for g in only] == [1]
    by_bus = parse_list(t.out("-L", "-i", GPU_BUSES[3]))
    assert by_bus == ((3, "NVIDIA GB200", t.state["gpus"][3]["uuid"]),)
    proc = t.run("-i", "9", "-L")
    assert (proc.returncode, proc.stdout.strip()) == (6, "No devices were found")


# --- faults ---

def test_fault_gpu_missing(tray, processes):
    t = tray({"gpu_missing": [1]})
    report = parse_xml(t.out("-q", "-x"))
    want = [g for g in t.state["gpus"] if g["index"] != 1]
    assert report.attached_gpus == 3
    assert [g.uuid for g in report.gpus] == [g["uuid"] for g in want]
    listed = parse_list(t.out("-L"))
    assert [(i, u) for i, _, u in listed] == [(0, want[0]["uuid"]), (1, want[1]["uuid"]), (2, want[2]["uuid"])]
    assert len(parse_nvlink_status(t.out("nvlink", "--status"))) == 3
    assert len(parse_query_csv(t.out("--query-gpu=uuid", "--format=csv,noheader"), ["uuid"])) == 3


def test_fault_fabric_in_progress(tray, processes):
    t = tray({"fabric": "in-progress"})
    report = parse_xml(t.out("-q", "-x"))
    for gpu in report.gpus:
        assert gpu.fabric.state == "In Progress"
        assert (gpu.fabric.status, gpu.fabric.cluster_uuid, gpu.fabric.clique_id) == (None, None, None)
        assert not gpu.fabric_attached and gpu.clique_label is None
    rows = parse_query_csv(t.out("--query-gpu=fabric.state,fabric.status,fabric.clusterUuid", "--format=csv"),
                           ["fabric.state", "fabric.status", "fabric.clusterUuid"])
    assert rows[0] == {"fabric.state": "In Progress", "fabric.status": None, "fabric.clusterUuid": None}
    assert "        State                             : In Progress" in t.out("-q")


def test_fault_fabric_degraded(tray, processes):
    report = parse_xml(tray({"fabric": "degraded"}).out("-q", "-x"))
    for gpu in report.gpus:
        assert gpu.fabric.health.bandwidth == "Degraded" and gpu.fabric.health.degraded_bandwidth
        assert gpu.fabric.health.problems() == ("bandwidth degraded",)
        assert gpu.fabric_attached  # still Completed/Success: degraded is a health finding, not detachment


def test_fault_fabric_unhealthy(tray, processes):
    t = tray({"fabric": "unhealthy"})
    report = parse_xml(t.out("-q", "-x"))
    for gpu in report.gpus:
        assert gpu.fabric.state == "Completed" and gpu.fabric.status == "Unknown Error"
        assert gpu.fabric.health.route_unhealthy is True
        assert not gpu.fabric_attached
    assert report.clique_label is None
    row = parse_query_csv(t.out("--query-gpu=fabric.status", "--format=csv,noheader"), ["fabric.status"])[0]
    assert row["fabric.status"] == "Unknown Error"


def test_fault_ecc_uncorrectable(tray, processes):
    t = tray({"ecc_uncorrectable": {"0": 5}})
    report = parse_xml(t.out("-q", "-x"))
    bad, *good = report.gpus
    assert (bad.ecc.volatile_uncorrectable, bad.ecc.aggregate_uncorrectable) == (5, 5)
    assert (bad.ecc.volatile_dram_uncorrectable, bad.ecc.aggregate_dram_uncorrectable) == (5, 5)
    assert bad.remapped_rows.pending is True and bad.remapped_rows.uncorrectable == 5
    assert bad.gpu_recovery_action == "Reset"
    assert all(g.ecc.volatile_uncorrectable == 0 and g.gpu_recovery_action == "None" for g in good)
    fields = ["ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total"]
    rows = parse_query_csv(t.out(f"--query-gpu={','.join(fields)}", "--format=csv"), fields)
    assert [r[fields[0]] for r in rows] == ["5", "0", "0", "0"]
    table = t.out().splitlines()
    assert table[8].endswith("|                    5 |") and table[12].endswith("|                    0 |")


def test_fault_nvlink_down(tray, processes):
    t = tray({"nvlink_down": [[0, 3], [0, 17], [2, 0]]})
    links = parse_nvlink_status(t.out("nvlink", "--status"))
    assert [g.inactive_links for g in links] == [(3, 17), (), (0,), ()]
    assert "\t Link 3: <inactive>" in t.out("nvlink", "--status")
    report = parse_xml(t.out("-q", "-x"))
    assert [g.fabric.health.bandwidth for g in report.gpus] == ["Degraded", "Full", "Degraded", "Full"]


def test_fault_xid_79_makes_gpu_unreadable(tray, processes):
    t = tray({"xid": [{"gpu": 2, "code": 79, "time": 1764441497.5}]})
    proc = t.run("-q", "-x")
    assert proc.returncode == 0
    assert proc.stderr.strip() == "Unable to determine the device handle for GPU2: 0018:01:00.0: Unknown Error"
    report = parse_xml(proc.stdout)
    assert report.attached_gpus == 4 and len(report.gpus) == 3
    assert GPU_BUSES[2] not in [g.pci_bus_id for g in report.gpus]
    assert [i for i, _, _ in parse_list(t.out("-L"))] == [0, 1, 3]


def test_fault_xid_reset_class_sets_recovery_action(tray, processes):
    report = parse_xml(tray({"xid": [{"gpu": 1, "code": 48, "time": 1.0}]}).out("-q", "-x"))
    assert [g.gpu_recovery_action for g in report.gpus] == ["None", "Reset", "None", "None"]


def test_fault_xid_without_lasting_effect_changes_nothing(tmp_path, processes):
    healthy = _normalize(EmulatedTray(tmp_path, contract_state()).out("-q", "-x"))
    with_xid = _normalize(EmulatedTray(tmp_path, contract_state(), {"xid": [{"gpu": 0, "code": 13, "time": 1.0}]}).out("-q", "-x"))
    assert with_xid == healthy


def test_empty_faults_file_is_healthy(tmp_path, processes):
    healthy = _normalize(EmulatedTray(tmp_path, contract_state()).out("-q", "-x"))
    assert _normalize(EmulatedTray(tmp_path, contract_state(), {}).out("-q", "-x")) == healthy


def test_no_state_file_is_a_host_without_driver(tmp_path, processes):
    t = EmulatedTray(tmp_path, None)
    proc = t.run("-q", "-x")
    assert proc.returncode == 9
    assert proc.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(DriverUnavailable):
        parse_xml(proc.stdout)
    assert t.run().returncode == 9


def test_host_level_faults_leave_gpus_alone(tmp_path, processes):
    """unreachable/hang act on the tray's sshd (the lab's job); the GPUs read as healthy."""
    healthy = _normalize(EmulatedTray(tmp_path, contract_state()).out("-q", "-x"))
    faulted = EmulatedTray(tmp_path, contract_state(), {"unreachable": True, "hang": True})
    assert _normalize(faulted.out("-q", "-x")) == healthy


def test_two_cliques_and_zero_domain_are_rendered_per_gpu(tmp_path, processes):
    state = contract_state()
    state["gpus"][0]["clique_id"] = 7
    state["gpus"][1]["clique_id"] = 7
    report = parse_xml(EmulatedTray(tmp_path, state).out("-q", "-x"))
    assert [g.fabric.clique_id for g in report.gpus] == [7, 7, 32766, 32766]
    assert report.clique_ids == (7, 32766) and report.clique_label is None

    report = parse_xml(EmulatedTray(tmp_path, contract_state(cluster_uuid=None, clique_id=None)).out("-q", "-x"))
    assert "<clusterUuid>00000000-0000-0000-0000-000000000000</clusterUuid>" in \
        EmulatedTray(tmp_path, contract_state(cluster_uuid=None, clique_id=None)).out("-q", "-x")
    assert all(g.fabric.cluster_uuid is None and not g.fabric_attached for g in report.gpus)


def test_bad_arguments(tray, processes):
    t = tray()
    for args in (("--bogus",), ("-x",), ("--query-gpu=index",), ("--query-gpu=index", "--format=json"),
                 ("nvlink",)):
        proc = t.run(*args)
        assert proc.returncode == 2, args
        assert "Invalid combination of input arguments" in proc.stdout


# --- kernel log line ---

def test_xid_log_line_is_read_back_by_the_parser():
    when = time.mktime((2025, 11, 9, 19, 18, 17, 0, 0, -1))
    line = emu.xid_log_line("lab-r1-tray03", "00000008:01:00.0", 79, 4242, "python3", when, uptime=123.456)
    assert line == ("Nov  9 19:18:17 lab-r1-tray03 kernel: [  123.456000] NVRM: Xid (PCI:0008:01:00): 79, "
                    "pid=4242, name=python3, GPU has fallen off the bus.")
    event = parse_xid_line(line)
    assert (event.pci, event.code, event.pid, event.process_name) == ("0008:01:00", 79, 4242, "python3")
    assert (event.host, event.timestamp, event.uptime) == ("lab-r1-tray03", "Nov  9 19:18:17", 123.456)
    assert event.on_gpu("00000008:01:00.0") and event.info.bucket == "reboot host"


def test_xid_log_line_unknown_owner_and_messages():
    line = emu.xid_log_line("h", "00000019:01:00.0", 48, when=1764441497.5, uptime=5.0)
    assert "NVRM: Xid (PCI:0019:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit" in line
    event = parse_xid_line(line)
    assert event.pid is None and event.process_name is None and event.code == 48
    assert emu.kernel_pci("00000000:9C:00.0") == "0000:9c:00"
    assert {79, 48, 74, 63, 64, 92, 94, 95, 119, 154}.issubset(emu.XID_MESSAGES)


def test_emulator_is_stdlib_only():
    tree = ast.parse(SMI_EMULATOR.read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    assert modules - {"__future__"} <= set(sys.stdlib_module_names), modules
    assert SMI_EMULATOR.read_text().startswith("#!/usr/bin/python3\n")


if __name__ == "__main__" and "--regen" in sys.argv:
    import tempfile
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in sorted(GOLDEN_CASES):
        with tempfile.TemporaryDirectory() as tmp:
            (GOLDEN / case).write_text(_golden_output(Path(tmp), case))
            print("wrote", GOLDEN / case)


def test_state_files_are_read_through_a_marshal_copy_that_follows_each_rewrite(tmp_path):
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"driver_version": "570.1", "gpus": [{"index": 0}]}))
    assert emu._read_json(str(state))["driver_version"] == "570.1"
    copy = tmp_path / ".gpus.json.marshal"
    assert copy.exists()
    assert emu._read_json(str(state))["driver_version"] == "570.1"        # served from the copy
    # An atomic rewrite of the same size (as `mctl lab fault` writes): the next read sees it.
    new = tmp_path / "gpus.json.new"
    new.write_text(json.dumps({"driver_version": "570.2", "gpus": [{"index": 0}]}))
    new.replace(state)
    assert emu._read_json(str(state))["driver_version"] == "570.2"
    copy.write_bytes(b"garbage")                                             # a broken copy is ignored
    assert emu._read_json(str(state))["driver_version"] == "570.2"
