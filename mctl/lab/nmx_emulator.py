"""NMX-Manager emulator: the partition REST API of one rack's NVLink domain, over real HTTP.

Run as `python3 -m mctl.lab.nmx_emulator --config FILE` (one per rack, on the
rack's service address). It follows the NMX-M v1 contract (docs/partitions.md: the OpenAPI
model NVIDIA's generated client `crates/libnmxm` carries, the NMX-M and NetQ
documentation): Basic auth with a read-write and a read-only user (a write by the
read-only one is refused 403, as the Kong gateway's ACL does), partitions with ID
or location members, 202 + operations (`ID, CreatedAt, UpdatedAt, Status,
Percentage, CurrentStep, Request, Result`) that end completed, failed or cancelled
(`DELETE /operations/{id}` cancels a pending one), counts as `{"total": N}`,
errors as NMX-M's Error object, inventory lists (gpus, compute-nodes, switch-nodes,
switches, ports, chassis) shaped like the model and paged with `offset`/`limit` (and by
default above `page_limit` items), and the Default Partition 32766 that holds every
GPU no other partition holds.

What makes it a lab part rather than a mock: when a partition's membership
changes, the affected trays' GPUs change clique for real. Each tray's
gpus.json (the file the tray's nvidia-smi emulator reads) goes through fabric
state "In Progress" and then "Completed" with the new clique ID. The clique ID a
GPU reports is its partition's PartitionID (32766 in the default partition).
The tray-level `clique_id` is the clique of the tray's GPUs (of its first GPU
when a GPU-granularity partition splits the tray); every GPU entry also gets
its own `clique_id`.

Config (JSON):
  listen, port                  address and TCP port (port 0: any free port)
  base_path                     "/nmx/v1" (default)
  username + password           the read-write user's Basic-auth credentials, or
                                credentials_file (one line "username:password")
  ro_credentials_file           optional: the read-only user's "username:password"
  users                         optional: [{username, password, role: "rw"|"ro"}]
  page_limit                    items a list answers when not asked for a page
                                (default 50; 0: the whole list)
  faults_file                   optional JSON file of faults (same keys as below),
                                re-read when it changes: what `mctl lab fault
                                nmx RACK ...` writes
  domain_uuid, chassis_serial   the rack's NVLink domain and chassis
  chassis_id                    1 (default)
  state_file                    JSON file keeping partitions across restarts
  operation_delay_s             time an operation stays "pending" (default 0.3)
  fabric_delay_s                time GPUs stay "In Progress" (default 0.3)
  resync_s                      how often trays' gpus.json is checked (default 2)
  switch_trays                  number of NVLink switch trays listed (default 9)
  switch_power_files            optional [FILE, ...]: switch tray i's BMC power state (the lab's
                                switch tray BMCs write {"state": "Off"}); an Off tray's switch node
                                reads UNHEALTHY and the GPU ports cabled to it are down
  faults                        {"fail_next": N, "status": 500, "fail_all": bool,
                                 "hang": bool, "delay_s": S, "fail_operations": N,
                                 "operation_error": str, "operation_details": str,
                                 "page_limit": N, "switch_health": {"<switch index
                                 from 0>": SwitchNode Health}, "ports_down": [[switch
                                 index, switch port number], ...], "partition_health":
                                 {"<name>": Partition Health}}
  tls                           optional {"cert": FILE, "key": FILE}
  trays: [{name, tray_index, slot_id, host_id, gpus (default 4), gpus_json}]
Fault hook at runtime: GET/POST /_lab/faults with the same JSON ({"clear": true}
resets). fail_next counts down for every request outside /_lab/; fail_all answers
every request with `status`; hang reads requests and never answers (until cleared);
delay_s answers every request late; fail_operations makes the next N operations
end "failed" with Result.Error/Details (the change is rolled back).
SIGHUP re-reads the trays' gpus_json paths from the config (a restarted tray
has a new /proc/PID/root); SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import queue
import secrets
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mctl.state.files import atomic_write

DEFAULT_ID = 32766
DEFAULT_NAME = "Default Partition"
MAX_ID = 32765
MAX_NAME = 244                      # the model's PartitionName maxLength
PORTS_PER_GPU = 18                  # NVLink 5: 18 links per Blackwell GPU
NVIDIA_VENDOR_ID = 0x10DE
LAB_PCIE_DEVICE_ID = 0x2941         # a lab value; mctl never reads it
ERROR_CODES = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 409: "conflict",
               500: "internal-error", 503: "service-unavailable"}


def _now() -> str:
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _object_id(seed: str) -> str:
    """A stable 24-hex id, shaped like NMX-M's (MongoDB ObjectId) ids."""
    return hashlib.sha1(seed.encode()).hexdigest()[:24]


class ConfigError(Exception):
    pass


@dataclass
class Tray:
    name: str
    tray_index: int
    slot_id: int
    host_id: int
    gpus: int
    gpus_json: Path | None


@dataclass
class Config:
    listen: str
    port: int
    username: str
    password: str
    domain_uuid: str
    chassis_serial: str
    trays: list[Tray]
    state_file: Path | None = None
    base_path: str = "/nmx/v1"
    chassis_id: int = 1
    operation_delay_s: float = 0.3
    fabric_delay_s: float = 0.3
    resync_s: float = 2.0
    switch_trays: int = 9
    faults: dict[str, Any] = field(default_factory=dict)
    tls: dict[str, str] | None = None
    source: Path | None = None
    users: dict[str, tuple[str, str]] = field(default_factory=dict)     # username -> (password, "rw"|"ro")
    page_limit: int = 50
    faults_file: Path | None = None
    switch_power_files: list[Path] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read config {p}: {exc}") from None
        cfg = cls.from_dict(data, base=p.parent)
        cfg.source = p
        return cfg

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Path | None = None) -> "Config":
        def rel(value: str | None) -> Path | None:
            if not value:
                return None
            q = Path(value)
            return q if q.is_absolute() or base is None else base / q
        def cred_line(path: str) -> tuple[str, str]:
            line = next(ln.strip() for ln in rel(path).read_text().splitlines()  # type: ignore
                        if ln.strip() and not ln.startswith("#"))
            user, password = line.split(":", 1)
            return user, password
        try:
            user, password = data.get("username"), data.get("password")
            if data.get("credentials_file"):
                user, password = cred_line(data["credentials_file"])
            if not user or password is None:
                raise ConfigError("config needs username and password (or credentials_file)")
            users = {str(user): (str(password), "rw")}
            if data.get("ro_credentials_file") and rel(data["ro_credentials_file"]).exists():  # type: ignore
                ro_user, ro_password = cred_line(data["ro_credentials_file"])
                users[ro_user] = (ro_password, "ro")
            for u in data.get("users") or []:
                if u.get("role", "rw") not in ("rw", "ro"):
                    raise ConfigError(f"user {u.get('username')!r}: role is rw or ro")
                users[str(u["username"])] = (str(u["password"]), str(u.get("role", "rw")))
            trays = [Tray(name=str(t["name"]), tray_index=int(t["tray_index"]),
                          slot_id=int(t.get("slot_id", int(t["tray_index"]) + 1)), host_id=int(t.get("host_id", 1)),
                          gpus=int(t.get("gpus", 4)), gpus_json=rel(t.get("gpus_json")))
                     for t in data.get("trays", [])]
            return cls(listen=str(data.get("listen", "127.0.0.1")), port=int(data.get("port", 8443)),
                       username=str(user), password=str(password), domain_uuid=str(data["domain_uuid"]),
                       chassis_serial=str(data.get("chassis_serial", "0000000000000")), trays=trays,
                       state_file=rel(data.get("state_file")), base_path="/" + str(data.get("base_path",
                                                                                             "/nmx/v1")).strip("/"),
                       chassis_id=int(data.get("chassis_id", 1)),
                       operation_delay_s=float(data.get("operation_delay_s", 0.3)),
                       fabric_delay_s=float(data.get("fabric_delay_s", 0.3)),
                       resync_s=float(data.get("resync_s", 2.0)), switch_trays=int(data.get("switch_trays", 9)),
                       faults=dict(data.get("faults") or {}), tls=data.get("tls"), users=users,
                       page_limit=int(data.get("page_limit", 50)), faults_file=rel(data.get("faults_file")),
                       switch_power_files=[rel(str(f)) for f in data.get("switch_power_files") or []])
        except (KeyError, TypeError, ValueError, StopIteration, OSError) as exc:
            raise ConfigError(f"bad emulator config: {exc!r}") from None


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Gpu:
    id: str
    uid: int                      # DeviceUID: a JSON number (uint64) in the model
    tray: Tray
    device: int

    def location_key(self, domain: str, chassis: int) -> tuple:
        return (domain.lower(), chassis, self.tray.slot_id, self.tray.host_id, self.device)


@dataclass
class Partition:
    id: str
    pid: int
    name: str
    kind: str
    members: list[Any]            # as given (ID strings or location dicts)
    gpu_ids: list[str]
    created: str
    updated: str
    new: bool = False

    def to_state(self) -> dict[str, Any]:
        return {"ID": self.id, "PartitionID": self.pid, "Name": self.name, "Type": self.kind,
                "Members": self.members, "CreatedAt": self.created, "UpdatedAt": self.updated}

    def copy(self) -> "Partition":
        return Partition(self.id, self.pid, self.name, self.kind, list(self.members), list(self.gpu_ids),
                         self.created, self.updated, self.new)


@dataclass
class Operation:
    id: str
    kind: str
    partition: str
    deltas: dict[str, int]        # gpu id -> partition id it moves to
    status: str = "pending"
    error: str | None = None
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    partition_id: str | None = None
    method: str = "post"          # Request.Method, lower case as in the model
    uri: str = ""                 # Request.URI
    body: Any = None              # Request.Body
    details: str | None = None
    step: str = "queued"
    before: "Partition | None" = None     # what to put back when the operation fails or is cancelled
    pid: int | None = None

    @property
    def cancellable(self) -> bool:
        return self.status == "pending" and self.kind != "CANCEL_OPERATION"

    def to_json(self, base: str) -> dict[str, Any]:
        pct = {"pending": 0.0, "in-progress": 50.0, "completed": 100.0}.get(self.status, 100.0)
        out: dict[str, Any] = {
            "ID": self.id, "CreatedAt": self.created, "UpdatedAt": self.updated, "Status": self.status,
            "Percentage": pct, "CurrentStep": self.step,
            "Request": {"Method": self.method, "URI": self.uri, "Body": self.body, "Cancellable": self.cancellable}}
        if self.status in ("completed", "failed", "cancelled"):
            result: dict[str, Any] = {"Data": None}
            if self.error:
                result["Error"] = self.error
            if self.details:
                result["Details"] = self.details
            out["Result"] = result
        return out


class NMXState:
    """The emulated NMX-M: partitions, operations and the fabric (GPU -> applied partition)."""

    def __init__(self, cfg: Config, log=None):
        self.cfg = cfg
        self.log = log or (lambda msg: None)
        self.lock = threading.RLock()
        self.file_lock = threading.Lock()
        self.gpus: list[Gpu] = []
        for tray in cfg.trays:
            for dev in range(tray.gpus):
                seed = f"{cfg.domain_uuid}/{cfg.chassis_serial}/{tray.slot_id}/{tray.host_id}/{dev}"
                self.gpus.append(Gpu(_object_id(seed), int(hashlib.sha1(seed.encode()).hexdigest()[:15], 16),
                                     tray, dev))
        self.by_id = {g.id: g for g in self.gpus}
        self.by_uid = {str(g.uid): g for g in self.gpus}
        self.by_loc = {g.location_key(cfg.domain_uuid, cfg.chassis_id): g for g in self.gpus}
        self.partitions: dict[int, Partition] = {}
        self.operations: dict[str, Operation] = {}
        self.applied: dict[str, int] = {}
        self.transition: set[str] = set()          # trays whose GPUs are "In Progress"
        self.faults: dict[str, Any] = {}
        self.set_faults(dict(cfg.faults), replace=True)
        self._faults_mtime: tuple[int, int] | None = None
        self.unhang = threading.Event()
        if not self.faults["hang"]:
            self.unhang.set()
        self.queue: "queue.Queue[str | None]" = queue.Queue()
        self.started = _now()
        self._load()
        self.applied = self._assignment()

    # ---- persistence

    def _load(self) -> None:
        path = self.cfg.state_file
        if path is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.log(f"ignoring unreadable state file {path}: {exc}")
            return
        for p in data.get("partitions", []):
            try:
                ids = [g.id for g in self._resolve(p["Members"])[1]]
            except ApiError as exc:
                self.log(f"dropping partition {p.get('Name')!r} from state: {exc.message}")
                continue
            self.partitions[int(p["PartitionID"])] = Partition(
                p["ID"], int(p["PartitionID"]), p["Name"], p["Type"], p["Members"], ids,
                p.get("CreatedAt", _now()), p.get("UpdatedAt", _now()))

    def _save(self) -> None:
        if self.cfg.state_file is None:
            return
        data = {"schema": 1, "domain_uuid": self.cfg.domain_uuid,
                "partitions": [p.to_state() for p in sorted(self.partitions.values(), key=lambda p: p.pid)]}
        atomic_write(self.cfg.state_file, json.dumps(data, indent=2) + "\n")

    # ---- helpers

    def _assignment(self) -> dict[str, int]:
        out = {g.id: DEFAULT_ID for g in self.gpus}
        for p in self.partitions.values():
            for gid in p.gpu_ids:
                out[gid] = p.pid
        return out

    def _find(self, ident: str) -> Partition:
        if ident.isdigit() and int(ident) in self.partitions:
            return self.partitions[int(ident)]
        for p in self.partitions.values():
            if p.id == ident:
                return p
        if ident in (str(DEFAULT_ID), self.default_id):
            raise ApiError(400, "the Default Partition cannot be changed; create, update or delete other partitions")
        raise ApiError(404, f"partition {ident} not found")

    @property
    def default_id(self) -> str:
        return _object_id(f"{self.cfg.domain_uuid}/default-partition")

    def _resolve(self, members: Any) -> tuple[str, list[Gpu]]:
        if not isinstance(members, list) or not members:
            raise ApiError(400, "Members must be a non-empty list")
        kinds = {"LOCATION_BASED" if isinstance(m, dict) else "ID_BASED" if isinstance(m, str) else "?"
                 for m in members}
        if "?" in kinds:
            raise ApiError(400, "a member is a GPU ID (string) or a location (object)")
        if len(kinds) > 1:
            raise ApiError(409, "members mix GPU IDs and locations; a partition uses one member type")
        kind = kinds.pop()
        gpus: list[Gpu] = []
        for m in members:
            if kind == "ID_BASED":
                g = self.by_id.get(m) or self.by_uid.get(m)
                if g is None:
                    raise ApiError(400, f"unknown GPU ID {m}")
            else:
                try:
                    key = (str(m["DomainUUID"]).lower(), int(m["ChassisID"]), int(m["SlotID"]), int(m["HostID"]),
                           int(m["DeviceID"]))
                except (KeyError, TypeError, ValueError):
                    raise ApiError(400, "a location member needs DomainUUID, ChassisID, SlotID, HostID, DeviceID") \
                        from None
                g = self.by_loc.get(key)
                if g is None:
                    raise ApiError(400, f"no GPU at location {m}")
            gpus.append(g)
        if len({g.id for g in gpus}) != len(gpus):
            raise ApiError(400, "a GPU is listed twice")
        return kind, gpus

    def _overlap(self, gpus: list[Gpu], skip: int | None) -> None:
        for p in self.partitions.values():
            if p.pid == skip:
                continue
            common = set(p.gpu_ids) & {g.id for g in gpus}
            if common:
                raise ApiError(409, f"{len(common)} of the GPUs are already in partition {p.name!r} "
                                    f"(PartitionID {p.pid}); a GPU belongs to one partition")

    def _accept(self, kind: str, part: Partition, deltas: dict[str, int], *, method: str, uri: str, body: Any,
                before: Partition | None) -> Operation:
        op = Operation(secrets.token_hex(12), kind, part.name, deltas, partition_id=part.id, method=method, uri=uri,
                       body=body, before=before, pid=part.pid)
        self.operations[op.id] = op
        self.queue.put(op.id)
        return op

    # ---- faults

    FAULT_KEYS = ("fail_next", "status", "fail_all", "hang", "delay_s", "fail_operations", "operation_error",
                  "operation_details", "page_limit", "switch_health", "ports_down", "partition_health")

    def set_faults(self, doc: dict[str, Any], *, replace: bool = False) -> dict[str, Any]:
        """Merge (or replace with) *doc*; unknown keys refused (ValueError)."""
        unknown = sorted(set(doc) - set(self.FAULT_KEYS) - {"clear"})
        if unknown:
            raise ValueError(f"unknown fault keys {unknown}; known: {', '.join(self.FAULT_KEYS)}")
        base = {"fail_next": 0, "status": 500, "fail_all": False, "hang": False, "delay_s": 0.0,
                "fail_operations": 0, "operation_error": "lab-injected-failure",
                "operation_details": "the lab failed this operation on purpose (mctl lab fault / _lab/faults); "
                                     "the fabric did not change", "page_limit": None,
                "switch_health": {}, "ports_down": [], "partition_health": {}}
        current = base if (replace or doc.get("clear")) else dict(self.faults or base)
        types = {"fail_next": int, "status": int, "fail_all": bool, "hang": bool, "delay_s": float,
                 "fail_operations": int, "operation_error": str, "operation_details": str}
        for key, value in doc.items():
            if key == "clear":
                continue
            if key == "page_limit":
                current[key] = None if value is None else int(value)
            elif key == "switch_health":        # {"<switch index from 0>": SwitchNode Health}
                current[key] = {str(int(k)): str(v) for k, v in dict(value).items()}
            elif key == "ports_down":           # [[switch index from 0, switch port number], ...]
                current[key] = [[int(a), int(b)] for a, b in value]
            elif key == "partition_health":     # {"<partition name>": Partition Health}
                current[key] = {str(k): str(v) for k, v in dict(value).items()}
            else:
                current[key] = types[key](value)
        if not 100 <= current["status"] <= 599:
            raise ValueError("status must be an HTTP status code")
        self.faults = current
        if not current["hang"] and hasattr(self, "unhang"):
            self.unhang.set()
        elif hasattr(self, "unhang"):
            self.unhang.clear()
        return dict(current)

    def reload_faults_file(self) -> None:
        """Pick up the lab's faults file when it changed (cheap: one stat per request)."""
        path = self.cfg.faults_file
        if path is None:
            return
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._faults_mtime:
            return
        self._faults_mtime = stamp
        try:
            doc = json.loads(path.read_text()) if stamp else {}
            self.set_faults(doc if isinstance(doc, dict) else {}, replace=True)
            self.log(f"faults from {path}: {doc}")
        except (OSError, ValueError, TypeError) as exc:
            self.log(f"ignoring unreadable faults file {path}: {exc}")

    @property
    def page_limit(self) -> int:
        override = self.faults.get("page_limit")
        return self.cfg.page_limit if override is None else override

    # ---- API operations (called with the lock held)

    def create(self, body: Any) -> Operation:
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object with Name and Members")
        name = body.get("Name")
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
            raise ApiError(400, "Name must be a non-empty string of at most 244 characters")
        if any(not 0x20 <= ord(c) <= 0x7E for c in name):
            raise ApiError(400, "Name must be printable ASCII (the model's pattern ^[\\x20-\\x7E]*$)")
        if name == DEFAULT_NAME:
            raise ApiError(400, f"{DEFAULT_NAME!r} is reserved")
        if any(p.name == name for p in self.partitions.values()):
            raise ApiError(409, f"a partition named {name!r} exists; names are unique in the domain")
        kind, gpus = self._resolve(body.get("Members"))
        self._overlap(gpus, None)
        pid = next((i for i in range(1, MAX_ID + 1) if i not in self.partitions), None)
        if pid is None:
            raise ApiError(409, "no free partition ID (1..32765)")
        now = _now()
        part = Partition(secrets.token_hex(12), pid, name, kind, body["Members"], [g.id for g in gpus], now, now,
                         new=True)
        self.partitions[pid] = part
        self._save()
        return self._accept("CREATE_PARTITION", part, {g.id: pid for g in gpus}, method="post",
                            uri=f"{self.cfg.base_path}/partitions", body=body, before=None)

    def update(self, ident: str, body: Any) -> Operation:
        part = self._find(ident)
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object with Members")
        extra = sorted(set(body) - {"Members"})
        if extra:       # UpdatePartitionRequest: Members only (additionalProperties: false)
            raise ApiError(400, f"unknown fields {extra}: the update body holds Members only; a partition's name "
                                "cannot change")
        kind, gpus = self._resolve(body.get("Members"))
        if kind != part.kind:
            raise ApiError(409, f"partition {part.name!r} is {part.kind}; its members cannot change type")
        self._overlap(gpus, part.pid)
        new_ids = [g.id for g in gpus]
        deltas = {gid: DEFAULT_ID for gid in set(part.gpu_ids) - set(new_ids)}
        deltas.update({gid: part.pid for gid in new_ids})
        before = part.copy()
        part.members, part.gpu_ids, part.updated = body["Members"], new_ids, _now()
        self._save()
        return self._accept("UPDATE_PARTITION", part, deltas, method="put",
                            uri=f"{self.cfg.base_path}/partitions/{part.id}", body=body, before=before)

    def delete(self, ident: str) -> Operation:
        part = self._find(ident)
        del self.partitions[part.pid]
        self._save()
        return self._accept("DELETE_PARTITION", part, {gid: DEFAULT_ID for gid in part.gpu_ids}, method="delete",
                            uri=f"{self.cfg.base_path}/partitions/{part.id}", body=None, before=part.copy())

    def _roll_back(self, op: Operation) -> None:
        """Undo what accepting *op* changed (its fabric change never happened); lock held."""
        if op.kind == "CREATE_PARTITION":
            if op.pid in self.partitions and self.partitions[op.pid].id == op.partition_id:
                del self.partitions[op.pid]
        elif op.before is not None and (op.pid not in self.partitions or
                                        self.partitions[op.pid].id == op.before.id):
            self.partitions[op.before.pid] = op.before.copy()
        self._save()

    def cancel(self, op_id: str) -> Operation:
        op = self.operations.get(op_id)
        if op is None:
            raise ApiError(404, f"operation {op_id} not found")
        if not op.cancellable:
            raise ApiError(409, f"operation {op_id} is {op.status}; only a pending operation can be cancelled")
        op.status, op.updated, op.step = "cancelled", _now(), "cancelled"
        op.error, op.details = "cancelled", f"cancelled by request (DELETE {self.cfg.base_path}/operations/{op_id})"
        self._roll_back(op)
        done = Operation(secrets.token_hex(12), "CANCEL_OPERATION", op.partition, {}, status="completed",
                         method="delete", uri=f"{self.cfg.base_path}/operations/{op_id}", step="done")
        self.operations[done.id] = done
        return done

    # ---- views

    def switches_off(self) -> set[int]:
        """Indexes of the switch trays whose BMC has them powered off (cfg.switch_power_files)."""
        off = set()
        for i, path in enumerate(self.cfg.switch_power_files[:self.cfg.switch_trays]):
            try:
                if path is not None and json.loads(path.read_text()).get("state") == "Off":
                    off.add(i)
            except (OSError, ValueError, AttributeError):
                pass
        return off

    def tray_faults(self, tray: Tray) -> dict[str, Any]:
        if tray.gpus_json is None:
            return {}
        try:
            faults = json.loads((tray.gpus_json.parent / "faults.json").read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return faults if isinstance(faults, dict) else {}

    def tray_health(self, tray: Tray) -> str:
        fabric = self.tray_faults(tray).get("fabric")
        return {"degraded": "DEGRADED", "unhealthy": "UNHEALTHY"}.get(str(fabric), "HEALTHY")

    def gpu_health(self, g: Gpu, faults: dict[str, Any]) -> str:
        """GPU health in the model's words: UNKNOWN|HEALTHY|DEGRADED|NO_NVLINK|DEGRADED_BW."""
        if g.device in (faults.get("gpu_missing") or []):
            return "UNKNOWN"
        fabric = str(faults.get("fabric"))
        if fabric == "unhealthy":
            return "NO_NVLINK"
        if fabric == "degraded":
            return "DEGRADED"
        if any(int(pair[0]) == g.device for pair in faults.get("nvlink_down") or [] if len(pair) == 2):
            return "DEGRADED_BW"
        return "HEALTHY"

    def partition_json(self, p: Partition) -> dict[str, Any]:
        trays = {self.by_id[g].tray.name: self.by_id[g].tray for g in p.gpu_ids}
        health = "NEW" if p.new else _worst([self.tray_health(t) for t in trays.values()]
                                            + [(self.faults.get("partition_health") or {}).get(p.name, "HEALTHY")])
        return {"ID": p.id, "PartitionID": p.pid, "Name": p.name, "Type": p.kind, "Health": health,
                "Members": p.members, "CreatedAt": p.created, "UpdatedAt": p.updated}

    def default_json(self) -> dict[str, Any]:
        taken = {gid for p in self.partitions.values() for gid in p.gpu_ids}
        members = [g.id for g in self.gpus if g.id not in taken]
        return {"ID": self.default_id, "PartitionID": DEFAULT_ID, "Name": DEFAULT_NAME, "Type": "ID_BASED",
                "Health": _worst([self.tray_health(self.by_id[m].tray) for m in members]
                                 + [(self.faults.get("partition_health") or {}).get(DEFAULT_NAME, "HEALTHY")])
                if members else "HEALTHY",
                "Members": members, "CreatedAt": self.started, "UpdatedAt": self.started}

    def partitions_json(self) -> list[dict[str, Any]]:
        return [self.partition_json(p) for p in sorted(self.partitions.values(), key=lambda p: p.pid)] + \
            [self.default_json()]

    def location_info(self, tray: Tray) -> dict[str, Any]:
        return {"ChassisID": self.cfg.chassis_id, "ChassisSerialNumber": self.cfg.chassis_serial,
                "HostID": tray.host_id, "SlotID": tray.slot_id, "TrayIndex": tray.tray_index}

    def system_uid(self, tray: Tray) -> int:
        return int(hashlib.sha1(f"{self.cfg.domain_uuid}/{tray.slot_id}/{tray.host_id}/system".encode())
                   .hexdigest()[:15], 16)

    def gpus_json(self) -> list[dict[str, Any]]:
        """The model's GPU object (additionalProperties: false): nothing it does not list."""
        out = []
        faults = {t.name: self.tray_faults(t) for t in self.cfg.trays}
        for g in self.gpus:
            pid = self.applied.get(g.id, DEFAULT_ID)
            out.append({"ID": g.id, "Name": f"{g.tray.name}/GPU{g.device}", "Description": "",
                        "InternalDescription": f"GPU {g.device} of compute tray {g.tray.tray_index}",
                        "CreatedAt": self.started, "UpdatedAt": self.started, "DomainUUID": self.cfg.domain_uuid,
                        "LocationInfo": self.location_info(g.tray), "DeviceUID": g.uid, "DeviceID": g.device,
                        "DevicePcieID": LAB_PCIE_DEVICE_ID, "SystemUID": self.system_uid(g.tray),
                        "VendorID": NVIDIA_VENDOR_ID, "ALIDList": [], "PartitionID": pid,
                        "PortIDList": [self.port_id(g, n) for n in range(1, PORTS_PER_GPU + 1)],
                        "Health": self.gpu_health(g, faults[g.tray.name])})
        return out

    def port_id(self, g: Gpu, num: int) -> str:
        return _object_id(f"{g.id}/port/{num}")

    def switch_uid(self, index: int) -> int:
        # Port numbers stay below 2**31: the spec says uint64, NVIDIA's generated Rust model reads them as i32.
        return int(hashlib.sha1(f"{self.cfg.domain_uuid}/switch/{index}".encode()).hexdigest()[:7], 16)

    def ports_json(self) -> list[dict[str, Any]]:
        """The GPU side of every NVLink (18 per GPU), in the model's Port shape."""
        out = []
        faults = {t.name: self.tray_faults(t) for t in self.cfg.trays}
        switches_off = self.switches_off()
        ports_down = {(int(a), int(b)) for a, b in self.faults.get("ports_down") or []}
        for gi, g in enumerate(self.gpus):
            down = {int(p[1]) for p in faults[g.tray.name].get("nvlink_down") or []
                    if len(p) == 2 and int(p[0]) == g.device}
            for num in range(1, PORTS_PER_GPU + 1):
                switch = (num - 1) // 2 % max(1, self.cfg.switch_trays)
                peer_num = g.tray.tray_index * 8 + g.device * 2 + (num - 1) % 2 + 1
                link_down = (num - 1) in down or g.device in (faults[g.tray.name].get("gpu_missing") or []) \
                    or switch in switches_off or (switch, peer_num) in ports_down
                out.append({"ID": self.port_id(g, num), "CreatedAt": self.started, "UpdatedAt": self.started,
                            "DomainUUID": self.cfg.domain_uuid, "LocationInfo": self.location_info(g.tray),
                            "Type": "GPU", "PortUID": gi * 100 + num, "PortNum": num,
                            "PeerPortDeviceUID": self.asic_uid(switch, (num - 1) % 2),
                            "PeerPortNum": peer_num,
                            "Rail": num - 1, "Plane": (num - 1) % 2, "PhysicalState":
                            "DISABLED" if link_down else "LINKUP",
                            "LogicalState": "STATE_DOWN" if link_down else "STATE_ACTIVE", "SubnetPrefix": 0,
                            "IsSDNPort": False, "ContainAndDrain": False})
        return out

    def node_id(self, tray: Tray) -> str:
        return _object_id(f"{self.cfg.domain_uuid}/{self.cfg.chassis_serial}/{tray.slot_id}/{tray.host_id}/node")

    def compute_nodes_json(self) -> list[dict[str, Any]]:
        """As the real sample (tests/fixtures/nmx-m-compute-nodes.json): the model's fields plus GpuIDList."""
        out = []
        for tray in self.cfg.trays:
            out.append({"CreatedAt": self.started, "Description": "", "DomainUUID": self.cfg.domain_uuid,
                        "GpuIDList": [g.id for g in self.gpus if g.tray is tray], "Health": self.tray_health(tray),
                        "ID": self.node_id(tray), "LocationInfo": self.location_info(tray), "Name": tray.name,
                        "UpdatedAt": self.started})
        return out

    def switch_nodes_json(self) -> list[dict[str, Any]]:
        first_slot = max([t.slot_id for t in self.cfg.trays if t.slot_id <= 10] or [0]) + 1
        off = self.switches_off()
        return [{"ID": _object_id(f"{self.cfg.domain_uuid}/switch/{i}"), "Name": f"nvsw{i + 1:02d}",
                 "Description": "", "CreatedAt": self.started, "UpdatedAt": self.started,
                 "DomainUUID": self.cfg.domain_uuid, "Health": self.switch_health(i, off),
                 "LocationInfo": {"ChassisID": self.cfg.chassis_id, "ChassisSerialNumber": self.cfg.chassis_serial,
                                  "SlotID": first_slot + i, "TrayIndex": i},
                 "SwitchIDList": [_object_id(f"{self.cfg.domain_uuid}/switch/{i}/asic/{a}") for a in range(2)]}
                for i in range(self.cfg.switch_trays)]

    def switch_health(self, index: int, off: set[int]) -> str:
        """SwitchNode Health: UNHEALTHY when its BMC has it off, else the lab's fault, else HEALTHY."""
        if index in off:
            return "UNHEALTHY"
        return str((self.faults.get("switch_health") or {}).get(str(index), "HEALTHY"))

    def asic_uid(self, index: int, asic: int) -> int:
        """DeviceUID of NVSwitch ASIC *asic* (0, 1) of switch tray *index*; a GPU port of plane p is cabled to ASIC p."""
        if asic == 0:
            return self.switch_uid(index)
        return int(hashlib.sha1(f"{self.cfg.domain_uuid}/switch/{index}/asic/{asic}".encode()).hexdigest()[:7], 16)

    def switches_json(self) -> list[dict[str, Any]]:
        """The model's Switch (additionalProperties: false): the two NVSwitch ASICs of each switch tray."""
        off = self.switches_off()
        first_slot = max([t.slot_id for t in self.cfg.trays if t.slot_id <= 10] or [0]) + 1
        return [{"ID": _object_id(f"{self.cfg.domain_uuid}/switch/{i}/asic/{a}"), "Name": f"nvsw{i + 1:02d}/asic{a}",
                 "Description": "", "InternalDescription": f"NVSwitch {a} of switch tray {i}",
                 "CreatedAt": self.started, "UpdatedAt": self.started, "DomainUUID": self.cfg.domain_uuid,
                 "LocationInfo": {"ChassisID": self.cfg.chassis_id, "ChassisSerialNumber": self.cfg.chassis_serial,
                                  "SlotID": first_slot + i, "TrayIndex": i},
                 "DeviceUID": self.asic_uid(i, a), "DeviceID": a, "DevicePcieID": LAB_PCIE_DEVICE_ID,
                 "SystemUID": self.asic_uid(i, 0), "VendorID": NVIDIA_VENDOR_ID, "PortIDList": [],
                 "Health": self.switch_health(i, off)}
                for i in range(self.cfg.switch_trays) for a in range(2)]

    def chassis_json(self) -> list[dict[str, Any]]:
        return [{"ID": _object_id(f"{self.cfg.domain_uuid}/chassis"), "Name": f"chassis{self.cfg.chassis_id}",
                 "Description": "", "CreatedAt": self.started, "UpdatedAt": self.started,
                 "DomainUUID": self.cfg.domain_uuid, "InternalID": self.cfg.chassis_id,
                 "SerialNumber": self.cfg.chassis_serial,
                 "ComputeNodeIDList": [self.node_id(t) for t in self.cfg.trays],
                 "SwitchNodeIDList": [_object_id(f"{self.cfg.domain_uuid}/switch/{i}")
                                      for i in range(self.cfg.switch_trays)]}]

    # ---- the fabric side

    def worker(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                op_id = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if op_id is None:
                return
            op = self.operations[op_id]
            if stop.wait(self.cfg.operation_delay_s):
                return
            with self.lock:
                if op.status != "pending":          # cancelled while it waited
                    continue
                if self.faults.get("fail_operations", 0) > 0:
                    self.faults["fail_operations"] -= 1
                    op.status, op.updated, op.step = "failed", _now(), "failed"
                    op.error, op.details = self.faults["operation_error"], self.faults["operation_details"]
                    self._roll_back(op)
                    self.log(f"operation {op.id} {op.kind} {op.partition!r} failed (injected)")
                    continue
                op.status, op.updated, op.step = "in-progress", _now(), "applying the partition to the NVLink fabric"
                moving = {gid: pid for gid, pid in op.deltas.items() if self.applied.get(gid) != pid}
                trays = {self.by_id[gid].tray.name: self.by_id[gid].tray for gid in moving}
                self.transition.update(trays)
            for tray in trays.values():
                self.write_tray(tray, in_progress=True)
            if stop.wait(self.cfg.fabric_delay_s):
                return
            with self.lock:
                self.applied.update(op.deltas)
                self.transition.difference_update(trays)
                for p in self.partitions.values():
                    if p.id == op.partition_id:
                        p.new = False
            for tray in trays.values():
                self.write_tray(tray)
            with self.lock:
                op.status, op.updated, op.step = "completed", _now(), "done"
            self.log(f"operation {op.id} {op.kind} {op.partition!r} completed "
                     f"({len(moving)} GPUs moved on {len(trays)} trays)")

    def write_tray(self, tray: Tray, *, in_progress: bool = False, only_if_stale: bool = False) -> bool:
        """Bring a tray's gpus.json in line with the fabric; True when the file changed."""
        if tray.gpus_json is None:
            return False
        with self.file_lock:
            with self.lock:
                if only_if_stale and tray.name in self.transition:
                    return False            # the worker owns this tray until its operation completes
            try:
                data = json.loads(tray.gpus_json.read_text())
            except FileNotFoundError:
                return False
            except (OSError, ValueError) as exc:
                self.log(f"cannot read {tray.gpus_json}: {exc}")
                return False
            with self.lock:
                cliques = {g.device: self.applied.get(g.id, DEFAULT_ID) for g in self.gpus if g.tray is tray}
            entries = data.get("gpus") or []
            first = entries[0].get("index", 0) if entries else 0
            want_state = "In Progress" if in_progress else "Completed"
            changed = data.get("fabric_state") != want_state or data.get("fabric_status") != "Success"
            if not in_progress:
                tray_clique = cliques.get(first, DEFAULT_ID)
                changed |= data.get("clique_id") != tray_clique
                for e in entries:
                    changed |= e.get("clique_id") != cliques.get(e.get("index"), DEFAULT_ID)
            if only_if_stale and not changed:
                return False
            data["fabric_state"] = want_state
            data["fabric_status"] = "Success"
            if not in_progress:
                data["clique_id"] = cliques.get(first, DEFAULT_ID)
                for e in entries:
                    e["clique_id"] = cliques.get(e.get("index"), DEFAULT_ID)
            try:
                atomic_write(tray.gpus_json, json.dumps(data, indent=2) + "\n")
            except OSError as exc:
                self.log(f"cannot write {tray.gpus_json}: {exc}")
                return False
            return True

    def resync(self) -> None:
        with self.lock:
            trays = [t for t in self.cfg.trays if t.name not in self.transition]
        for tray in trays:
            if self.write_tray(tray, only_if_stale=True):
                self.log(f"resynced {tray.name}'s gpus.json with the fabric")


def _worst(values) -> str:
    order = ["HEALTHY", "DEGRADED_BANDWIDTH", "DEGRADED", "UNHEALTHY"]
    worst = "HEALTHY"
    for v in values:
        if order.index(v) > order.index(worst):
            worst = v
    return worst


class Handler(BaseHTTPRequestHandler):
    server_version = "nmx-m-emulator/1"
    protocol_version = "HTTP/1.1"
    emulator: "NMXEmulator"

    def log_message(self, fmt: str, *args: Any) -> None:   # quiet by default; requests go to log_request
        pass

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)
        self.emulator.log(f"{self.command} {self.path} {status}")

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """NMX-M's Error object (httpErrorCode, customErrorCode, description)."""
        self._send(status, {"httpErrorCode": status, "customErrorCode": ERROR_CODES.get(status, "error"),
                            "description": message}, headers)

    def _role(self) -> str | None:
        """"rw" or "ro" for a known user with the right password, else None (Kong's basic-auth plugin)."""
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        role = None
        for name, (want, kind) in self.emulator.state.cfg.users.items():
            if hmac.compare_digest(user.encode(), name.encode()) & hmac.compare_digest(password.encode(),
                                                                                         want.encode()):
                role = kind
        return role

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "body is not JSON") from None

    def _handle(self) -> None:
        try:
            body = self._body()
        except ApiError as exc:
            return self._error(exc.status, exc.message)
        role = self._role()
        if role is None:        # Kong answers these itself, in its own shape
            return self._send(401, {"message": "Unauthorized"}, {"WWW-Authenticate": 'Basic realm="kong"'})
        url = urllib.parse.urlsplit(self.path)
        path = url.path.rstrip("/")
        state = self.emulator.state
        if path == "/_lab/faults":
            return self._faults(body)
        state.reload_faults_file()
        with state.lock:
            faults = dict(state.faults)
            failing = faults["fail_all"] or faults["fail_next"] > 0
            if faults["fail_next"] > 0 and not faults["fail_all"]:
                state.faults["fail_next"] -= 1
        if faults["hang"]:          # read, never answered while the fault lasts (the client's deadline ends it)
            while not state.unhang.wait(0.5):
                if self.emulator.stopping:
                    return
                state.reload_faults_file()
            self.close_connection = True
            return
        if faults["delay_s"]:
            time.sleep(faults["delay_s"])
        if failing:
            return self._error(faults["status"], "injected fault (lab)")
        base = state.cfg.base_path
        if not (path == base or path.startswith(base + "/")):
            return self._error(404, f"no such endpoint {url.path}")
        if role == "ro" and self.command not in ("GET", "HEAD"):
            # The Kong ACL plugin: ro-user's group is allowed the read routes only.
            return self._send(403, {"message": "You cannot consume this service"})
        parts = [p for p in path[len(base):].split("/") if p]
        try:
            self._route(parts, urllib.parse.parse_qs(url.query), body)
        except ApiError as exc:
            self._error(exc.status, exc.message)

    def _faults(self, body: Any) -> None:
        state = self.emulator.state
        with state.lock:
            if self.command == "POST":
                if not isinstance(body, dict):
                    return self._error(400, f"body must be an object of {', '.join(state.FAULT_KEYS)} (or clear)")
                try:
                    state.set_faults(body)
                except (ValueError, TypeError) as exc:
                    return self._error(400, str(exc))
            elif self.command != "GET":
                return self._error(405, "GET or POST")
            current = dict(state.faults)
        self._send(200, current)

    def _page(self, items: list[dict[str, Any]], query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """offset/limit as asked (Pagination: offset >= 0, limit >= 1); unasked, the first page_limit items."""
        try:
            offset = int(query.get("offset", ["0"])[-1])
            limit = int(query["limit"][-1]) if "limit" in query else None
        except ValueError:
            raise ApiError(400, "offset and limit are integers") from None
        if offset < 0 or (limit is not None and limit < 1):
            raise ApiError(400, "offset must be >= 0 and limit >= 1")
        if limit is None:
            limit = self.emulator.state.page_limit or None
        return items[offset:offset + limit] if limit is not None else items[offset:]

    def _route(self, parts: list[str], query: dict[str, list[str]], body: Any) -> None:
        state = self.emulator.state
        method = self.command
        base = state.cfg.base_path
        paged = {"gpus": state.gpus_json, "compute-nodes": state.compute_nodes_json,
                 "switch-nodes": state.switch_nodes_json, "switches": state.switches_json,
                 "chassis": state.chassis_json, "ports": state.ports_json}
        if not parts:
            raise ApiError(404, "no such endpoint")
        head = parts[0]
        if head in paged and method == "GET" and len(parts) <= 2:
            with state.lock:
                items = _filter(paged[head](), query)
                if len(parts) == 2 and parts[1] == "count":
                    return self._send(200, {"total": len(items)})
                if len(parts) == 2:
                    found = next((i for i in items if i.get("ID") == parts[1]), None)
                    if found is None:
                        raise ApiError(404, f"{head} {parts[1]} not found")
                    return self._send(200, found)
                return self._send(200, self._page(items, query))
        if head == "partitions":
            with state.lock:
                if len(parts) == 1 and method == "GET":
                    return self._send(200, state.partitions_json())
                if len(parts) == 1 and method == "POST":
                    op = state.create(body)
                elif len(parts) == 2 and method == "GET":
                    if parts[1] in (str(DEFAULT_ID), state.default_id):
                        return self._send(200, state.default_json())
                    return self._send(200, state.partition_json(state._find(parts[1])))
                elif len(parts) == 2 and method == "PUT":
                    op = state.update(parts[1], body)
                elif len(parts) == 2 and method == "DELETE":
                    op = state.delete(parts[1])
                else:
                    raise ApiError(405 if len(parts) <= 2 else 404, f"{method} not allowed here")
            return self._send(202, {"operationId": op.id}, {"Location": f"{base}/operations/{op.id}"})
        if head == "operations":
            with state.lock:
                if len(parts) == 1 and method == "GET":
                    return self._send(200, [o.to_json(base) for o in state.operations.values()])
                if len(parts) == 2 and method == "DELETE":
                    done = state.cancel(parts[1])
                    return self._send(202, {"operationId": done.id}, {"Location": f"{base}/operations/{done.id}"})
                if len(parts) == 2 and method == "GET":
                    op = state.operations.get(parts[1])
                    if op is None:
                        raise ApiError(404, f"operation {parts[1]} not found")
                    return self._send(200, op.to_json(base))
                raise ApiError(405 if len(parts) <= 2 else 404, f"{method} not allowed here")
        raise ApiError(404, f"no such endpoint /{'/'.join(parts)}")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


def _filter(items: list[dict[str, Any]], query: dict[str, list[str]]) -> list[dict[str, Any]]:
    keys = {"chassisSerialNumber": ("LocationInfo", "ChassisSerialNumber"), "slotID": ("LocationInfo", "SlotID"),
            "trayIndex": ("LocationInfo", "TrayIndex"), "hostID": ("LocationInfo", "HostID"),
            "deviceUID": (None, "DeviceUID"), "domain": (None, "DomainUUID")}
    for param, values in query.items():
        if param not in keys:
            continue
        outer, inner = keys[param]
        items = [i for i in items if str((i.get(outer) or {}).get(inner) if outer else i.get(inner)) in values]
    return items


class NMXEmulator:
    """The HTTP server plus its worker and resync threads; usable in-process (tests) or as the lab's service."""

    def __init__(self, cfg: Config, log_stream=None):
        self._log_stream = log_stream
        self._log_lock = threading.Lock()
        self.state = NMXState(cfg, self.log)
        handler = type("BoundHandler", (Handler,), {"emulator": self})
        self.server = ThreadingHTTPServer((cfg.listen, cfg.port), handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if cfg.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cfg.tls["cert"], cfg.tls["key"])
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{self.scheme}://{host}:{port}{self.state.cfg.base_path}"

    def log(self, message: str) -> None:
        if self._log_stream is None:
            return
        with self._log_lock:
            self._log_stream.write(f"{_now()} nmx-emulator: {message}\n")
            self._log_stream.flush()

    def start(self) -> "NMXEmulator":
        self.state.resync()
        for target in (self.server.serve_forever, lambda: self.state.worker(self._stop), self._resync_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.state.cfg.resync_s):
            self.state.resync()

    def reload_trays(self) -> None:
        """Re-read tray file paths from the config file (SIGHUP)."""
        src = self.state.cfg.source
        if src is None:
            return
        try:
            fresh = Config.load(src)
        except ConfigError as exc:
            self.log(f"reload failed: {exc}")
            return
        paths = {t.name: t.gpus_json for t in fresh.trays}
        with self.state.lock:
            for tray in self.state.cfg.trays:
                if tray.name in paths:
                    tray.gpus_json = paths[tray.name]
        self.log("reloaded tray paths")
        self.state.resync()

    def stop(self) -> None:
        self._stop.set()
        self.state.unhang.set()
        self.state.queue.put(None)
        self.server.shutdown()
        self.server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> "NMXEmulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m mctl.lab.nmx_emulator",
                                     description="NMX-Manager emulator for one rack of the mctl lab.")
    parser.add_argument("--config", required=True, help="JSON config (see the module docstring)")
    parser.add_argument("--log-file", help="append request and operation logs here (default: stderr)")
    args = parser.parse_args(argv)
    try:
        cfg = Config.load(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"nmx-emulator: {exc}\n")
        return 2
    stream = open(args.log_file, "a") if args.log_file else sys.stderr
    try:
        emulator = NMXEmulator(cfg, stream)
    except OSError as exc:
        sys.stderr.write(f"nmx-emulator: cannot listen on {cfg.listen}:{cfg.port}: {exc.strerror}\n")
        return 1
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=emulator.reload_trays, daemon=True).start())
    emulator.start()
    sys.stdout.write(f"nmx-emulator: listening on {emulator.url}\n")
    sys.stdout.flush()
    emulator.log(f"listening on {emulator.url} for domain {cfg.domain_uuid} ({len(cfg.trays)} trays)")
    done.wait()
    emulator.stop()
    emulator.log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
