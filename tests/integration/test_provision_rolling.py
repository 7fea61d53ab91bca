"""Provisioning never breaks running work without consent, and rolls a driver upgrade through a rack (issue 27).

Real Slurm on the shared lab, as the session deployed it (`slurm_lab`: no deploy of its own, and the
session's deploy stays as it was for the modules after). A job runs on trays 1-2: provisioning driver
branch 580 is refused, the job named, nothing changed (the check pass tells the driver and IMEX changes
disruptive); a file nothing reads live, changed on the job's tray, goes ahead without consent. With --drain the
rack's trays are held, the job ends on its own, the trays are provisioned, rebooted (the driver
needs it), verified and released. `--rolling 1 --drain` then takes the rack back to branch 570 one
tray at a time while a job runs on one of them (it waits for it; no job is killed, never more than
one tray out), killed with SIGKILL while it waits for that job and finished by --resume; so the
session's lab is left as found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from functools import partial

import pytest

from tests.helpers import wait_for

# --own-labs beside (scripts/test): in the second pytest, on its shared lab (minutes of reboots; tests/beside.py)
pytestmark = pytest.mark.beside

_wait = partial(wait_for, timeout=120.0)        # every wait here: two minutes unless it says

IMAGE = "lab-debian13-580"
HOLD = "mctl: provision"


def _provision(lab, *args: str, timeout: float = 900) -> tuple[int, dict, str]:
    proc = lab.mctl("--json", "provision", *args, timeout=timeout)
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        raise AssertionError(f"not JSON (exit {proc.returncode}): {proc.stdout[-2000:]}\n{proc.stderr}") from None
    return proc.returncode, doc, proc.stderr


def _driver(lab, tray: str) -> str:
    return lab.run(tray, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0]


def _boot(lab, tray: str) -> str:
    return lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _job(lab, trays: str, seconds: int, name: str = "mctl-test") -> str:
    n = len(trays.split(","))
    job = lab.run(lab.head, f"sbatch --parsable -N{n} -w {trays} -o /dev/null --job-name={name} "
                            f"--wrap 'sleep {seconds}'").stdout.strip().split(";")[0]
    _wait(f"job {job} RUNNING", lambda: _job_state(lab, job)[0] == "RUNNING")
    return job


def _job_state(lab, job: str) -> tuple[str, str]:
    """(JobState, ExitCode) as scontrol shows them (kept MinJobAge after the end)."""
    out = lab.run(lab.head, f"scontrol show job -o {job}", check=False).stdout
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    return fields.get("JobState", ""), fields.get("ExitCode", "")


def _held(lab) -> list[str]:
    out = lab.run(lab.head, "sinfo -h -N -o '%N|%E'", check=False).stdout
    return sorted({line.split("|", 1)[0] for line in out.splitlines() if f"|{HOLD}" in line})


class HoldWatch:
    """How many trays provisioning holds at once, watched from Slurm while a rollout runs."""

    def __init__(self, lab):
        self.lab, self.most, self.seen = lab, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            held = _held(self.lab)
            self.most = max(self.most, len(held))
            self.seen |= set(held)
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


@pytest.fixture(scope="module")
def rack(lab, slurm_lab):
    """Slurm deployed (the session's deploy, as slurm_lab hands it over), IMEX up, every tray provisioned with
    its image (branch 570) and idle."""
    if len(lab.trays) < 4:
        pytest.skip("needs a lab with 4 trays (MCTL_TEST_TRAYS)")
    proc = lab.mctl("imex", "apply", lab.rack, "--imex-wait", "60", timeout=300)
    assert proc.returncode == 0, f"imex apply failed: {proc.stderr}\n{proc.stdout[-2000:]}"
    lab.settle_slurm()
    code, doc, err = _provision(lab, lab.rack)                 # no job anywhere: as before, no check pass
    assert code == 0, (doc, err)
    lab.settle_slurm()
    assert {_driver(lab, t) for t in lab.trays} == {"570.148.08"}
    try:
        yield lab.trays
    finally:
        lab.run(lab.head, "scancel --user=root; true", check=False)
        lab.settle_slurm()
        if {_driver(lab, t) for t in lab.trays} != {"570.148.08"}:      # a test stopped half way: put it back
            code, doc, err = _provision(lab, lab.rack, "--tags", "nvidia", "--rolling", "2", "--drain", "--wait",
                                        "60")
            assert code == 0, (doc.get("error"), err)
        for t in lab.trays:
            lab.run(t, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q cuda-toolkit-13-0 >/dev/null 2>&1; true",
                    check=False)
        lab.settle_slurm()
        assert {_driver(lab, t) for t in lab.trays} == {"570.148.08"}


def test_a_new_driver_branch_under_a_job_is_refused_naming_it_and_changes_nothing(lab, rack):
    t = rack
    job = _job(lab, f"{t[0]},{t[1]}", 900)
    try:
        # the dry run shows each tray's disruptive changes and the work on it
        code, doc, err = _provision(lab, lab.rack, "--image", IMAGE, "--dry-run")
        assert code == 0, err
        view = doc["disruption"]
        assert view["verdict"] == "refuse" and view["breaking"] == [t[0], t[1]]
        for tray in t:
            v = view["trays"][tray]
            assert v["disruptive"] and v["reboot"], v
            comps = [c for c in v["changes"] if c["disruptive"]]
            assert comps and set(comps[0]["disrupts"]) == {"nvidia_driver", "imex"}, v
        assert [w["id"] for w in view["trays"][t[0]]["work"]] == [job]
        assert view["trays"][t[0]]["action"].startswith("refused") and view["trays"][t[2]]["work"] == []

        proc = lab.mctl("provision", lab.rack, "--image", IMAGE, timeout=600)
        assert proc.returncode == 2, proc.stderr + proc.stdout[-2000:]
        assert f"job {job} user root name 'mctl-test' R on {lab.rack}-tray[01-02]" in proc.stderr, proc.stderr
        assert "nvidia_driver, imex (then a reboot)" in proc.stderr and "nothing was changed" in proc.stderr
        assert "--drain" in proc.stderr and "--force" in proc.stderr
        assert {_driver(lab, tray) for tray in t} == {"570.148.08"}
        assert lab.run(t[0], "dpkg-query -W -f '${Version}' nvidia-utils-570").stdout == "570.148.08-0ubuntu1"
        assert _job_state(lab, job)[0] == "RUNNING" and _held(lab) == []
        # without a terminal, --force needs --yes (and still changes nothing without it)
        proc = lab.mctl("provision", t[0], "--image", IMAGE, "--force", timeout=600)
        assert proc.returncode == 2 and "there is no terminal to ask" in proc.stderr, proc.stderr
        assert _driver(lab, t[0]) == "570.148.08"

        # a file nothing reads live, changed on the job's tray: harmless, it goes ahead without consent
        limits = "/etc/security/limits.d/90-mctl.conf"
        lab.run(t[0], f"echo '# local edit' >> {limits}")
        code, doc, err = _provision(lab, t[0])
        assert code == 0, (doc, err)
        assert doc["hosts"][t[0]]["changed"] >= 1 and doc["status"] == "successful"
        assert "# local edit" not in lab.run(t[0], f"cat {limits}").stdout
        assert _job_state(lab, job)[0] == "RUNNING" and _held(lab) == []
    finally:
        lab.run(lab.head, f"scancel {job}", check=False)
    lab.settle_slurm()


def test_drain_holds_the_trays_waits_for_the_job_provisions_reboots_verifies_and_releases(lab, rack):
    t = rack
    boots = {tray: _boot(lab, tray) for tray in t}
    job = _job(lab, f"{t[0]},{t[1]}", 60)        # outlives the check pass on a loaded machine
    with HoldWatch(lab) as watch:
        code, doc, err = _provision(lab, lab.rack, "--image", IMAGE, "--tags", "nvidia", "--drain", "--wait", "300")
    assert code == 0, (doc.get("error"), err)
    assert doc["status"] == "succeeded" and {tray: s["status"] for tray, s in doc["trays"].items()} == \
        {tray: "done" for tray in t}
    assert sorted(tray for b in doc["batches"] for tray in b["trays"]) == t     # one batch, unless Slurm refused some
    waits = [d for s in doc["steps"] if s["step"].endswith(":wait") for d in s["details"]]
    assert waits == [f"waited for job {job} user root name 'mctl-test' R on {lab.rack}-tray[01-02]"], doc["steps"]
    assert all(s["summary"].startswith("rebooted") for s in doc["steps"] if s["step"].endswith(":reboot"))
    assert _job_state(lab, job) == ("COMPLETED", "0:0")           # it ended on its own: nothing killed it
    assert watch.seen == set(t) and _held(lab) == []
    assert {_driver(lab, tray) for tray in t} == {"580.105.08"}
    assert all(_boot(lab, tray) != boots[tray] for tray in t)
    for line in lab.run(lab.head, f"sinfo -h -N -n {lab.rack}-tray[01-04] -o '%T|%E'").stdout.splitlines():
        assert line == "idle|released by mctl provision", line


def test_a_rolling_change_takes_one_tray_at_a_time_waits_for_the_job_and_a_killed_one_resumes(lab, rack):
    """Back to the inventory's image (branch 570) on the four trays, one at a time, a job on the first; the
    rollout killed with SIGKILL while it waits for that job, then finished by --resume."""
    t = rack
    boots = {tray: _boot(lab, tray) for tray in t}
    job = _job(lab, t[0], 75)        # outlives the check pass on a loaded machine
    runs = lab.state_dir / "provision-rollout" / lab.rack
    before = set(runs.iterdir()) if runs.is_dir() else set()
    with HoldWatch(lab) as watch:
        proc = subprocess.Popen([sys.executable, "-m", "mctl", "--json", "provision", lab.rack, "--tags", "nvidia",
                                 "--rolling", "1", "--drain", "--wait", "300"], env=lab._env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            def journal():
                new = [p for p in (set(runs.iterdir()) if runs.is_dir() else set()) - before
                       if (p / "journal.json").is_file()]
                try:
                    return json.loads((new[0] / "journal.json").read_text()) if new else None
                except ValueError:
                    return None

            def waiting_for_the_job():
                data = journal()
                phases = {p["name"]: p["status"] for p in (data or {}).get("phases", [])}
                return data if phases.get("batch-1:wait") == "running" else None

            # killed while its first tray waits for the job: nothing half done on a tray, and the resume
            # must take the tray again and go on waiting
            _wait("the rollout waiting for the job on its first tray", waiting_for_the_job, timeout=300, every=0.2)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
        data = journal()
        assert data["status"] == "running" and data["rollout"]["state"][t[0]]["status"] == "held"
        assert data["rollout"]["spec"]["trays"] == t and data["rollout"]["spec"]["unchanged"] == []
        assert _held(lab) == [t[0]] and _job_state(lab, job)[0] == "RUNNING"
        resumed = lab.mctl("--json", "provision", lab.rack, "--resume", timeout=900)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout[-3000:]
    doc = json.loads(resumed.stdout)
    assert doc["resumed"] and doc["status"] == "succeeded" and doc["run_id"] == data["run_id"]
    assert [b["trays"] for b in doc["batches"]] == [[tray] for tray in t]
    assert {tray: s["status"] for tray, s in doc["trays"].items()} == {tray: "done" for tray in t}
    steps = {s["step"]: s for s in doc["steps"]}
    assert steps["batch-1:wait"]["details"] == [f"waited for job {job} user root name 'mctl-test' R on {t[0]}"]
    assert _job_state(lab, job) == ("COMPLETED", "0:0")
    assert watch.most == 1 and watch.seen == set(t) and _held(lab) == []
    assert {_driver(lab, tray) for tray in t} == {"570.148.08"}
    assert all(_boot(lab, tray) != boots[tray] for tray in t)
