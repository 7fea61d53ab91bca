"""IMEX renderers (golden files), domain assessment, the SSH probe's parser, and the per-job scripts run for real.

Regenerate the golden files after an intended change with:
    MCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_imex_render.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.fabric.imex import (TrayImexReport, assess_domain, imex_domains, render_nodes_config, render_rack,
                              trays_needing, expected_files)
from mctl.model.imex import ImexSettings, ImexTLS, render_config
from mctl.sched.slurm.imex_job import JobScopeSettings, render_epilog, render_prolog
from mctl.fabric.imex import compare_views
from mctl.fabric.imex_remote import parse_probe, probe_command, push_command, report_from
from mctl.facts import FactsParseError
from mctl.inventory import load_site
from mctl.model.fabric import ImexDomainStatus, ImexNodeStatus
from mctl.transport.results import HostResult, HostStatus

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "imex"
REGEN = os.environ.get("MCTL_REGEN_GOLDEN") == "1"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file (MCTL_REGEN_GOLDEN=1 to update)"


@pytest.fixture(scope="module")
def site():
    return load_site(REPO / "inventories" / "example-gb200")


def test_domains_follow_partitions(site):
    a = imex_domains(site.racks["rack-a"])
    assert [(d.name, len(d.members)) for d in a] == [("p0", 9), ("p1", 9)]
    assert a[1].addresses[0] == "10.20.1.20" and a[1].trays[-1] == "rack-a-tray18"
    bare = replace(site.racks["rack-a"], partitions=())
    assert [(d.name, len(d.members)) for d in imex_domains(bare)] == [("default", 18)]


def test_golden_partition_files(site):
    rack = site.racks["rack-a"]
    p0 = imex_domains(rack)[0]
    golden("nodes_config-rack-a-p0.cfg", render_nodes_config(p0))
    golden("config-rack-a-tray03.cfg", render_config(ImexSettings(), p0.members[2], p0))
    tls = ImexSettings(tls=ImexTLS("/etc/nvidia-imex/tls/server.key", "/etc/nvidia-imex/tls/server.crt",
                                   "/etc/nvidia-imex/tls/ca.crt", "/etc/nvidia-imex/tls/client.key",
                                   "/etc/nvidia-imex/tls/client.crt", "/etc/nvidia-imex/tls/ca.crt"),
                       disconnected_grace_time=120, wait_for_quorum="FULL")
    golden("config-rack-a-tray03-tls.cfg", render_config(tls, p0.members[2], p0))


def test_every_tray_of_a_domain_gets_the_same_node_list(site):
    files = render_rack(site.racks["rack-a"], ImexSettings())
    assert len(files) == 18
    lists = {t.domain: set() for t in files}
    for t in files:
        lists[t.domain].add(dict(t.files)["/etc/nvidia-imex/nodes_config.cfg"])
        assert f"BIND_INTERFACE_IP={t.address}\n" in dict(t.files)["/etc/nvidia-imex/config.cfg"]
    assert all(len(v) == 1 for v in lists.values())


def test_settings_from_inventory_vars():
    s = ImexSettings.from_vars({"server_port": 51000, "tls": None, "restart_command": "rc-service imex restart"})
    assert s.server_port == 51000 and s.restart_command.startswith("rc-service")
    for bad, msg in (({"server_port": 0}, "TCP port"), ({"wait_for_quorum": "SOME"}, "one of"),
                     ({"log_levle": 1}, "unknown key"), ({"tls": {"server_key": "x"}}, "vars.imex.tls")):
        with pytest.raises(UsageError, match=msg):
            ImexSettings.from_vars(bad)


# ------------------------------------------------------------------ status

def _status(addresses, state="UP", links=None, node_states=None) -> ImexDomainStatus:
    n = len(addresses)
    nodes = []
    for i, a in enumerate(addresses):
        row = tuple(links[i]) if links else ("C",) * n
        nodes.append(ImexNodeStatus(i, a, (node_states or ["READY"] * n)[i], "570.172", None, row))
    return ImexDomainStatus(state, tuple(nodes))


def _reports(domain, **overrides):
    nodes = render_nodes_config(domain)
    out = {}
    for m in domain.members:
        out[m.tray] = TrayImexReport(m.tray, nodes_config=nodes, query="READY", status=_status(domain.addresses))
    out.update(overrides)
    return out


def test_assess_up_and_reasons(site):
    domain = imex_domains(site.racks["rack-a"])[0]
    health = assess_domain(domain, _reports(domain))
    assert health.state == "UP" and not health.reasons

    shuffled = "".join(f"{a}\n" for a in reversed(domain.addresses))
    bad = _reports(domain, **{"rack-a-tray04": TrayImexReport("rack-a-tray04", nodes_config=shuffled, query="READY",
                                                              status=_status(domain.addresses, "DEGRADED"))})
    health = assess_domain(domain, bad)
    assert health.state == "DEGRADED"
    assert health.reasons[0].message == "node map mismatch on tray rack-a-tray04: same addresses in another order"
    assert health.reasons[0].tray == "rack-a-tray04"

    links = [["C"] * 9 for _ in range(9)]
    links[0][5] = "!M!"
    links[1][5] = "D"
    mism = _reports(domain, **{"rack-a-tray01": TrayImexReport(
        "rack-a-tray01", nodes_config=render_nodes_config(domain), query="READY",
        status=_status(domain.addresses, "DEGRADED", links))})
    messages = [r.message for r in assess_domain(domain, mism).reasons]
    assert "node map mismatch between tray rack-a-tray01 and tray rack-a-tray06" in messages
    assert "tray rack-a-tray02 is not connected to tray rack-a-tray06 (disconnected)" in messages


def test_assess_down_and_unreachable(site):
    domain = imex_domains(site.racks["rack-a"])[1]
    reports = {t: TrayImexReport(t, nodes_config=render_nodes_config(domain), query="WAITING_FOR_PEERS")
               for t in domain.trays}
    reports["rack-a-tray10"] = TrayImexReport("rack-a-tray10", nodes_config=render_nodes_config(domain),
                                              query="READY")
    reports["rack-a-tray11"] = TrayImexReport("rack-a-tray11", reachable=False, error="unreachable: timed out")
    health = assess_domain(domain, reports)
    assert health.state == "DOWN"
    messages = [r.message for r in health.reasons]
    assert "IMEX daemon on tray rack-a-tray12 is WAITING_FOR_PEERS" in messages
    assert "tray rack-a-tray11 unreachable: unreachable: timed out" in messages
    assert ("rack-a-tray11", "UNREACHABLE") in health.per_tray
    none = assess_domain(domain, {t: TrayImexReport(t, reachable=False) for t in domain.trays})
    assert none.state == "UNKNOWN"


def test_apply_plan_lists_only_differing_files(site):
    rack = site.racks["rack-b"]
    expected = expected_files(rack, ImexSettings())
    current = {t: dict(files) for t, files in expected.items()}
    current["rack-b-tray07"]["/etc/nvidia-imex/nodes_config.cfg"] = "10.0.0.1\n"
    current["rack-b-tray08"]["/etc/nvidia-imex/config.cfg"] = None
    assert trays_needing(expected, current) == {"rack-b-tray07": ["/etc/nvidia-imex/nodes_config.cfg"],
                                                "rack-b-tray08": ["/etc/nvidia-imex/config.cfg"]}


# ------------------------------------------------------------- SSH probe

def _run_probe(tmp_path: Path, ctl_script: str) -> str:
    """Run the real probe under bash with a stand-in nvidia-imex-ctl on PATH and the files in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ctl = bin_dir / "nvidia-imex-ctl"
    ctl.write_text("#!/bin/sh\n" + ctl_script)
    ctl.chmod(0o755)
    (tmp_path / "nodes.cfg").write_text("10.0.0.1\n10.0.0.2")          # no trailing newline on purpose
    settings = ImexSettings(node_config_file=str(tmp_path / "nodes.cfg"))
    script = probe_command(settings).replace("/etc/nvidia-imex/config.cfg", str(tmp_path / "absent.cfg"))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout


def test_probe_output_round_trip(tmp_path, processes):
    doc = '{"nodes": {"0": {"status": "READY", "host": "10.0.0.1", "connections": {"0": {"status": "CONNECTED"}, ' \
          '"1": {"status": "CONNECTED"}}}, "1": {"status": "READY", "host": "10.0.0.2", "connections": ' \
          '{"0": {"status": "CONNECTED"}, "1": {"status": "CONNECTED"}}}}, "status": "UP"}'
    text = ("Nodes:\nNode #0   - 10.0.0.1        - READY\nNode #1   - 10.0.0.2        - READY\n\n"
            " Nodes From\\To  0  1\n       0        C  C\n       1        C  C\nDomain State: UP")
    out = _run_probe(tmp_path, f"case \"$*\" in *-q*) echo READY;; *-j*) echo '{doc}';; "
                               f"*) printf '%s\\n' '{text}';; esac\n")
    sections = parse_probe(out)
    assert sections["nodes_config"].text == "10.0.0.1\n10.0.0.2" and sections["nodes_config"].rc == 0
    assert sections["config"].rc != 0
    report, files = report_from(HostResult("t1", "10.0.0.1", HostStatus.OK, 0, out))
    assert report.query == "READY" and report.status is not None and report.status.state == "UP"
    assert report.text_status is not None and report.text_error is None
    assert compare_views(report.status, report.text_status) == []
    assert files["nodes_config"] == "10.0.0.1\n10.0.0.2" and files["/etc/nvidia-imex/config.cfg"] is None


def test_probe_with_a_dead_daemon(tmp_path, processes):
    out = _run_probe(tmp_path, "echo 'cannot connect to the IMEX command service' >&2; exit 1\n")
    report, _ = report_from(HostResult("t1", "10.0.0.1", HostStatus.OK, 0, out))
    assert report.query is None and "cannot connect" in report.error
    with pytest.raises(FactsParseError, match="truncated"):
        parse_probe(out[: len(out) // 2])
    unreachable, files = report_from(HostResult("t2", "10.0.0.2", HostStatus.UNREACHABLE, error="refused"))
    assert not unreachable.reachable and files == {}


def test_push_command_writes_atomically(tmp_path, processes):
    target = tmp_path / "etc" / "nvidia-imex" / "nodes_config.cfg"
    script = push_command({str(target): "10.0.0.1\n10.0.0.2\n", str(tmp_path / "q'uote.cfg"): "A=1\n"},
                          f"touch {tmp_path}/restarted")
    subprocess.run(["bash", "-c", script], check=True, timeout=30)
    assert target.read_text() == "10.0.0.1\n10.0.0.2\n" and (tmp_path / "q'uote.cfg").read_text() == "A=1\n"
    assert (tmp_path / "restarted").exists() and oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in target.parent.iterdir()) == ["nodes_config.cfg"]
    # The restart command is not under errexit: its last status decides (a missing pid file is fine).
    script = push_command({str(target): "x\n"}, f"pid=$(cat {tmp_path}/absent.pid 2>/dev/null); echo started")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "started\n"


# ------------------------------------------------------------ job scope

def test_golden_job_scripts(processes):
    golden("prolog.sh", render_prolog())
    golden("epilog.sh", render_epilog())
    for text in (render_prolog(), render_epilog()):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=30)


@pytest.fixture()
def job_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("""#!/bin/sh
if [ "$2" = job ]; then echo "JobId=$4 JobName=x OverSubscribe=${STUB_OVERSUBSCRIBE:-NO} Contiguous=0"; exit 0; fi
echo "NodeName=t10 Arch=aarch64 CoresPerSocket=72 NodeAddr=10.0.0.10 NodeHostName=t10 Version=24.11"
echo "NodeName=t2 Arch=aarch64 CoresPerSocket=72 NodeAddr=10.0.0.2 NodeHostName=t2 Version=24.11"
echo "NodeName=t1 Arch=aarch64 CoresPerSocket=72 NodeAddr=10.0.0.1 NodeHostName=t1 Version=24.11"
""")
    ctl = bin_dir / "nvidia-imex-ctl"
    ctl.write_text("#!/bin/sh\ncase \"$*\" in *-N*) echo 'Domain State: UP';; *) echo READY;; esac\n")
    for f in (scontrol, ctl):
        f.chmod(0o755)
    settings = JobScopeSettings(nodes_config=str(tmp_path / "nodes_config.cfg"),
                                imex_config=str(tmp_path / "config.cfg"), scontrol=str(scontrol),
                                imex_ctl=str(ctl), restart=f"touch {tmp_path}/restarted",
                                stop=f"touch {tmp_path}/stopped", ready_timeout_s=5)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "t[1-2,10]"}
    return tmp_path, settings, env


def _run(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_prolog_and_epilog_for_an_exclusive_job(job_env, processes):
    tmp, settings, env = job_env
    result = _run(render_prolog(settings), env)
    assert result.returncode == 0, result.stderr
    assert (tmp / "nodes_config.cfg").read_text() == "10.0.0.1\n10.0.0.2\n10.0.0.10\n"
    assert (tmp / "restarted").exists()
    result = _run(render_epilog(settings), env)
    assert result.returncode == 0
    assert (tmp / "nodes_config.cfg").read_text() == "" and (tmp / "stopped").exists()


def test_prolog_leaves_shared_jobs_alone(job_env, processes):
    tmp, settings, env = job_env
    result = _run(render_prolog(settings), dict(env, STUB_OVERSUBSCRIBE="YES"))
    assert result.returncode == 0 and not (tmp / "nodes_config.cfg").exists() and not (tmp / "restarted").exists()
    result = _run(render_prolog(settings), dict(env, SLURM_JOB_OVERSUBSCRIBE="OK"))
    assert result.returncode == 0 and not (tmp / "nodes_config.cfg").exists()
    result = _run(render_prolog(settings), dict(env, SLURM_JOB_OVERSUBSCRIBE="TOPO"))
    assert result.returncode == 0 and (tmp / "nodes_config.cfg").exists()
