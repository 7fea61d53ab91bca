"""The audit's probes, run for real under /bin/sh on this machine, and their parsers.

The tray probe reads real files; the controller probe runs against a stand-in
`scontrol` on PATH that prints captured Slurm 24.11 output (or fails as
scontrol does when slurmctld is down).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mctl.audit.collect import controller_command, parse_controller
from mctl.facts.probe import AUDIT, from_result, probe_command
from mctl.transport.results import HostKeyProblem, HostResult, HostStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURED = FIXTURES / "golden" / "slurm" / "captured"


def run_local(command: str, env: dict | None = None) -> HostResult:
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60, env=env)
    status = HostStatus.OK if proc.returncode == 0 else HostStatus.FAILED
    return HostResult("lab-r1-tray01", "127.0.0.1", status, proc.returncode, proc.stdout, proc.stderr)


def test_tray_probe_reads_files_versions_and_absence(tmp_path, processes):
    nodes = tmp_path / "nodes_config.cfg"
    nodes.write_text("127.83.1.1\n127.83.1.2\n")
    absent = tmp_path / "config.cfg"
    unreadable = tmp_path / "dir.cfg"
    unreadable.mkdir()                  # cat of a directory fails: unreadable, not absent
    files = [str(nodes), str(absent), str(unreadable)]
    nonce = "0123456789abcdef"
    result = run_local(probe_command(AUDIT, nonce, files=files))
    state = from_result(AUDIT, result, nonce, files=files)
    assert state.reached and state.problems == ()
    assert state.files == {str(nodes): "127.83.1.1\n127.83.1.2\n", str(absent): None}
    assert "Is a directory" in state.file_errors[str(unreadable)]
    assert state.os is not None and state.os.id and state.kernel == Path("/proc/sys/kernel/osrelease").read_text().strip()
    # this machine may or may not have slurmd: either a version or a reason, never both
    assert (state.slurmd_version is None) != (state.slurmd_error is None)


def test_tray_that_did_not_answer_keeps_the_refused_host_key():
    problem = HostKeyProblem("ssh-ed25519 SHA256:new", ("ssh-ed25519 SHA256:old",), "kh")
    result = HostResult("t", "127.0.0.9", HostStatus.HOST_KEY_MISMATCH, error="HOST KEY CHANGED", host_key=problem)
    state = from_result(AUDIT, result, "n")
    assert not state.reached and state.reach == "host-key-mismatch" and state.host_key is problem


def fake_scontrol(tmp_path: Path, *, down: bool = False) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if down:
        body = "echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2; exit 1\n"
    else:
        body = (f'case "$1 $2" in\n'
                f'  "show node") cat {CAPTURED / "scontrol-show-node-o.txt"} ;;\n'
                f'  "show topology") cat {CAPTURED / "scontrol-show-topology.txt"} ;;\n'
                f'  "show partition") cat {CAPTURED / "scontrol-show-partition-o.txt"} ;;\n'
                '  "show config") printf "%s\\n" "SLURM_VERSION           = 24.11.5" '
                '"SwitchType              = switch/nvidia_imex" "TopologyPlugin          = topology/block" '
                '"TreeWidth               = 16" ;;\n'
                '  *) exit 2 ;;\nesac\n')
    script = bin_dir / "scontrol"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_controller_probe_with_captured_slurm_output(tmp_path, processes):
    conf = tmp_path / "etc-slurm"
    conf.mkdir()
    (conf / "topology.conf").write_text("BlockName=lab-r1-p0 Nodes=lab-r1-tray[01-02]\n")
    nonce = "feedfacecafebeef"
    state = parse_controller(run_local(controller_command(nonce, str(conf)), env=fake_scontrol(tmp_path)), nonce)
    assert state.error is None and state.now_local is not None
    assert [n.name for n in state.nodes] == [f"lab-r1-tray0{i}" for i in range(1, 5)]
    assert [(e.name, e.kind) for e in state.topology] == [("lab-r1-p0", "block"), ("lab-r1-p1", "block"),
                                                          ("lab-r1-p[0-1]", "aggregated")]
    assert state.config == {"SLURM_VERSION": "24.11.5", "SwitchType": "switch/nvidia_imex",
                            "TopologyPlugin": "topology/block"}
    assert state.partitions["gpu"]["State"] == "UP"
    assert state.topology_conf == "BlockName=lab-r1-p0 Nodes=lab-r1-tray[01-02]\n"


def test_controller_without_topology_conf_and_with_slurmctld_down(tmp_path, processes):
    nonce = "feedfacecafebeef"
    state = parse_controller(run_local(controller_command(nonce, str(tmp_path / "nowhere")),
                                       env=fake_scontrol(tmp_path)), nonce)
    assert state.error is None and state.topology_conf is None and state.topology_conf_error is None
    down = tmp_path / "down"
    down.mkdir()
    state = parse_controller(run_local(controller_command(nonce, str(tmp_path)), env=fake_scontrol(down, down=True)),
                             nonce)
    assert state.error == ("scontrol show node on lab-r1-tray01: slurm_load_node error: Unable to contact slurm "
                           "controller (connect failure)")
    gone = parse_controller(HostResult("lab-r1-head", "127.0.0.1", HostStatus.UNREACHABLE,
                                       error="no SSH answer within 5s"), nonce)
    assert gone.error == "lab-r1-head: unreachable: no SSH answer within 5s" and not gone.reached


def test_without_a_health_sweep_the_tray_probe_runs_nvidia_smi(tmp_path, processes):
    from mctl.audit.collect import Actual

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n[ \"$1 $2\" = '-q -x' ] || exit 2\ncat {FIXTURES / 'lab' / 'healthy-q-x.xml'}\n")
    smi.chmod(0o755)
    nonce = "0123456789abcdef"
    result = run_local(probe_command(AUDIT, nonce, smi_timeout=10), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    state = from_result(AUDIT, result, nonce, smi_timeout=10)
    assert state.gpus is not None and state.gpu_error is None and len(state.gpus.gpus) == 4
    actual = Actual({state.host: state}, None, {})
    assert actual.gpu_versions(state.host) == (state.gpus.driver_version, state.gpus.cuda_version, None)
    assert state.gpus.driver_version == "570.148.08"
    missing = from_result(AUDIT, run_local(probe_command(AUDIT, nonce, smi_timeout=10), env={"PATH": "/usr/bin:/bin"}), nonce, smi_timeout=10)
    assert missing.gpus is None and missing.gpu_error == "nvidia-smi is not installed (command not found)"
    assert Actual({state.host: missing}, None, {}).gpu_versions(state.host) == (None, None,
                                                                                "nvidia-smi is not installed (command not found)")
