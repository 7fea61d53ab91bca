"""`mctl bmc inventory`: what every tray's BMC says about the tray (docs/bmc.md).

Per tray, one connection at a time (a GB200 BMC allows at most 4 clients, 2 of
them DPS's), GET only:

    /redfish/v1                                   Vendor, Product, RedfishVersion
    Systems, Systems/{id}                         PowerState, SerialNumber, Model, BiosVersion
    Managers, Managers/{id}                       FirmwareVersion (BMC_0, HGX_BMC_0 = the HMC)
    UpdateService, .../FirmwareInventory/{id}     Version of every firmware item
    Chassis, Chassis/{id}                         SerialNumber, PartNumber, Model, PowerState,
                                                  Oem.Nvidia.ComputeTrayIndex / ChassisPhysicalSlotNumber
    {tray chassis}/PowerSubsystem, ThermalSubsystem, Sensors   Status and the sensor count

Trays are read in parallel threads; each has its own deadline (`bmc.deadline_s`)
enforced from outside, so a BMC that trickles or hangs is reported as timed out
while every other tray goes on.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mctl.bmc.client import ROOT, BMCCredentials, BMCError, RedfishClient, base_url, clean, link
from mctl.errors import EXIT_OK, EXIT_PARTIAL, UsageError

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

SNAPSHOT_KIND = "bmc-inventory"
# ChassisType values that name a whole enclosure; the compute tray's Chassis_0 is a Shelf.
ENCLOSURES = ("Shelf", "RackMount", "Enclosure", "StandAlone", "Sled", "Blade", "Drawer", "Cartridge")
# Firmware inventory ids by what an operator asks for (the real GB200 compute and switch captures).
FIRMWARE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("bmc", re.compile(r"^(FW_BMC_\d+|MGX_FW_BMC_\d+)$")),
    ("bios", re.compile(r"^UEFI$")),
    ("hmc", re.compile(r"^HGX_FW_BMC_\d+$")),
    ("gpu", re.compile(r"^HGX_FW_GPU_\d+$")),
    ("cx", re.compile(r"^CX\d*_\d+$")),
    ("nic", re.compile(r"^NIC_\d+$")),
    ("nvswitch", re.compile(r"^MGX_FW_NVSwitch_\d+$")),
)
# A compute tray's GPUs as its BMC lists them: Chassis/HGX_GPU_0..3 (ChassisType Component), as in the real
# GB200 capture (tests/fixtures/real/redfish/nvidia_gb200); a GPU that is not there reads State Absent.
GPU_CHASSIS = re.compile(r"^HGX_GPU_\d+$")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_DEADLINE_S = 60.0


@dataclass
class TrayBMC:
    host: str
    role: str
    bmc: str | None
    url: str | None = None
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    vendor: str | None = None
    product: str | None = None
    redfish_version: str | None = None
    serial: str | None = None                   # the tray chassis' serial (a swapped tray changes it)
    part_number: str | None = None
    model: str | None = None
    tray_chassis: str | None = None
    tray_index: int | None = None
    slot: int | None = None
    power_state: str | None = None              # the host system's (System_0)
    systems: list[dict[str, Any]] = field(default_factory=list)
    managers: list[dict[str, Any]] = field(default_factory=list)
    chassis: list[dict[str, Any]] = field(default_factory=list)
    firmware: dict[str, str | None] = field(default_factory=dict)
    versions: dict[str, list[str]] = field(default_factory=dict)   # kind -> distinct versions
    power: dict[str, Any] | None = None
    thermal: dict[str, Any] | None = None
    sensors: int | None = None
    firmware_listed: bool = False               # the BMC has a FirmwareInventory (even an empty one)
    requests: int = 0
    tls_handshakes: int = 0                     # full TLS handshakes, and resumed ones
    tls_resumed: int = 0
    elapsed: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def gpus(self) -> list[str]:
        """The GPUs the BMC lists as there (GPU_CHASSIS ids whose State is not Absent)."""
        return sorted((c["id"] for c in self.chassis if GPU_CHASSIS.match(c["id"] or "") and c.get("state") != "Absent"),
                      key=lambda i: int(i.rsplit("_", 1)[1]))


@dataclass
class BMCReport:
    trays: list[TrayBMC]
    elapsed: float
    snapshot_paths: dict[str, str] = field(default_factory=dict)
    changes: dict[str, list[dict[str, str]]] | None = None
    previous: dict[str, str | None] = field(default_factory=dict)

    @property
    def failed(self) -> list[TrayBMC]:
        return [t for t in self.trays if not t.ok]

    @property
    def exit_code(self) -> int:
        return EXIT_PARTIAL if self.failed else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {"trays": [t.to_dict() for t in self.trays], "elapsed": round(self.elapsed, 3),
                "failed": [t.host for t in self.failed], "snapshots": self.snapshot_paths,
                "changes": self.changes, "previous": self.previous}


# ------------------------------------------------------------------ one tray

def _text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise BMCError("malformed", f"{clean(doc.get('@odata.id', '?'))}: {key} is not a value")
    return clean(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _status(doc: dict[str, Any]) -> dict[str, Any]:
    st = doc.get("Status") if isinstance(doc.get("Status"), dict) else {}
    word = lambda v: clean(v, 64) if isinstance(v, str) else None  # noqa: E731
    return {"state": word(st.get("State")), "health": word(st.get("Health")),
            "health_rollup": word(st.get("HealthRollup"))}


def _link_of(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return link(value, f"{doc.get('@odata.id', '?')} {key}") if value is not None else None


def read_tray(client: RedfishClient, tray: TrayBMC) -> None:
    """Fill *tray* from its BMC; raises BMCError on the first thing that cannot be read."""
    root = client.get(ROOT)
    client.use_expand(root)
    tray.vendor, tray.product = _text(root, "Vendor"), _text(root, "Product")
    tray.redfish_version = _text(root, "RedfishVersion")

    systems_link = _link_of(root, "Systems")
    if systems_link is None:
        raise BMCError("malformed", "the service root links no Systems")
    for path, doc in client.member_docs(systems_link, ("Id", "PowerState")):
        tray.systems.append({"id": _text(doc, "Id"), "power_state": _text(doc, "PowerState"),
                             "serial": _text(doc, "SerialNumber"), "model": _text(doc, "Model"),
                             "bios_version": _text(doc, "BiosVersion"), **_status(doc)})
    host_system = next((s for s in tray.systems if s["id"] == "System_0"), tray.systems[0] if tray.systems else None)
    if host_system is not None:
        tray.power_state = host_system["power_state"]

    managers_link = _link_of(root, "Managers")
    if managers_link is not None:
        for path, doc in client.member_docs(managers_link, ("Id", "FirmwareVersion")):
            tray.managers.append({"id": _text(doc, "Id"), "firmware_version": _text(doc, "FirmwareVersion"),
                                  "type": _text(doc, "ManagerType"), "model": _text(doc, "Model"), **_status(doc)})

    read_firmware_inventory(client, root, tray)
    for kind, pattern in FIRMWARE_KINDS:
        found = sorted({v.strip() for k, v in tray.firmware.items() if pattern.match(k) and v and v.strip()})
        if found:
            tray.versions[kind] = found
    if "bios" not in tray.versions and host_system and host_system["bios_version"]:
        tray.versions["bios"] = [host_system["bios_version"]]
    if "hmc" not in tray.versions or tray.versions["hmc"] == ["NA"]:
        hmc = [m["firmware_version"] for m in tray.managers if (m["id"] or "").startswith("HGX_BMC")
               and m["firmware_version"]]
        if hmc:
            tray.versions["hmc"] = sorted(set(hmc))
    if "bmc" not in tray.versions:
        bmc = [m["firmware_version"] for m in tray.managers if m["id"] == "BMC_0" and m["firmware_version"]]
        if bmc:
            tray.versions["bmc"] = bmc

    docs = _read_chassis(client, root, tray)
    main = _tray_chassis(tray)
    if main is not None:
        doc = docs[main["id"]]
        tray.tray_chassis, tray.serial = main["id"], main["serial"]
        tray.part_number, tray.model = main["part_number"], main["model"]
        power_link, thermal_link = _link_of(doc, "PowerSubsystem"), _link_of(doc, "ThermalSubsystem")
        if power_link:
            p = client.get(power_link)
            tray.power = {**_status(p), "capacity_watts": _number(p.get("CapacityWatts"))}
        if thermal_link:
            t = client.get(thermal_link)
            tray.thermal = {**_status(t), "leak_detection": "LeakDetection" in t, "fans": "Fans" in t}
        sensors_link = _link_of(doc, "Sensors")
        if sensors_link:
            tray.sensors = len(client.members(sensors_link))
    if tray.power_state is None and main is not None:
        tray.power_state = main["power_state"]


def read_gpus(client: RedfishClient, tray: TrayBMC) -> None:
    """Only what bring-up asks of a tray that has no GPU tools yet: its chassis (the GPUs, HGX_GPU_n) and
    the tray's serial; raises BMCError on the first thing that cannot be read."""
    root = client.get(ROOT)
    client.use_expand(root)
    tray.vendor, tray.product = _text(root, "Vendor"), _text(root, "Product")
    if _link_of(root, "Chassis") is None:
        raise BMCError("malformed", "the service root links no Chassis")
    _read_chassis(client, root, tray)
    main = _tray_chassis(tray)
    if main is not None:
        tray.tray_chassis, tray.serial = main["id"], main["serial"]
        tray.part_number, tray.model = main["part_number"], main["model"]


def _read_chassis(client: RedfishClient, root: dict[str, Any], tray: TrayBMC) -> dict[str, dict[str, Any]]:
    """Every chassis into tray.chassis (and the tray index); the documents by id."""
    chassis_link = _link_of(root, "Chassis")
    docs: dict[str, dict[str, Any]] = {}
    if chassis_link is not None:
        for path, doc in client.member_docs(chassis_link, ("Id", "ChassisType")):
            cid = _text(doc, "Id") or path.rsplit("/", 1)[-1]
            docs[cid] = doc
            oem = doc.get("Oem", {}).get("Nvidia", {}) if isinstance(doc.get("Oem"), dict) else {}
            oem = oem if isinstance(oem, dict) else {}
            tray.chassis.append({"id": cid, "type": _text(doc, "ChassisType"), "serial": _text(doc, "SerialNumber"),
                                 "part_number": _text(doc, "PartNumber"), "model": _text(doc, "Model"),
                                 "power_state": _text(doc, "PowerState"), **_status(doc)})
            if tray.tray_index is None and _int(oem.get("ComputeTrayIndex")) is not None:
                tray.tray_index = _int(oem.get("ComputeTrayIndex"))
                tray.slot = _int(oem.get("ChassisPhysicalSlotNumber"))
    return docs


def read_firmware_inventory(client: RedfishClient, root: dict[str, Any], tray: TrayBMC) -> None:
    """Every item of UpdateService/FirmwareInventory into tray.firmware (id -> Version)."""
    update_link = _link_of(root, "UpdateService")
    if update_link is None:
        return
    fw_link = _link_of(client.get(update_link), "FirmwareInventory")
    if fw_link is None:
        return
    tray.firmware_listed = True
    for path, doc in client.member_docs(fw_link, ("Id", "Version")):
        fid = _text(doc, "Id") or path.rsplit("/", 1)[-1]
        tray.firmware[fid] = _text(doc, "Version")


def read_firmware(client: RedfishClient, tray: TrayBMC) -> None:
    """Only what a firmware baseline needs (mctl audit, mctl image diff): the root and FirmwareInventory."""
    root = client.get(ROOT)
    client.use_expand(root)
    tray.vendor, tray.product = _text(root, "Vendor"), _text(root, "Product")
    read_firmware_inventory(client, root, tray)
    if not tray.firmware_listed:
        raise BMCError("malformed", "the BMC lists no UpdateService/FirmwareInventory")


def _tray_chassis(tray: TrayBMC) -> dict[str, Any] | None:
    """The chassis that is the tray: an enclosure type, else the one carrying the host system's serial."""
    for c in tray.chassis:
        if c["type"] in ENCLOSURES:
            return c
    serials = {s["serial"] for s in tray.systems if s["serial"]}
    same = [c for c in tray.chassis if c["serial"] in serials]
    # The switch tray: SYS_eeprom (Module), MGX_NVSwitch_0 and System_0 (Components) share the serial.
    return next((c for c in same if c["type"] != "Component"), same[0] if same else None)


# ------------------------------------------------------------------ the run

@dataclass(frozen=True)
class Settings:
    credentials: BMCCredentials
    verify_tls: bool | str = True
    scheme: str = "https"
    port: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    deadline_s: float = DEFAULT_DEADLINE_S
    concurrency: int = 32


def settings_for(site: "Site") -> Settings:
    """The site's `bmc` section as client settings (the credentials file read and checked)."""
    from mctl.bmc.client import load_credentials

    spec = getattr(site, "bmc", None)
    if spec is None:
        raise UsageError("the inventory has no bmc section: mctl does not know the BMC credentials",
                         hint="add 'bmc: {credentials_file: secrets/bmc.cred}' to mctl.yml (docs/bmc.md)")
    cred = Path(spec.credentials_file).expanduser()
    if not cred.is_absolute():
        cred = site.root / cred
    verify = spec.verify_tls
    if isinstance(verify, str) and not Path(verify).expanduser().is_absolute():
        verify = str(site.root / verify)
    return Settings(load_credentials(cred), verify_tls=verify, scheme=spec.scheme, port=spec.port,
                    timeout_s=spec.timeout_s, deadline_s=spec.deadline_s, concurrency=spec.concurrency)


def collect(hosts: list["Host"], settings: Settings, *, timeout_s: float | None = None,
            warn: Callable[[str], None] | None = None,
            reader: Callable[[RedfishClient, TrayBMC], None] = read_tray) -> list[TrayBMC]:
    """Read every host's BMC with *reader* (the whole tray, or only its firmware: read_firmware);
    each within its own deadline. Never raises for one tray's trouble."""
    deadline_s = timeout_s or settings.deadline_s
    warned: list[str] = []
    lock = threading.Lock()

    def once(message: str) -> None:             # one warning per run, not one per tray
        with lock:
            if warned:
                return
            warned.append(message)
        (warn or _stderr)(message)

    def work(tray: TrayBMC, done: threading.Event) -> None:
        start = time.monotonic()
        client = None
        try:
            client = RedfishClient(tray.url or "", settings.credentials, verify_tls=settings.verify_tls,
                                   timeout_s=min(settings.timeout_s, deadline_s),
                                   deadline=start + deadline_s, warn=once)
            reader(client, tray)
            tray.ok = True
        except BMCError as exc:
            tray.error_kind, tray.error = exc.kind, exc.message
        except UsageError as exc:
            tray.error_kind, tray.error = "config", exc.message
        except Exception as exc:                # a document shape mctl did not expect: that tray, not the run
            tray.error_kind, tray.error = "malformed", f"unexpected answer ({type(exc).__name__})"
        finally:
            if client is not None:
                tray.requests = client.requests
                tray.tls_handshakes, tray.tls_resumed = client.tls_handshakes, client.tls_resumed
                client.close()
            tray.elapsed = round(time.monotonic() - start, 3)
            done.set()

    results: list[TrayBMC] = []
    queue: list[tuple[int, TrayBMC]] = []
    for i, h in enumerate(hosts):
        tray = TrayBMC(h.name, h.role, h.bmc)
        results.append(tray)
        if not h.bmc:
            tray.error_kind, tray.error = "config", "no BMC address in the inventory"
        else:
            tray.url = base_url(h.bmc, scheme=settings.scheme, port=settings.port)
            queue.append((i, tray))
    pending: list[tuple[int, TrayBMC, threading.Event, float]] = []
    while queue or pending:
        while queue and len(pending) < max(1, settings.concurrency):
            i, template = queue.pop(0)
            # The worker fills its own copy; only a finished copy replaces the result, so a worker
            # abandoned at its deadline cannot change the report afterwards.
            mine = TrayBMC(template.host, template.role, template.bmc, url=template.url)
            done = threading.Event()
            threading.Thread(target=work, args=(mine, done), name=f"bmc-{mine.host}", daemon=True).start()
            pending.append((i, mine, done, time.monotonic() + deadline_s + 1.0))
        pending[0][2].wait(0.05)
        now = time.monotonic()
        for item in list(pending):
            i, mine, done, until = item
            if done.is_set():
                results[i] = mine
                pending.remove(item)
            elif now >= until:                  # stuck in a read the library cannot interrupt: leave it
                results[i].error_kind = "timeout"
                results[i].error = f"no complete answer within {deadline_s:g}s"
                results[i].elapsed = round(deadline_s + 1.0, 3)
                pending.remove(item)
    return results


def _stderr(message: str) -> None:
    import sys
    sys.stderr.write(f"mctl: warning: {message}\n")


# ------------------------------------------------------------------ snapshots and diff

def snapshot_doc(tray: TrayBMC) -> dict[str, Any]:
    return {"host": tray.host, "ok": tray.ok, "serial": tray.serial, "tray_chassis": tray.tray_chassis,
            "chassis_serials": {c["id"]: c["serial"] for c in tray.chassis if c["serial"]},
            "firmware": dict(tray.firmware), "power_state": tray.power_state}


def diff_trays(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, str]]:
    """What changed on one tray between two snapshots (trays that were not read are not compared)."""
    changes: list[dict[str, str]] = []
    if not old.get("ok") or not new.get("ok"):
        return changes
    if old.get("serial") != new.get("serial"):
        changes.append({"host": new["host"], "kind": "serial",
                        "message": f"tray serial {old.get('serial')} -> {new.get('serial')} (tray swapped)"})
    for kind, key in (("chassis", "chassis_serials"), ("firmware", "firmware")):
        a, b = old.get(key) or {}, new.get(key) or {}
        for item in sorted(set(a) | set(b)):
            if a.get(item) != b.get(item):
                if kind == "chassis" and item == new.get("tray_chassis"):
                    continue                    # said above as the tray serial
                what = "serial" if kind == "chassis" else "version"
                changes.append({"host": new["host"], "kind": kind,
                                "message": f"{item} {what} {a.get(item, 'absent')} -> {b.get(item, 'absent')}"})
    if old.get("power_state") != new.get("power_state"):
        changes.append({"host": new["host"], "kind": "power",
                        "message": f"power {old.get('power_state')} -> {new.get('power_state')}"})
    return changes


def run_inventory(site: "Site", hosts: list["Host"], *, state_dir: str | Path, save: bool = True, diff: bool = False,
                  timeout_s: float | None = None, settings: Settings | None = None) -> BMCReport:
    from mctl.state.snapshots import latest_snapshot, save_snapshot

    settings = settings or settings_for(site)
    start = time.monotonic()
    trays = collect(hosts, settings, timeout_s=timeout_s)
    report = BMCReport(trays, time.monotonic() - start)
    by_rack: dict[str, list[TrayBMC]] = {}
    for h, t in zip(hosts, trays):
        by_rack.setdefault(h.rack or "site", []).append(t)
    if diff:
        report.changes = {}
    for rack, members in by_rack.items():
        previous = latest_snapshot(state_dir, SNAPSHOT_KIND, rack) if (diff or save) else None
        if diff:
            report.previous[rack] = str(previous.path) if previous else None
            if previous is not None:
                old = {d.get("host"): d for d in (previous.data or {}).get("trays", []) if isinstance(d, dict)}
                report.changes[rack] = [c for t in members if t.host in old
                                        for c in diff_trays(old[t.host], snapshot_doc(t))]
        if save:
            # A tray not read this time keeps its last good reading, so the next --diff still compares it.
            docs = {t.host: snapshot_doc(t) for t in members}
            if previous is not None:
                for d in (previous.data or {}).get("trays", []):
                    if isinstance(d, dict) and d.get("ok") and d.get("host") in docs and not docs[d["host"]]["ok"]:
                        docs[d["host"]] = d
            path = save_snapshot(state_dir, SNAPSHOT_KIND, rack,
                                 {"taken_at": datetime.now(timezone.utc).isoformat(), "trays": list(docs.values())})
            report.snapshot_paths[rack] = str(path)
    return report
