"""The lab's apt repository: which packages it holds, under which names and versions (pure parts),
and one real build with dpkg-deb, dpkg-scanpackages and gpg where they are installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mctl.lab import aptrepo, services
from mctl.lab.layout import LabLayout

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"


def test_every_repository_component_of_every_image_is_packaged_once():
    pkgs = aptrepo.packages_of(IMAGES)
    names = {(p.name, p.version) for p in pkgs}
    assert len(names) == len(pkgs)
    for path in IMAGES.glob("*.yml"):
        for comp, spec in yaml.safe_load(path.read_text())["components"].items():
            if spec.get("delivery", "repository") == "repository":
                for entry in spec["packages"]:
                    name, version = entry.split("=", 1)
                    assert (name, version) in names, (path.name, comp, entry)
    assert aptrepo.repositories(pkgs) == ["cuda", "doca", "site"]
    by = {p.name: p for p in pkgs}
    assert by["nvidia-driver-570-open"].depends == ("nvidia-utils-570 (= 570.148.08-0ubuntu1)",
                                                   "libnvidia-compute-570 (= 570.148.08-0ubuntu1)",
                                                   "nvidia-compute-utils-570 (= 570.148.08-0ubuntu1)")
    assert by["datacenter-gpu-manager-4-core"].filename == "datacenter-gpu-manager-4-core_4.3.1-1"   # no epoch


def test_emulator_files_belong_to_the_packages_named_without_branch():
    pkgs = {p.name: p for p in aptrepo.packages_of(IMAGES)}
    tags = {f.package for f in services.HOST_FILES if f.package}
    assert tags == {"nvidia-utils", "nvidia-imex", "datacenter-gpu-manager-4-core", "nccl-tests"}
    # every tagged package is one an image delivers, so provisioning installs what burn-in runs
    assert tags <= {p.tag for p in pkgs.values()}
    burn_in = {f.dest for f in services.HOST_FILES if f.package in ("datacenter-gpu-manager-4-core", "nccl-tests")}
    assert {"/usr/bin/dcgmi", "/usr/bin/all_reduce_perf"} <= burn_in
    assert pkgs["nvidia-utils-570"].tag == "nvidia-utils" and pkgs["nvidia-imex-570"].tag == "nvidia-imex"
    files = {f.dest for f in services.HOST_FILES if f.package == "nvidia-imex"}
    assert {"/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl", "/usr/lib/systemd/system/nvidia-imex.service"} <= files


def test_inventory_names_each_repository_flat_with_the_lab_key(tmp_path):
    v = aptrepo.inventory_vars(tmp_path, "127.77.1.200", ["cuda", "site"])
    assert v["cuda"] == {"url": "http://127.77.1.200:8080/cuda/", "suite": "/",
                         "key_file": str(tmp_path / "aptrepo" / "mctl-lab-archive.asc")}


@pytest.mark.skipif(aptrepo.missing_programs() != [], reason="needs dpkg-deb, dpkg-scanpackages and gpg")
def test_real_build_is_signed_and_indexed(tmp_path, processes):
    layout = LabLayout("lab", 1, 1, 77)
    tray = layout.trays_of("lab-r1")[0]
    root = aptrepo.build(tmp_path, IMAGES, services.HostContext(layout, tray, tmp_path))
    index = (root / "cuda" / "Packages").read_text()
    assert "Package: nvidia-imex-570\nVersion: 570.148.08-1\n" in index
    assert "dpkg-scanpackages" not in index
    assert (root / "cuda" / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    contents = subprocess.run(["dpkg-deb", "-c", *root.glob("cuda/nvidia-utils-570_*.deb")], capture_output=True,
                              text=True, check=True).stdout
    assert "./usr/bin/nvidia-smi" in contents
    # both driver branches are served; every package has a real postinst, the driver's sets the lab GPUs' version
    assert "Package: nvidia-utils-580\nVersion: 580.105.08-0ubuntu1\n" in index
    for deb, has_driver in (("nvidia-driver-580-open_*.deb", True), ("nvidia-imex-580_*.deb", False)):
        ctl = tmp_path / deb.split("_")[0]
        subprocess.run(["dpkg-deb", "-e", *root.glob(f"cuda/{deb}"), str(ctl)], check=True, capture_output=True)
        postinst = (ctl / "postinst").read_text()
        assert f"{aptrepo.POSTINST_FAULTS_IN_HOST}/{deb.split('_')[0]}" in postinst
        assert ('state["driver_version"] = "580.105.08"' in postinst) is has_driver
        assert ('state["cuda_version"] = "13.0"' in postinst) is has_driver
    assert (aptrepo.signing_key_file(tmp_path).stat().st_mode & 0o777) == 0o600
    if shutil.which("gpgv"):
        # the Release signature verifies with the published key alone (what the trays get)
        keyring = tmp_path / "k.gpg"
        subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(root / aptrepo.KEY_NAME)],
                       check=True, capture_output=True)
        ok = subprocess.run(["gpgv", "--keyring", str(keyring), str(root / "cuda" / "InRelease")],
                            capture_output=True)
        assert ok.returncode == 0, ok.stderr
    aptrepo.withhold(tmp_path, "cuda", {"nvidia-imex-570=570.148.08-1"})
    assert "Package: nvidia-imex-570\n" not in (root / "cuda" / "Packages").read_text()
    aptrepo.withhold(tmp_path, "cuda", set())
    assert "Package: nvidia-imex-570\n" in (root / "cuda" / "Packages").read_text()
