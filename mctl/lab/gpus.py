"""The emulated GPUs of a lab tray: identities that are stable across `lab up`s.

A real GB200 tray carries four GPUs on two boards; every identifier nvidia-smi
reports (UUID, serial, PCI bus id, module id, fabric GUID, the chassis serial and
slot of the tray) is fixed by the hardware. Deriving each from the lab name,
rack and slot keeps them stable, so facts gathered before a `lab down` still
match after the next `lab up`, and distinct between trays and racks.
PCI bus ids, module ids and board-shared serials follow a real GB200 capture
(tests/fixtures/gb200-nvidia-smi-q-x.xml).
"""

from __future__ import annotations

import hashlib
import uuid

from mctl.lab.layout import LabHost, LabLayout

GPUS_PER_TRAY = 4
DRIVER_VERSION = "570.148.08"
CUDA_VERSION = "12.8"
PRODUCT_NAME = "NVIDIA GB200"
DEFAULT_CLIQUE_ID = 32766          # NMX-M's default partition
MEMORY_TOTAL_MIB = 189471
POWER_LIMIT_W = 1200.0
# index -> (PCI bus id, module id), as on a real tray
GPU_SLOTS = (("00000000:29:00.0", 2), ("00000000:3F:00.0", 1), ("00000000:9C:00.0", 4), ("00000000:B2:00.0", 3))


def _digits(seed: str, n: int) -> str:
    value = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    return str(value % 10**n).zfill(n)


def chassis_serial(layout: LabLayout, rack: str) -> str:
    return "1821" + _digits(f"{layout.name}/{rack}/chassis", 9)


def gpu_state(layout: LabLayout, host: LabHost) -> dict:
    """Contents of the tray's /var/lib/mctl-lab/gpus.json (schema 1 of the lab contract)."""
    if host.kind != "tray":
        raise ValueError(f"{host.name} is not a compute tray")
    base = f"{layout.name}/{host.rack}/{host.slot}"
    gpus = []
    for index, (pci, module) in enumerate(GPU_SLOTS):
        board = index // 2              # two Blackwell GPUs per Bianca board share its serial
        guid = hashlib.sha256(f"{base}/gpu{index}/guid".encode()).hexdigest()[:16]
        gpus.append({
            "index": index,
            "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"mctl-lab/{base}/gpu{index}")),
            "serial": "1761" + _digits(f"{base}/board{board}", 9),
            "pci_bus_id": pci,
            "module_id": module,
            "minor_number": index,
            "gpu_fabric_guid": "0x" + guid,
            "memory_total_mib": MEMORY_TOTAL_MIB,
            "power_limit_w": POWER_LIMIT_W,
            "temperature_c": 30 + int(_digits(f"{base}/gpu{index}/temp", 2)) % 9,
        })
    return {
        "schema": 1,
        "hostname": host.name,
        "driver_version": DRIVER_VERSION,
        "cuda_version": CUDA_VERSION,
        "product_name": PRODUCT_NAME,
        "chassis_serial": chassis_serial(layout, host.rack),
        "tray_index": host.tray_index,
        "slot_number": host.slot,
        "host_id": 1,
        "cluster_uuid": layout.nvlink_domain(host.rack),
        "clique_id": DEFAULT_CLIQUE_ID,
        "fabric_state": "Completed",
        "fabric_status": "Success",
        "gpus": gpus,
    }
