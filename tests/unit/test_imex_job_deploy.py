"""IMEX per-job scope in the Slurm deployment (scheduler.slurm.imex_scope: job), and the lab's
/proc/devices view that lets Slurm's switch/nvidia_imex find the channel major."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.model.imex import ImexSettings
from mctl.sched.slurm.imex_job import JobScopeSettings, render_epilog, render_job_config, render_prolog
from mctl.sched.slurm import deploy, parse_slurmd_c, parse_version, render
from tests.helpers import SLURM_GOLDEN, SLURM_LAB_SETTINGS, lab_like_site

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "real"


def _render(site):
    _n, hw = parse_slurmd_c((SLURM_GOLDEN / "captured" / "slurmd-C.txt").read_text())
    return render(site, parse_version("slurm 24.11.5"), {t.name: hw for t in site.compute_trays()})


def _conf_lines(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line and not line.startswith("#")]


def test_partition_scope_is_the_default_and_names_no_prolog(tmp_path):
    cfg = _render(lab_like_site(tmp_path, slurm=SLURM_LAB_SETTINGS))
    assert cfg.imex_job is None and cfg.to_dict()["imex_scope"] == "partition"
    assert not [l for l in _conf_lines(cfg.files["slurm.conf"]) if l.split("=")[0] in ("Prolog", "Epilog", "PrologFlags")]


def test_job_scope_wires_prolog_epilog_and_alloc_into_slurm_conf(tmp_path):
    cfg = _render(lab_like_site(tmp_path, slurm={**SLURM_LAB_SETTINGS, "imex_scope": "job"}))
    lines = _conf_lines(cfg.files["slurm.conf"])
    assert "Prolog=/etc/slurm/prolog.d/90-mctl-imex.sh" in lines
    assert "Epilog=/etc/slurm/epilog.d/90-mctl-imex.sh" in lines
    assert "PrologFlags=Alloc" in lines
    # after the switch plugin, before the node lines
    assert lines.index("SwitchType=switch/nvidia_imex") < lines.index("PrologFlags=Alloc") < \
        next(i for i, l in enumerate(lines) if l.startswith("NodeName="))
    job = cfg.imex_job
    assert job.prolog == render_prolog() and job.epilog == render_epilog()
    assert sorted(job.configs) == [f"lab-r1-tray0{i}" for i in range(1, 5)]
    tray3 = job.configs["lab-r1-tray03"]
    assert "BIND_INTERFACE_IP=127.77.1.3\n" in tray3 and "IMEX_CMD_BIND_INTERFACE_IP=127.77.1.3\n" in tray3
    assert "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n" in tray3
    assert tray3.startswith("# nvidia-imex configuration for lab-r1-tray03 of rack lab-r1, IMEX per-job scope")
    assert cfg.to_dict()["imex_job"]["trays"] == "lab-r1-tray[01-04]"


def test_job_scope_follows_conf_dir_and_vars_imex(tmp_path):
    site = lab_like_site(tmp_path, slurm={**SLURM_LAB_SETTINGS, "imex_scope": "job", "conf_dir": "/opt/slurm/etc"})
    site.vars["imex"] = {"node_config_file": "/etc/nvidia-imex/job_nodes.cfg", "server_port": 51000,
                         "restart_command": "systemctl restart nvidia-imex.service"}
    cfg = _render(site)
    assert "Prolog=/opt/slurm/etc/prolog.d/90-mctl-imex.sh" in _conf_lines(cfg.files["slurm.conf"])
    assert cfg.imex_job.nodes_config_path == "/etc/nvidia-imex/job_nodes.cfg"
    assert "NODES_CONFIG=/etc/nvidia-imex/job_nodes.cfg\n" in cfg.imex_job.prolog
    assert "RESTART=(systemctl restart nvidia-imex.service)" in cfg.imex_job.prolog
    assert "SERVER_PORT=51000\n" in cfg.imex_job.configs["lab-r1-tray01"]


@pytest.mark.parametrize("extra, word", [({"Prolog": "/etc/slurm/site-prolog.sh"}, "Prolog"),
                                         ({"epilog": "/etc/slurm/site-epilog.sh"}, "Epilog"),
                                         ({"PrologFlags": "Contain"}, "PrologFlags=Contain")])
def test_extra_that_would_undo_the_job_scope_is_refused(tmp_path, extra, word):
    site = lab_like_site(tmp_path, slurm={**SLURM_LAB_SETTINGS, "imex_scope": "job", "extra": extra})
    with pytest.raises(UsageError) as exc:
        _render(site)
    assert word in exc.value.message and "nothing was changed" in exc.value.hint


def test_extra_prolog_flags_with_alloc_is_kept(tmp_path):
    site = lab_like_site(tmp_path, slurm={**SLURM_LAB_SETTINGS, "imex_scope": "job", "extra": {"PrologFlags": "Alloc,Contain"}})
    lines = _conf_lines(_render(site).files["slurm.conf"])
    assert "PrologFlags=Alloc,Contain" in lines and "PrologFlags=Alloc" not in lines


def test_unknown_scope_is_refused_by_the_inventory(tmp_path):
    with pytest.raises(UsageError) as exc:
        lab_like_site(tmp_path, slurm={"imex_scope": "node"})
    assert "imex_scope" in exc.value.message


def test_job_scope_reaches_the_playbook_and_topology_only_leaves_it_out(tmp_path):
    site = lab_like_site(tmp_path, slurm={**SLURM_LAB_SETTINGS, "imex_scope": "job"})
    cfg = _render(site)
    plan = deploy.SlurmPlan(site, tmp_path / "state", cfg, [cfg.controller] + site.compute_trays())
    job = deploy._extravars(plan)["slurm_imex_job"]
    assert job["prolog_path"] == "/etc/slurm/prolog.d/90-mctl-imex.sh" and job["prolog"] == cfg.imex_job.prolog
    assert set(job["configs"]) == {t.name for t in site.compute_trays()}
    plan.topology_only = True
    assert deploy._extravars(plan)["slurm_imex_job"] is None
    (tmp_path / "d").mkdir()
    default = _render(lab_like_site(tmp_path / "d", slurm=SLURM_LAB_SETTINGS))
    plan = deploy.SlurmPlan(site, tmp_path / "state", default, [default.controller] + site.compute_trays())
    assert deploy._extravars(plan)["slurm_imex_job"] is None


def test_job_scope_settings_from_vars_imex():
    s = JobScopeSettings.from_imex(ImexSettings(node_config_file="/x/nodes.cfg", restart_command="restart-imex"))
    assert s.nodes_config == "/x/nodes.cfg" and s.restart == "restart-imex"
    assert render_job_config(ImexSettings(bind_tray_address=False), "r", "t1", "10.0.0.1").count("127.0.0.1") == 1


def test_playbook_installs_the_scripts_before_slurmd():
    main = (REPO / "playbooks/roles/slurm_node/tasks/main.yml").read_text()
    assert main.index("imex_job.yml") < main.index("slurmd running and enabled")
    tasks = (REPO / "playbooks/roles/slurm_node/tasks/imex_job.yml").read_text()
    assert tasks.count('mode: "0755"') >= 2 and "force: false" in tasks


# ------------------------------------------------------------------ the lab's /proc/devices

def _nsinit():
    sys.path.insert(0, str(REPO / "mctl" / "lab"))
    try:
        import nsinit
    finally:
        sys.path.pop(0)
    return nsinit


MACHINE = ("Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n136 pts\n245 hidraw\n254 ndctl\n\n"
           "Block devices:\n  7 loop\n259 blkext\n")


def _plugin_major(text: str):
    """Slurm's switch/nvidia_imex (imex_device.c _find_major): sscanf("%d %40s") per line, name equal."""
    for line in text.splitlines():
        m = re.match(r"^\s*(-?\d+)\s+(\S{1,40})", line)
        if m and m.group(2) == "nvidia-caps-imex-channels":
            return int(m.group(1))
    return None


def test_tray_proc_devices_lists_the_channel_major_like_a_loaded_driver(processes):
    ns = _nsinit()
    text = ns.proc_devices_text(MACHINE, ["nvidia-caps-imex-channels"])
    assert text == MACHINE.replace("245 hidraw\n", "245 hidraw\n253 nvidia-caps-imex-channels\n")
    assert _plugin_major(text) == 253
    # the prolog's own lookup finds the same major
    awk = subprocess.run(["awk", '$2 == "nvidia-caps-imex-channels" {print $1}'], input=text, text=True,
                         capture_output=True, check=True).stdout
    assert awk == "253\n"
    # nothing to add: the machine's text unchanged; a name already there is not added twice
    assert ns.proc_devices_text(MACHINE, []) == MACHINE
    assert ns.proc_devices_text(text, ["nvidia-caps-imex-channels"]) == text


def test_free_major_follows_the_kernels_dynamic_order():
    ns = _nsinit()
    assert ns.free_char_major({254, 253}) == 252
    assert ns.free_char_major(set(range(234, 255))) == 511
    with pytest.raises(OSError):
        ns.free_char_major(set(range(234, 255)) | set(range(384, 512)))


def test_real_proc_devices_line_parses_like_ours():
    """The line a GB200 host's /proc/devices holds (excerpt, tests/fixtures/real/README.md)."""
    real = (REAL / "issue-dra-driver-pr304-proc-devices-excerpt.txt").read_text()
    assert _plugin_major(real) == 234
    ours = _nsinit().proc_devices_text(MACHINE, ["nvidia-caps-imex-channels"])
    line = next(l for l in ours.splitlines() if l.endswith("nvidia-caps-imex-channels"))
    real_line = next(l for l in real.splitlines() if l.endswith("nvidia-caps-imex-channels"))
    assert re.fullmatch(r"[ \d]{3} \S+", line) and re.fullmatch(r"[ \d]{3} \S+", real_line)


# ------------------------------------------------------------------ the health probe between jobs

def _probe_imex(tmp_path: Path, nodes: str | None) -> int:
    """The health probe's imex() (mctl/facts/probe.py) against a config whose node list is *nodes*."""
    from mctl.facts.shell import RC_ABSENT
    from mctl.facts import probe

    cfg = tmp_path / "config.cfg"
    cfg.write_text(f"LOG_LEVEL=4\nIMEX_NODE_CONFIG_FILE={tmp_path / 'nodes.cfg'}\nIMEX_CMD_PORT=50005\n")
    if nodes is not None:
        (tmp_path / "nodes.cfg").write_text(nodes)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-imex-ctl").write_text("#!/bin/sh\necho READY\n")
    (bin_dir / "nvidia-imex-ctl").chmod(0o755)
    local = probe._HEALTH_LOCAL.replace("@IMEX_CONFIG@", str(cfg)).replace("@RC_ABSENT@", str(RC_ABSENT)) \
        .replace("@RC_READY_BY_DOMAIN@", str(probe.RC_READY_BY_DOMAIN))
    script = "to() { shift; \"$@\"; }\n" + local + "imex -q >/dev/null\necho $?\n"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    return int(out.strip()), RC_ABSENT


def test_probe_reads_an_empty_node_list_as_no_domain_wanted(tmp_path, processes):
    rc, absent = _probe_imex(tmp_path, "")
    assert rc == absent                          # per-job scope between jobs: not checked
    (tmp_path / "b").mkdir()
    rc, _ = _probe_imex(tmp_path / "b", "10.0.0.1\n10.0.0.2\n")
    assert rc == 0                               # a job's domain (or a static one): asked
    (tmp_path / "c").mkdir()
    rc, _ = _probe_imex(tmp_path / "c", None)    # a node list that is missing: asked, as before
    assert rc == 0
