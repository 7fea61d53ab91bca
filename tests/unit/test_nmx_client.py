"""NMX-M client pieces that need no server: credentials, URLs, and reading NMX-M objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.fabric.nmx import NMXClient, NMXCredentials, load_credentials
from mctl.model.fabric import GpuLocation, NmxComputeNode, NmxOperation, NmxPartition

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _cred(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    p = tmp_path / "nmx.cred"
    p.write_text(text)
    p.chmod(mode)
    return p


def test_credentials_file_format(tmp_path):
    cred = load_credentials(_cred(tmp_path, "# NMX-M rack a\n\nrw-user:pa:ss:word\n"))
    assert cred.username == "rw-user" and cred.password == "pa:ss:word"
    assert "pa:ss" not in repr(cred) and "pa:ss" not in str(cred) and "***" in repr(cred)
    assert cred.header() == "Basic cnctdXNlcjpwYTpzczp3b3Jk"


@pytest.mark.parametrize("text", ["", "justauser\n", "a:b\nc:d\n", ":nouser\n"])
def test_credentials_file_must_hold_one_pair(tmp_path, text):
    with pytest.raises(UsageError, match="exactly one line"):
        load_credentials(_cred(tmp_path, text))


def test_credentials_readable_by_others_are_refused(tmp_path):
    path = _cred(tmp_path, "u:secret\n", 0o644)
    with pytest.raises(UsageError) as exc:
        load_credentials(path)
    assert exc.value.hint == f"chmod 600 {path}" and "secret" not in exc.value.message
    with pytest.raises(UsageError, match="does not exist"):
        load_credentials(tmp_path / "missing")


def test_client_urls_and_redaction():
    cred = NMXCredentials("admin", "s3cret")
    assert NMXClient("https://10.20.0.5", cred).url == "https://10.20.0.5/nmx/v1"
    assert NMXClient("https://nmx.example/v1/", cred).url == "https://nmx.example/v1"
    assert NMXClient("http://127.77.1.200:8443", cred, base_path="/nmx/v1").base_path == "/nmx/v1"
    client = NMXClient("https://10.20.0.5", cred)
    assert "s3cret" not in repr(client)
    with pytest.raises(UsageError, match="must not carry credentials"):
        NMXClient("https://admin:s3cret@10.20.0.5", cred)
    with pytest.raises(UsageError, match="not an http"):
        NMXClient("ftp://x", cred)


def test_real_compute_node_sample_reads_fully():
    nodes = [NmxComputeNode.from_nmx(d) for d in json.loads((FIXTURES / "nmx-m-compute-nodes.json").read_text())]
    assert [(n.name, n.slot_id, n.tray_index, n.host_id, n.chassis_id) for n in nodes] == [
        ("node1", 5, 4, 1, 1), ("node2", 22, 12, 1, 1)]
    assert nodes[1].gpu_ids[-1] == "690a2d9cc5e905fa41a87ce1" and nodes[0].chassis_serial == "1825024170029"
    assert all(n.domain_uuid == "3fbfc98b-7f95-4749-ab11-bd351a2aab3e" for n in nodes)


def test_partition_and_operation_objects():
    loc = {"DomainUUID": "d", "ChassisID": 1, "SlotID": 5, "HostID": 1, "DeviceID": 2}
    p = NmxPartition.from_nmx({"ID": "abc", "PartitionID": 3, "Name": "p0", "Type": "LOCATION_BASED",
                               "Health": "HEALTHY", "Members": [loc]})
    assert p.members == (GpuLocation("d", 1, 5, 1, 2),) and not p.is_default
    assert NmxPartition.from_nmx({"PartitionID": 32766, "Name": "Default Partition", "Members": ["x"]}).is_default
    op = NmxOperation.from_nmx({"ID": "551137c2f9e1fac808a5f572", "Status": "IN_PROGRESS"})
    assert op.status == "in-progress" and not op.terminal
    failed = NmxOperation.from_nmx({"operationId": "o", "status": "failed", "Error": "GPU busy"})
    assert failed.terminal and failed.error == "GPU busy"
