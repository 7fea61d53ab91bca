"""mctl's Redfish client and `mctl bmc inventory` against real GB200 BMC captures.

The captures (tests/fixtures/real/redfish/, NVIDIA/libredfish) are served by a
static mockup server on loopback addresses, over TLS with a throwaway CA, with
HTTP Basic required: a real HTTP exchange through DMTF's `redfish` library, not a
mock. Expected values were read from the capture files themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cli_helpers import run_cli  # noqa: E402
from redfish_mockup import MockupServer, free_port, throwaway_ca  # noqa: E402

from mctl.bmc.client import BMCCredentials, BMCError, RedfishClient, check_path, load_credentials  # noqa: E402
from mctl.bmc.inventory import Settings, TrayBMC, collect, read_tray  # noqa: E402
from mctl.errors import UsageError  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "redfish"
GB200 = REAL / "nvidia_gb200"
SWITCH = REAL / "nvidia_gbswitch"
CRED = BMCCredentials("root", "0penBmc")
BAD = BMCCredentials("root", "wrong")


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_captures_are_byte_exact_copies():
    rows = [ln.split(" ", 1) for ln in (REAL / "MANIFEST").read_text().splitlines() if ln.strip()]
    assert len(rows) == 137
    listed = {path for _blob_id, path in rows}
    on_disk = {str(p.relative_to(REAL)) for p in REAL.rglob("index.json")}
    assert listed == on_disk
    for blob_id, path in rows:
        assert _blob((REAL / path).read_bytes()) == blob_id, f"{path} differs from the capture"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    hosts = ["127.0.0.1"] + [f"127.64.{i}.1" for i in range(1, 8)]
    ca, cert, key = throwaway_ca(tmp_path_factory.mktemp("pki"), hosts)
    return ca, (cert, key)


def _client(srv: MockupServer, ca: Path | bool, cred: BMCCredentials = CRED, **kw) -> RedfishClient:
    return RedfishClient(f"https://{srv.host}:{srv.port}", cred, verify_tls=str(ca) if isinstance(ca, Path) else ca,
                         timeout_s=5, **kw)


def test_compute_tray_capture_read_through_the_library_over_verified_tls(pki, sockets):
    ca, tls = pki
    with MockupServer(GB200, tls=tls) as srv:
        tray = TrayBMC("tray01", "compute", srv.host)
        client = _client(srv, ca)
        read_tray(client, tray)
    assert (tray.vendor, tray.product, tray.redfish_version) == ("NVIDIA", "GB200 NVL", "1.17.0")
    assert tray.tray_chassis == "Chassis_0" and tray.serial == "1333024020524"
    assert tray.part_number == "699-25859-0310-TS3" and tray.model == "GB200 NVL"
    assert (tray.tray_index, tray.slot) == (0, 1)            # CBC_0 Oem.Nvidia ComputeTrayIndex / slot number
    assert tray.power_state == "On"
    assert [s["id"] for s in tray.systems] == ["System_0", "HGX_Baseboard_0"]
    assert {m["id"]: m["firmware_version"] for m in tray.managers}["BMC_0"] == "GB200Nvl-24.12-8"
    fw = tray.firmware
    assert len(fw) == 30
    assert fw["FW_BMC_0"] == "GB200Nvl-24.12-8"
    assert fw["UEFI"] == "buildbrain-gcid-38635631"
    assert fw["HGX_FW_GPU_0"] == "97.00.6C.00.03"          # State Absent, Health Critical, yet a Version
    assert fw["HGX_FW_GPU_1"] == "97.00.72.00.00"
    assert fw["CX7_0"] == "28.42.1234" and fw["FW_CPLD_0"] == "0x00 0x0b 0x03 0x04"
    assert tray.versions["bmc"] == ["GB200Nvl-24.12-8"] and tray.versions["hmc"] == ["GB200Nvl-24.12-8"]
    assert tray.versions["gpu"] == ["97.00.6C.00.03", "97.00.72.00.00"]
    assert tray.versions["cx"] == ["28.42.1234"] and tray.versions["nic"] == ["32.41.1300"]
    assert len(tray.chassis) == 42                        # Members@odata.count 42
    assert {c["id"]: c["serial"] for c in tray.chassis}["HGX_ProcessorModule_0"] == "1643024000315"
    assert tray.power["health"] == "OK" and tray.thermal["health"] == "OK" and tray.thermal["leak_detection"]
    assert tray.sensors == 24
    # Every request carried the credentials to this origin only, and all were GETs of /redfish/v1 paths.
    assert all(m == "GET" and p.startswith("/redfish/v1") for m, p, _a in srv.requests)
    assert client.requests == len(srv.requests) == 85


def test_switch_tray_capture(pki, sockets):
    ca, tls = pki
    with MockupServer(SWITCH, tls=tls) as srv:
        tray = TrayBMC("nvsw01", "switch", srv.host)
        read_tray(_client(srv, ca), tray)
    assert tray.product == "P3809"
    assert tray.tray_chassis == "SYS_eeprom" and tray.serial == "MT2519600UDR" and tray.model == "N5110_LD"
    assert tray.versions["bmc"] == ["88.0002.1950"] and tray.versions["nvswitch"] == ["35_2014_4652"]
    assert tray.firmware["MGX_FW_CPU_0"] == "0ACTV_00.01.022"
    assert [m["id"] for m in tray.managers] == ["BMC_0"]


def test_tls_is_verified_by_default(pki, sockets):
    _ca, tls = pki
    with MockupServer(GB200, tls=tls) as srv:
        with pytest.raises(BMCError) as exc:
            _client(srv, True).get("/redfish/v1")          # the system CAs do not know the throwaway CA
    assert exc.value.kind == "tls"


def test_wrong_credentials_are_reported_not_retried(pki, sockets):
    ca, tls = pki
    with MockupServer(GB200, tls=tls) as srv:
        client = _client(srv, ca, BAD)
        client.get("/redfish/v1")                           # the root is open, as on a BMC
        with pytest.raises(BMCError) as exc:
            client.get("/redfish/v1/Systems")
        assert len(srv.requests) == 2                       # sent once: max_retry=0
    assert exc.value.kind == "auth" and exc.value.status == 401
    assert "wrong" not in exc.value.message and "wrong" not in repr(client)


def test_redirect_to_another_port_is_refused_and_gets_no_credentials(pki, sockets):
    ca, tls = pki
    with MockupServer(GB200, tls=tls, fault="redirect-port", fault_path="/redfish/v1/Systems") as srv:
        try:
            other = MockupServer(GB200, tls=tls, port=srv.port + 1)
        except OSError:
            pytest.skip("the next port is taken")
        with other:
            with pytest.raises(BMCError) as exc:
                _client(srv, ca).get("/redfish/v1/Systems")
            assert other.requests == []
    assert exc.value.kind == "origin" and "another origin" in exc.value.message


def test_same_origin_redirect_of_a_get_is_followed(pki, sockets):
    ca, tls = pki
    with MockupServer(GB200, tls=tls, fault="redirect-same", fault_path="/redfish/v1/Systems") as srv:
        doc = _client(srv, ca).get("/redfish/v1/Systems")
    assert doc["Members@odata.count"] == 2
    assert [p for p in srv.paths()] == ["/redfish/v1/Systems", "/redfish/v1/Systems/moved"]


@pytest.mark.parametrize("link", ["https://10.0.0.9/redfish/v1/Systems", "//evil/redfish/v1", "/etc/passwd",
                                  "/redfish/v1/../../x", "/redfish/v1/Systems\r\nX: y", "redfish/v1"])
def test_links_that_leave_the_bmc_are_refused(link):
    with pytest.raises(BMCError) as exc:
        check_path(link)
    assert exc.value.kind in ("origin", "malformed")


def test_a_link_with_a_space_or_control_character_is_refused_and_no_other():
    # check_path's one regex (issue 29.3's profile) refuses exactly C0 controls, space and DEL (and a backslash)
    refused = []
    for cp in range(0x800):
        try:
            check_path(f"/redfish/v1/Chassis/a{chr(cp)}b")
        except BMCError as exc:
            assert exc.kind == "origin"
            refused.append(cp)
    assert refused == [*range(33), 0x5C, 0x7F]


def test_a_bmc_word_is_kept_as_written_when_printable_else_escaped():
    from mctl.checks.leak import _word

    assert _word("  OK ") == "OK" and _word("Normal") == "Normal" and _word("") is None and _word(3) is None
    assert _word("Le\x1bak\n") == "Le?ak?" and _word("x" * 100) == "x" * 64 and _word("\u00e9t\u00e9") == "\u00e9t\u00e9"


def test_credentials_file_rules(tmp_path):
    p = tmp_path / "bmc.cred"
    p.write_text("# BMC\nroot:0pen:Bmc\n")
    p.chmod(0o600)
    cred = load_credentials(p)
    assert (cred.username, cred.password) == ("root", "0pen:Bmc") and "0pen" not in repr(cred)
    p.chmod(0o640)
    with pytest.raises(UsageError, match="readable by others"):
        load_credentials(p)
    p.chmod(0o600)
    p.write_text("root\n")
    with pytest.raises(UsageError, match="exactly one line"):
        load_credentials(p)


def _settings(ca: Path, deadline_s: float = 20.0) -> Settings:
    return Settings(CRED, verify_tls=str(ca), deadline_s=deadline_s, timeout_s=5)


def test_a_trickling_bmc_is_cut_at_the_tray_deadline_and_others_go_on(pki, sockets):
    """Each read makes progress (no socket timeout fires); only the tray deadline stops it."""
    from mctl.model.site import Host

    ca, tls = pki
    hosts = [Host("t1", "127.64.1.1", "compute", "r", bmc="127.64.1.1"),
             Host("t2", "127.64.2.1", "compute", "r", bmc="127.64.2.1")]
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host="127.64.1.1", port=port, tls=tls, fault="trickle",
                      fault_path="/redfish/v1/Systems"), \
            MockupServer(GB200, host="127.64.2.1", port=port, tls=tls):
        start = time.monotonic()
        trays = collect(hosts, Settings(CRED, verify_tls=str(ca), port=port, deadline_s=10, timeout_s=5))
        took = time.monotonic() - start
    assert trays[0].ok is False and trays[0].error_kind == "timeout"
    assert trays[1].ok is True and trays[1].serial == "1333024020524"
    assert took < 120                                        # the trickle alone would take half an hour


# ------------------------------------------------------------------ the command

FAULTY = {2: "401", 3: "slow", 4: "500", 5: "malformed", 6: "redirect-port"}


def _site(tmp: Path, ca: Path, port: int) -> Path:
    cred = tmp / "bmc.cred"
    cred.write_text("root:0penBmc\n")
    cred.chmod(0o600)
    (tmp / "mctl.yml").write_text(f"""\
site: bmctest
bmc:
  credentials_file: bmc.cred
  verify_tls: {ca}
  port: {port}
  timeout_s: 2
  deadline_s: 60
racks:
  r1:
    shape: {{compute_trays: 6, switch_trays: 1}}
    compute:
      nodes: r1-tray[1-6]
      addresses: 127.65.0.[1-6]
      bmc: 127.64.[1-6].1
    switches:
      nodes: r1-nvsw1
      addresses: 127.65.1.1
      bmc: 127.64.7.1
""")
    return tmp / "mctl.yml"


@pytest.fixture
def rack(pki, tmp_path):
    ca, tls = pki
    ips = [f"127.64.{i}.1" for i in range(1, 8)]
    port = free_port(ips)
    inv = _site(tmp_path, ca, port)
    servers = {}
    with ExitStack() as stack:
        for i, ip in enumerate(ips, 1):
            root = SWITCH if i == 7 else GB200
            fault = FAULTY.get(i, "none")
            path = {"401": "/redfish/v1/Systems", "500": "/redfish/v1/Managers/BMC_0",
                    "malformed": "/redfish/v1/UpdateService/FirmwareInventory/UEFI",
                    "redirect-port": "/redfish/v1/Chassis", "slow": "/redfish/v1/Systems"}.get(fault)
            servers[i] = stack.enter_context(MockupServer(root, host=ip, port=port, tls=tls, fault=fault,
                                                          fault_path=path, hold_s=300))
        yield inv, servers, tmp_path


def test_bmc_inventory_reports_each_broken_bmc_and_reads_the_others(capsys, rack, sockets):
    inv, servers, tmp = rack
    start = time.monotonic()
    r = run_cli(capsys, "-i", str(inv), "--state-dir", str(tmp / "state"), "bmc", "inventory", "r1",
                "--timeout", "45", "--json")
    assert time.monotonic() - start < 200                    # the hanging BMC holds its answer 300 s
    assert r.code == 3, r.err
    doc = json.loads(r.out)
    by = {t["host"]: t for t in doc["trays"]}
    assert sorted(doc["failed"]) == ["r1-tray2", "r1-tray3", "r1-tray4", "r1-tray5", "r1-tray6"]
    assert by["r1-tray2"]["error_kind"] == "auth"
    assert by["r1-tray3"]["error_kind"] == "timeout"
    assert by["r1-tray4"]["error_kind"] == "http" and "HTTP 500" in by["r1-tray4"]["error"]
    assert by["r1-tray5"]["error_kind"] == "malformed" and "UEFI" in by["r1-tray5"]["error"]
    assert by["r1-tray6"]["error_kind"] == "origin"
    t1 = by["r1-tray1"]
    assert t1["ok"] and t1["serial"] == "1333024020524" and t1["slot"] == 1
    assert t1["firmware"]["FW_BMC_0"] == "GB200Nvl-24.12-8" and t1["firmware"]["HGX_FW_GPU_0"] == "97.00.6C.00.03"
    sw = by["r1-nvsw1"]
    assert sw["ok"] and sw["role"] == "switch" and sw["serial"] == "MT2519600UDR"
    assert "0penBmc" not in r.out + r.err
    assert "5 BMCs not read" in r.err and "auth r1-tray2" in r.err
    # The redirect's target (the next port on that address) was never contacted.
    assert all(p.startswith("/redfish/v1") for s in servers.values() for p in s.paths())


def test_bmc_inventory_table_and_swap_diff(capsys, pki, tmp_path, sockets):
    ca, tls = pki
    ip = "127.64.1.1"
    port = free_port([ip])
    cred = tmp_path / "bmc.cred"
    cred.write_text("root:0penBmc\n")
    cred.chmod(0o600)
    (tmp_path / "mctl.yml").write_text(f"""\
site: bmctest
bmc: {{credentials_file: bmc.cred, verify_tls: {ca}, port: {port}}}
racks:
  r1:
    shape: {{compute_trays: 1, switch_trays: 0}}
    compute: {{nodes: r1-tray1, addresses: 127.65.0.1, bmc: {ip}}}
""")
    args = ("-i", str(tmp_path / "mctl.yml"), "--state-dir", str(tmp_path / "state"), "bmc", "inventory")
    with MockupServer(GB200, host=ip, port=port, tls=tls):
        first = run_cli(capsys, *args, "--diff")
    assert first.code == 0, first.err
    assert "1333024020524" in first.out and "GB200Nvl-24.12-8" in first.out and "baseline" in first.out
    swapped = (GB200 / "redfish/v1/Chassis/Chassis_0/index.json").read_bytes().replace(
        b'"SerialNumber": "1333024020524"', b'"SerialNumber": "1333024029999"')
    newer = (GB200 / "redfish/v1/UpdateService/FirmwareInventory/UEFI/index.json").read_bytes().replace(
        b"buildbrain-gcid-38635631", b"buildbrain-gcid-40000000")
    with MockupServer(GB200, host=ip, port=port, tls=tls,
                      overrides={"/redfish/v1/Chassis/Chassis_0": swapped,
                                 "/redfish/v1/UpdateService/FirmwareInventory/UEFI": newer}):
        second = run_cli(capsys, *args, "--diff")
    assert second.code == 0, second.err
    assert "tray serial 1333024020524 -> 1333024029999 (tray swapped)" in second.out
    assert "UEFI version buildbrain-gcid-38635631 -> buildbrain-gcid-40000000" in second.out


def test_bmc_inventory_refuses_a_readable_credentials_file(capsys, tmp_path):
    cred = tmp_path / "bmc.cred"
    cred.write_text("root:0penBmc\n")
    cred.chmod(0o644)
    (tmp_path / "mctl.yml").write_text("""\
site: bmctest
bmc: {credentials_file: bmc.cred}
racks:
  r1:
    shape: {compute_trays: 1, switch_trays: 0}
    compute: {nodes: r1-tray1, addresses: 127.65.0.1, bmc: 127.64.1.1}
""")
    r = run_cli(capsys, "-i", str(tmp_path / "mctl.yml"), "--state-dir", str(tmp_path / "s"), "bmc", "inventory")
    assert r.code == 2 and "readable by others" in r.err and "chmod 600" in r.err


def test_bmc_inventory_without_a_bmc_section_says_what_is_missing(capsys, tmp_path):
    (tmp_path / "mctl.yml").write_text("""\
site: bmctest
racks:
  r1:
    shape: {compute_trays: 1, switch_trays: 0}
    compute: {nodes: r1-tray1, addresses: 127.65.0.1, bmc: 127.64.1.1}
""")
    r = run_cli(capsys, "-i", str(tmp_path / "mctl.yml"), "--state-dir", str(tmp_path / "s"), "bmc", "inventory")
    assert r.code == 2 and "no bmc section" in r.err


def test_hostile_values_from_a_bmc_are_escaped(capsys, pki, tmp_path, sockets):
    ca, tls = pki
    ip = "127.64.1.1"
    port = free_port([ip])
    cred = tmp_path / "bmc.cred"
    cred.write_text("root:0penBmc\n")
    cred.chmod(0o600)
    (tmp_path / "mctl.yml").write_text(f"""\
site: bmctest
bmc: {{credentials_file: bmc.cred, verify_tls: {ca}, port: {port}}}
racks:
  r1:
    shape: {{compute_trays: 1, switch_trays: 0}}
    compute: {{nodes: r1-tray1, addresses: 127.65.0.1, bmc: {ip}}}
""")
    evil = (GB200 / "redfish/v1/UpdateService/FirmwareInventory/UEFI/index.json").read_bytes().replace(
        b'"buildbrain-gcid-38635631"', b'"\\u001b[2J\\u001b]0;pwned\\u0007x"')
    with MockupServer(GB200, host=ip, port=port, tls=tls,
                      overrides={"/redfish/v1/UpdateService/FirmwareInventory/UEFI": evil}):
        r = run_cli(capsys, "-i", str(tmp_path / "mctl.yml"), "--state-dir", str(tmp_path / "s"), "bmc", "inventory")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "\\x1b[2J\\x1b]0;pwned\\x07x" in r.out


@pytest.mark.parametrize("section, message", [
    ("{credentials_file: c, scheme: http}", "cross the network in clear"),
    ("{credentials_file: c, verify_tls: 'false'}", "not a boolean or a CA bundle path"),
    ("{credentials_file: c, port: 70000}", "port"),
])
def test_inventory_bmc_section_is_checked(capsys, tmp_path, section, message):
    (tmp_path / "mctl.yml").write_text(f"""\
site: bmctest
bmc: {section}
racks:
  r1:
    shape: {{compute_trays: 1, switch_trays: 0}}
    compute: {{nodes: r1-tray1, addresses: 10.1.0.1, bmc: 10.2.0.1}}
""")
    r = run_cli(capsys, "-i", str(tmp_path / "mctl.yml"), "inventory", "validate")
    assert r.code == 2 and message in (r.out + r.err), r.out + r.err


def test_the_redfish_library_is_not_loaded_at_start_up(processes):
    import subprocess

    code = ("import sys; from mctl.cli.main import main; main(['--help']); "
            "print('LOADED' if 'redfish' in sys.modules or 'requests' in sys.modules else 'CLEAN')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "100"})
    assert out.stdout.strip().endswith("CLEAN"), out.stdout[-300:] + out.stderr[-300:]


def _GB200_DOC(link) -> dict:
    path = link["@odata.id"] if isinstance(link, dict) else link
    return json.loads((GB200 / path.lstrip("/") / "index.json").read_text())


def test_a_bmc_that_does_not_listen_is_unreachable(sockets):
    port = free_port(["127.64.1.1"])                         # nothing listens there
    client = RedfishClient(f"http://127.64.1.1:{port}", CRED, verify_tls=False, timeout_s=5)
    with pytest.raises(BMCError) as exc:
        client.get("/redfish/v1")
    assert exc.value.kind == "unreachable" and "0penBmc" not in exc.value.message


def test_health_sweep_reads_leaks_and_power_of_the_real_capture_over_verified_tls(pki, sockets):
    """mctl.health.oob against the GB200 capture served as a static mockup: what the sweep judges; the first read
    finds the leak detectors (the root, the chassis in one $expand GET, the ThermalSubsystem each chassis links,
    Chassis_0's LeakDetection) on one kept connection, a read that knows them costs 3 GETs (7 without $expand:
    tests/unit/test_leaks.py); and a BMC that hangs is reported at the deadline, not taken as healthy."""
    from mctl.health import oob
    from mctl.model.site import Host

    ca, tls = pki
    with MockupServer(GB200, tls=tls, expand=True) as srv:
        host = Host("tray01", srv.host, "compute", "rack-a", bmc=srv.host)
        got = oob.read([host], Settings(CRED, verify_tls=str(ca), port=srv.port, timeout_s=5, deadline_s=5), 5.0)
        bmc = got["tray01"]
        assert bmc.answered, bmc.error
        assert [d.state for d in bmc.detectors] == ["OK", "OK", "Critical", "OK"] and bmc.power_health == "OK"
        thermal = sum(1 for p in (_GB200_DOC(m) for m in _GB200_DOC("/redfish/v1/Chassis")["Members"])
                      if p.get("ThermalSubsystem"))
        gets = [p for m, p, _a in srv.requests if m == "GET"]
        assert len(gets) == 1 + 1 + thermal + 1 + 3 and thermal == 31, gets
        assert srv.connections == 1                    # one kept connection, one TLS handshake
        client = oob._client_for(host, Settings(CRED, verify_tls=str(ca), port=srv.port, timeout_s=5, deadline_s=5),
                                 5.0, None, None)
        paths = oob.discover_leaks(client)
        before = len(srv.requests)
        again = oob.read_tray(client, paths)
        assert again.detectors == bmc.detectors and len(srv.requests) - before == 3
        client.close()
    with MockupServer(GB200, tls=tls, fault="slow", hold_s=10) as srv:
        host = Host("tray01", srv.host, "compute", "rack-a", bmc=srv.host)
        start = time.monotonic()
        bmc = oob.read([host], Settings(CRED, verify_tls=str(ca), port=srv.port, timeout_s=5, deadline_s=5), 1.5)["tray01"]
        srv.release.set()
        assert not bmc.answered and bmc.error_kind == "timeout" and time.monotonic() - start < 4.0
