"""The NMX-M emulator over real HTTP on 127.77.251.x, driven by mctl's client and CLI.

No lab and no root needed: the emulator is a plain HTTP server on a loopback
address, and the trays' gpus.json files are temporary files written per the lab
contract. Operation delays are a few tens of milliseconds so the suite stays fast.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mctl.fabric.nmx import (NMXClient, NMXConflict, NMXCredentials, NMXNotFound, NMXOperationFailed,
                             NMXUnavailable, RetryPolicy)
from mctl.lab.nmx_emulator import Config, NMXEmulator
from tests.unit.cli_helpers import run_cli

DOMAIN = "5b0c7f0e-6d7a-5d8e-9b51-3f3c1d2e4a10"
ADDRESS = "127.77.251.1"
FAST = RetryPolicy(attempts=4, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5, operation_deadline_s=10,
                   poll_s=0.02, max_poll_s=0.1)
SAMPLE_KEYS = set(json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "nmx-m-compute-nodes.json")
                             .read_text())[0])


def tray_file(path: Path, name: str, index: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": 1, "hostname": name, "driver_version": "570.148.08", "chassis_serial": "1821000000001",
        "tray_index": index, "slot_number": index + 1, "host_id": 1, "cluster_uuid": DOMAIN, "clique_id": 32766,
        "fabric_state": "Completed", "fabric_status": "Success",
        "gpus": [{"index": i, "uuid": f"GPU-{index}-{i}"} for i in range(4)]}, indent=2))


def make_config(tmp: Path, **overrides) -> dict:
    trays = []
    for i in range(4):
        name = f"lab-r1-tray{i + 1:02d}"
        path = tmp / "trays" / name / "var/lib/mctl-lab/gpus.json"
        tray_file(path, name, i)
        trays.append({"name": name, "tray_index": i, "slot_id": i + 1, "host_id": 1, "gpus_json": str(path)})
    cfg = {"listen": ADDRESS, "port": 0, "username": "admin", "password": "lab-secret", "domain_uuid": DOMAIN,
           "chassis_serial": "1821000000001", "state_file": str(tmp / "nmx-state.json"), "operation_delay_s": 0.05,
           "fabric_delay_s": 0.05, "resync_s": 0.2, "trays": trays}
    cfg.update(overrides)
    return cfg


def gpus_json(tmp: Path, tray: int) -> dict:
    return json.loads((tmp / "trays" / f"lab-r1-tray{tray:02d}" / "var/lib/mctl-lab/gpus.json").read_text())


@pytest.fixture()
def emu(tmp_path, sockets):
    emulator = NMXEmulator(Config.from_dict(make_config(tmp_path))).start()
    try:
        yield emulator
    finally:
        emulator.stop()


def client_for(emulator: NMXEmulator, policy: RetryPolicy = FAST, password: str = "lab-secret") -> NMXClient:
    return NMXClient(emulator.url, NMXCredentials("admin", password), policy=policy)


def raw(emulator: NMXEmulator, method: str, path: str, body=None, auth=True):
    req = urllib.request.Request(f"http://{ADDRESS}:{emulator.address[1]}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(b"admin:lab-secret").decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def test_inventory_endpoints_and_auth(emu):
    client = client_for(emu)
    nodes = client.inventory("compute-nodes")
    assert len(nodes) == 4 and set(nodes[0]) == SAMPLE_KEYS
    assert nodes[2]["LocationInfo"] == {"ChassisID": 1, "ChassisSerialNumber": "1821000000001", "HostID": 1,
                                        "SlotID": 3, "TrayIndex": 2}
    assert client.count("gpus") == 16 and client.count("switch-nodes") == 9 and client.count("chassis") == 1
    assert {g.partition_id for g in client.gpus()} == {32766}
    parts = client.partitions()
    assert [(p.partition_id, p.name, len(p.members)) for p in parts] == [(32766, "Default Partition", 16)]
    status, headers, body = raw(emu, "GET", "/nmx/v1/partitions", auth=False)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert raw(emu, "GET", "/nmx/v1/nothing")[0] == 404
    assert raw(emu, "GET", "/nmx/v1/gpus?slotID=2&chassisSerialNumber=1821000000001")[2][0]["Name"] == \
        "lab-r1-tray02/GPU0"
    from mctl.fabric.nmx import NMXAuthError
    with pytest.raises(NMXAuthError, match="refused the credentials"):
        client_for(emu, password="wrong").partitions()


def test_partition_lifecycle_moves_cliques_through_in_progress(emu, tmp_path):
    client = client_for(emu)
    nodes = {n.name: n for n in client.compute_nodes()}
    members = list(nodes["lab-r1-tray01"].gpu_ids + nodes["lab-r1-tray02"].gpu_ids)
    seen_states: set[str] = set()
    seen_fabric: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen_fabric.add(gpus_json(tmp_path, 1)["fabric_state"])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        status, headers, body = raw(emu, "POST", "/nmx/v1/partitions", {"Name": "p0", "Members": members})
        assert status == 202 and headers["Location"] == f"/nmx/v1/operations/{body['operationId']}"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            op = raw(emu, "GET", headers["Location"])[2]
            seen_states.add(op["Status"])
            if op["Status"] == "completed":
                break
            time.sleep(0.01)
    finally:
        stop.set()
        watcher.join()
    assert seen_states >= {"pending", "in-progress", "completed"}
    assert "In Progress" in seen_fabric
    p0 = client.partition_named("p0")
    assert p0 is not None and p0.partition_id == 1 and p0.health == "HEALTHY" and p0.type == "ID_BASED"
    one, three = gpus_json(tmp_path, 1), gpus_json(tmp_path, 3)
    assert one["clique_id"] == 1 and one["fabric_state"] == "Completed" and {g["clique_id"] for g in one["gpus"]} == {1}
    assert three["clique_id"] == 32766 and one["hostname"] == "lab-r1-tray01" and one["gpus"][0]["uuid"] == "GPU-0-0"
    default = next(p for p in client.partitions() if p.is_default)
    assert len(default.members) == 8
    assert {g.partition_id for g in client.gpus() if g.id in members} == {1}

    client.replace_members(p0.id, list(nodes["lab-r1-tray01"].gpu_ids), name="p0")
    assert gpus_json(tmp_path, 2)["clique_id"] == 32766 and gpus_json(tmp_path, 1)["clique_id"] == 1
    p1 = client.create_partition("p1", list(nodes["lab-r1-tray02"].gpu_ids))
    assert p1.partition_id == 2 and gpus_json(tmp_path, 2)["clique_id"] == 2
    client.delete_partition(p0.id)
    p2 = client.create_partition("p2", list(nodes["lab-r1-tray03"].gpu_ids))
    assert p2.partition_id == 1                      # the lowest free ID in 1..32765
    assert gpus_json(tmp_path, 1)["clique_id"] == 32766


def test_conflicts_and_bad_requests(emu):
    client = client_for(emu)
    nodes = client.compute_nodes()
    a = client.create_partition("a", list(nodes[0].gpu_ids))
    with pytest.raises(NMXConflict, match="already in partition 'a'"):
        client.create_partition("b", [nodes[0].gpu_ids[0], nodes[1].gpu_ids[0]])
    with pytest.raises(NMXConflict, match="mix GPU IDs and locations"):
        client.create_partition("c", [nodes[2].gpu_ids[0], {"DomainUUID": DOMAIN, "ChassisID": 1, "SlotID": 3,
                                                             "HostID": 1, "DeviceID": 1}])
    with pytest.raises(NMXConflict, match="names are unique"):
        client.create_partition("a", list(nodes[3].gpu_ids))
    loc = [{"DomainUUID": DOMAIN, "ChassisID": 1, "SlotID": 2, "HostID": 1, "DeviceID": d} for d in range(4)]
    b = client.create_partition("b", loc)
    assert b.type == "LOCATION_BASED" and client.partition(b.id).members[3].device_id == 3
    with pytest.raises(NMXConflict, match="cannot change type"):
        client.replace_members(b.id, list(nodes[1].gpu_ids))
    assert raw(emu, "POST", "/nmx/v1/partitions", {"Name": "x", "Members": ["nope"]})[0] == 400
    assert raw(emu, "PUT", f"/nmx/v1/partitions/{a.id}", {"Name": "renamed", "Members": [nodes[0].gpu_ids[0]]})[0] \
        == 400
    assert raw(emu, "DELETE", "/nmx/v1/partitions/32766")[0] == 400
    with pytest.raises(NMXNotFound):
        client.partition("0123456789abcdef01234567")
    with pytest.raises(NMXNotFound):
        client.delete_partition("0123456789abcdef01234567")
    assert client.partition(a.partition_id).name == "a"          # numeric PartitionID works too


def test_retries_faults_and_deadlines(emu):
    client = client_for(emu)
    assert raw(emu, "POST", "/_lab/faults", {"fail_next": 2, "status": 503})[2]["fail_next"] == 2
    assert client.count("gpus") == 16                              # two 503s, then success
    raw(emu, "POST", "/_lab/faults", {"fail_next": 10, "status": 500})
    with pytest.raises(NMXUnavailable) as exc:
        client.partitions()
    assert "failed 4 times, last with HTTP 500" in exc.value.message and exc.value.exit_code == 3
    assert "lab-secret" not in exc.value.message
    raw(emu, "POST", "/_lab/faults", {"fail_next": 0, "delay_s": 0.4})
    slow = client_for(emu, RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.1))
    with pytest.raises(NMXUnavailable, match="unavailable"):
        slow.count("gpus")
    with pytest.raises(NMXUnavailable, match="may or may not have been accepted"):
        slow.create_partition("late", list(client.compute_nodes()[0].gpu_ids))
    raw(emu, "POST", "/_lab/faults", {"delay_s": 0})
    end = time.monotonic() + 30                                    # the slow POST still went through
    while client.partition_named("late") is None:
        assert time.monotonic() < end, "the POST the client gave up on never made its partition"
        time.sleep(0.1)
    emu.state.cfg.operation_delay_s = 1.0
    impatient = client_for(emu, RetryPolicy(operation_deadline_s=0.2, poll_s=0.05))
    with pytest.raises(NMXOperationFailed, match="still pending"):
        impatient.create_partition("slowop", list(client.compute_nodes()[1].gpu_ids))


def test_unreachable_endpoint(sockets):
    client = NMXClient("http://127.77.251.9:9", NMXCredentials("a", "b"), policy=FAST)
    with pytest.raises(NMXUnavailable, match="Connection refused"):
        client.partitions()


def test_restart_keeps_partitions_and_resyncs_trays(tmp_path, processes):
    cfg_path = tmp_path / "nmx.json"
    cfg_path.write_text(json.dumps(make_config(tmp_path, port=0)))

    def start() -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-m", "mctl.lab.nmx_emulator", "--config", str(cfg_path),
                                 "--log-file", str(tmp_path / "nmx.log")], stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        assert line.startswith("nmx-emulator: listening on http://127.77.251.1:"), line
        return proc, line.split()[-1]

    proc, url = start()
    try:
        client = NMXClient(url, NMXCredentials("admin", "lab-secret"), policy=FAST)
        created = client.create_partition("keep", list(client.compute_nodes()[3].gpu_ids))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    path = tmp_path / "trays" / "lab-r1-tray04" / "var/lib/mctl-lab/gpus.json"
    tray_file(path, "lab-r1-tray04", 3)                            # the lab rewrote the tray (clique 32766)
    proc, url = start()
    try:
        client = NMXClient(url, NMXCredentials("admin", "lab-secret"), policy=FAST)
        again = client.partition_named("keep")
        assert again is not None and again.partition_id == created.partition_id and again.id == created.id
        assert json.loads(path.read_text())["clique_id"] == created.partition_id
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert "POST /nmx/v1/partitions 202" in (tmp_path / "nmx.log").read_text()
    assert "lab-secret" not in (tmp_path / "nmx.log").read_text()


# ------------------------------------------------------------------------ CLI

INVENTORY = """\
# lab-like inventory for the NMX-M emulator tests
plugin: mctl
site: nmxtest
ssh:
  known_hosts: known_hosts
racks:
  lab-r1:
    model: nvl72
    shape: {{compute_trays: 4, switch_trays: 0}}
    nvlink_domain: {domain}
    nmx:
      url: {url}
      credentials_file: nmx.cred   # username:password, chmod 600
    compute:
      nodes: lab-r1-tray[01-04]
      addresses: 127.77.251.[11-14]
"""


def cliques(tmp: Path) -> list[int]:
    return [gpus_json(tmp, t)["clique_id"] for t in range(1, 5)]


def test_cli_create_apply_list_delete(emu, tmp_path, capsys):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "mctl.yml").write_text(INVENTORY.format(domain=DOMAIN, url=emu.url.rsplit("/nmx", 1)[0]))
    cred = inv / "nmx.cred"
    cred.write_text("admin:lab-secret\n")
    cred.chmod(0o644)
    base = ["-i", str(inv), "--state-dir", str(tmp_path / "state")]

    result = run_cli(capsys, *base, "partition", "list", "lab-r1")
    assert result.code == 2 and "chmod 600" in result.err
    cred.chmod(0o600)

    dry = run_cli(capsys, *base, "partition", "create", "lab-r1", "--template", "2x9", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    data = json.loads(dry.out)
    assert [(c["action"], c["name"], c["trays"]) for c in data["plan"]["changes"]] == [
        ("create", "p0", ["lab-r1-tray01", "lab-r1-tray02"]), ("create", "p1", ["lab-r1-tray03", "lab-r1-tray04"])]
    assert "partitions" not in (inv / "mctl.yml").read_text() and cliques(tmp_path) == [32766] * 4

    made = run_cli(capsys, *base, "partition", "create", "lab-r1", "--template", "2x9", "--nmx-only")
    assert made.code == 0, made.err
    assert "create p0: lab-r1-tray[01-02] (8 GPUs, ID_BASED)" in made.out
    text = (inv / "mctl.yml").read_text()
    assert "      - name: p1\n        trays: lab-r1-tray[03-04]\n" in text and text.startswith("# lab-like")
    assert (inv / "mctl.yml.bak").read_text() == INVENTORY.format(domain=DOMAIN, url=emu.url.rsplit("/nmx", 1)[0])
    first = cliques(tmp_path)
    assert first[0] == first[1] != first[2] == first[3] and 32766 not in first

    again = run_cli(capsys, *base, "partition", "apply", "lab-r1", "--json")
    assert again.code == 0 and json.loads(again.out)["racks"][0]["plan"]["changes"] == []

    listed = json.loads(run_cli(capsys, *base, "partition", "list", "lab-r1", "--json").out)
    states = {p["name"]: (p["state"], p["trays"]) for p in listed["racks"][0]["partitions"]}
    assert states == {"p0": ("in-sync", "lab-r1-tray[01-02]"), "p1": ("in-sync", "lab-r1-tray[03-04]"),
                      "Default Partition": ("default", "-")}

    shown = json.loads(run_cli(capsys, *base, "partition", "show", "lab-r1", "p1", "--json").out)
    assert shown["partition_id"] == first[2] and [m["tray"] for m in shown["members"]].count("lab-r1-tray04") == 4

    whole = run_cli(capsys, *base, "partition", "create", "lab-r1", "--template", "all", "--nmx-only")
    assert whole.code == 0, whole.err
    assert len(set(cliques(tmp_path))) == 1 and cliques(tmp_path)[0] != 32766

    half = run_cli(capsys, *base, "partition", "create", "lab-r1", "half", "--gpus", "lab-r1-tray01:0-1")
    assert half.code == 2 and "smaller than one tray" in half.err

    gone = run_cli(capsys, *base, "partition", "delete", "lab-r1", "all", "--nmx-only")
    assert gone.code == 0, gone.err
    assert cliques(tmp_path) == [32766] * 4 and "partitions: []" in (inv / "mctl.yml").read_text()

    split = run_cli(capsys, *base, "partition", "create", "lab-r1", "half", "--gpus", "lab-r1-tray01:0-1",
                    "--gpu-granularity")
    assert split.code == 0, split.err
    assert "not recorded in the inventory" in split.err
    tray1 = gpus_json(tmp_path, 1)
    assert [g["clique_id"] for g in tray1["gpus"]][2:] == [32766, 32766] and tray1["gpus"][0]["clique_id"] != 32766
    kept = json.loads(run_cli(capsys, *base, "partition", "apply", "lab-r1", "--json").out)
    assert kept["racks"][0]["plan"]["unmanaged"] == ["half"] and kept["racks"][0]["plan"]["changes"] == []
    pruned = run_cli(capsys, *base, "partition", "apply", "lab-r1", "--prune", "--nmx-only")
    assert pruned.code == 0 and "delete half" in pruned.out and cliques(tmp_path) == [32766] * 4

    emu.stop()
    down = run_cli(capsys, *base, "partition", "list", "lab-r1")
    assert down.code == 3 and "unavailable" in down.err


# ------------------------------------------------------------------ the lab

def test_partitions_reach_the_trays_nvidia_smi(lab, tmp_path, capsys):
    """Contract check on a real lab: partition create -> NMX-M emulator -> tray gpus.json -> tray nvidia-smi."""
    import yaml

    from mctl.lab.hosts import host_path

    lab.settle_slurm()                           # no job an earlier test left refuses the partition change
    doc = yaml.safe_load(lab.inventory.read_text())
    rack = doc["racks"][lab.rack]
    emulator = None
    if "nmx" not in rack:                        # the lab does not run one itself yet: start one for its rack
        trays = []
        for i, name in enumerate(lab.trays):
            path = host_path(lab.dir, name, "/var/lib/mctl-lab/gpus.json")
            state = json.loads(path.read_text())
            trays.append({"name": name, "tray_index": state["tray_index"], "slot_id": state["slot_number"],
                          "host_id": state["host_id"], "gpus_json": str(path)})
        emulator = NMXEmulator(Config.from_dict({
            "listen": "127.77.251.2", "port": 0, "username": "admin", "password": "lab-secret",
            "domain_uuid": rack["nvlink_domain"], "chassis_serial": state["chassis_serial"],
            "state_file": str(tmp_path / "nmx-state.json"), "operation_delay_s": 0.05, "fabric_delay_s": 0.05,
            "trays": trays})).start()
        cred = tmp_path / "nmx.cred"
        cred.write_text("admin:lab-secret\n")
        cred.chmod(0o600)
        rack["nmx"] = {"url": emulator.url, "credentials_file": str(cred)}
    rack.pop("partitions", None)
    inv = tmp_path / "mctl.yml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    base = ["-i", str(inv), "--state-dir", str(tmp_path / "state")]

    def cliques(tray: str) -> set[str]:
        out = lab.run(tray, "nvidia-smi --query-gpu=fabric.cliqueId --format=csv,noheader").stdout
        return set(out.split())

    try:
        made = run_cli(capsys, *base, "partition", "create", lab.rack, "--template", "2x9", "--nmx-only")
        assert made.code == 0, made.err
        ids = {p["name"]: p["partition_id"] for p in json.loads(
            run_cli(capsys, *base, "partition", "list", lab.rack, "--json").out)["racks"][0]["partitions"]}
        half = len(lab.trays) // 2
        assert cliques(lab.trays[0]) == {str(ids["p0"])}
        assert cliques(lab.trays[-1]) == {str(ids["p1"])} and half >= 1
        assert run_cli(capsys, *base, "partition", "delete", lab.rack, "p0", "--nmx-only").code == 0
        assert cliques(lab.trays[0]) == {"32766"}
    finally:
        run_cli(capsys, *base, "partition", "delete", lab.rack, "p1", "--nmx-only")     # the lab is shared: leave no partition
        run_cli(capsys, *base, "partition", "apply", lab.rack, "--prune", "--nmx-only")
        if emulator is not None:
            emulator.stop()
    assert cliques(lab.trays[-1]) == {"32766"}


# ------------------------------------------------- the real contract (issue 16.3, 17.3)

def ro_client(emulator: NMXEmulator, policy: RetryPolicy = FAST) -> NMXClient:
    return NMXClient(emulator.url, NMXCredentials("ro-user", "ro-secret"), policy=policy)


@pytest.fixture()
def emu_rw_ro(tmp_path, sockets):
    cfg = make_config(tmp_path, users=[{"username": "ro-user", "password": "ro-secret", "role": "ro"}])
    emulator = NMXEmulator(Config.from_dict(cfg)).start()
    try:
        yield emulator
    finally:
        emulator.stop()


def test_counts_answer_total_and_shapes_follow_the_model(emu):
    status, _, body = raw(emu, "GET", "/nmx/v1/gpus/count")
    assert status == 200 and body == {"total": 16}
    client = client_for(emu)
    assert client.count("ports") == 16 * 18 and client.count("compute-nodes") == 4
    gpu = client.inventory("gpus")[0]
    assert isinstance(gpu["DeviceUID"], int) and isinstance(gpu["SystemUID"], int) and gpu["VendorID"] == 0x10DE
    assert gpu["Health"] == "HEALTHY" and len(gpu["PortIDList"]) == 18
    assert client.gpus()[0].device_uid == gpu["DeviceUID"]
    chassis = client.inventory("chassis")[0]
    assert set(chassis) == {"ID", "Name", "Description", "CreatedAt", "UpdatedAt", "DomainUUID", "InternalID",
                            "SerialNumber", "ComputeNodeIDList", "SwitchNodeIDList"}
    port = client.inventory("ports")[0]
    assert port["Type"] == "GPU" and port["PhysicalState"] == "LINKUP" and port["LogicalState"] == "STATE_ACTIVE"
    status, _, err = raw(emu, "GET", "/nmx/v1/partitions/0123456789abcdef01234567")
    assert status == 404 and set(err) == {"httpErrorCode", "customErrorCode", "description"}


def test_lists_page_and_the_client_follows_every_page(emu, tmp_path):
    status, _, first = raw(emu, "GET", "/nmx/v1/ports")               # unasked: the first page_limit items
    assert status == 200 and len(first) == 50
    assert len(raw(emu, "GET", "/nmx/v1/gpus?offset=14&limit=5")[2]) == 2
    assert raw(emu, "GET", "/nmx/v1/gpus?limit=0")[0] == 400
    small = client_for(emu, RetryPolicy(**{**FAST.__dict__, "page_size": 5}))
    gpus = small.inventory("gpus")
    assert len(gpus) == 16 and len({g["ID"] for g in gpus}) == 16    # 5 + 5 + 5 + 1, none twice
    assert len(client_for(emu).inventory("ports")) == 16 * 18           # pages of 100
    raw(emu, "POST", "/_lab/faults", {"page_limit": 3})                # a smaller server-side default
    assert len(raw(emu, "GET", "/nmx/v1/gpus")[2]) == 3
    assert len(small.gpus()) == 16


def test_failed_operation_reports_result_error_and_rolls_back(emu):
    client = client_for(emu)
    nodes = client.compute_nodes()
    raw(emu, "POST", "/_lab/faults", {"fail_operations": 1, "operation_error": "GPU_NOT_READY",
                                      "operation_details": "GPU 3 of slot 2 did not answer the fabric manager"})
    with pytest.raises(NMXOperationFailed) as exc:
        client.create_partition("doomed", list(nodes[0].gpu_ids))
    assert "failed: GPU_NOT_READY: GPU 3 of slot 2 did not answer" in exc.value.message
    assert "create partition 'doomed'" in exc.value.message and exc.value.exit_code == 3
    assert client.partition_named("doomed") is None                    # NMX-M rolled it back
    ops = client.operations()
    failed = next(o for o in ops if o.status == "failed")
    assert failed.error == "GPU_NOT_READY" and failed.method == "post" and failed.uri.endswith("/partitions")
    assert client.create_partition("fine", list(nodes[0].gpu_ids)).name == "fine"   # one failure only


def test_cancel_a_pending_operation(emu, tmp_path):
    client = client_for(emu)
    nodes = client.compute_nodes()
    kept = client.create_partition("kept", list(nodes[1].gpu_ids))
    emu.state.cfg.operation_delay_s = 30.0                              # stays pending until cancelled
    op = client.create_partition("later", list(nodes[0].gpu_ids), wait=False)
    current = client.operation(op.id)
    assert current.status == "pending" and current.cancellable is True and current.percentage == 0
    cancel = client.cancel_operation(op.id)
    assert cancel.id and client.operation(cancel.id).status == "completed"
    with pytest.raises(NMXOperationFailed, match="was cancelled"):
        client.wait(op)
    assert client.partition_named("later") is None and client.partition_named("kept") is not None
    from mctl.fabric.nmx import NMXConflict as Conflict
    with pytest.raises(Conflict, match="only a pending operation"):
        client.cancel_operation(op.id)
    with pytest.raises(NMXNotFound):
        client.cancel_operation("0123456789abcdef01234567")
    deleting = client.delete_partition(kept.id, wait=False)            # a cancelled delete puts it back
    client.cancel_operation(deleting.id)
    assert client.partition(kept.id).name == "kept"
    assert gpus_json(tmp_path, 2)["clique_id"] == kept.partition_id      # the fabric never moved


def test_read_only_user_reads_but_cannot_write(emu_rw_ro):
    from mctl.fabric.nmx import NMXAuthError, NMXReadOnly

    ro = ro_client(emu_rw_ro)
    nodes = ro.compute_nodes()
    assert len(nodes) == 4 and ro.count("gpus") == 16 and ro.partitions()
    with pytest.raises(NMXReadOnly) as exc:
        ro.create_partition("nope", list(nodes[0].gpu_ids))
    assert "this user is read-only" in exc.value.message and "'ro-user'" in exc.value.message
    assert "rw-user" in exc.value.hint and exc.value.exit_code == 2
    assert "ro-secret" not in exc.value.message + (exc.value.hint or "")
    assert client_for(emu_rw_ro).partition_named("nope") is None
    with pytest.raises(NMXAuthError, match="refused the credentials"):
        NMXClient(emu_rw_ro.url, NMXCredentials("ro-user", "wrong"), policy=FAST).partitions()


def test_replace_members_sends_members_only(emu):
    client = client_for(emu)
    nodes = client.compute_nodes()
    p = client.create_partition("m", list(nodes[0].gpu_ids))
    client.replace_members(p.id, list(nodes[0].gpu_ids + nodes[1].gpu_ids), name="m")
    last = [o for o in client.operations() if o.method == "put"][-1]
    assert raw(emu, "GET", f"/nmx/v1/operations/{last.id}")[2]["Request"]["Body"] == {
        "Members": list(nodes[0].gpu_ids + nodes[1].gpu_ids)}


def test_injected_500_timeout_and_slow(emu):
    client = client_for(emu)
    raw(emu, "POST", "/_lab/faults", {"fail_all": True, "status": 500})
    with pytest.raises(NMXUnavailable, match="failed 4 times, last with HTTP 500 injected fault"):
        client.count("gpus")
    raw(emu, "POST", "/_lab/faults", {"clear": True, "hang": True})
    quick = client_for(emu, RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.5, call_deadline_s=5))
    started = time.monotonic()
    with pytest.raises(NMXUnavailable, match="unavailable"):
        quick.partitions()
    assert time.monotonic() - started < 5                               # bounded by the deadlines
    with pytest.raises(NMXUnavailable, match="may or may not have been accepted"):
        quick.create_partition("x", list(emu.state.by_id)[:4])
    raw(emu, "POST", "/_lab/faults", {"clear": True, "delay_s": 0.3})
    assert quick.count("gpus") == 16                                   # slow, inside the deadline
    raw(emu, "POST", "/_lab/faults", {"clear": True})


def test_faults_file_is_picked_up(tmp_path, sockets):
    faults = tmp_path / "nmx-faults.json"
    emulator = NMXEmulator(Config.from_dict(make_config(tmp_path, faults_file=str(faults)))).start()
    try:
        client = client_for(emulator)
        assert client.count("gpus") == 16
        faults.write_text(json.dumps({"fail_all": True, "status": 503}))
        with pytest.raises(NMXUnavailable, match="HTTP 503"):
            client.count("gpus")
        faults.write_text("{}\n")
        assert client.count("gpus") == 16
    finally:
        emulator.stop()


# --------------------------------------------- credentials stay with their origin (17.3)

class _Recorder:
    """A plain HTTP server on a loopback address that records what it was sent."""

    def __init__(self, address: str, handler):
        from http.server import ThreadingHTTPServer

        self.seen: list[dict] = []
        outer = self

        class H(handler):
            def log_message(self, *a):
                pass

            def record(self):
                outer.seen.append({"path": self.path, "auth": self.headers.get("Authorization")})

        self.server = ThreadingHTTPServer((address, 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_redirect_to_another_origin_never_carries_the_credentials(sockets):
    from http.server import BaseHTTPRequestHandler

    from mctl.fabric.nmx import NMXForeignOrigin

    class Sink(BaseHTTPRequestHandler):
        def do_GET(self):
            self.record()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

    sink = _Recorder("127.77.251.3", Sink)
    target = f"http://127.77.251.3:{sink.port}/nmx/v1/partitions"

    class Redirector(BaseHTTPRequestHandler):
        def _go(self):
            self.record()
            if self.command == "GET" and self.path.startswith("/nmx/v1/partitions"):
                self.send_response(302)
                self.send_header("Location", target)
            elif self.path.startswith("/nmx/v1/gpus"):      # same origin, other path: followed
                self.send_response(301)
                self.send_header("Location", "/nmx/v1/compute-nodes?offset=0&limit=100")
            elif self.path.startswith("/nmx/v1/compute-nodes"):
                body = b"[]"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            else:                                          # a 202 whose Location names another host
                self.send_response(202)
                body = b'{"operationId": "551137c2f9e1fac808a5f572"}'
                self.send_header("Location", f"http://127.77.251.3:{sink.port}/nmx/v1/operations/x")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = do_DELETE = _go

    origin = _Recorder("127.77.251.4", Redirector)
    try:
        client = NMXClient(f"http://127.77.251.4:{origin.port}", NMXCredentials("admin", "s3cret"), policy=FAST)
        with pytest.raises(NMXForeignOrigin) as exc:
            client.partitions()
        assert f"127.77.251.3:{sink.port}" in exc.value.message and "does not send the NMX-M credentials" \
            in exc.value.message
        assert "s3cret" not in exc.value.message
        assert client.gpus() == []                                     # a same-origin redirect is followed
        with pytest.raises(NMXForeignOrigin, match="accepted the request"):
            client.delete_partition("551137c2f9e1fac808a5f572")
        assert sink.seen == []                                         # nothing, not even without credentials
        assert origin.seen and all(s["auth"] == NMXCredentials("admin", "s3cret").header() for s in origin.seen)
    finally:
        origin.close()
        sink.close()


# -------------------------------------------- lab faults of a rack's NMX-M (issue 15.2)

def test_lab_fault_nmx_500_timeout_slow_and_clear(lab):
    from mctl.inventory import load_site

    site = load_site(lab.inventory)
    rack = site.racks[lab.rack]
    quick = RetryPolicy(attempts=2, backoff_s=0.05, timeout_s=1.0, call_deadline_s=10)
    client = NMXClient.for_rack(site, rack, policy=quick)
    assert client.count("gpus") == 4 * len(lab.trays)
    try:
        dry = lab.mctl("lab", "fault", "nmx", lab.rack, "500", "--dry-run", "--dir", str(lab.dir))
        assert dry.returncode == 0 and "would: write nmx-faults.json" in dry.stdout
        assert client.count("gpus") == 4 * len(lab.trays)
        res = lab.mctl("lab", "fault", "nmx", lab.trays[0], "500", "--dir", str(lab.dir), "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["after"] == ["nmx answers 500"]
        shown = json.loads(lab.mctl("lab", "status", "--dir", str(lab.dir), "--json").stdout)["rack_services"]
        assert [s["faults"] for s in shown if s["name"] == "nmx"] == [["nmx answers 500"]]
        listed = lab.mctl("partition", "list", lab.rack)
        assert listed.returncode == 3 and "unavailable" in listed.stderr and "HTTP 500" in listed.stderr
        assert lab.mctl("lab", "fault", "nmx", lab.rack, "timeout", "--dir", str(lab.dir)).returncode == 0
        started = time.monotonic()
        with pytest.raises(NMXUnavailable, match="unavailable"):
            client.partitions()
        assert time.monotonic() - started < 10
        assert lab.mctl("lab", "fault", "nmx", lab.rack, "slow", "--dir", str(lab.dir)).returncode == 0
        started = time.monotonic()
        assert NMXClient.for_rack(site, rack).count("gpus") == 4 * len(lab.trays)     # late, inside the deadline
        assert time.monotonic() - started >= 2.5
        bad = lab.mctl("lab", "fault", "nmx", lab.rack, "404", "--dir", str(lab.dir))
        assert bad.returncode == 2 and "one of 500, timeout, slow, switch-unhealthy" in bad.stderr
    finally:
        cleared = lab.mctl("lab", "fault", "clear", lab.rack, "--dir", str(lab.dir))
        assert cleared.returncode == 0 and f"{lab.rack} nmx: no faults" in cleared.stdout
    assert lab.mctl("partition", "list", lab.rack).returncode == 0


def test_lab_nmx_has_a_read_only_user(lab):
    from mctl.fabric.nmx import NMXReadOnly, load_credentials
    from mctl.inventory import load_site

    site = load_site(lab.inventory)
    rack = site.racks[lab.rack]
    ro = load_credentials(Path(rack.nmx.credentials_file).with_name("nmx-ro.cred"))
    client = NMXClient(rack.nmx.url, ro, policy=FAST)
    nodes = client.compute_nodes()
    assert ro.username == "ro-user" and len(nodes) == len(lab.trays)
    with pytest.raises(NMXReadOnly, match="this user is read-only"):
        client.create_partition("ro-try", list(nodes[0].gpu_ids))


def test_a_dripping_answer_is_cut_at_the_deadline(sockets):
    """Each read arriving in time is not enough: the whole exchange has one deadline."""
    from http.server import BaseHTTPRequestHandler

    stop = threading.Event()

    class Drip(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.record()
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(100):                      # one header byte every 0.1 s: each read is "in time"
                if stop.wait(0.1):
                    return
                try:
                    self.wfile.write(b"X")
                    self.wfile.flush()
                except OSError:
                    return

    server = _Recorder("127.77.251.5", Drip)
    try:
        client = NMXClient(f"http://127.77.251.5:{server.port}", NMXCredentials("a", "b"),
                           policy=RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.5, call_deadline_s=5))
        started = time.monotonic()
        with pytest.raises(NMXUnavailable, match=r"no whole answer from /nmx/v1/partitions in 0.5 s"):
            client.partitions()
        assert time.monotonic() - started < 3 and len(server.seen) == 2
    finally:
        stop.set()
        server.close()
