"""Real captures of `nvidia-imex-ctl`, the IMEX daemon log and Slurm through mctl's parsers (issue 16).

Every file named here lives in tests/fixtures/real/ with its provenance in that folder's README;
expectations are written from reading each file. A test that needs a variant (a drained state on
a real reason) builds it in memory and says so.
"""

from __future__ import annotations

import io
import re
from datetime import datetime

import pytest

from mctl.audit.rules import drains
from mctl.facts import FactsParseError
from mctl.facts.imex import parse_domain, parse_nodes_config, parse_query
from mctl.model.fabric import DAEMON_STATES
from ClusterShell.NodeSet import NodeSet

from mctl.audit.rules.slurm import found_blocks
from mctl.sched.slurm.facts import (NodeHardware, NodeState, key_values, parse_show_nodes, parse_show_topology,
                                   parse_slurmd_c)
from tests.helpers import REAL_SAMPLES, REAL_SCHED_SAMPLES, real_text

def test_every_sched_sample_is_here_and_has_provenance():
    readme = (REAL_SAMPLES / "README.md").read_text(encoding="utf-8")
    for name in REAL_SCHED_SAMPLES:
        assert (REAL_SAMPLES / name).is_file(), name
        assert f"`{name}`" in readme, f"{name} has no provenance row"


# --- nvidia-imex-ctl --------------------------------------------------------------------------------

def test_real_query_answer_is_ready():
    assert real_text("jpsnips-imex-ctl-q-ready.txt") == "READY\n"
    assert parse_query(real_text("jpsnips-imex-ctl-q-ready.txt")) == "READY"


def test_real_wait_for_ready_output_reads_as_ready():
    """`-s -t 2000` prints `READY stopAtReady: 0`, `keepGoing: 1`, `Finishing subscription`, `READY`."""
    sample = real_text("jpsnips-imex-ctl-s-t-2000.txt")
    assert sample.splitlines()[0].startswith("READY ") and sample.splitlines()[-1] == "READY"
    assert parse_query(sample) == "READY"


@pytest.mark.parametrize("name", ["jpsnips-imex-daemon-log-570-node0.txt", "jpsnips-imex-ctl-s-t-2000.txt",
                                  "jpsnips-imex-ctl-q-ready.txt"])
def test_foreign_imex_output_is_not_read_as_a_domain(name):
    """Whatever is not `-N` output (the -q word, the -s lines, the daemon log) is refused, not half-read."""
    with pytest.raises(FactsParseError):
        parse_domain(real_text(name))


def test_daemon_log_is_not_a_query_answer():
    with pytest.raises(FactsParseError, match="not a daemon state"):
        parse_query(real_text("jpsnips-imex-daemon-log-570-node0.txt"))


_LOG_LINE = re.compile(r"^\[(?P<stamp>[A-Z][a-z]{2} \d{2} \d{4} \d{2}:\d{2}:\d{2})\] \[(?P<level>[A-Z]+)\] "
                       r"\[tid (?P<tid>\d+)\] (?P<message>.*)$")


def test_real_daemon_log_layout():
    lines = real_text("jpsnips-imex-daemon-log-570-node0.txt").splitlines()
    assert lines[0] == "IMEX Log initializing at: 3/25/2025 10:41:54.338"
    body = [ln for ln in lines[1:] if ln]
    assert body and all(_LOG_LINE.match(ln) for ln in body), [ln for ln in body if not _LOG_LINE.match(ln)]
    messages = [_LOG_LINE.match(ln)["message"] for ln in body]
    assert messages[0] == "IMEX version 570.00 is running with the following configuration options"
    assert "Creating gRPC channels to all peers (nPeers = 2)." in messages
    stamp = _LOG_LINE.match(body[0])["stamp"]
    assert datetime.strptime(stamp, "%b %d %Y %H:%M:%S") == datetime(2025, 3, 25, 10, 41, 54)


_VERSION_LINE = re.compile(r"^IMEX version (?P<version>\S+) is running with the following configuration options:?$")


@pytest.mark.parametrize("name,version,first", [
    ("jpsnips-imex-daemon-log-570-node0.txt", "570.00", 0),
    ("issue-dra-driver-pr298-imex-570-nodes-config-and-log.txt", "570.124.06", 3),
    ("issue-dra-driver-pr1465-imex-580-daemon-log.txt", "580.159.04", 3),
])
def test_real_daemon_logs_of_three_versions(name, version, first):
    """Every line from `IMEX Log initializing at:` on has the one layout; 580 ends the version line with ':'."""
    lines = real_text(name).splitlines()[first:]
    assert re.match(r"^IMEX Log initializing at: \d{1,2}/\d{1,2}/\d{4} \d{2}:\d{2}:\d{2}\.\d{3}$", lines[0])
    body = [ln for ln in lines[1:] if ln]
    assert all(_LOG_LINE.match(ln) for ln in body), [ln for ln in body if not _LOG_LINE.match(ln)]
    m = _VERSION_LINE.match(_LOG_LINE.match(body[0])["message"])
    assert m and m["version"] == version
    assert m.group(0).endswith(":") == version.startswith("580")


def test_real_580_log_on_stderr_and_host_name_entries():
    lines = real_text("issue-dra-driver-pr1465-imex-580-daemon-log.txt").splitlines()
    # with no log file the daemon says so on stderr before the first stamped line
    assert lines[:3] == ["WARNING: failed to open IMEX log file  errno = No such file or directory",
                         "INFO: using stderr for IMEX logging",
                         "WARNING: failed to chmod IMEX log file  errno = No such file or directory"]
    messages = [_LOG_LINE.match(ln)["message"] for ln in lines[4:]]
    assert "Logging file name/path = " in messages and "Authentication and Encryption enabled = 0" in messages
    hosts = [re.match(r"Treating node config entry '(.+)' as a host name\.$", m) for m in messages]
    assert [h[1] for h in hosts if h] == ["compute-domain-daemon-7555db58d7-0000",
                                          "compute-domain-daemon-7555db58d7-0001"]
    # such names are what a nodes_config.cfg may hold: one entry a line
    assert parse_nodes_config("\n".join(h[1] for h in hosts if h)) == (
        "compute-domain-daemon-7555db58d7-0000", "compute-domain-daemon-7555db58d7-0001")


def test_real_nodes_config_as_printed():
    lines = real_text("issue-dra-driver-pr298-imex-570-nodes-config-and-log.txt").splitlines()
    assert lines[0] == "/etc/nvidia-imex/nodes_config.cfg:"
    assert parse_nodes_config("\n".join(lines[1:3])) == ("10.115.131.13", "10.115.131.6")
    # the whole capture is not a nodes_config.cfg (the log lines hold more than an address)
    with pytest.raises(FactsParseError):
        parse_nodes_config(real_text("issue-dra-driver-pr298-imex-570-nodes-config-and-log.txt"))


def test_lab_imex_daemon_logs_the_real_layout_and_messages():
    """The lab's IMEX daemon writes the layout and the start-up sentences of the real log above."""
    from mctl.lab.emulators.imex_daemon import Daemon

    real = [_LOG_LINE.match(ln)["message"] for ln in real_text("jpsnips-imex-daemon-log-570-node0.txt").splitlines()
            if _LOG_LINE.match(ln)]
    daemon = Daemon("/nonexistent/config.cfg")
    daemon.log_fh = io.StringIO()
    daemon.cfg = {"BIND_INTERFACE_IP": "10.136.206.47", "IMEX_WAIT_FOR_QUORUM": "RECOVERY"}
    # one node: start_peers dials no peer (nothing leaves this process)
    daemon.nodes, daemon.index = ["10.136.206.47"], 0
    daemon.start_peers()
    lab = daemon.log_fh.getvalue().splitlines()
    assert lab and all(_LOG_LINE.match(ln) for ln in lab), lab
    said = [_LOG_LINE.match(ln)["message"] for ln in lab]
    # the interface name differs (the lab binds to lo, the real one was enP2s2f1)
    assert said[0].split(", and network interface")[0] == real[real.index(next(
        m for m in real if m.startswith("Identified this node")))].split(", and network interface")[0]
    assert "Creating gRPC channels to all peers (nPeers = 1)." in said
    assert ("IMEX_WAIT_FOR_QUORUM != FULL, continuing initialization without waiting for connections to all "
            "nodes.") in said and said[-1] in real
    assert daemon.state in DAEMON_STATES


# --- Slurm: scontrol show node without -o ----------------------------------------------------------

def test_multi_line_show_node_powered_down_cloud_node():
    """Without -o the state, reason and the rest are on indented lines: they belong to the node."""
    [node] = parse_show_nodes(real_text("slurm-on-aws-scontrol-show-node-down-cloud-powered-down.txt"))
    assert node.name == "gpu-st-ml-1"
    assert node.state == "DOWN+CLOUD+POWERED_DOWN"
    assert node.flags == {"DOWN", "CLOUD", "POWERED_DOWN"}
    assert node.gres == "gpu:rtxproserver6000:1" and node.address == "10.0.10.166"
    assert node.fields["CPUTot"] == "32" and node.fields["RealMemory"] == "249036"
    assert node.fields["FreeMem"] == "N/A" and node.fields["BootTime"] == "None"
    assert node.reason == "Static node maintenance: unhealthy node is being replaced [root@2026-03-13T04:18:07]"
    assert not node.registered and not node.drained
    view = node.view()
    assert view.down and not view.drained
    assert view.reason == "Static node maintenance: unhealthy node is being replaced"
    assert not view.mctl_drain


def test_multi_line_show_node_registered_cloud_node():
    [node] = parse_show_nodes(real_text("slurm-on-aws-scontrol-show-node-idle-cloud.txt"))
    assert (node.name, node.state, node.address) == ("gpu-st-ml-1", "IDLE+CLOUD", "10.0.10.160")
    assert node.fields["Version"] == "24.11.7" and node.fields["SlurmdStartTime"] == "2026-03-11T11:05:49"
    assert node.fields["OS"] == "Linux 6.8.0-1045-aws #47~22.04.1-Ubuntu SMP Thu Jan 29 21:28:23 UTC 2026"
    assert node.fields["InstanceType"] == "g7e.8xlarge"
    assert node.reason == "Node start up [root@2026-03-11T11:05:51]"
    # slurmd started and registered (SlurmdStartTime, Version): CLOUD alone is not "unregistered"
    assert node.registered
    # an idle node's leftover reason does not count (scontrol(1): only while drained, down or failing)
    assert node.view().reason is None


def test_one_line_and_multi_line_forms_read_the_same():
    """The same capture joined onto one line (as -o prints it) reads to the same node (variant built here)."""
    sample = real_text("slurm-on-aws-scontrol-show-node-idle-cloud.txt")
    one_line = " ".join(ln.strip() for ln in sample.splitlines() if ln.strip())
    [multi], [single] = parse_show_nodes(sample), parse_show_nodes(one_line)
    assert multi == single and multi.fields == single.fields


def test_multi_line_records_end_at_an_unindented_line():
    sample = real_text("slurm-on-aws-scontrol-show-node-down-cloud-powered-down.txt")
    [node] = parse_show_nodes(sample + "ubuntu@ip-10-0-0-130:~$ sudo tail -50 x\n   Weight=99\n")
    assert node.fields["Weight"] == "1"


# --- Slurm: the drain reason stamp -----------------------------------------------------------------

def test_real_reason_stamps_are_split_off():
    samples = {
        "issue-arjuna-users-164-reason-stamp.txt": ("Node unexpectedly rebooted", "slurm",
                                                    datetime(2022, 7, 23, 15, 31, 0)),
        "slurm-on-aws-scontrol-show-node-down-cloud-powered-down.txt": (
            "Static node maintenance: unhealthy node is being replaced", "root", datetime(2026, 3, 13, 4, 18, 7)),
        "slurm-on-aws-scontrol-show-node-idle-cloud.txt": ("Node start up", "root",
                                                           datetime(2026, 3, 11, 11, 5, 51)),
    }
    for name, (reason, who, since) in samples.items():
        raw = key_values(real_text(name).replace("\n", " "))["Reason"]
        # the real reasons on a drained node (variant: the state is set here, the reason is the real one)
        drain = drains.drain_of(NodeState("n1", "IDLE+DRAIN", raw))
        assert (drain.reason, drain.who, drain.since) == (reason, who, since), name
        assert NodeState("n1", "DOWN+DRAIN", raw).view().reason == reason


# --- Slurm: state words with suffixes ---------------------------------------------------------------

def _states(name: str) -> list[str]:
    return [line.split()[-1] if name.startswith("slurm-on-aws") else line.split()[1]
            for line in real_text(name).splitlines()[(1 if name.startswith("slurm-on-aws") else 0):]]


def test_real_sinfo_states_with_suffixes():
    states = _states("issue-arjuna-users-85-sinfo-state-suffixes.txt")
    assert states == ["maint", "down$", "fail*", "down*"]
    nodes = {s: NodeState("n", s) for s in states}
    assert nodes["down$"].flags == {"DOWN"} and nodes["down*"].flags == {"DOWN"}
    assert nodes["fail*"].flags == {"FAIL"} and nodes["maint"].flags == {"MAINT"}
    assert not nodes["down*"].registered and not nodes["fail*"].registered
    assert nodes["fail*"].view().drained and nodes["down$"].view().down


def test_powered_off_suffix_is_not_registered():
    """sinfo `down~` (powered off) for the nodes scontrol shows as DOWN+CLOUD+POWERED_DOWN in the same capture."""
    states = _states("slurm-on-aws-sinfo-N-down-powered-off.txt")
    assert states == ["down~", "down~"]
    node = NodeState("gpu-st-ml-1", states[0])
    assert node.flags == {"DOWN"} and not node.registered
    # a suffix on any part of a combined state counts (the form of 'DOWN*+DRAIN', rackslab/Slurm-web#153)
    assert not NodeState("n", "DOWN*+DRAIN").registered
    assert not NodeState("n", "IDLE#").registered
    assert NodeState("n", "IDLE+DRAIN").registered and NodeState("n", "MIXED+PLANNED").registered


def test_crusoe_sinfo_down_star_is_not_registered():
    lines = real_text("crusoe-slurm-sinfo-down-not-responding.txt").splitlines()
    assert lines[0].split() == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    states = {row.split()[5]: row.split()[4] for row in lines[1:]}
    assert states == {"slurm-compute-node-0": "down*", "slurm-compute-node-[1-7]": "idle"}
    assert not NodeState("slurm-compute-node-0", "down*").registered
    assert NodeState("slurm-compute-node-1", "idle").registered


# --- Slurm: scontrol show topology (block plugin) ---------------------------------------------------

def test_real_block_topology_of_ten_nvl72_racks():
    entries = parse_show_topology(real_text("crusoe-slurm-scontrol-show-topology-block-gb200.txt"))
    assert [e.name for e in entries] == [f"block{i:02d}" for i in range(1, 11)]
    assert {e.kind for e in entries} == {"block"} and {e.size for e in entries} == {18}
    assert entries[0].nodes == "slurm-compute-node-[000-017]" and entries[-1].nodes == "slurm-compute-node-[162-179]"
    members = [set(NodeSet(e.nodes)) for e in entries]
    assert all(len(m) == 18 for m in members)
    assert set().union(*members) == {f"slurm-compute-node-{i:03d}" for i in range(180)}
    blocks = found_blocks(entries, "block")
    assert blocks["block03"] == "slurm-compute-node-[036-053]" and len(blocks) == 10
    # the BlockIndex field is read too (the parser keeps every field in key_values)
    first = real_text("crusoe-slurm-scontrol-show-topology-block-gb200.txt").splitlines()[0]
    assert key_values(first) == {"BlockName": "block01", "BlockIndex": "0", "Nodes": "slurm-compute-node-[000-017]",
                                 "BlockSize": "18"}


# --- Slurm: slurmd -C -------------------------------------------------------------------------------

def test_real_slurmd_c():
    sample = real_text("minyang-chen-slurmd-C-slurmnode6.txt")
    assert sample.splitlines()[1] == "UpTime=0-02:55:22"
    name, hw = parse_slurmd_c(sample)
    # RealMemory=56153 MiB is rounded down to whole GiB (54 GiB) so trays of one model share a line
    assert (name, hw) == ("slurmnode6", NodeHardware(cpus=24, sockets=1, cores_per_socket=12, threads_per_core=2,
                                                     real_memory=54 * 1024))
    assert hw.sockets * hw.cores_per_socket * hw.threads_per_core == hw.cpus
