"""The node check runs with the standard library only: proven in a subprocess under `python3 -I -S`
with nothing on sys.path but the staged bundle (what the node_check role installs on trays)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mctl.health import bundle
from mctl.lab.emulators import nvidia_smi as emu

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "mctl" / "lab" / "emulators" / "nvidia_smi.py"
EXAMPLE = ROOT / "inventories" / "example-gb200"


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("bundle")
    tar = bundle.stage(dest)
    out = dest / "lib"
    with tarfile.open(tar) as t:
        # Debian 12's Python 3.11.2 predates extraction filters; the tarball is our own, so check its members.
        members = t.getmembers()
        assert all(m.isfile() or m.isdir() for m in members)
        assert not any(m.name.startswith("/") or ".." in Path(m.name).parts for m in members)
        t.extractall(out, members)
    return out


def isolated(lib: Path, code: str, *, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """python3 -I -S: no site-packages, no PYTHON* variables; only the bundle is importable."""
    prelude = f"import sys; sys.path.insert(0, {str(lib)!r}); "
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + code], capture_output=True, text=True,
                          cwd="/", timeout=timeout, env=env)


def test_bundle_imports_with_the_standard_library_alone(lib, processes):
    lazy = ", ".join(repr(m) for m in bundle.LAZY)
    proc = isolated(lib, f"""
import importlib, json
import mctl.health.node_check
for m in ({lazy},):
    importlib.import_module(m)
std = sys.stdlib_module_names
outside = sorted(n for n, mod in sys.modules.items()
                 if n.split('.')[0] not in std and getattr(mod, '__file__', None)
                 and not mod.__file__.startswith({str(lib)!r}))
print(json.dumps({{"outside": outside, "site": "site" in sys.modules, "pydantic": "pydantic" in sys.modules}}))
""")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"outside": [], "site": False, "pydantic": False}


def test_every_bundled_module_is_needed_or_a_package(lib):
    names = {str(rel) for _, rel, _ in bundle.files()}
    assert "mctl/health/node_check.py" in names and "mctl/cli/health.py" not in names
    assert "mctl/health/engine.py" not in names and "mctl/inventory/schema.py" not in names
    stub = (lib / "mctl" / "sched" / "slurm" / "__init__.py").read_text()
    assert "import" not in stub


def test_tarball_is_reproducible():
    a, b = bundle.tarball(), bundle.tarball()
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    with tarfile.open(fileobj=io.BytesIO(a)) as t:
        members = t.getmembers()
    assert {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}
    assert {m.mode for m in members if m.isfile()} == {0o644}


def test_node_check_runs_isolated_against_the_gpu_emulator(lib, tmp_path, processes):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} -I {EMULATOR} \"$@\"\n")
    smi.chmod(0o755)
    state = tmp_path / "gpus.json"
    buses = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")
    state.write_text(json.dumps({
        "schema": 1, "hostname": "t01", "driver_version": "570.148.08", "cuda_version": "12.8",
        "product_name": "NVIDIA GB200", "cluster_uuid": "3f5c1a9e-2b7d-5e04-8c61-9d2a4b7e0f13", "clique_id": 32766,
        "fabric_state": "Completed", "fabric_status": "Success",
        "gpus": [{"index": i, "uuid": f"GPU-{i:08x}-7c3e-5a1b-9d2f-4e6a8b0c1d2e", "pci_bus_id": bus,
                  "temperature_c": 33} for i, bus in enumerate(buses)]}))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"nvlink_down": [[1, 5]]}))
    config = tmp_path / "node-check.json"
    config.write_text(json.dumps({
        "schema": 1, "node": "t01", "scheduler": None, "drain": False, "state_dir": str(tmp_path / "state"),
        "rack_nodes": ["t01", "t02"],
        "expect": {"host": "t01", "rack": "r1", "gpus_per_tray": 4, "driver_version": "570.148.08",
                   "nvlink_domain": "3f5c1a9e-2b7d-5e04-8c61-9d2a4b7e0f13", "scheduler": None},
        "settings": {"disk_paths": ["/"], "disk_warn_pct": 100, "disk_critical_pct": 100,
                     "memory_warn_available_pct": 0}}))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", emu.STATE_ENV: str(state), emu.FAULTS_ENV: str(faults)}
    proc = isolated(lib, "from mctl.health.node_check import main; "
                         f"sys.exit(main(['--config', {str(config)!r}, '--json']))", env=env)
    assert proc.returncode == 1, proc.stderr            # critical: an NVLink is down
    data = json.loads(proc.stdout)
    assert data["node"] == "t01" and data["worst"] == "critical"
    assert data["gpu_source"].startswith("nvidia-smi")
    import ctypes.util
    if ctypes.util.find_library("nvidia-ml") is None:          # pynvml is in the bundle; the driver's library is not
        assert "NVML did not load" in data["gpu_source"], data["gpu_source"]
    crit = [f for f in data["findings"] if f["severity"] == "critical"]
    assert [f["check"] for f in crit] == ["nvlink.links"] and "gpu1 link5" in crit[0]["message"]
    assert data["elapsed"] < 45 and not (tmp_path / "state").exists()    # --no-drain via config: nothing written
    faults.write_text("{}")
    proc = isolated(lib, "from mctl.health.node_check import main; "
                         f"sys.exit(main(['--config', {str(config)!r}]))", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("t01: ok")


def test_bad_config_exits_2(lib, tmp_path, processes):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"schema": 7}))
    proc = isolated(lib, "from mctl.health.node_check import main; "
                         f"sys.exit(main(['--config', {str(bad)!r}]))")
    assert proc.returncode == 2 and "schema" in proc.stderr


def test_wrapper_runs_the_installed_tree(lib, tmp_path, processes):
    script = tmp_path / "mctl-node-check"
    script.write_text(bundle.wrapper(python=sys.executable, lib_dir=str(lib)))
    script.chmod(0o755)
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/nonexistent"})
    assert proc.returncode == 0 and "Example: mctl-node-check" in proc.stdout


def test_node_configs_from_the_example_inventory():
    from mctl.inventory import load_site

    configs = bundle.node_configs(load_site(str(EXAMPLE)))
    c = configs["rack-a-tray03"]
    assert c["expect"]["driver_version"] == "570.148.08" and c["expect"]["image"] == "gb200-ubuntu24.04"
    assert c["expect"]["nvlink_domain"] == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    assert len(c["rack_nodes"]) == 18 and c["drain"] is True and c["scheduler"] == "slurm"
    assert sorted(c["settings"]["drain_xids"])[:3] == [46, 48, 64]
    assert configs["rack-b-tray01"]["expect"]["nvlink_domain"] is None


def test_stage_writes_only_on_change(tmp_path):
    path = bundle.stage(tmp_path)
    before = path.stat().st_mtime_ns
    os.utime(path, ns=(before - 10**9, before - 10**9))
    bundle.stage(tmp_path)
    assert path.stat().st_mtime_ns == before - 10**9


def test_stage_is_content_addressed_so_two_bundles_never_share_a_file(tmp_path, monkeypatch):
    """Two checkouts (or versions) staging into one folder at once each get their own file, never the other's."""
    import hashlib

    path = bundle.stage(tmp_path)
    assert path.name == f"mctl-node-check-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}.tar"
    monkeypatch.setattr(bundle, "tarball", lambda: b"another version's bundle")
    other = bundle.stage(tmp_path)
    assert other != path and other.read_bytes() == b"another version's bundle" and path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, other.name])    # no temporary left


def test_bundle_ships_nvidia_ml_py_and_names_the_path_it_used(lib, processes):
    """pynvml travels in the bundle (no pip on the tray); without the driver's libnvidia-ml the
    node check says NVML did not load and which path it used instead, never that NVML worked."""
    import ctypes.util

    assert (lib / "pynvml.py").is_file()
    proc = isolated(lib, """
import json, pynvml
from mctl.health import nvml
nv, why = nvml.load()
print(json.dumps({"file": pynvml.__file__, "loaded": nv is not None, "why": why}))
""")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["file"].startswith(str(lib))
    if ctypes.util.find_library("nvidia-ml") is None:          # no NVIDIA driver on this machine
        assert data["loaded"] is False and data["why"].startswith("NVML did not load")
