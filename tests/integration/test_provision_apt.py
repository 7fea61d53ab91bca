"""Provisioning an OS-only lab through apt, as on a fresh real tray (issue 21, deliverables 1, 2, 7).

The trays of this module's own lab (`mctl lab up --os-only`) start with the OS image only: no
nvidia-smi, no IMEX. `mctl provision` installs every component of image lab-debian13 from the
lab's signed apt repository (mctl/lab/aptrepo.py), pinned and held, and the services are asserted
as well as the files. Faults: a tray whose repository is unreachable, a version missing from the
repository, a package whose post-installation script fails on one tray; each fails its tray with the
component and apt's error, the others go on. Image lab-debian13-580 changes a tray's driver branch.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER_PKGS = ["nvidia-driver-570-open", "nvidia-utils-570", "libnvidia-compute-570", "nvidia-compute-utils-570"]
PROXY_FAULT = "/etc/apt/apt.conf.d/99-mctl-test-unreachable"


APT_TRAYS_ENV = "MCTL_TEST_APT_TRAYS"      # trays of the OS-only lab (default 2: one that fails, one that goes on)


@pytest.fixture(scope="module")
def oslab(own_lab, tmp_path_factory):
    # Two trays show every case here (a failing tray and one that goes on) at half the suite's time of four;
    # MCTL_TEST_APT_TRAYS=18 measures the 18-tray provisioning (the times go to stderr with -s).
    with own_lab(tmp_path_factory.mktemp("mctl-state-apt"), trays=int(os.environ.get(APT_TRAYS_ENV) or 2),
                 label="oslab", os_only=True) as handle:
        yield handle


def provision(lab, *args: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    proc = lab.mctl("provision", *args, "--json", timeout=900)
    took = time.monotonic() - started
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), took


def test_os_only_trays_start_without_gpu_tools(oslab):
    for tray in oslab.trays:
        out = oslab.run(tray, "command -v nvidia-smi nvidia-imex; dpkg-query -W nvidia-utils-570 2>&1; true").stdout
        assert "/usr/bin/nvidia-smi" not in out and "/usr/bin/nvidia-imex" not in out
        assert "no packages found matching nvidia-utils-570" in out


@pytest.fixture(scope="module")
def first_run(oslab):
    """The first provisioning, with one tray's repository unreachable (a dead proxy in its apt config)."""
    bad = oslab.trays[1]
    oslab.run(bad, f"echo 'Acquire::http::Proxy \"http://127.0.0.1:9/\";' > {PROXY_FAULT}")
    try:
        code, result, took = provision(oslab, oslab.rack)
    finally:
        oslab.run(bad, f"rm -f {PROXY_FAULT}")
    sys.stderr.write(f"[oslab] first provisioning of {len(oslab.trays)} OS-only trays: {took:.1f} s\n")
    return bad, code, result


def test_unreachable_repository_fails_only_that_tray(oslab, first_run):
    bad, code, result = first_run
    assert code == 3, result
    assert result["failed_hosts"] == [bad]
    msg = result["hosts"][bad]["message"]
    assert msg.startswith("component nvidia_driver: apt-get update of repository cuda"), msg
    assert "127.0.0.1" in msg or "Could not connect" in msg or "Failed to fetch" in msg, msg
    for tray in oslab.trays:
        if tray != bad:
            assert result["hosts"][tray]["failed"] == 0, result["hosts"][tray]


def test_every_component_installed_pinned_held_and_running(oslab, first_run):
    bad, _code, _result = first_run
    for tray in [t for t in oslab.trays if t != bad]:
        versions = dict(line.split("\t") for line in oslab.run(
            tray, "dpkg-query -W -f '${Package}\\t${Version}\\n' " + " ".join(DRIVER_PKGS + [
                "nvidia-imex-570", "cuda-toolkit-12-8", "datacenter-gpu-manager-4-core", "doca-ofed", "enroot",
                "nvslurm-plugin-pyxis", "nccl-tests"])).stdout.splitlines())
        assert versions == {**{p: "570.148.08-0ubuntu1" for p in DRIVER_PKGS}, "nvidia-imex-570": "570.148.08-1",
                            "cuda-toolkit-12-8": "12.8.1-1", "datacenter-gpu-manager-4-core": "1:4.3.1-1",
                            "doca-ofed": "2.9.1-1", "enroot": "3.5.0-1", "nvslurm-plugin-pyxis": "0.20.0-1",
                            "nccl-tests": "2.17.1-1"}
        # the tools came from the packages (the lab's emulators), through the signed repository
        assert oslab.run(tray, "dpkg -S /usr/bin/nvidia-smi /usr/bin/nvidia-imex").stdout.split() == [
            "nvidia-utils-570:", "/usr/bin/nvidia-smi", "nvidia-imex-570:", "/usr/bin/nvidia-imex"]
        # burn-in's and evidence's tools too, and they run (tests/integration/test_burnin.py judges them)
        assert oslab.run(tray, "dpkg -S /usr/bin/dcgmi /usr/bin/all_reduce_perf /usr/bin/nvidia-bug-report.sh"
                         ).stdout.split() == ["datacenter-gpu-manager-4-core:", "/usr/bin/dcgmi", "nccl-tests:",
                                              "/usr/bin/all_reduce_perf", "nvidia-utils-570:",
                                              "/usr/bin/nvidia-bug-report.sh"]
        assert oslab.run(tray, "dcgmi -v").stdout.startswith("Version : 4.3.1")
        src = oslab.run(tray, "cat /etc/apt/sources.list.d/mctl-cuda.list").stdout
        assert "[signed-by=/etc/apt/keyrings/mctl-cuda.asc]" in src and "/cuda/ /" in src
        held = set(oslab.run(tray, "apt-mark showhold").stdout.split())
        assert held == set(DRIVER_PKGS) | {"nvidia-imex-570"}
        pin = oslab.run(tray, "cat /etc/apt/preferences.d/mctl-imex.pref").stdout
        assert "Package: nvidia-imex-570\nPin: version 570.148.08-1\nPin-Priority: 1001" in pin
        # services, not only files
        pm = oslab.run(tray, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout.split()
        assert pm and set(pm) == {"Enabled"}
        assert oslab.run(tray, "systemctl is-enabled nvidia-imex").stdout.strip() == "enabled"
        assert oslab.run(tray, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0] \
            == "570.148.08"
        # time sync: chronyd runs and has selected the site's time server (the rack's, mctl/lab/ntp.py); in the
        # lab it runs with -x, so this proves the daemon, its configuration and its source, not clock steering
        assert oslab.run(tray, "systemctl is-enabled chrony").stdout.strip() == "enabled"
        assert 'DAEMON_OPTS="-F 1 -x"' in oslab.run(tray, "cat /etc/default/chrony").stdout
        tracking = oslab.run(tray, "chronyc -n tracking").stdout
        server = oslab.addresses[tray].rsplit(".", 1)[0] + ".200"
        assert re.search(r"^Reference ID\s*: [0-9A-F]{8} \(" + re.escape(server) + r"\)$", tracking, re.M), tracking
        assert re.search(r"^Leap status\s*: Normal$", tracking, re.M), tracking


def test_missing_version_and_broken_postinst_fail_naming_the_component_then_retry_finishes(oslab, first_run):
    from mctl.lab import aptrepo

    bad, _code, _result = first_run
    aptrepo.withhold(oslab.dir, "cuda", {"datacenter-gpu-manager-4-core=1:4.3.1-1"})
    try:
        code, result, _took = provision(oslab, bad)
    finally:
        aptrepo.withhold(oslab.dir, "cuda", set())
    assert code == 3 and result["failed_hosts"] == [bad], result
    msg = result["hosts"][bad]["message"]
    assert msg.startswith("component dcgm: apt-get install of datacenter-gpu-manager-4-core=1:4.3.1-1 failed"), msg
    # apt's own words: the only version the repository had is gone from its index
    assert "E: Unable to locate package datacenter-gpu-manager-4-core" in msg or "was not found" in msg, msg
    # the components before it are in
    assert oslab.run(bad, "dpkg-query -W -f '${Version}' nvidia-imex-570").stdout == "570.148.08-1"

    # a package whose post-installation script fails on that tray (the package's own postinst, run by
    # dpkg): the tray fails naming the component and quoting dpkg; the other tray goes on (nothing to do)
    aptrepo.postinst_fails(oslab.dir, bad, "nvslurm-plugin-pyxis", "cannot register the SPANK plugin (lab fault)")
    try:
        code, result, _took = provision(oslab, oslab.rack)
    finally:
        aptrepo.postinst_fails(oslab.dir, bad, "nvslurm-plugin-pyxis", None)
    assert code == 3 and result["failed_hosts"] == [bad], result
    msg = result["hosts"][bad]["message"]
    assert msg.startswith("component pyxis: apt-get install of nvslurm-plugin-pyxis=0.20.0-1 failed (exit 100)"), msg
    assert "nvslurm-plugin-pyxis post-installation script: cannot register the SPANK plugin (lab fault)" in msg, msg
    assert "installed nvslurm-plugin-pyxis package post-installation script subprocess returned error exit " \
           "status 1" in msg, msg
    assert result["hosts"][oslab.trays[0]]["failed"] == 0, result
    assert oslab.run(bad, "dpkg-query -W -f '${db:Status-Status}' nvslurm-plugin-pyxis").stdout == "half-configured"
    assert oslab.run(bad, "dpkg-query -W -f '${Version}' datacenter-gpu-manager-4-core").stdout == "1:4.3.1-1"

    # fixed (the tray's fault gone): --retry-failed finishes the tray
    code, result, _took = provision(oslab, oslab.rack, "--retry-failed")
    assert code == 0 and list(result["hosts"]) == [bad], result
    assert oslab.run(bad, "dpkg-query -W -f '${Version} ${db:Status-Status}' nvslurm-plugin-pyxis").stdout == \
        "0.20.0-1 installed"


def test_rerun_changes_nothing(oslab, first_run):
    code, result, took = provision(oslab, oslab.rack)
    sys.stderr.write(f"[oslab] re-run on {len(oslab.trays)} provisioned trays: {took:.1f} s\n")
    assert code == 0, result
    assert {h: r["changed"] for h, r in result["hosts"].items()} == {t: 0 for t in oslab.trays}


def test_boot_parameters_through_update_grub_and_reboot_required(oslab, first_run):
    """Image lab-debian13-bootparams declares kernel parameters. A tray without update-grub fails,
    named; with it (a stand-in here: lab trays share the machine's kernel and have no boot loader,
    so the stand-in only records that it ran) the boot configuration is regenerated once, and the
    tray is flagged, and audited, "reboot required" while its running kernel lacks them."""
    tray = oslab.trays[0]
    image = "lab-debian13-bootparams"
    code, result, _ = provision(oslab, tray, "--image", image, "--tags", "base")
    assert code == 3, result
    assert "no update-grub or grub2-mkconfig on this tray" in result["hosts"][tray]["message"]
    oslab.run(tray, "printf '#!/bin/sh\\necho \"$(date +%s) $*\" >> /var/log/update-grub.calls\\n' "
                    "> /usr/local/sbin/update-grub && chmod 0755 /usr/local/sbin/update-grub")
    try:
        code, result, _ = provision(oslab, tray, "--image", image, "--tags", "base")
        assert code == 0, result
        # regenerated although the grub.d file was already written by the failed run
        assert len(oslab.run(tray, "cat /var/log/update-grub.calls").stdout.splitlines()) == 1
        assert 'iommu.passthrough=1"' in oslab.run(tray, "cat /etc/default/grub.d/90-mctl.cfg").stdout
        assert oslab.run(tray, "tail -1 /var/lib/mctl/reboot-required").stdout.split() == [
            "init_on_alloc=0", "iommu.passthrough=1"]
        code, result, _ = provision(oslab, tray, "--image", image, "--tags", "base")
        assert code == 0 and result["hosts"][tray]["changed"] == 0, result
        assert len(oslab.run(tray, "cat /var/log/update-grub.calls").stdout.splitlines()) == 1
        # the audit reads the running kernel's command line and the flag
        inv = oslab.dir / "mctl.yml"
        inv.write_text(inv.read_text().replace("image: lab-debian13\n", f"image: {image}\n"))
        proc = oslab.mctl("audit", "--json", timeout=300)
        found = [f for f in _findings(json.loads(proc.stdout)) if f.get("check") == "boot.kernel_parameters"]
        by_host = {f["host"]: f for f in found}
        assert by_host[tray]["message"].startswith("reboot required: boot configuration has init_on_alloc=0")
        assert by_host[tray]["details"]["reboot_required"] is True
        other = oslab.trays[-1]
        assert by_host[other]["message"].startswith("kernel parameters not applied")
    finally:
        inv = oslab.dir / "mctl.yml"
        inv.write_text(inv.read_text().replace(f"image: {image}\n", "image: lab-debian13\n"))
        oslab.run(tray, "rm -f /usr/local/sbin/update-grub /var/log/update-grub.calls", check=False)


BRANCH_580 = ["nvidia-driver-580-open", "nvidia-utils-580", "libnvidia-compute-580", "nvidia-compute-utils-580",
              "nvidia-imex-580"]


def test_driver_branch_upgrade_570_to_580(oslab, first_run):
    """Image lab-debian13-580 on a tray of branch 570: the 570 packages' holds released and the packages
    removed, the 580 ones installed, pinned and held; the GPUs then report 580 and `image diff` is clean for
    the new image. The tray is provisioned back to lab-debian13 (branch 570) afterwards."""
    tray = oslab.trays[0]
    image = "lab-debian13-580"
    inv = oslab.dir / "mctl.yml"
    try:
        code, result, took = provision(oslab, tray, "--image", image)
        sys.stderr.write(f"[oslab] branch change 570 -> 580 on one tray: {took:.1f} s\n")
        assert code == 0, result
        rows = dict(line.split("\t", 1) for line in oslab.run(
            tray, "dpkg-query -W -f '${Package}\\t${Version} ${db:Status-Status}\\n' 'nvidia-*' "
                  "'libnvidia-*' 'cuda-toolkit-*'").stdout.splitlines())
        assert {p: rows.get(p) for p in BRANCH_580} == {
            **{p: "580.105.08-0ubuntu1 installed" for p in BRANCH_580[:4]}, "nvidia-imex-580": "580.105.08-1 installed"}
        # the old branch is gone (removed: at most its configuration files are left), CUDA 12.8's toolkit stays
        for p in DRIVER_PKGS + ["nvidia-imex-570"]:
            assert rows.get(p, "").split(" ")[-1] in ("", "config-files", "not-installed"), (p, rows.get(p))
        assert rows["cuda-toolkit-13-0"] == "13.0.2-1 installed" and rows["cuda-toolkit-12-8"] == "12.8.1-1 installed"
        assert set(oslab.run(tray, "apt-mark showhold").stdout.split()) == set(BRANCH_580)
        pin = oslab.run(tray, "cat /etc/apt/preferences.d/mctl-nvidia-driver.pref").stdout
        assert "Package: nvidia-utils-580\nPin: version 580.105.08-0ubuntu1\n" in pin and "570" not in pin
        assert oslab.run(tray, "dpkg -S /usr/bin/nvidia-smi").stdout.split() == ["nvidia-utils-580:", "/usr/bin/nvidia-smi"]
        assert oslab.run(tray, "nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader"
                         ).stdout.splitlines()[0] == "580.105.08, Enabled"
        assert oslab.run(tray, "systemctl is-enabled nvidia-imex").stdout.strip() == "enabled"
        # image diff (the audit's drift rules) against the new image: clean
        inv.write_text(inv.read_text().replace("image: lab-debian13\n", f"image: {image}\n"))
        proc = oslab.mctl("--json", "image", "diff", tray, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert [t["status"] for t in doc["trays"]] == ["match"], doc
    finally:
        inv.write_text(inv.read_text().replace(f"image: {image}\n", "image: lab-debian13\n"))
        # back to branch 570: the same change the other way (the components and nvidia roles are enough)
        code, result, _ = provision(oslab, tray, "--tags", "nvidia")
        oslab.run(tray, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q cuda-toolkit-13-0", check=False)
        assert code == 0, result
    assert set(oslab.run(tray, "apt-mark showhold").stdout.split()) == set(DRIVER_PKGS) | {"nvidia-imex-570"}
    assert oslab.run(tray, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0] \
        == "570.148.08"


def _findings(doc):
    if isinstance(doc, dict):
        if "check" in doc and "host" in doc:
            yield doc
        for v in doc.values():
            yield from _findings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _findings(v)
