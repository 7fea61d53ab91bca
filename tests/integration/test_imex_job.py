"""IMEX per-job scope under real Slurm on the lab (scheduler.slurm.imex_scope: job).

`mctl deploy slurm` installs the prolog/epilog (mctl/sched/slurm/imex_job.py) on the trays and names
them in slurm.conf with PrologFlags=Alloc. An exclusive two-tray job then finds, from its own
batch script (its first task), an IMEX domain UP of exactly its two trays; after it ends the
epilog has stopped both daemons and emptied the node list. With switch/nvidia_imex, the lab's
trays list `nvidia-caps-imex-channels` in /proc/devices as a loaded driver does, so slurmstepd
makes each job its own channel device: two jobs running at once see different channels
(in their srun steps; Slurm 24.11 sets none up for the batch step).
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import pytest
import yaml

from tests.helpers import wait_for

CHANNELS = "/dev/nvidia-caps-imex-channels"
IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"

_wait = partial(wait_for, timeout=120.0, every=1.0)


def _deploy(lab, site: Path):
    proc = lab.mctl("-i", str(site), "--json", "deploy", "slurm", timeout=900)
    assert proc.returncode == 0, f"deploy slurm failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-3000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def site(slurm_lab, tmp_path_factory):
    lab = slurm_lab.lab
    folder = tmp_path_factory.mktemp("imex-job-site")
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["scheduler"].setdefault("slurm", {})["imex_scope"] = "job"
    (folder / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    # A site switching to the job scope starts with no static domain: an earlier test's partitions left
    # node lists and running daemons, which the deployment keeps (it never changes a running job's domain)
    for tray in lab.trays:
        lab.run(tray, f"systemctl stop nvidia-imex >/dev/null 2>&1; rm -f {NODES_CONFIG}; true", check=False)
    data = _deploy(lab, folder)
    lab.settle_slurm()
    try:
        yield {"dir": folder, "deploy": data}
    finally:
        lab.run(lab.head, "scancel --user=root; true", check=False)
        # Leave the trays as slurm_lab deployed them (partition scope), no IMEX files.
        slurm_lab.restore(why="test_imex_job's job scope put back")
        for tray in lab.trays:
            lab.run(tray, f"systemctl stop nvidia-imex >/dev/null 2>&1; rm -f {IMEX_CONFIG} {NODES_CONFIG} "
                          "/etc/slurm/prolog.d/90-mctl-imex.sh /etc/slurm/epilog.d/90-mctl-imex.sh; true",
                    check=False)


def _squeue_state(lab, job: str) -> str:
    return lab.run(lab.head, f"squeue -h -j {job} -o %T", check=False).stdout.strip()


def _daemon_gone(lab, tray: str) -> bool:
    out = lab.run(tray, f"systemctl is-active nvidia-imex; wc -c < {NODES_CONFIG}", check=False).stdout.split()
    return len(out) == 2 and out[0] != "active" and out[1] == "0"


def test_deploy_wires_the_prolog_and_epilog(lab, site):
    conf = lab.run(lab.trays[0], "cat /etc/slurm/slurm.conf").stdout
    assert "\nProlog=/etc/slurm/prolog.d/90-mctl-imex.sh\n" in conf
    assert "\nEpilog=/etc/slurm/epilog.d/90-mctl-imex.sh\n" in conf
    assert "\nPrologFlags=Alloc\n" in conf
    assert "\nSwitchType=switch/nvidia_imex\n" in conf
    for tray in lab.trays:
        out = lab.run(tray, "stat -c '%a %U' /etc/slurm/prolog.d/90-mctl-imex.sh /etc/slurm/epilog.d/90-mctl-imex.sh; "
                            f"grep '^BIND_INTERFACE_IP=' {IMEX_CONFIG}").stdout.split("\n")
        assert out[:2] == ["755 root", "755 root"]
        assert out[2] == f"BIND_INTERFACE_IP={lab.addresses[tray]}"
    plan = site["deploy"]["plan"]
    assert plan["imex_scope"] == "job" and plan["imex_job"]["trays"] == "lab-r1-tray[01-04]"


def test_exclusive_job_gets_a_domain_of_exactly_its_trays(lab, site):
    pair = lab.trays[:2]
    others = lab.trays[2:]
    out = "/tmp/mctl-imex-job.out"
    # The batch script is the job's first task: it records what IMEX looks like when it starts.
    script = (f"#!/bin/bash\nnvidia-imex-ctl -c {IMEX_CONFIG} -N\necho '--- nodes_config'\ncat {NODES_CONFIG}\n")
    lab.run(lab.head, f"cat > /tmp/mctl-imex-job.sh <<'EOF'\n{script}EOF")
    job = lab.run(lab.head, f"sbatch --parsable --exclusive -N2 -w {','.join(pair)} -o {out} "
                            "/tmp/mctl-imex-job.sh").stdout.strip().split(";")[0]
    try:
        _wait(f"job {job} to end", lambda: _squeue_state(lab, job) == "", timeout=180)
    except AssertionError as exc:
        why = lab.run(lab.head, f"squeue -h -j {job} -o '%T %r'; sinfo -N -o '%N %T %E'", check=False).stdout
        raise AssertionError(f"{exc}\n{why}") from None
    text = lab.run(pair[0], f"cat {out}").stdout
    assert "Domain State: UP" in text, text
    matrix, listed = text.split("--- nodes_config\n", 1)
    want = [lab.addresses[t] for t in pair]
    assert listed.split() == want, text
    nodes = re.findall(r"^Node #\d+\s+- (\S+)\s+- (\S+)", matrix, re.M)
    assert [addr for addr, _ in nodes] == want and {status for _, status in nodes} == {"READY"}, matrix
    # After the job: the epilog stopped both daemons and emptied the node list.
    for tray in pair:
        _wait(f"the IMEX domain gone on {tray}", lambda t=tray: _daemon_gone(lab, t), timeout=60)
    # The trays outside the job never got a domain.
    for tray in others:
        assert _daemon_gone(lab, tray), lab.run(tray, f"systemctl is-active nvidia-imex; cat {NODES_CONFIG}",
                                                check=False).stdout
    assert all("drain" not in lab.run(lab.head, f"sinfo -h -n {t} -o %T").stdout for t in pair)


def test_non_exclusive_job_leaves_imex_alone(lab, site):
    out = lab.run(lab.head, f"srun --immediate=30 -N1 -w {lab.trays[2]} cat {NODES_CONFIG} && echo end",
                  timeout=90).stdout
    assert out.split() == ["end"]
    assert _daemon_gone(lab, lab.trays[2])


def _channel_of(lab, tray: str, path: str):
    proc = lab.run(tray, f"cat {path} 2>/dev/null", check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return lines if lines and lines[-1] == "end" else None


# What a job sees in the channel folder: one `path|type|major hex|minor hex` line per entry.
LIST_CHANNELS = f"""#!/bin/sh
for f in {CHANNELS}/*; do [ -e "$f" ] && stat -c '%n|%F|%t|%T' "$f"; done
true
"""
JOB = """#!/bin/sh
out=$1
{ echo batch; /tmp/mctl-list-channels.sh; echo step; srun -n1 /tmp/mctl-list-channels.sh; echo end; } > "$out.tmp"
mv "$out.tmp" "$out"
sleep 300
"""


def _parse(lines: list[str], major: int) -> dict[str, int]:
    """batch/step -> the one channel minor that part of the job sees (asserting it is the plugin's device)."""
    seen: dict[str, list[str]] = {}
    part = None
    for line in lines[:-1]:
        if line in ("batch", "step"):
            part = line
            seen[part] = []
        elif part:
            seen[part].append(line)
    out = {}
    assert set(seen) == {"batch", "step"}, lines
    # Slurm 24.11 sets the channel up for srun steps only: the batch step sees the tray's (empty)
    # folder. Later releases set it up for every step (switch_p_setup_special_steps); then the same one.
    if not seen["batch"]:
        del seen["batch"]
    for part, entries in seen.items():
        assert len(entries) == 1, f"the job's {part} sees not exactly one channel: {lines}"
        name, kind, hex_major, hex_minor = entries[0].split("|")
        assert kind == "character special file" and int(hex_major, 16) == major, lines
        assert name == f"{CHANNELS}/channel{int(hex_minor, 16)}", lines
        out[part] = int(hex_minor, 16)
    assert out.get("batch", out["step"]) == out["step"], lines
    return out


def test_two_jobs_see_their_own_channel(lab, site):
    major = lab.run(lab.trays[2], "awk '$2 == \"nvidia-caps-imex-channels\" {print $1}' /proc/devices").stdout.split()
    assert len(major) == 1 and major[0].isdigit(), "the tray's /proc/devices lists no nvidia-caps-imex-channels"
    jobs, seen = [], {}
    try:
        for tray in lab.trays[2:4]:
            path = f"/tmp/mctl-imex-channel.{tray}"
            lab.run(tray, f"rm -f {path}; cat > /tmp/mctl-list-channels.sh <<'EOF'\n{LIST_CHANNELS}EOF\n"
                          f"cat > /tmp/mctl-channel-job.sh <<'EOF'\n{JOB}EOF\n"
                          "chmod 755 /tmp/mctl-list-channels.sh /tmp/mctl-channel-job.sh")
            # the batch script must exist where sbatch runs (the head) too
            lab.run(lab.head, f"cat > /tmp/mctl-channel-job.sh <<'EOF'\n{JOB}EOF")
            jobs.append(lab.run(lab.head, f"sbatch --parsable -N1 -n1 -w {tray} -o /dev/null "
                                          f"/tmp/mctl-channel-job.sh {path}").stdout.strip().split(";")[0])
            seen[tray] = path
        got = {t: _wait(f"the job's channel list on {t}", lambda t=t, p=p: _channel_of(lab, t, p), timeout=120)
               for t, p in seen.items()}
        # both running at once: neither channel was freed for the other
        assert all(_squeue_state(lab, j) == "RUNNING" for j in jobs)
    finally:
        lab.run(lab.head, f"scancel {' '.join(jobs)}; true", check=False)
    channels = {t: _parse(lines, int(major[0])) for t, lines in got.items()}
    # the two jobs' channels differ, and none is channel 0 (Slurm keeps it back)
    minors = {c["step"] for c in channels.values()}
    assert len(minors) == 2 and 0 not in minors, channels
    # outside the jobs the tray's own folder holds no job channel (slurmstepd's tmpfs is the job's)
    out = lab.run(lab.trays[2], f"ls -A {CHANNELS}", check=False).stdout.split()
    assert not (set(out) & {f"channel{m}" for m in minors}), out
