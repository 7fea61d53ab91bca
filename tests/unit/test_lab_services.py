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


def test_emulator_commands_import_their_module_so_the_tray_caches_bytecode(tmp_path, processes):
    by_dest = {f.dest: f for f in services.HOST_FILES}
    smi = by_dest["/usr/bin/nvidia-smi"]                   # a shell script (replays, see below) importing it too
    assert smi.mode == 0o755 and "import nvidia_smi; nvidia_smi.run()" in smi.content(None).decode()
    for command, module in (("/usr/bin/nvidia-imex-ctl", "imex_ctl"),):
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


def smi_on_this_machine(tmp_path):
    """The tray's /usr/bin/nvidia-smi (a shell script) with the emulator module copied under tmp_path."""
    from mctl.lab.emulators import nvidia_smi as emu

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "nvidia_smi.py").write_bytes((services.EMULATORS / "nvidia_smi.py").read_bytes())
    text = services._smi_launcher(None).decode().replace(services.EMULATOR_LIB, str(lib))
    text = text.replace("exec /usr/bin/python3 -IS", f"exec {sys.executable} -IS")
    launcher = tmp_path / "nvidia-smi"
    launcher.write_text(text)
    launcher.chmod(0o755)
    state = tmp_path / "state" / "gpus.json"
    state.parent.mkdir()
    faults = state.parent / "faults.json"
    gpus = [{"index": i, "uuid": f"GPU-{i:08x}-7c3e-5a1b-9d2f-4e6a8b0c1d2e", "serial": f"1655024000{i}",
             "pci_bus_id": f"0000000{8 + i}:01:00.0", "module_id": i + 1, "minor_number": i,
             "gpu_fabric_guid": f"0x98{i:02x}", "memory_total_mib": 189471, "power_limit_w": 1200.0,
             "temperature_c": 33 + i} for i in range(4)]
    state.write_text(__import__("json").dumps({
        "schema": 1, "hostname": "t01", "driver_version": "570.148.08", "cuda_version": "12.8",
        "product_name": "NVIDIA GB200", "chassis_serial": "1825024170029", "tray_index": 0, "slot_number": 1,
        "host_id": 1, "cluster_uuid": "3f5c1a9e-2b7d-5e04-8c61-9d2a4b7e0f13", "clique_id": 32766,
        "fabric_state": "Completed", "fabric_status": "Success", "gpus": gpus}))
    env = {"PATH": "/usr/bin:/bin", emu.STATE_ENV: str(state), emu.FAULTS_ENV: str(faults)}

    def call(*args):
        return subprocess.run([str(launcher), *args], capture_output=True, text=True, env=env, timeout=60)

    def set_faults(doc):
        tmp = faults.with_suffix(".tmp")
        tmp.write_text(__import__("json").dumps(doc))
        os.replace(tmp, faults)            # as `mctl lab fault` writes it: a rename

    return call, set_faults, state.parent


def test_smi_replays_unchanged_answers_byte_for_byte_with_the_time_of_the_call(tmp_path, processes):
    import re
    import time

    call, set_faults, folder = smi_on_this_machine(tmp_path)
    set_faults({"gpu_missing": [], "xid": [{"gpu": 1, "code": 79, "time": 0}]})
    first = call("-q", "-x")                                   # the emulator answers and stores it
    assert first.returncode == 0 and (folder / ".nvidia-smi.q-x").exists()
    (folder / "nvidia_smi.py").write_text("raise SystemExit('the emulator must not run')")
    time.sleep(1.1)
    again = call("-q", "-x")                                   # replayed by the shell script
    assert (again.returncode, again.stderr) == (first.returncode, first.stderr)
    assert "Unable to determine the device handle" in again.stderr
    strip = lambda text: re.sub(r"<timestamp>[^<]*</timestamp>", "", text)
    assert strip(again.stdout) == strip(first.stdout) and again.stdout != first.stdout   # a later timestamp
    stamp = re.search(r"\t<timestamp>([^<]*)</timestamp>\n", again.stdout).group(1)
    assert stamp == time.asctime(time.strptime(stamp, "%a %b %d %H:%M:%S %Y"))          # time.asctime's layout
    assert abs(time.mktime(time.strptime(stamp, "%a %b %d %H:%M:%S %Y")) - time.time()) < 5
    nvl = call("nvlink", "--status"), call("nvlink", "--status")
    assert nvl[0].stdout == nvl[1].stdout and nvl[0].stdout.count("53.125 GB/s") == 3 * 18


def test_smi_replay_follows_every_change_of_the_state_files_at_once(tmp_path, processes):
    call, set_faults, folder = smi_on_this_machine(tmp_path)
    assert "<inactive>" not in call("nvlink", "--status").stdout        # no faults.json yet
    assert "<inactive>" not in call("nvlink", "--status").stdout        # replayed
    set_faults({"nvlink_down": [[2, 9]]})                                # within the same second
    assert call("nvlink", "--status").stdout.count("<inactive>") == 1
    assert call("nvlink", "--status").stdout.count("<inactive>") == 1
    set_faults({})
    assert "<inactive>" not in call("nvlink", "--status").stdout
    (folder / "gpus.json").unlink()                                      # driver gone: never replayed
    gone = call("-q", "-x")
    assert gone.returncode == 9 and "couldn't communicate with the NVIDIA driver" in gone.stdout
    assert call("-q", "-x", "-i", "0").returncode == 9                   # other calls always run the emulator
