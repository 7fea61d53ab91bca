"""The BMC's view of a tray's GPUs for bring-up (mctl.bmc.inventory.read_gpus), read over TLS through mctl's
Redfish client from the real GB200 compute-tray capture (tests/fixtures/real/redfish/nvidia_gb200,
NVIDIA/libredfish) served by the static mockup server: Chassis/HGX_GPU_0..3 and the tray's serial."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from redfish_mockup import MockupServer, throwaway_ca  # noqa: E402

from mctl.bmc.client import BMCCredentials, RedfishClient  # noqa: E402
from mctl.bmc.inventory import TrayBMC, read_gpus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GB200 = REPO / "tests" / "fixtures" / "real" / "redfish" / "nvidia_gb200"
CRED = BMCCredentials("root", "0penBmc")


def _read(root: Path, pki: Path) -> tuple[TrayBMC, list[str]]:
    ca, cert, key = throwaway_ca(pki, ["127.0.0.1"])
    with MockupServer(root, tls=(cert, key)) as srv:
        client = RedfishClient(f"https://{srv.host}:{srv.port}", CRED, verify_tls=str(ca), timeout_s=5)
        tray = TrayBMC("t1", "compute", "127.0.0.1")
        read_gpus(client, tray)
        return tray, [p for m, p, _a in srv.requests if m == "GET"]


def test_the_captured_tray_shows_its_four_gpus_and_its_serial(tmp_path, processes, sockets):
    tray, gets = _read(GB200, tmp_path / "pki")
    assert tray.gpus == ["HGX_GPU_0", "HGX_GPU_1", "HGX_GPU_2", "HGX_GPU_3"]
    chassis0 = json.loads((GB200 / "redfish/v1/Chassis/Chassis_0/index.json").read_text())
    assert tray.tray_chassis == "Chassis_0" and tray.serial == chassis0["SerialNumber"]
    # only the service root and the chassis: no firmware, power, thermal or sensors for this question
    assert not any("UpdateService" in p or "Sensors" in p or "Subsystem" in p for p in gets), gets


def test_an_absent_gpu_is_not_counted(tmp_path, processes, sockets):
    """A GPU that is not there reads Status.State Absent on its chassis (a copy of the capture edited so)."""
    root = tmp_path / "tree"
    shutil.copytree(GB200, root)
    doc_path = root / "redfish/v1/Chassis/HGX_GPU_2/index.json"
    doc = json.loads(doc_path.read_text())
    doc["Status"] = {"State": "Absent"}
    doc_path.write_text(json.dumps(doc))
    tray, _gets = _read(root, tmp_path / "pki")
    assert tray.gpus == ["HGX_GPU_0", "HGX_GPU_1", "HGX_GPU_3"]
