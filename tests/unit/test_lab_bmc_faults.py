"""`mctl lab fault bmc` (mctl/lab/bmc_faults.py): what the lab tray's BMC serves with each fault, that mctl's own
reader and checks see it (the integration test sees it over HTTPS: tests/integration/test_leaks.py), a switch
tray's leaks where the real one has them, and a hung or slow BMC on a real HTTPS client, kept connections too."""

from __future__ import annotations

import base64
import time

import pytest

from mctl.checks import leak
from mctl.errors import UsageError
from mctl.health import oob
from mctl.lab import bmc_emulator as emu
from mctl.lab import bmc_faults, bmcs
from mctl.model.findings import Severity
from mctl.model.settings import HealthSettings
from mctl.model.tray import TrayFacts

TREE = emu.load_tree()
emu.add_missing(TREE)


class LabBMC:
    """The emulator's documents (personalised, faults laid over), without HTTP."""

    def __init__(self, faults: dict):
        self.faults = faults

    def get(self, path: str) -> dict:
        if path not in TREE:
            from mctl.bmc.client import BMCError
            raise BMCError("http", f"GET {path} answered HTTP 404", status=404)
        doc = emu.personalize(TREE[path], tray_id="lab/t", tray_index=0, slot=1, power="On")
        return bmc_faults.overlay(path, doc, self.faults)

    def members(self, path: str) -> list[str]:
        return [m["@odata.id"] for m in self.get(path)["Members"]]

    def member_docs(self, path: str, need: tuple[str, ...] = ("Id",)) -> list[tuple[str, dict]]:
        return [(p, self.get(p)) for p in self.members(path)]


def judged(faults: dict) -> dict:
    bmc = oob.read_tray(LabBMC(faults))
    return {f.check: f for f in leak.check(TrayFacts(host="t", bmc=bmc), None, HealthSettings())}


def test_a_healthy_lab_tray_is_dry():
    f = judged({})
    assert [f[c].severity for c in (leak.BMC, leak.LEAK, leak.POWER)] == [Severity.OK] * 3


@pytest.mark.parametrize("level,severity", [("warning", Severity.WARN), ("critical", Severity.CRITICAL)])
def test_a_leak_fault_changes_one_detector_and_the_rollups(level, severity):
    faults = {"leak": level, "detector": "Chassis_0_LeakDetector_1_Manifold"}
    f = judged(faults)[leak.LEAK]
    assert f.severity is severity and "Chassis_0_LeakDetector_1_Manifold" in f.message
    chassis = LabBMC(faults).get("/redfish/v1/Chassis/Chassis_0")
    assert chassis["Status"]["HealthRollup"] == level.capitalize()


def test_psu_fail_is_the_power_subsystems_health():
    f = judged({"psu_fail": True})
    assert f[leak.POWER].severity is Severity.WARN and "PowerSubsystem Critical" in f[leak.POWER].message
    assert f[leak.LEAK].severity is Severity.OK


def test_watched_file_is_reread_when_it_changes(tmp_path):
    path = tmp_path / bmc_faults.FAULTS_NAME
    w = bmc_faults.Watched(path)
    assert w.get() == {}
    path.write_text('{"leak": "critical"}')
    assert w.get() == {"leak": "critical"}
    path.unlink()
    assert w.get() == {}


def test_apply_refuses_bad_input_without_a_lab(tmp_path):
    with pytest.raises(UsageError, match="no lab"):
        bmc_faults.apply(tmp_path, "t", leak="critical")


def test_the_bmc_command_takes_only_bmc_faults(capsys, tmp_path):
    from tests.unit.cli_helpers import run_cli

    for extra in (["--xid", "79", "--gpu", "0"], ["--freeze"], ["--slurmd-down"]):
        r = run_cli(capsys, "lab", "fault", "bmc", "lab-r1-tray01", "--leak", "critical", *extra, "--dir", str(tmp_path))
        assert r.code == 2 and "No such option" in r.err + r.out, (extra, r)
    for extra in (["--psu-fail"], ["--hang"], ["--slow", "2"]):
        r = run_cli(capsys, "lab", "fault", "bmc", "lab-r1-tray01", *extra, "--dir", str(tmp_path))
        assert r.code == 2 and "no lab" in r.err + r.out and "Traceback" not in r.err, (extra, r)


# ------------------------------------------------------------------ switch trays (issue 27.4)

SWITCH_TREE = emu.load_tree(emu.SWITCH_CAPTURE)
emu.add_missing(SWITCH_TREE, "switch")
SWITCH_DETECTORS = "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors"


def switch_get(path: str, faults: dict) -> dict:
    doc = emu.personalize(SWITCH_TREE[path], tray_id="lab/sw", tray_index=0, slot=1, power="On", serial_by_value=True)
    return bmc_faults.overlay(path, doc, faults, "switch")


@pytest.mark.parametrize("level", ["warning", "critical"])
def test_a_switch_tray_leak_is_where_the_real_one_shows_it(level):
    faults = {"leak": level, "detector": "leakage4"}
    states = {m["@odata.id"].rsplit("/", 1)[-1]: switch_get(m["@odata.id"], faults)["DetectorState"]
              for m in switch_get(SWITCH_DETECTORS, faults)["Members"]}
    word = level.capitalize()
    # the detector, and the aggregate beside the six; the others dry
    assert states == {"leakage1": "OK", "leakage2": "OK", "leakage3": "OK", "leakage4": word, "leakage5": "OK",
                      "leakage6": "OK", "leakage_aggr": word}
    assert switch_get(f"{SWITCH_DETECTORS}/leakage4", faults)["Status"]["Health"] == word
    for path in ("/redfish/v1/Chassis/MGX_BMC_0", "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem",
                 "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection"):
        assert switch_get(path, faults)["Status"]["HealthRollup"] == word, path
    assert switch_get("/redfish/v1/Chassis/MGX_BMC_0", {})["Status"]["HealthRollup"] == "OK"
    # a compute tray's default detector means nothing on a switch tray, and the reverse
    assert bmc_faults.overlay(f"{SWITCH_DETECTORS}/leakage1", dict(SWITCH_TREE[f"{SWITCH_DETECTORS}/leakage1"]),
                              {"leak": level}, "switch")["DetectorState"] == word
    assert LabBMC({"leak": level, "detector": "leakage1"}).get(
        "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/"
        "Chassis_0_LeakDetector_0_ColdPlate")["DetectorState"] == "OK"


def _record_only_lab(tmp_path, switch_trays=1):
    """A lab's record alone (no process): enough for the faults' files and their checks."""
    import json

    (tmp_path / "lab.json").write_text(json.dumps({"name": "lab", "racks": 1, "trays": 2, "net": 92,
                                                   "switch_trays": switch_trays}))
    return tmp_path


def test_apply_on_a_switch_tray_and_what_it_refuses(tmp_path):
    lab = _record_only_lab(tmp_path)
    res = bmc_faults.apply(lab, "lab-r1-sw01", leak="critical", detector="leakage_aggr")
    assert res.after == ["leak critical leakage_aggr"] and res.before == []
    assert bmc_faults.read(bmc_faults.faults_path(lab, "lab-r1-sw01")) == {"leak": "critical",
                                                                           "detector": "leakage_aggr"}
    assert bmc_faults.apply(lab, "lab-r1-sw01", leak="warning").after == ["leak warning leakage1"]
    for kw, words in (({"leak": "critical", "detector": "Chassis_0_LeakDetector_0_ColdPlate"}, "leakage1"),
                      ({"psu_fail": True}, "no power subsystem"),
                      ({"slow": 0.0}, "not a delay"),
                      ({"slow": float("nan")}, "not a delay"),
                      ({}, "no BMC fault given"),
                      ({"hang": True, "clear": True}, "cannot be combined")):
        with pytest.raises(UsageError) as exc:
            bmc_faults.apply(lab, "lab-r1-sw01", **kw)
        assert words in exc.value.message + (exc.value.hint or ""), kw
    for name, words in (("lab-r1-head", "head node"), ("lab-r1-sw09", "not a compute or switch tray")):
        with pytest.raises(UsageError, match=words):
            bmc_faults.apply(lab, name, hang=True)
    assert bmc_faults.apply(lab, "lab-r1-sw01", clear=True).after == []
    assert not bmc_faults.faults_path(lab, "lab-r1-sw01").exists()


def test_hang_and_slow_are_bmc_faults_of_both_kinds(tmp_path):
    lab = _record_only_lab(tmp_path)
    for tray in ("lab-r1-tray02", "lab-r1-sw01"):
        dry = bmc_faults.apply(lab, tray, hang=True, dry_run=True)
        assert dry.after == [] and dry.actions and not bmc_faults.faults_path(lab, tray).exists()
        assert bmc_faults.apply(lab, tray, hang=True).after == ["bmc never answers"]
        assert bmc_faults.apply(lab, tray, slow=2.5).after == ["bmc never answers", "bmc answers 2.5 s late"]
        assert bmc_faults.read(bmc_faults.faults_path(lab, tray)) == {"hang": True, "slow": 2.5}
        assert bmc_faults.apply(lab, tray, clear=True).after == []


def test_cli_bmc_faults_and_clear_by_target_on_a_record_only_lab(capsys, tmp_path):
    import json

    from tests.unit.cli_helpers import run_cli

    lab = str(_record_only_lab(tmp_path))
    r = run_cli(capsys, "lab", "fault", "bmc", "lab-r1-sw01", "--leak", "critical", "--detector", "leakage3",
                "--dir", lab, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out) == {"host": "lab-r1-sw01", "dry_run": False, "before": [],
                                 "after": ["leak critical leakage3"], "actions": json.loads(r.out)["actions"]}
    r = run_cli(capsys, "lab", "fault", "bmc", "lab-r1-tray01", "--slow", "3", "--dir", lab)
    assert r.code == 0 and "lab-r1-tray01 bmc: bmc answers 3 s late" in r.out, r.err
    r = run_cli(capsys, "lab", "fault", "clear", "lab-r1-sw01", "--dry-run", "--dir", lab)
    assert r.code == 0 and "would: remove" in r.out and "lab-r1-sw01 bmc: leak critical leakage3" in r.out
    r = run_cli(capsys, "lab", "fault", "clear", "lab-r1-sw01", "--dir", lab, "--json")
    assert r.code == 0 and json.loads(r.out)["after"] == []
    r = run_cli(capsys, "lab", "fault", "clear", "lab-r1-tray01", "--target", "bmc", "--dir", lab)
    assert r.code == 0 and "lab-r1-tray01 bmc: no faults" in r.out
    r = run_cli(capsys, "lab", "fault", "clear", "lab-r1", "--dir", lab, "--json")
    assert r.code == 0 and json.loads(r.out)["rack"] == "lab-r1" and json.loads(r.out)["after"] == []
    for args, words in ((["lab-r1", "--target", "gpu"], "is a rack"),
                        (["lab-r1-sw01", "--target", "host"], "is a switch tray"),
                        (["lab-r1-head", "--target", "bmc"], "head node"),
                        (["lab-r1-tray01", "--target", "disk"], "unknown target"),
                        (["lab-r9-tray01"], "unknown lab tray")):
        r = run_cli(capsys, "lab", "fault", "clear", *args, "--dir", lab)
        assert r.code == 2 and words in r.err and "Traceback" not in r.err, (args, r)
    r = run_cli(capsys, "lab", "fault", "gpu", "lab-r1-sw01", "--xid", "79", "--gpu", "0", "--dir", lab)
    assert r.code == 2 and "switch tray" in r.err and "mctl lab fault bmc lab-r1-sw01" in r.err


# ------------------------------------------------------------------ a hung and a slow BMC, over HTTPS (issue 27.5)

class EmulatedBMC:
    """One tray's BMC emulator as `mctl lab up` runs it (its own process, TLS from the lab's CA, Basic auth),
    on a free port of the tray's BMC address, with a real HTTP client on kept connections."""

    def __init__(self, lab_dir, tray: str, address: str):
        import json
        import socket
        import subprocess
        import sys

        self.lab_dir, self.tray, self.address = lab_dir, tray, address
        config = bmcs.tray_bmc_dir(lab_dir, tray) / "bmc.json"
        with socket.socket() as s:
            s.bind((address, 0))
            self.port = s.getsockname()[1]
        doc = json.loads(config.read_text())
        config.write_text(json.dumps(dict(doc, port=self.port)))
        self.log = open(bmcs.tray_bmc_dir(lab_dir, tray) / "bmc.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", bmcs.MODULE, str(config)], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        user, password = (lab_dir / "bmc" / "credentials").read_text().strip().split(":", 1)
        self.auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get(self.connect(timeout=10), "/redfish/v1")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"the BMC emulator of {tray} did not start: see {self.log.name}")
                time.sleep(0.2)

    def connect(self, timeout: float):
        import http.client
        import ssl

        ctx = ssl.create_default_context(cafile=str(bmcs.lab_bmc_dir(self.lab_dir) / "ca.pem"))
        conn = http.client.HTTPSConnection(self.address, self.port, context=ctx, timeout=timeout)
        conn.connect()
        return conn

    def get(self, conn, path: str) -> tuple[int, dict]:
        import json

        conn.request("GET", path, headers=self.auth)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")

    def stop(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def emulated_bmc(tmp_path):
    """Start a lab's (record only, no host) compute or switch tray BMC: emulated_bmc("lab-r1-sw01")."""
    import json

    pytest.importorskip("bcrypt")
    pytest.importorskip("sushy_tools")
    from mctl.lab.layout import LabLayout

    layout = LabLayout("lab", 1, 1, net=92, switch_trays=1)
    bmcs.prepare(tmp_path, layout)
    (tmp_path / "lab.json").write_text(json.dumps({"name": "lab", "racks": 1, "trays": 1, "net": 92,
                                                   "switch_trays": 1}))
    started: list[EmulatedBMC] = []

    def start(tray: str) -> EmulatedBMC:
        unit = next(u for u in bmcs.bmc_units(layout) if u["tray"] == tray)
        started.append(EmulatedBMC(tmp_path, tray, unit["address"]))
        return started[-1]

    yield start
    for bmc in started:
        bmc.stop()


HELD_S = 2.0        # a healthy lab BMC answers a GET in well under this on a loaded machine


def _unanswered(bmc: EmulatedBMC, conn) -> bool:
    conn.sock.settimeout(HELD_S)
    try:
        bmc.get(conn, "/redfish/v1/Chassis/Chassis_0")
    except TimeoutError:
        return True
    return False


def test_stall_holds_each_request_while_hung_and_delays_each_while_slow(tmp_path):
    import threading

    path = tmp_path / bmc_faults.FAULTS_NAME
    calls: list[str] = []
    app = bmc_faults.Stall(lambda environ, start: calls.append(environ["PATH_INFO"]) or [b"ok"],
                           bmc_faults.Watched(path))
    assert app({"PATH_INFO": "/a"}, None) == [b"ok"]
    path.write_text('{"hang": true}')
    held = threading.Thread(target=app, args=({"PATH_INFO": "/b"}, None), daemon=True)
    held.start()
    held.join(HELD_S)
    assert held.is_alive() and calls == ["/a"]                  # not answered while the fault lasts
    path.write_text('{"slow": 0.5}')                            # cleared into slow: answered, late
    held.join(10)
    assert not held.is_alive() and calls == ["/a", "/b"]
    started = time.monotonic()
    app({"PATH_INFO": "/c"}, None)
    assert time.monotonic() - started >= 0.5
    path.unlink()
    assert app({"PATH_INFO": "/d"}, None) == [b"ok"]


def test_a_hung_bmc_takes_connections_and_answers_nothing_on_open_ones_too(emulated_bmc, sockets):
    bmc = emulated_bmc("lab-r1-tray01")
    assert bmc.get(bmc.connect(timeout=30), "/redfish/v1")[0] == 200
    # The lab's BMCs keep a connection between requests (mctl/lab/bmc_http.py): one that answered before the
    # fault is held at its next request, as one connected (TCP and TLS) before it and not yet used.
    kept, opened = bmc.connect(timeout=30), bmc.connect(timeout=30)
    sock = kept.sock
    assert bmc.get(kept, "/redfish/v1")[0] == 200 and kept.sock is sock
    bmc_faults.apply(bmc.lab_dir, bmc.tray, hang=True)
    assert _unanswered(bmc, kept) and kept.sock is sock
    assert _unanswered(bmc, opened)
    # a new connection: TCP and TLS are taken, the request is not answered (a wrong login neither)
    assert _unanswered(bmc, bmc.connect(timeout=30))
    bad = bmc.connect(timeout=30)
    bad.sock.settimeout(HELD_S)
    with pytest.raises(TimeoutError):
        bad.request("GET", "/redfish/v1/Systems",
                    headers={"Authorization": "Basic " + base64.b64encode(b"root:wrong").decode()})
        bad.getresponse()
    bmc_faults.apply(bmc.lab_dir, bmc.tray, clear=True)
    assert bmc.get(bmc.connect(timeout=30), "/redfish/v1/Chassis/Chassis_0")[0] == 200


def test_the_lab_bmc_keeps_one_connection_across_requests(emulated_bmc, sockets):
    """Issue 29.3: HTTP/1.1 keep-alive (mctl/lab/bmc_http.py, not Werkzeug's server, which closes every
    connection): mctl's client reads the tray over one connection with one TLS handshake, answers of every
    kind (200, 404, $expand, 401) included, each request read exactly."""
    from mctl.bmc.client import BMCCredentials, RedfishClient

    bmc = emulated_bmc("lab-r1-tray01")
    user, password = (bmc.lab_dir / "bmc" / "credentials").read_text().strip().split(":", 1)
    ca = str(bmcs.lab_bmc_dir(bmc.lab_dir) / "ca.pem")
    client = RedfishClient(f"https://{bmc.address}:{bmc.port}", BMCCredentials(user, password), verify_tls=ca,
                           timeout_s=10, resume_tls=False)
    client.use_expand(client.get("/redfish/v1"))
    docs = client.member_docs(leak.LEAK_DETECTORS, need=("Id", "DetectorState"))
    assert [d["DetectorState"] for _p, d in docs] == ["OK"] * 4 and client.requests == 2      # one $expand GET
    with pytest.raises(Exception):
        client.get("/redfish/v1/Chassis/Chassis_0/NotThere")
    for _ in range(20):
        assert client.get("/redfish/v1/Chassis/Chassis_0")["Id"] == "Chassis_0"
    assert client.connections == 1 and client.tls_handshakes == 1, client.connections
    client.close()
    wrong = RedfishClient(f"https://{bmc.address}:{bmc.port}", BMCCredentials(user, "wrong"), verify_tls=ca,
                          timeout_s=10, resume_tls=False)
    for _ in range(3):
        with pytest.raises(Exception, match="refused the credentials"):
            wrong.get("/redfish/v1/Systems")
    assert wrong.connections == 1
    wrong.close()


def test_a_slow_bmc_answers_every_request_late_on_open_connections_too(emulated_bmc, sockets):
    bmc = emulated_bmc("lab-r1-tray01")
    opened = bmc.connect(timeout=30)                # before the fault
    bmc_faults.apply(bmc.lab_dir, bmc.tray, slow=1.5)
    for conn in (opened, bmc.connect(timeout=30)):
        started = time.monotonic()
        code, doc = bmc.get(conn, "/redfish/v1/Chassis/Chassis_0")
        assert code == 200 and doc["Id"] == "Chassis_0" and time.monotonic() - started >= 1.5
    bmc_faults.apply(bmc.lab_dir, bmc.tray, clear=True)
    assert bmc.get(bmc.connect(timeout=30), "/redfish/v1")[0] == 200


def test_a_switch_tray_bmc_serves_its_leak_over_https(emulated_bmc, sockets):
    bmc = emulated_bmc("lab-r1-sw01")
    conn = bmc.connect(timeout=30)
    code, coll = bmc.get(conn, SWITCH_DETECTORS)
    assert code == 200 and len(coll["Members"]) == 7
    assert bmc.get(conn, f"{SWITCH_DETECTORS}/leakage2")[1]["DetectorState"] == "OK"
    bmc_faults.apply(bmc.lab_dir, bmc.tray, leak="critical", detector="leakage2")
    assert bmc.get(conn, f"{SWITCH_DETECTORS}/leakage2")[1]["DetectorState"] == "Critical"
    assert bmc.get(conn, f"{SWITCH_DETECTORS}/leakage_aggr")[1]["DetectorState"] == "Critical"
    assert bmc.get(conn, "/redfish/v1/Chassis/MGX_BMC_0")[1]["Status"]["HealthRollup"] == "Critical"
    bmc_faults.apply(bmc.lab_dir, bmc.tray, clear=True)
    assert bmc.get(conn, f"{SWITCH_DETECTORS}/leakage2")[1]["DetectorState"] == "OK"
