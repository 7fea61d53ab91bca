"""One lab tray's BMC: OpenStack's sushy-tools Redfish emulator, shaped like a real GB200 tray BMC.

`python -m mctl.lab.bmc_emulator CONFIG.json` (started by `mctl lab up`, one process per tray on the
tray's own BMC address, port 443, TLS from the lab's CA, HTTP Basic from a bcrypt htpasswd file).

What sushy-tools does here: the web application (Flask), authentication (its Basic middleware over an
htpasswd file), routing, its error documents, `Systems`, `Systems/{id}` and the
`ComputerSystem.Reset` action, all through a systems driver of mctl's (`LabSystemsDriver`) that acts on
the lab tray: ForceOff / GracefulShutdown stop the tray's host (SSH, Slurm and IMEX go away), On boots
it again (a new boot id), PowerCycle / ForceRestart / GracefulRestart do both. It also takes the tray
OS's own `systemctl reboot` (the lab's systemctl leaves a request in the host, mctl.lab.hosts
REBOOT_REQUEST): off, then on, logged as the power event `OSReboot` (a lab host cannot restart itself).

What sushy-tools lacks, added here (docs/decisions.md, D42): the resource tree and ids of the
real GB200 compute-tray capture (tests/fixtures/real/redfish/nvidia_gb200: service root, `BMC_0` and
`HGX_BMC_0` managers, `Chassis_0` and the other chassis, `UpdateService/FirmwareInventory` with the
`FW_*`/`HGX_FW_*` ids, PowerSubsystem, ThermalSubsystem, Sensors), per tray (serial numbers, tray
index and slot, power state), plus `Chassis_0/ThermalSubsystem/LeakDetection` with its four leak
detectors (ids and fields of the capture, docs: ../shared/reference/redfish.md) and
`Systems/System_0/ResetActionInfo` with the capture's allowed ResetType values. sushy-tools picks its
systems backend from a hard-coded list (`Application.systems`); that property is replaced here, the
only way to give it a driver of one's own.

A switch tray's BMC (config `"kind": "switch"`, `mctl lab up --switch-trays N`) serves the real switch
tray capture (tests/fixtures/real/redfish/nvidia_gbswitch) the same way, with `SwitchSystemsDriver`: no
host stands behind it, so its power state is the BMC's own (bmc/power.json, which the rack's NMX-M
emulator reads too); its leak detectors are the capture's, under `Chassis/MGX_BMC_0`. Every BMC logs
its power steps with their times (bmc/power-events.jsonl).

The HTTP server is mctl's (mctl/lab/bmc_http.py: HTTP/1.1, connections kept between requests as a real
BMC keeps them), not Werkzeug's development server, which closes every connection (docs/decisions.md,
D78).

Faults (`mctl lab fault bmc TRAY ...`, mctl/lab/bmc_faults.py): a leak or a failed supply is laid over
the documents served; a hung or slow BMC is a WSGI middleware outside sushy-tools' own (authentication
too), asked on every request, so a kept connection opened before the fault is held as a new one.

Power semantics as on a real tray: a Reset is answered 204 at once and runs in the background;
PowerState says PoweringOff / PoweringOn meanwhile; a second Reset while one runs gets 409. A
GracefulShutdown (or GracefulRestart) of a tray whose OS does not answer (`mctl lab fault host --freeze`)
does nothing, as an ACPI request to a hung OS does; ForceOff always works.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from mctl.lab import bmc_faults
from mctl.lab.bmcs import SWITCH_POWER_FILE

CAPTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "real" / "redfish" / "nvidia_gb200"
SWITCH_CAPTURE = CAPTURE.parent / "nvidia_gbswitch"
ROOT = "/redfish/v1"
HOST_SYSTEM = "System_0"
# The capture's System_0 ResetActionInfo (shared/reference/redfish.md, "Power actions").
RESET_TYPES = ("ForceOff", "PowerCycle", "Nmi", "GracefulShutdown", "On", "ForceOn", "GracefulRestart",
               "ForceRestart")
# The switch tray's System_0 (the NVOS host): the same, no Nmi (shared/reference/redfish.md, "Power actions").
SWITCH_RESET_TYPES = tuple(t for t in RESET_TYPES if t != "Nmi")
# Chassis that keep standby power when the host is off (the BMC and its root of trust; the switch
# tray's BMC board and its EEPROM).
STANDBY_CHASSIS = ("BMC_0", "ERoT_BMC_0", "MGX_BMC_0", "BMC_eeprom")
SWITCH_STEP_S = 0.5     # how long a lab switch tray reads PoweringOff / PoweringOn
LEAK_DETECTORS = bmc_faults.COMPUTE.detectors
LOG = logging.getLogger("mctl-lab-bmc")


# ------------------------------------------------------------------ the resource tree

def load_tree(capture: Path = CAPTURE) -> dict[str, dict[str, Any]]:
    """Every captured document by its path (`/redfish/v1/X`), as Mockup Creator stored it (`X/index.json`)."""
    tree: dict[str, dict[str, Any]] = {}
    base = capture / "redfish" / "v1"
    for f in sorted(base.rglob("index.json")):
        rel = f.parent.relative_to(base).as_posix()
        tree[ROOT if rel == "." else f"{ROOT}/{rel}"] = json.loads(f.read_text())
    if ROOT not in tree:
        raise SystemExit(f"mctl lab bmc: no Redfish capture under {capture}")
    return tree


def serial_for(tray_id: str, item: str) -> str:
    """A per-tray serial in the capture's style (a swapped tray changes it; a restart does not)."""
    return "0x" + hashlib.sha256(f"{tray_id}/{item}".encode()).hexdigest()[:16].upper()


def add_missing(tree: dict[str, dict[str, Any]], kind: str = "compute") -> None:
    """Resources the capture links and mctl reads that were not captured (or sushy-tools lacks)."""
    if kind == "switch":
        _reset_action_info(tree, SWITCH_RESET_TYPES)
        return
    leak = f"{ROOT}/Chassis/Chassis_0/ThermalSubsystem/LeakDetection"
    tree.setdefault(leak, {
        "@odata.id": leak, "@odata.type": "#LeakDetection.v1_0_1.LeakDetection", "Id": "LeakDetection",
        "Name": "Leak Detection Systems", "LeakDetectors": {"@odata.id": f"{leak}/LeakDetectors"},
        "Status": {"Health": "OK", "State": "Enabled"}})
    tree.setdefault(f"{leak}/LeakDetectors", {
        "@odata.id": f"{leak}/LeakDetectors", "@odata.type": "#LeakDetectorCollection.LeakDetectorCollection",
        "Name": "Leak Detector Collection", "Members@odata.count": len(LEAK_DETECTORS),
        "Members": [{"@odata.id": f"{leak}/LeakDetectors/{d}"} for d in LEAK_DETECTORS]})
    for d in LEAK_DETECTORS:
        tree.setdefault(f"{leak}/LeakDetectors/{d}", {
            "@odata.id": f"{leak}/LeakDetectors/{d}", "@odata.type": "#LeakDetector.v1_1_0.LeakDetector",
            "Id": d, "Name": d.replace("_", " "), "DetectorState": "OK", "LeakDetectorType": "Moisture",
            "Status": {"Health": "OK", "State": "Enabled"}})
    _reset_action_info(tree, RESET_TYPES)


def _reset_action_info(tree: dict[str, dict[str, Any]], types: tuple[str, ...]) -> None:
    info = f"{ROOT}/Systems/{HOST_SYSTEM}/ResetActionInfo"
    tree.setdefault(info, {
        "@odata.id": info, "@odata.type": "#ActionInfo.v1_2_0.ActionInfo", "Id": "ResetActionInfo",
        "Name": "Reset Action Info",
        "Parameters": [{"AllowableValues": list(types), "DataType": "String", "Name": "ResetType",
                        "Required": True}]})


def personalize(doc: dict[str, Any], *, tray_id: str, tray_index: int, slot: int, power: str,
                serial_by_value: bool = False) -> dict[str, Any]:
    """The captured document as this tray's BMC answers it now. *serial_by_value*: a captured serial
    shared by several resources stays shared (the switch tray's SYS_eeprom, System_0 and its chassis
    carry one serial, which is how mctl finds the tray's chassis)."""
    out = json.loads(json.dumps(doc))
    item = str(out.get("Id") or out.get("@odata.id"))
    if isinstance(out.get("SerialNumber"), str) and out["SerialNumber"].strip():
        out["SerialNumber"] = serial_for(tray_id, out["SerialNumber"] if serial_by_value else item)
    oem = (out.get("Oem") or {}).get("Nvidia") if isinstance(out.get("Oem"), dict) else None
    if isinstance(oem, dict) and "ComputeTrayIndex" in oem:
        oem["ComputeTrayIndex"] = tray_index
        oem["ChassisPhysicalSlotNumber"] = slot
    odata = str(out.get("@odata.id", ""))
    if "PowerState" in out and (odata.startswith(f"{ROOT}/Chassis/") or odata.startswith(f"{ROOT}/Systems/")) \
            and out.get("Id") not in STANDBY_CHASSIS:
        out["PowerState"] = power
    return out


# ------------------------------------------------------------------ the systems driver

def _driver_base():
    from sushy_tools.emulator.resources.systems.base import AbstractSystemsDriver
    return AbstractSystemsDriver


class LabSystemsDriver(_driver_base()):  # type: ignore[misc]
    """sushy-tools systems driver acting on one lab tray (mctl.lab.host_faults power_off / power_on)."""

    def __init__(self, config: dict[str, Any], tree: dict[str, dict[str, Any]]):
        self._config = config
        self._tree = tree
        self._ids = [p.rsplit("/", 1)[-1] for p in
                     (m["@odata.id"] for m in tree[f"{ROOT}/Systems"].get("Members", []))]
        self._lock = threading.Lock()
        self._transition: str | None = None          # PoweringOn / PoweringOff while a Reset runs
        self._boot = {i: "Hdd" for i in self._ids}
        self._lab_cache = None

    # -- the lab tray
    def _lab(self):
        """The lab's record and the tray, read once (the lab's shape does not change while it is up)."""
        if self._lab_cache is None:
            from mctl.lab import host_faults, labdir

            files = labdir.LabFiles(Path(self._config["lab_dir"]))
            record = labdir.load_record(files.dir) or {}
            layout = labdir.layout_of(record)
            host = layout.host(self._config["tray"])
            if host is None:
                raise RuntimeError(f"{self._config['tray']} is not in the lab record")
            self._lab_cache = (host_faults, files, layout, record, host)
        return self._lab_cache

    def host_power(self) -> str:
        with self._lock:
            if self._transition:
                return self._transition
        host_faults, files, _layout, _record, host = self._lab()
        return "On" if host_faults.host_running(files, host) else "Off"

    # -- AbstractSystemsDriver
    @property
    def driver(self) -> str:
        return "<mctl lab tray>"

    @property
    def systems(self) -> list[str]:
        return list(self._ids)

    def uuid(self, identity: str) -> str:
        from sushy_tools import error
        if identity not in self._ids:
            raise error.NotFound(f"no system {identity}")
        return identity

    def name(self, identity: str) -> str:
        return self.uuid(identity)

    def get_power_state(self, identity: str) -> str:
        self.uuid(identity)
        return self.host_power()

    reset_types = RESET_TYPES

    def _check_reset(self, identity: str, state: str) -> None:
        from sushy_tools import error

        if self.uuid(identity) != HOST_SYSTEM:
            raise error.BadRequest(f"{identity} has no Reset action")
        if state not in self.reset_types:
            raise error.BadRequest(f"ResetType {state!r} is not one of {', '.join(self.reset_types)}")

    def set_power_state(self, identity: str, state: str) -> None:
        from sushy_tools import error

        self._check_reset(identity, state)
        host_faults, files, layout, record, host = self._lab()
        with self._lock:
            if self._transition:
                raise error.FishyError(f"a reset is already in progress ({self._transition})", code=409)
            running = host_faults.host_running(files, host)
            frozen = host_faults.host_frozen(files, host)
            plan: list[str] = []
            if state in ("On", "ForceOn"):
                plan = [] if running else ["on"]
            elif state == "ForceOff":
                plan = ["force-off"] if running else []
            elif state == "GracefulShutdown":
                plan = ["off"] if running and not frozen else []
            elif state in ("PowerCycle", "ForceRestart"):
                plan = (["force-off"] if running else []) + ["on"]
            elif state == "GracefulRestart":
                plan = ["off", "on"] if running and not frozen else []
            if running and frozen and state.startswith("Graceful"):
                LOG.warning("%s: %s not answered: the OS does not respond", host.name, state)
            if not plan:
                LOG.info("%s: %s: nothing to do", host.name, state)
                return
            self._transition = "PoweringOn" if plan[0] == "on" else "PoweringOff"
        threading.Thread(target=self._run, args=(state, plan), name=f"reset-{state}", daemon=True).start()

    def _run(self, state: str, plan: list[str]) -> None:
        try:
            host_faults, files, layout, record, host = self._lab()
            for step in plan:
                with self._lock:
                    self._transition = "PoweringOn" if step == "on" else "PoweringOff"
                LOG.info("%s: %s: %s", host.name, state, step)
                power_event(self._config, state, step, "start")
                if step == "on":
                    host_faults.power_on(files, layout, record, host)
                else:
                    host_faults.power_off(files, host, force=step == "force-off")
                power_event(self._config, state, step, "done")
        except Exception:                           # the state read next says what the tray is
            LOG.exception("%s failed", state)
        finally:
            with self._lock:
                self._transition = None

    def watch_os_reboots(self, every: float = 0.5) -> threading.Thread:
        """Take the tray OS's reboot requests (its `systemctl reboot`) for as long as the BMC runs."""
        import time

        def loop() -> None:
            while True:
                time.sleep(every)
                try:
                    self.take_os_reboot()
                except Exception:                   # the next look tries again; the BMC goes on serving
                    LOG.exception("reading the OS's reboot request failed")

        thread = threading.Thread(target=loop, name="os-reboot", daemon=True)
        thread.start()
        return thread

    def take_os_reboot(self) -> bool:
        """When the host asked for a reboot: take the request (the host's systemctl returns) and restart it."""
        from mctl.errors import EnvironmentProblem
        from mctl.lab import hosts

        control, files, _layout, _record, host = self._lab()
        try:
            request = hosts.host_path(files.dir, host.name, hosts.REBOOT_REQUEST)
        except EnvironmentProblem:
            return False                            # the host is off
        if not request.exists():
            return False
        with self._lock:
            if self._transition:
                return False                        # a Reset is running: the request goes with the host
            self._transition = "PoweringOff"
        request.unlink(missing_ok=True)
        LOG.info("%s: the OS asked for a reboot", host.name)
        threading.Thread(target=self._run, args=("OSReboot", ["off", "on"]), name="os-reboot-run",
                         daemon=True).start()
        return True

    def get_boot_device(self, identity: str) -> str:
        return self._boot[self.uuid(identity)]

    def set_boot_device(self, identity: str, boot_source: str) -> None:
        self._boot[self.uuid(identity)] = boot_source

    def get_versions(self, identity: str) -> dict[str, str]:
        bios = self._tree.get(f"{ROOT}/Systems/{self.uuid(identity)}", {}).get("BiosVersion")
        return {"BiosVersion": bios} if bios else {}


def power_event(config: dict[str, Any], reset: str, step: str, phase: str) -> None:
    """One line of the BMC's power log (bmc/power-events.jsonl next to its config): what it did, when."""
    import time

    from mctl.lab.bmcs import POWER_EVENTS, tray_bmc_dir

    line = json.dumps({"t": time.time(), "tray": config["tray"], "reset": reset, "step": step, "phase": phase})
    try:
        with open(tray_bmc_dir(Path(config["lab_dir"]), config["tray"]) / POWER_EVENTS, "a") as f:
            f.write(line + "\n")
    except OSError:
        LOG.warning("cannot log the power event %s", line)


class SwitchSystemsDriver(LabSystemsDriver):
    """A lab switch tray's System_0 (the NVOS host). No host stands behind it: the power state is the
    BMC's own, kept in bmc/power.json (the NMX-M emulator reads it: a switch tray that is off has its
    NVLink switches down). A Reset reads PoweringOff / PoweringOn for a moment, then Off / On."""

    def _state_file(self) -> Path:
        from mctl.lab.bmcs import tray_bmc_dir
        return tray_bmc_dir(Path(self._config["lab_dir"]), self._config["tray"]) / SWITCH_POWER_FILE

    def _stored(self) -> str:
        try:
            return "Off" if json.loads(self._state_file().read_text()).get("state") == "Off" else "On"
        except (OSError, ValueError, AttributeError):
            return "On"

    def _store(self, state: str) -> None:
        import time

        from mctl.state.files import atomic_write
        atomic_write(self._state_file(), json.dumps({"state": state, "changed_at": time.time()}) + "\n")

    def host_power(self) -> str:
        with self._lock:
            if self._transition:
                return self._transition
        return self._stored()

    reset_types = SWITCH_RESET_TYPES

    def set_power_state(self, identity: str, state: str) -> None:
        from sushy_tools import error

        self._check_reset(identity, state)
        with self._lock:
            if self._transition:
                raise error.FishyError(f"a reset is already in progress ({self._transition})", code=409)
            on = self._stored() == "On"
            if state in ("On", "ForceOn"):
                plan = [] if on else ["on"]
            elif state in ("ForceOff", "GracefulShutdown"):
                plan = ["off"] if on else []
            else:                                   # PowerCycle, ForceRestart, GracefulRestart
                plan = (["off"] if on else []) + ["on"]
            if not plan:
                LOG.info("%s: %s: nothing to do", self._config["tray"], state)
                return
            self._transition = "PoweringOn" if plan[0] == "on" else "PoweringOff"
        threading.Thread(target=self._run, args=(state, plan), name=f"reset-{state}", daemon=True).start()

    def _run(self, state: str, plan: list[str]) -> None:
        import time

        try:
            for step in plan:
                with self._lock:
                    self._transition = "PoweringOn" if step == "on" else "PoweringOff"
                LOG.info("%s: %s: %s", self._config["tray"], state, step)
                power_event(self._config, state, step, "start")
                time.sleep(SWITCH_STEP_S)
                self._store("On" if step == "on" else "Off")
                power_event(self._config, state, step, "done")
        except Exception:
            LOG.exception("%s failed", state)
        finally:
            with self._lock:
                self._transition = None


def switch_powered_off(lab_dir: Path, name: str) -> bool:
    """Whether the lab switch tray *name*'s BMC has it off (for the NMX-M emulator)."""
    from mctl.lab.bmcs import tray_bmc_dir
    try:
        return json.loads((tray_bmc_dir(Path(lab_dir), name) / SWITCH_POWER_FILE).read_text()).get("state") == "Off"
    except (OSError, ValueError, AttributeError):
        return False


# ------------------------------------------------------------------ the service

class FleetTraySystemsDriver(SwitchSystemsDriver):
    """A fleet-mode compute tray's System_0 (docs/lab.md, "Fleet mode"): the tray's OS is one identity of
    its rack's shared host, which no single tray's Reset can stop, so the power state is the BMC's own
    (bmc/power.json, as a switch tray's), with the compute tray's ResetTypes."""

    reset_types = RESET_TYPES


class _Unit:
    """One BMC served by the app: its config, systems driver, faults, firmware overrides and stall wrapper."""

    def __init__(self, config: dict[str, Any], tree: dict[str, dict[str, Any]]):
        kind = config.get("kind", "compute")
        self.config, self.tree, self.kind = config, tree, kind
        if kind == "switch":
            self.driver: LabSystemsDriver = SwitchSystemsDriver(config, tree)
        elif config.get("power_model") == "bmc":
            self.driver = FleetTraySystemsDriver(config, tree)
        else:
            self.driver = LabSystemsDriver(config, tree)
            if config.get("watch_os_reboots", True):
                self.driver.watch_os_reboots()
        self.tray_id = f"{config.get('lab', 'lab')}/{config['tray']}"
        self.fault = bmc_faults.Watched(bmc_faults.faults_path(Path(config["lab_dir"]), config["tray"]))
        self.firmware = FirmwareOverrides(config.get("firmware_file"))
        self.stall = None
        from mctl.lab.bmc_events import Subscriptions
        self.events = Subscriptions()               # its EventService subscriptions (mctl/lab/bmc_events.py)


def build_app(config: dict[str, Any] | list[dict[str, Any]], tree: dict[str, dict[str, Any]] | None = None):
    """sushy-tools' Flask app with the GB200 resources it lacks, answering as the BMC of *config*, or, given
    a list (fleet mode: one process per rack), as each BMC of the list: a request is that BMC's whose
    address it reached (the WSGI SERVER_NAME bmc_http sets to the listening address)."""
    import flask
    from sushy_tools import error
    from sushy_tools.emulator import api_utils
    from sushy_tools.emulator import main as st

    configs = config if isinstance(config, list) else [config]
    if not configs:
        raise ValueError("no BMC to serve")
    trees: dict[str, dict[str, dict[str, Any]]] = {}
    for c in configs:
        kind = c.get("kind", "compute")
        if kind not in trees:
            trees[kind] = tree if tree is not None and len(configs) == 1 else load_tree(
                Path(c.get("capture") or (SWITCH_CAPTURE if kind == "switch" else CAPTURE)))
            add_missing(trees[kind], kind)
    units = {str(c.get("address")): _Unit(c, trees[c.get("kind", "compute")]) for c in configs}
    only = next(iter(units.values())) if len(units) == 1 else None
    local = threading.local()

    def cur() -> _Unit:
        return only or local.unit

    app = st.app
    _remember_good_logins()
    type(app).systems = property(lambda self: cur().driver)     # sushy-tools' backend list is hard-coded
    app.configure(extra_config={"SUSHY_EMULATOR_AUTH_FILE": configs[0]["auth_file"],
                                "SUSHY_EMULATOR_FEATURE_SET": "full"})
    # `mctl lab fault bmc TRAY ...` (mctl/lab/bmc_faults.py): a leak or a failed supply laid over what the BMC
    # serves; a hung or slow BMC held outside everything it does, authentication included
    inner = app.wsgi_app
    for u in units.values():
        u.stall = bmc_faults.Stall(inner, u.fault)

    def dispatch(environ, start_response):
        u = only or units.get(environ.get("SERVER_NAME", ""))
        if u is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"no BMC at this address"]
        local.unit = u
        return u.stall(environ, start_response)

    app.wsgi_app = dispatch

    def doc(path: str) -> dict[str, Any]:
        u = cur()
        path = path.rstrip("/") or "/"
        if path not in u.tree:
            raise error.NotFound(f"{path} not found")
        return bmc_faults.overlay(path, personalize(u.tree[path], tray_id=u.tray_id,
                                                    tray_index=int(u.config["tray_index"]),
                                                    slot=int(u.config["slot"]), power=u.driver.host_power(),
                                                    serial_by_value=u.kind == "switch"),
                                  u.fault.get(), u.kind)

    def answer(path: str) -> dict[str, Any]:
        """The document, with the lab's firmware versions, and its members where $expand asks for them."""
        u = cur()
        out = u.firmware.apply(doc(path))
        if expand_levels(flask.request.args.get("$expand")) and isinstance(out.get("Members"), list):
            out["Members"] = [u.firmware.apply(doc(m["@odata.id"]))
                              if isinstance(m, dict) and str(m.get("@odata.id", "")).rstrip("/") in u.tree else m
                              for m in out["Members"]]
        return out

    def serve(path: str):
        return flask.Response(json.dumps(answer(path), indent=2), 200, content_type="application/json")

    # Replace sushy-tools' own documents by the capture's where the GB200 tree differs.
    views = app.view_functions
    views["root_resource"] = lambda: serve(ROOT)
    views["chassis_collection_resource"] = lambda: serve(f"{ROOT}/Chassis")
    views["chassis_resource"] = lambda identity: serve(f"{ROOT}/Chassis/{identity}")
    views["manager_collection_resource"] = lambda: serve(f"{ROOT}/Managers")
    views["manager_resource"] = lambda identity: serve(f"{ROOT}/Managers/{identity}")
    for name in list(views):
        if name.endswith("update_service_resource"):
            views[name] = lambda: serve(f"{ROOT}/UpdateService")
    sushy_system = views["system_resource"]

    def system_resource(identity):
        answer = sushy_system(identity=identity)
        if flask.request.method != "GET" or answer.status_code != 200:
            return answer
        served = json.loads(answer.get_data())
        mine = doc(f"{ROOT}/Systems/{identity}")
        mine["PowerState"] = served.get("PowerState", mine.get("PowerState"))
        return flask.Response(json.dumps(mine, indent=2), 200, content_type="application/json")

    views["system_resource"] = system_resource
    sushy_systems = views["system_collection_resource"]

    def system_collection_resource():
        """sushy-tools' Systems collection; with $expand, each member as system_resource answers it."""
        answer = sushy_systems()
        if answer.status_code != 200 or not expand_levels(flask.request.args.get("$expand")):
            return answer
        served = json.loads(answer.get_data())
        members = []
        for m in served.get("Members", []):
            one = system_resource(str(m.get("@odata.id", "")).rstrip("/").rsplit("/", 1)[-1])
            members.append(json.loads(one.get_data()) if one.status_code == 200 else m)
        served["Members"] = members
        return flask.Response(json.dumps(served, indent=2), 200, content_type="application/json")

    views["system_collection_resource"] = system_collection_resource

    @app.route(f"{ROOT}/<path:rest>", methods=["GET"])
    @api_utils.returns_json
    def captured(rest):
        return json.dumps(answer(f"{ROOT}/{rest}"), indent=2)

    add_event_service(app, cur)
    from mctl.lab import bmc_events
    app.mctl_event_watch = bmc_events.watch_leaks(units, _detector_path, configs[0].get("ca_file"))
    return app


def _detector_path(u: "_Unit", detector: str | None) -> str:
    bmc = bmc_faults.KINDS[u.kind]
    return f"{bmc.leak_detectors}/{detector or bmc.default_detector}"


def add_event_service(app, cur) -> None:
    """The EventService routes (mctl/lab/bmc_events.py), answered as the BMC *cur()* is."""
    import flask

    from mctl.lab import bmc_events as ev

    def reply(doc: dict[str, Any], status: int = 200, location: str | None = None):
        resp = flask.Response(json.dumps(doc, indent=2), status, content_type="application/json")
        if location:
            resp.headers["Location"] = location
        return resp

    def off() -> bool:
        return bool(cur().fault.get().get("no_events"))

    def service():
        return reply(ev.service_doc(not off()))

    def subscriptions():
        u = cur()
        if flask.request.method == "GET":
            return reply(u.events.collection())
        if off():
            return reply(ev._error("Base.1.15.ServiceDisabled", "The event service is disabled."), 503)
        status, doc, location = u.events.create(flask.request.get_json(silent=True, force=True))
        return reply(doc, status, location)

    def subscription(ident):
        u = cur()
        if flask.request.method == "DELETE":
            return ("", 204) if u.events.delete(ident) else reply(
                ev._error("Base.1.15.ResourceNotFound", f"{ident} not found"), 404)
        doc = u.events.get(ident)
        return reply(doc) if doc else reply(ev._error("Base.1.15.ResourceNotFound", f"{ident} not found"), 404)

    for rule, endpoint, func, methods in ((ev.SERVICE, "mctl_event_service", service, ["GET"]),
                                          (ev.SUBSCRIPTIONS, "mctl_subscriptions", subscriptions, ["GET", "POST"]),
                                          (f"{ev.SUBSCRIPTIONS}/<ident>", "mctl_subscription", subscription,
                                           ["GET", "DELETE"])):
        if endpoint in app.view_functions:
            app.view_functions[endpoint] = func
        else:
            app.add_url_rule(rule, endpoint, func, methods=methods)


def expand_levels(value: str | None) -> bool:
    """Whether a `$expand` query asks for one level of members (the subset of DSP0266 the lab serves:
    `.`, `*` or `~`, with `($levels=1)` or without levels). Other levels are answered unexpanded, which a
    client must handle anyway (a member left as a link is read by its own GET)."""
    if not value:
        return False
    value = value.strip()
    return value[:1] in (".", "*", "~") and value[1:] in ("", "($levels=1)")


class FirmwareOverrides:
    """The lab's firmware versions (`mctl.lab.bmcs.set_firmware`): {FirmwareInventory id: Version} in a
    JSON file next to the emulator's config, read again whenever it changes. The item's document in
    UpdateService/FirmwareInventory then reports that Version, as a real BMC does after an update."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self._seen: tuple[int, int, int] | None = None
        self._versions: dict[str, str] = {}

    def versions(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._seen, self._versions = None, {}
            return {}
        if self._seen != (st.st_ino, st.st_mtime_ns, st.st_size):
            try:
                data = json.loads(self.path.read_text())
                self._versions = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
            except (OSError, ValueError):
                LOG.warning("%s is unreadable: firmware as captured", self.path)
                self._versions = {}
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        return self._versions

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        odata = str(doc.get("@odata.id", ""))
        if odata.startswith(f"{ROOT}/UpdateService/FirmwareInventory/"):
            version = self.versions().get(odata.rsplit("/", 1)[-1])
            if version is not None:
                doc = {**doc, "Version": version}
        return doc


def _remember_good_logins() -> None:
    """sushy-tools checks bcrypt on every request (~7 ms each on a loaded lab machine, most of a GET);
    a login that passed once is remembered by this process (the htpasswd file's mtime is part of the
    key), a wrong one is checked every time. A real BMC keeps sessions for the same reason."""
    import functools
    import os

    from sushy_tools.emulator import auth_basic

    check = auth_basic.authenticate
    if getattr(check, "_mctl_remembers", False):
        return

    @functools.lru_cache(maxsize=64)
    def good(auth_file: str, mtime: float, username: str, password: bytes) -> tuple:
        return tuple(check(auth_file, username, password).items())

    def authenticate(auth_file, username, password):
        return dict(good(auth_file, os.stat(auth_file).st_mtime, username, bytes(password)))

    authenticate._mctl_remembers = True  # type: ignore[attr-defined]
    auth_basic.authenticate = authenticate


def main(argv: list[str] | None = None) -> int:
    """One BMC (one config), or in fleet mode every BMC of a rack in this one process (several configs,
    each on its own address with its own certificate)."""
    import ssl

    from mctl.lab import bmc_http

    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.stderr.write("usage: python -m mctl.lab.bmc_emulator CONFIG.json [CONFIG.json ...]\n")
        return 2
    configs = [json.loads(Path(a).read_text()) for a in args]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(configs if len(configs) > 1 else configs[0])
    listeners = []
    for config in configs:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(config["cert"], config["key"])
        LOG.info("BMC of %s on https://%s:%s", config["tray"], config["address"], config["port"])
        listeners.append((config["address"], int(config["port"]), ctx))
    bmc_http.serve_many(app, listeners)
    return 0


if __name__ == "__main__":
    sys.exit(main())
