"""Parsers for Slurm's output, on real captures from Slurm 24.11 (tests/fixtures/golden/slurm/captured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.sched.slurm import parse_show_nodes, parse_show_topology, parse_slurmd_c, parse_version
from mctl.sched.slurm.facts import key_values
from mctl.facts.slurm_version import SlurmVersion

CAPTURED = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "golden" / "slurm" / "captured"


def test_slurmd_c_capture():
    name, hw = parse_slurmd_c((CAPTURED / "slurmd-C.txt").read_text())
    assert name == "lab-r1-tray01"
    assert (hw.cpus, hw.sockets, hw.cores_per_socket, hw.threads_per_core) == (2, 1, 2, 1)
    assert hw.real_memory == 23552          # 24105 MiB rounded down to whole GiB


def test_slurmd_c_boards_multiply_sockets():
    _n, hw = parse_slurmd_c("NodeName=n CPUs=8 Boards=2 SocketsPerBoard=2 CoresPerSocket=2 ThreadsPerCore=1 "
                            "RealMemory=512")
    assert hw.sockets == 4 and hw.real_memory == 512


@pytest.mark.parametrize("text", ["", "slurmd: error: something", "NodeName=n CPUs=x"])
def test_slurmd_c_rejects_other_text(text):
    with pytest.raises(ValueError):
        parse_slurmd_c(text)


@pytest.mark.parametrize("text, expected", [
    ("slurm-wlm 24.11.5\n", SlurmVersion(24, 11, 5)),
    ("slurm 23.11.10", SlurmVersion(23, 11, 10)),
    ("slurm 24.05.0-0rc1", SlurmVersion(24, 5, 0)),
    ("slurmctld: error: x\nslurm 22.05.8", SlurmVersion(22, 5, 8)),
])
def test_versions(text, expected):
    v = parse_version(text)
    assert v == expected
    assert v.block_topology == (v.release >= (23, 11))
    assert v.nvidia_imex == v.block_sizes == v.segment == (v.release >= (24, 5))


def test_version_capture_and_garbage():
    assert str(parse_version((CAPTURED / "slurmctld-V.txt").read_text())) == "24.11.5"
    with pytest.raises(ValueError):
        parse_version("bash: slurmctld: command not found")


def test_show_node_capture():
    nodes = {n.name: n for n in parse_show_nodes((CAPTURED / "scontrol-show-node-o.txt").read_text())}
    assert sorted(nodes) == [f"lab-r1-tray0{i}" for i in range(1, 5)]
    t2 = nodes["lab-r1-tray02"]
    assert t2.state == "IDLE+DRAIN" and t2.drained and t2.registered
    assert t2.reason == "mctl: test drain [root@2026-11-29T19:51:38]"
    assert t2.port == 16471 and t2.address == "127.83.1.2" and t2.gres == "gpu:4"
    assert nodes["lab-r1-tray03"].registered and not nodes["lab-r1-tray03"].drained
    # values with spaces stay whole
    assert t2.fields["OS"].startswith("Linux 6.")


@pytest.mark.parametrize("state, reason, registered", [
    ("IDLE", None, True), ("MIXED+DRAIN", "x", True), ("ALLOCATED", None, True),
    ("IDLE*", None, False), ("DOWN+NOT_RESPONDING", None, False), ("UNKNOWN", None, False),
    ("IDLE+DRAIN+INVALID_REG", "gres/gpu count reported lower than configured (0 < 4)", False),
    ("DOWN", "Not responding", False), ("DOWN", "operator took it out", True),
])
def test_registered(state, reason, registered):
    line = f"NodeName=n State={state}" + (f" Reason={reason}" if reason else "")
    (node,) = parse_show_nodes(line)
    assert node.registered is registered


def test_show_topology_capture():
    entries = parse_show_topology((CAPTURED / "scontrol-show-topology.txt").read_text())
    assert [(e.name, e.kind, e.nodes, e.size) for e in entries] == [
        ("lab-r1-p0", "block", "lab-r1-tray[01-03]", 1),
        ("lab-r1-p1", "block", "lab-r1-tray04", 1),
        ("lab-r1-p[0-1]", "aggregated", "lab-r1-tray[01-04]", 2),
    ]


def test_show_topology_tree():
    entries = parse_show_topology("SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n[0-3]\n"
                                  "SwitchName=top Level=1 LinkSpeed=1 Switches=s[0-1]\n")
    assert [(e.name, e.kind, e.nodes, e.switches) for e in entries] == [
        ("s0", "switch", "n[0-3]", None), ("top", "switch", None, "s[0-1]")]


def test_key_values_keeps_spaces_and_equals_free_words():
    assert key_values("A=1 Reason=foo bar [x@y] B=2") == {"A": "1", "Reason": "foo bar [x@y]", "B": "2"}
