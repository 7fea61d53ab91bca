"""The lab's service registry: what `mctl lab up` installs besides the hosts (pure parts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mctl.inventory import load_site
from mctl.lab import services
from mctl.lab.layout import LabLayout
from mctl.sched.slurm import parse_slurmd_c, parse_version, render

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "slurm"


def test_slurm_dropins_track_the_pid_files_slurm_conf_names():
    site = load_site(REPO / "inventories" / "example-gb200")
    _name, hw = parse_slurmd_c((GOLDEN / "gb200-slurmd-C.txt").read_text())
    conf = render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()}).files["slurm.conf"]
    assert f"SlurmctldPidFile={services.SLURM_PID_FILES['slurmctld']}" in conf.splitlines()
    assert f"SlurmdPidFile={services.SLURM_PID_FILES['slurmd']}" in conf.splitlines()
    by_dest = {f.dest: f for f in services.HOST_FILES}
    head = by_dest["/etc/systemd/system/slurmctld.service.d/10-mctl-lab.conf"]
    assert head.kinds == ("head",)
    text = head.content(None).decode()
    assert "Type=\nType=forking\nExecStart=\nExecStart=/usr/sbin/slurmctld $SLURMCTLD_OPTIONS\n" in text


def test_tray_files_never_write_below_a_merged_usr_link():
    # /lib, /bin, /sbin are links into /usr on the image: a file below them would shadow the link.
    for f in services.HOST_FILES:
        assert not f.dest.startswith(("/lib/", "/bin/", "/sbin/", "/lib64/")), f.dest


def test_nmx_service_config_and_inventory(tmp_path):
    layout = LabLayout("lab", 1, 2, net=123)
    ctx = services.RackContext(layout, "lab-r1", 1, layout.service_address(1), tmp_path, tmp_path / "racks" / "lab-r1")
    assert services.NMX_SERVICE in services.RACK_SERVICES
    entry = services._nmx_inventory(ctx)["nmx"]
    assert entry == {"url": "http://127.123.1.200:8443", "verify_tls": False,
                     "credentials_file": str(tmp_path / "racks" / "lab-r1" / "nmx.cred")}
    argv = services._nmx_argv(ctx)
    assert argv[1:4] == ["-m", "mctl.lab.nmx_emulator", "--config"] and argv[4].endswith("racks/lab-r1/nmx.json")


def test_emulator_commands_import_their_module_so_the_tray_caches_bytecode(tmp_path):
    by_dest = {f.dest: f for f in services.HOST_FILES}
    for command, module in (("/usr/bin/nvidia-smi", "nvidia_smi"), ("/usr/bin/nvidia-imex-ctl", "imex_ctl")):
        launcher, lib = by_dest[command], by_dest[f"{services.EMULATOR_LIB}/{module}.py"]
        assert launcher.mode == 0o755 and launcher.kinds == lib.kinds == ("tray",)
        assert lib.content(None) == (services.EMULATORS / f"{module}.py").read_bytes()
        # The launcher runs here too: point it at a copy of the module and ask for nvidia-smi's help text.
        text = launcher.content(None).decode().replace(services.EMULATOR_LIB, str(tmp_path))
        assert text.startswith("#!/usr/bin/python3 -IS\n") and f"import {module}\n" in text
        (tmp_path / f"{module}.py").write_bytes(lib.content(None))
        script = tmp_path / module
        script.write_text(text)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        proc = subprocess.run([sys.executable, "-IS", str(script), "--help"], capture_output=True, text=True, timeout=60,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip()
        assert list((tmp_path / "__pycache__").glob(f"{module}.*.pyc"))
