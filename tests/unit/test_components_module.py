"""The components role's apt module: its pure parts (package lists, version rules, apt's errors)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "playbooks/library/mctl_apt_components.py"
spec = importlib.util.spec_from_file_location("mctl_apt_components", PATH)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


def test_repository_packages_need_an_exact_version():
    assert mod.parse_packages("dcgm", {"packages": ["datacenter-gpu-manager-4-core=1:4.3.1-1"]}) == [
        ("datacenter-gpu-manager-4-core", "1:4.3.1-1")]
    with pytest.raises(mod.Failed, match="component dcgm: 'datacenter-gpu-manager-4-core' has no version"):
        mod.parse_packages("dcgm", {"packages": ["datacenter-gpu-manager-4-core"]})
    with pytest.raises(mod.Failed, match="component cuda: the image names no packages"):
        mod.parse_packages("cuda", {"delivery": "repository"})
    with pytest.raises(mod.Failed, match="is not name=version"):
        mod.parse_packages("x", {"packages": ["bad name=1; rm -rf /"]})
    # an OS-image package may be named alone: verified at the component's upstream version
    assert mod.parse_packages("slurm", {"delivery": "image", "packages": ["slurmd"]}) == [("slurmd", None)]


def test_version_rules():
    assert mod.version_ok("570.148.08-0ubuntu1", "570.148.08-0ubuntu1", "570.148.08")
    assert not mod.version_ok("570.148.08-0ubuntu1", "570.172.08-0ubuntu1", "570.148.08")
    assert not mod.version_ok("1.0-1", None, "1.0")
    assert mod.version_ok(None, "24.11.5-4+deb13u1", "24.11")
    assert mod.version_ok(None, "1:24.11.5-4", "24.11")
    assert not mod.version_ok(None, "24.05.1-1", "24.11")
    assert not mod.version_ok(None, "24.110-1", "24.11")


def test_apt_errors_keep_apts_own_lines():
    out = ("Reading package lists...\nBuilding dependency tree...\n"
           "E: Version '1:4.3.1-1' for 'datacenter-gpu-manager-4-core' was not found\n")
    assert mod.apt_errors(out) == "E: Version '1:4.3.1-1' for 'datacenter-gpu-manager-4-core' was not found"
    assert mod.apt_errors("no error lines here at all") == "no error lines here at all"


def test_sources_and_pins():
    keyring, _key, src, line = mod.source_files("cuda", {"url": "http://127.77.1.200:8080/cuda/", "suite": "/",
                                                         "key": "-----BEGIN PGP PUBLIC KEY BLOCK-----\n..."})
    assert src == "/etc/apt/sources.list.d/mctl-cuda.list"
    assert line.endswith("deb [signed-by=/etc/apt/keyrings/mctl-cuda.asc] http://127.77.1.200:8080/cuda/ /\n")
    with pytest.raises(mod.Failed, match="no signing key"):
        mod.source_files("cuda", {"url": "http://127.0.0.1/", "key": ""})
    with pytest.raises(mod.Failed, match="not an http"):
        mod.source_files("cuda", {"url": "http://x/ ] trusted=yes", "key": "-----BEGIN PGP PUBLIC KEY BLOCK-----"})
    pin = mod.pin_text("imex", [("nvidia-imex-570", "570.148.08-1")])
    assert "Package: nvidia-imex-570\nPin: version 570.148.08-1\nPin-Priority: 1001\n" in pin


def test_apt_errors_keep_dpkgs_post_installation_failure():
    out = ("Setting up nvslurm-plugin-pyxis (0.20.0-1) ...\n"
           "nvslurm-plugin-pyxis post-installation script: cannot register the SPANK plugin\n"
           "dpkg: error processing package nvslurm-plugin-pyxis (--configure):\n"
           " installed nvslurm-plugin-pyxis package post-installation script subprocess returned error exit status 1\n"
           "Errors were encountered while processing:\n nvslurm-plugin-pyxis\n"
           "E: Sub-process /usr/bin/dpkg returned an error code (1)\n")
    assert mod.apt_errors(out, limit=1000) == (
        "nvslurm-plugin-pyxis post-installation script: cannot register the SPANK plugin; "
        "dpkg: error processing package nvslurm-plugin-pyxis (--configure):; "
        "installed nvslurm-plugin-pyxis package post-installation script subprocess returned error exit status 1; "
        "E: Sub-process /usr/bin/dpkg returned an error code (1)")


def test_other_branches_of_the_images_branch_named_packages():
    pkgs = [("nvidia-driver-580-open", "580.105.08-0ubuntu1"), ("nvidia-utils-580", "580.105.08-0ubuntu1"),
            ("cuda-toolkit-13-0", "13.0.2-1")]
    state = {"nvidia-driver-570-open": ("570.148.08-0ubuntu1", "installed"),
             "nvidia-utils-570": ("570.148.08-0ubuntu1", "half-configured"),
             "nvidia-utils-535": ("535.129.03-0ubuntu1", "config-files"),     # removed before: nothing to do
             "nvidia-driver-570": ("570.148.08-0ubuntu1", "installed"),       # the closed flavour: not this name
             "cuda-toolkit-12-8": ("12.8.1-1", "installed")}                  # toolkits live side by side
    assert mod.other_branches(pkgs, state) == {"nvidia-driver-570-open": "nvidia-driver-580-open",
                                               "nvidia-utils-570": "nvidia-utils-580"}


def test_plan_checks_every_component_before_anything_is_written():
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n..."
    comps = {"nvidia_driver": {"delivery": "repository", "repository": "cuda", "hold": True,
                               "packages": ["nvidia-utils-570=570.148.08-0ubuntu1"]},
             "slurm": {"delivery": "image", "version": "24.11", "packages": ["slurmd"]},
             "pyxis": {"delivery": "repository", "repository": "site", "packages": ["nvslurm-plugin-pyxis=0.20.0-1"]}}
    with pytest.raises(mod.Failed, match="component pyxis: repository 'site' is not defined by the inventory"):
        mod.Plan(comps, {"cuda": {"url": "http://127.0.0.1/cuda/", "key": key}})
    plan = mod.Plan(comps, {"cuda": {"url": "http://127.0.0.1/cuda/", "key": key},
                            "site": {"url": "http://127.0.0.1/site/", "key": key}})
    state = {"nvidia-utils-570": ("570.148.08-0ubuntu1", "installed"), "slurmd": ("24.11.5-4", "installed"),
             "nvslurm-plugin-pyxis": ("0.20.0-1", "half-configured")}
    # a half-configured package is not installed yet: its component is installed (configured) again
    assert plan.wrong(state) == {"pyxis": [("nvslurm-plugin-pyxis", "0.20.0-1")]}
    assert plan.repo("pyxis")[0] == "site" and plan.repo("slurm") is None


def test_plain_packages_only_the_missing_and_names_checked():
    state = {"chrony": ("4.6.1-1", "installed"), "numactl": ("2.0.18-1", "config-files")}
    assert mod.plain_missing(["chrony", "numactl", "rdma-core", "chrony"], state) == ["numactl", "rdma-core"]
    assert mod.plain_missing(["chrony"], state) == []
    for bad in ("rm -rf /", "Chrony", "-o", "x;y", 7):
        with pytest.raises(mod.Failed, match="is not a package name"):
            mod.plain_missing([bad], state)


def test_plain_packages_run_apt_only_for_what_is_missing(monkeypatch):
    calls = []

    def run(argv, timeout):
        calls.append(argv)
        if argv[0] == "dpkg-query":
            return 0, "chrony\t4.6.1-1\tinstalled\n"
        return 100, "E: Unable to locate package rdma-core\n"

    monkeypatch.setattr(mod, "run", run)
    assert mod.plain_packages(["chrony"], 60, check=False) == [] and len(calls) == 1
    assert mod.plain_packages(["chrony", "rdma-core"], 60, check=True) == ["rdma-core"] and len(calls) == 2
    with pytest.raises(mod.Failed, match="apt-get install of rdma-core failed \\(exit 100\\): E: Unable to locate"):
        mod.plain_packages(["chrony", "rdma-core"], 60, check=False)
    assert calls[-1][:2] == ["apt-get", "install"] and calls[-1][-1] == "rdma-core"
