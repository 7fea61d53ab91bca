"""The NMX-M contract, from the documented shapes and independent of the lab's emulator.

Two sources of truth (docs/partitions.md, "Sources"):
- the NMX-M OpenAPI spec as NVIDIA keeps it beside its generated Rust client
  (`crates/libnmxm/tests/opennmxm.yaml` of NVIDIA/ncx-infra-controller-core), stored
  byte for byte in tests/fixtures/real/nmx-m/ (provenance in its README): its
  `example:` objects are the documented JSON shapes the client is tested on, and its
  schemas are what the emulator's answers are checked against;
- the real compute-node listing in tests/fixtures/nmx-m-compute-nodes.json.

The client's HTTP is replaced by canned answers here (pure logic); the same paths
against the emulator over real HTTP are in tests/integration/test_nmx_emulator.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mctl.errors import UsageError
from mctl.fabric.nmx import (NMXAuthError, NMXClient, NMXCredentials, NMXError, NMXForeignOrigin,
                             NMXOperationFailed, NMXReadOnly, RetryPolicy)
from mctl.model.fabric import (GPU_HEALTH, PARTITION_HEALTH, PARTITION_TYPES, NmxComputeNode, NmxGpu, NmxOperation,
                               NmxPartition)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEC = yaml.safe_load((FIXTURES / "real" / "nmx-m" / "opennmxm.yaml").read_text())
SCHEMAS = SPEC["components"]["schemas"]


def example(name: str) -> dict[str, Any]:
    """The spec's documented example of *name*, as a JSON object (a fresh copy)."""
    return json.loads(json.dumps(SCHEMAS[name]["example"], default=str))


# ------------------------------------------------------------ a small OpenAPI checker

def conforms(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What in *value* breaks *schema* (the subset of OpenAPI 3 the NMX-M spec uses)."""
    if "$ref" in schema:
        return conforms(value, SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]], where)
    if value is None and "oneOf" not in schema:
        return [] if schema.get("nullable") or not schema else [f"{where}: null"]
    if "oneOf" in schema:
        fits = [s for s in schema["oneOf"] if not conforms(value, s, where)]
        return [] if len(fits) == 1 else [f"{where}: matches {len(fits)} of the oneOf forms"]
    kind = schema.get("type")
    problems: list[str] = []
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        props = schema.get("properties", {})
        problems += [f"{where}.{k}: required" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            problems += [f"{where}.{k}: not in the model" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                problems += conforms(v, props[k], f"{where}.{k}")
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: not an array"]
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: more than {schema['maxItems']} items")
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            problems.append(f"{where}: items repeat")
        for i, v in enumerate(value):
            problems += conforms(v, schema.get("items", {}), f"{where}[{i}]")
        return problems
    if kind == "string":
        if not isinstance(value, str):
            return [f"{where}: {value!r} is not a string"]
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"{where}: {value!r} not one of {schema['enum']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{where}: {value!r} does not match {schema['pattern']}")
        return problems
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{where}: {value!r} is not an integer"]
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return [f"{where}: {value!r} is not a number"]
    if kind == "boolean" and not isinstance(value, bool):
        return [f"{where}: {value!r} is not a boolean"]
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where}: above {schema['maximum']}")
    return problems


def test_the_checker_catches_what_the_model_refuses():
    gpu = example("GPU")
    assert conforms(gpu, SCHEMAS["GPU"]) == []
    assert conforms({**gpu, "DeviceUID": "2147483647"}, SCHEMAS["GPU"]) == ["$.DeviceUID: '2147483647' is not an "
                                                                            "integer"]
    assert "$.PartitionName: not in the model" in conforms({**gpu, "PartitionName": "p"}, SCHEMAS["GPU"])
    assert conforms({"Count": 3}, SCHEMAS["NetworkEntityCountResponse"]) == ["$.Count: not in the model"]
    assert conforms({**gpu, "Health": "UNHEALTHY"}, SCHEMAS["GPU"])


# --------------------------------------------------------- documented shapes -> model

def test_spec_enumerations_are_the_models():
    assert tuple(SCHEMAS["PartitionHealth"]["enum"]) == PARTITION_HEALTH
    assert tuple(SCHEMAS["PartitionType"]["enum"]) == PARTITION_TYPES
    assert tuple(SCHEMAS["GPU"]["properties"]["Health"]["enum"]) == GPU_HEALTH
    assert SCHEMAS["OperationStatus"]["enum"] == ["pending", "in-progress", "failed", "completed", "cancelled"]
    assert set(SCHEMAS["UpdatePartitionRequest"]["properties"]) == {"Members"}
    assert set(SCHEMAS["NetworkEntityCountResponse"]["properties"]) == {"total"}


def test_documented_gpu_reads_with_numeric_uids():
    g = NmxGpu.from_nmx(example("GPU"))
    assert (g.id, g.device_id, g.device_uid, g.system_uid, g.partition_id, g.health) == (
        "551137c2f9e1fac808a5f572", 2147483647, 2147483647, 2147483647, 988759834, "UNKNOWN")
    for health in GPU_HEALTH:
        assert NmxGpu.from_nmx({**example("GPU"), "Health": health}).health == health


def test_documented_operation_reads_result_and_request():
    op = NmxOperation.from_nmx(example("Operation"))
    assert (op.id, op.status, op.percentage, op.current_step) == ("551137c2f9e1fac808a5f572", "pending",
                                                                  pytest.approx(8.008282), "CurrentStep")
    assert (op.cancellable, op.method, op.uri, op.error, op.details) == (True, "get", "https://openapi-generator.tech",
                                                                         "Error", "Details")
    failed = example("Operation")
    failed.update(Status="failed", Percentage=100, Result={"Error": "GPU_BUSY", "Details": "GPU 2 is in use",
                                                           "Data": None})
    failed["Request"]["Body"] = None        # the spec's own example gives the string "{}" for this object
    assert conforms(failed, SCHEMAS["Operation"]) == []
    assert NmxOperation.from_nmx(failed).reason == "GPU_BUSY: GPU 2 is in use"
    bare = {k: v for k, v in example("Operation").items() if k != "Result"}       # Result is optional
    assert NmxOperation.from_nmx(bare).reason == ""


@pytest.mark.parametrize("members", [[], None])
def test_partition_members_may_be_empty_and_type_undefined(members):
    doc = {**example("Partition"), "Members": members, "Type": "UNDEFINED", "Health": "DEGRADED_BANDWIDTH"}
    assert conforms(doc, SCHEMAS["Partition"]) == []
    p = NmxPartition.from_nmx(doc)
    assert p.members == () and p.type == "UNDEFINED" and p.health == "DEGRADED_BANDWIDTH"
    assert NmxPartition.from_nmx({**doc, "Health": None}).health == "UNKNOWN"


def test_documented_compute_node_and_the_real_sample():
    node = NmxComputeNode.from_nmx(example("ComputeNode"))
    assert (node.slot_id, node.tray_index, node.host_id, node.chassis_id, node.health) == (6, 1, 5, 0, "UNKNOWN")
    real = json.loads((FIXTURES / "nmx-m-compute-nodes.json").read_text())
    # The real NMX-M lists GpuIDList, which this spec's ComputeNode leaves out: the one documented deviation.
    assert all(conforms({k: v for k, v in n.items() if k != "GpuIDList"}, SCHEMAS["ComputeNode"]) == [] for n in real)


# ------------------------------------------------------------ the client, canned HTTP

class Canned:
    """Stands in for NMXClient._once: answers by (method, path) from a table, records requests."""

    def __init__(self, table: dict[tuple[str, str], list[tuple[int, dict, Any]] | tuple[int, dict, Any]]):
        self.table = {k: (list(v) if isinstance(v, list) else [v]) for k, v in table.items()}
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, method: str, target: str, body: Any):
        self.calls.append((method, target, copy.deepcopy(body)))
        answers = self.table.get((method, target))
        if not answers:
            return 404, {}, {"httpErrorCode": 404, "customErrorCode": "not-found", "description": f"no {target}"}
        return answers.pop(0) if len(answers) > 1 else answers[0]


FAST = RetryPolicy(attempts=2, backoff_s=0.001, max_backoff_s=0.001, poll_s=0.001, max_poll_s=0.001,
                   operation_deadline_s=5)


def canned_client(table, *, user: str = "rw-user", **kw) -> tuple[NMXClient, Canned]:
    client = NMXClient("https://10.20.0.5", NMXCredentials(user, "pw"), policy=kw.pop("policy", FAST), **kw)
    stub = Canned(table)
    client._once = stub                                          # type: ignore[method-assign]
    return client, stub


def op_doc(status: str, **result) -> dict[str, Any]:
    doc = example("Operation")
    doc["Status"] = status
    doc.pop("Result")
    if result:
        doc["Result"] = result
    return doc


ACCEPTED = (202, {"Location": "/nmx/v1/operations/551137c2f9e1fac808a5f572"}, example("AsyncResponse"))
OP = "/nmx/v1/operations/551137c2f9e1fac808a5f572"


def test_count_reads_total_and_refuses_other_shapes():
    client, _ = canned_client({("GET", "/nmx/v1/gpus/count"): (200, {}, example("NetworkEntityCountResponse")),
                               ("GET", "/nmx/v1/ports/count"): (200, {}, {"total": 1296}),
                               ("GET", "/nmx/v1/chassis/count"): (200, {}, {"Count": 1})})
    assert client.count("gpus") == 0 and client.count("ports") == 1296
    with pytest.raises(NMXError, match=r'not \{"total": N\}'):
        client.count("chassis")


def test_lists_follow_offset_and_limit_pages():
    gpus = [{**example("GPU"), "ID": f"{i:024x}"} for i in range(7)]
    page = RetryPolicy(**{**FAST.__dict__, "page_size": 3})
    client, stub = canned_client({
        ("GET", "/nmx/v1/gpus?offset=0&limit=3"): (200, {}, gpus[0:3]),
        ("GET", "/nmx/v1/gpus?offset=3&limit=3"): (200, {}, gpus[3:6]),
        ("GET", "/nmx/v1/gpus?offset=6&limit=3"): (200, {}, gpus[6:])}, policy=page)
    assert [g.id for g in client.gpus()] == [g["ID"] for g in gpus]
    assert [c[1] for c in stub.calls] == ["/nmx/v1/gpus?offset=0&limit=3", "/nmx/v1/gpus?offset=3&limit=3",
                                          "/nmx/v1/gpus?offset=6&limit=3"]
    # An NMX-M that ignores paging answers everything at once, or the same page again: no loop, no duplicates.
    whole, _ = canned_client({("GET", "/nmx/v1/gpus?offset=0&limit=3"): (200, {}, gpus)}, policy=page)
    assert len(whole.gpus()) == 7
    same, stub2 = canned_client({("GET", "/nmx/v1/gpus?offset=0&limit=3"): (200, {}, gpus[0:3]),
                                 ("GET", "/nmx/v1/gpus?offset=3&limit=3"): (200, {}, gpus[0:3])}, policy=page)
    assert len(same.gpus()) == 3 and len(stub2.calls) == 2
    # Partitions and operations take no pagination in the spec: asked for whole.
    parts, stub3 = canned_client({("GET", "/nmx/v1/partitions"): (200, {}, [example("Partition")])})
    assert parts.partitions()[0].name == "Some-Name" and stub3.calls[0][1] == "/nmx/v1/partitions"


def test_failed_operation_says_why_from_result():
    client, _ = canned_client({("POST", "/nmx/v1/partitions"): ACCEPTED,
                               ("GET", OP): [(200, {}, op_doc("in-progress")),
                                             (200, {}, op_doc("failed", Error="CONFLICT",
                                                              Details="GPU 551137c2 is in partition 3"))]})
    with pytest.raises(NMXOperationFailed) as exc:
        client.create_partition("p0", ["551137c2f9e1fac808a5f572"])
    assert exc.value.message == ("NMX-M operation 551137c2f9e1fac808a5f572 (create partition 'p0') failed: "
                                 "CONFLICT: GPU 551137c2 is in partition 3")
    client, _ = canned_client({("DELETE", "/nmx/v1/partitions/abc"): ACCEPTED, ("GET", OP): (200, {}, op_doc("failed"))})
    with pytest.raises(NMXOperationFailed, match="failed: NMX-M gave no reason"):
        client.delete_partition("abc")


def test_cancelled_operation_and_cancel_request():
    client, stub = canned_client({("PUT", "/nmx/v1/partitions/abc"): ACCEPTED,
                                  ("GET", OP): (200, {}, op_doc("cancelled", Details="cancelled by admin")),
                                  ("DELETE", OP): (202, {}, {"operationId": "0123456789abcdef01234567"})})
    with pytest.raises(NMXOperationFailed, match="was cancelled: cancelled by admin"):
        client.replace_members("abc", ["551137c2f9e1fac808a5f572"], name="p0")
    assert stub.calls[0] == ("PUT", "/nmx/v1/partitions/abc", {"Members": ["551137c2f9e1fac808a5f572"]})
    assert client.cancel_operation("551137c2f9e1fac808a5f572").id == "0123456789abcdef01234567"


def test_still_running_at_the_deadline_names_the_step():
    slow = RetryPolicy(**{**FAST.__dict__, "operation_deadline_s": 0.0})
    client, _ = canned_client({("DELETE", "/nmx/v1/partitions/abc"): ACCEPTED,
                               ("GET", OP): (200, {}, {**op_doc("in-progress"), "Percentage": 40,
                                                       "CurrentStep": "programming switch 3"})}, policy=slow)
    with pytest.raises(NMXOperationFailed, match=r"still in-progress \(40 %\), at 'programming switch 3'"):
        client.delete_partition("abc")


def test_403_on_a_write_is_the_read_only_user_and_401_bad_credentials():
    kong = {"message": "You cannot consume this service"}
    client, _ = canned_client({("POST", "/nmx/v1/partitions"): (403, {}, kong),
                               ("GET", "/nmx/v1/partitions"): (403, {}, kong)}, user="ro-user")
    with pytest.raises(NMXReadOnly) as exc:
        client.create_partition("p0", [])
    assert "this user is read-only" in exc.value.message and "refused the credentials" not in exc.value.message
    assert exc.value.exit_code == 2 and "rw-user" in exc.value.hint
    with pytest.raises(NMXAuthError) as exc2:
        client.partitions()
    assert not isinstance(exc2.value, NMXReadOnly) and "does not let user 'ro-user' read" in exc2.value.message
    bad, _ = canned_client({("GET", "/nmx/v1/partitions"): (401, {}, {"message": "Unauthorized"})})
    with pytest.raises(NMXAuthError, match=r"refused the credentials \(HTTP 401\)"):
        bad.partitions()


def test_error_objects_give_their_description():
    client, _ = canned_client({("POST", "/nmx/v1/partitions"): (409, {}, {
        "httpErrorCode": 409, "customErrorCode": "conflict", "description": "GPU x is in partition 'a'"})})
    from mctl.fabric.nmx import NMXConflict
    with pytest.raises(NMXConflict, match=r"GPU x is in partition 'a' \(conflict\)"):
        client.create_partition("b", ["x"])


def test_an_operation_location_on_another_origin_is_refused():
    client, stub = canned_client({("POST", "/nmx/v1/partitions"): (
        202, {"Location": "https://203.0.113.9/nmx/v1/operations/551137c2f9e1fac808a5f572"},
        example("AsyncResponse"))})
    with pytest.raises(NMXForeignOrigin) as exc:
        client.create_partition("p0", ["551137c2f9e1fac808a5f572"])
    assert "accepted the request" in exc.value.message and "203.0.113.9" in exc.value.message
    assert len(stub.calls) == 1                                      # nothing was asked of the other host
    for other in ("http://10.20.0.5/x", "https://10.20.0.5:8443/x", "https://nmx.example/x"):
        with pytest.raises(NMXForeignOrigin):
            client._resolve(other)
    assert client._resolve("/nmx/v1/operations/1") == "https://10.20.0.5/nmx/v1/operations/1"
    assert client._resolve("https://10.20.0.5:443/y") == "https://10.20.0.5:443/y"


# ----------------------------------------------------- URL, TLS and inventory settings

def test_http_only_on_loopback_or_with_allow_http():
    cred = NMXCredentials("a", "b")
    with pytest.raises(UsageError, match="plain http:// on a routed address"):
        NMXClient("http://10.20.0.5", cred)
    assert NMXClient("http://10.20.0.5", cred, allow_http=True).url == "http://10.20.0.5/nmx/v1"
    for ok in ("http://127.0.0.1:8443", "http://[::1]:8443", "http://localhost"):
        assert NMXClient(ok, cred).root == ok


def test_verify_tls_is_typed_and_off_is_warned(tmp_path):
    cred = NMXCredentials("a", "b")
    with pytest.raises(UsageError, match="is the string 'false'"):
        NMXClient("https://10.20.0.5", cred, verify_tls="false")
    with pytest.raises(UsageError, match="does not exist"):
        NMXClient("https://10.20.0.5", cred, verify_tls=str(tmp_path / "ca.pem"))
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    with pytest.raises(UsageError, match="cannot load CA bundle"):
        NMXClient("https://10.20.0.5", cred, verify_tls=str(tmp_path / "bad.pem"))
    said: list[str] = []
    NMXClient("https://10.20.0.99", cred, verify_tls=False, warn=said.append)
    NMXClient("https://10.20.0.99", cred, verify_tls=False, warn=said.append)
    assert len(said) == 1 and "TLS verification of NMX-M at https://10.20.0.99 is off" in said[0]
    NMXClient("https://10.20.0.98", cred, warn=said.append)
    assert len(said) == 1


INVENTORY = """\
plugin: mctl
site: t
racks:
  r1:
    model: nvl72
    shape: {{compute_trays: 1, switch_trays: 0}}
    nmx:
      url: {url}
      credentials_file: nmx.cred
{extra}    compute:
      nodes: r1-tray01
      addresses: 127.9.1.1
"""


@pytest.mark.parametrize("url, extra, line, text", [
    ("https://10.0.0.5", '      verify_tls: "false"\n', 10, "verify_tls is the string 'false'"),
    ("https://10.0.0.5", "      verify_tls: 'no'\n", 10, "verify_tls is the string 'no'"),
    ("http://10.0.0.5", "", 8, "plain http:// on a routed address"),
    ("http://10.0.0.5", "      allow_http: false\n", 8, "plain http:// on a routed address"),
    ("https://u:p@10.0.0.5", "", 8, "must not carry credentials"),
    ("ftp://10.0.0.5", "", 8, "not an http(s) URL"),
    ("https://10.0.0.5:99999", "", 8, "not an http(s) URL"),
])
def test_inventory_refuses_bad_nmx_settings_with_file_and_line(tmp_path, capsys, url, extra, line, text):
    from tests.unit.cli_helpers import run_cli

    (tmp_path / "mctl.yml").write_text(INVENTORY.format(url=url, extra=extra))
    before = (tmp_path / "mctl.yml").read_text()
    res = run_cli(capsys, "-i", str(tmp_path), "inventory", "validate")
    said = res.out + res.err
    assert res.code == 2 and f"mctl.yml:{line}:" in said and text in said, said
    assert "Traceback" not in said and (tmp_path / "mctl.yml").read_text() == before


@pytest.mark.parametrize("url, extra", [("http://10.0.0.5", "      allow_http: true\n"),
                                        ("http://127.0.0.9:8443", ""),
                                        ("https://10.0.0.5", "      verify_tls: false\n"),
                                        ("https://10.0.0.5", "      verify_tls: ca/nmx.pem\n")])
def test_inventory_accepts_good_nmx_settings(tmp_path, capsys, url, extra):
    from tests.unit.cli_helpers import run_cli

    (tmp_path / "mctl.yml").write_text(INVENTORY.format(url=url, extra=extra))
    res = run_cli(capsys, "-i", str(tmp_path), "inventory", "validate")
    assert res.code == 0, res.err


# ---------------------------------------------- the lab's emulator answers in the model

def test_emulator_objects_conform_to_the_spec():
    """The lab teaches the client only what the spec says (GpuIDList aside, as the real sample has it)."""
    from mctl.lab.nmx_emulator import Config, NMXState

    cfg = Config.from_dict({"username": "rw-user", "password": "x", "domain_uuid": "5b0c7f0e-6d7a-5d8e-9b51-3f3c1d2e4a10",
                            "trays": [{"name": f"t{i}", "tray_index": i} for i in range(2)], "switch_trays": 2})
    state = NMXState(cfg)
    views = {"GPU": state.gpus_json(), "SwitchNode": state.switch_nodes_json(), "Switch": state.switches_json(),
             "Chassis": state.chassis_json(),
             "Port": state.ports_json(), "Partition": state.partitions_json(),
             "ComputeNode": [{k: v for k, v in n.items() if k != "GpuIDList"} for n in state.compute_nodes_json()]}
    with state.lock:
        op = state.create({"Name": "p0", "Members": [g.id for g in state.gpus[:4]]})
        loc = [{"DomainUUID": cfg.domain_uuid, "ChassisID": 1, "SlotID": 2, "HostID": 1, "DeviceID": d}
               for d in range(4)]
        op2 = state.create({"Name": "p1", "Members": loc})
        views["Partition"] += state.partitions_json()
        views["Operation"] = [op.to_json(cfg.base_path), op2.to_json(cfg.base_path)]
        done = state.cancel(op2.id)
        views["Operation"] += [op2.to_json(cfg.base_path), done.to_json(cfg.base_path)]
    problems = [f"{name}[{i}]{p[1:]}" for name, items in views.items() for i, item in enumerate(items)
                for p in conforms(item, SCHEMAS[name])]
    assert problems == []
    assert {o["Status"] for o in views["Operation"]} == {"pending", "cancelled", "completed"}
    assert views["Operation"][2]["Result"]["Details"].startswith("cancelled by request")


def test_an_empty_undefined_partition_flows_through_the_planner():
    """NMX-M may hold a partition without GPUs (Members empty or null, Type UNDEFINED): planned, never a crash."""
    from mctl.fabric.partitions import map_fabric, partition_rows, plan_partitions
    from mctl.model.fabric import DesiredPartition
    from tests.helpers import make_nodes, make_rack

    rack = make_rack(4)
    fabric = map_fabric(rack, make_nodes(rack))
    empty = NmxPartition.from_nmx({**example("Partition"), "Name": "x", "PartitionID": 5, "Type": "UNDEFINED",
                                   "Health": "UNKNOWN", "Members": None})
    want = [DesiredPartition("x", "r1", ("r1-tray01",))]
    plan = plan_partitions(rack, want, fabric, [empty])
    # Its member kind is unknown, so it is recreated with the planned kind rather than updated.
    assert [(c.action, c.kind, len(c.members)) for c in plan.changes] == [("delete", "UNDEFINED", 0),
                                                                          ("create", "ID_BASED", 4)]
    assert [(r.name, r.state, r.trays) for r in partition_rows(rack, want, fabric, [empty])] == [("x", "differs", "-")]
    assert plan_partitions(rack, [], fabric, [empty]).unmanaged == ("x",)
    assert [c.action for c in plan_partitions(rack, [], fabric, [empty], prune=True).changes] == ["delete"]
