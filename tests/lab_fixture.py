"""The `lab` fixture: one small virtual lab, shared by the whole test session (integration and e2e).

Registered in tests/conftest.py, so tests/integration and tests/e2e share one
lab (a fixture defined in each folder's conftest would start two). Tests under
both folders are marked `lab` automatically (select them with `pytest -m lab`,
leave them out with `-m "not lab"`). They run against real hosts: the
fixture brings up a lab once per session in a temporary folder with its own
state directory and its own addresses (a free 127.N.x.x block, so an
operator's lab on 127.77 is never touched), and takes it down at the end. Without root, debootstrap, unshare or overlayfs, the tests are skipped
with the reason. The first run on a machine also builds the image (a few
minutes; cached in /var/cache/mctl/images or $MCTL_IMAGE_CACHE).

    @pytest.mark.lab
    def test_hostname(lab):
        res = lab.run("lab-r1-tray01", "hostname")     # real ssh; CompletedProcess (text)
        assert res.stdout.strip() == "lab-r1-tray01"

    lab.dir            Path of the lab folder
    lab.state_dir      the state directory the lab lives in (MCTL_STATE_DIR for the CLI)
    lab.inventory      Path of the lab's mctl.yml (pass its folder or itself as -i)
    lab.rack           "lab-r1"
    lab.trays          ["lab-r1-tray01", ...]  (MCTL_TEST_TRAYS, default 4)
    lab.head           "lab-r1-head"
    lab.addresses      {host name: address}
    lab.run(host, cmd, timeout=60, check=True)   shell command over ssh, as root
    lab.ssh_argv(host) the ssh command line (key, known_hosts, strict checking) to build on
    lab.mctl(*args, timeout=120)   the mctl CLI in a subprocess, with MCTL_STATE_DIR and
                       MCTL_INVENTORY pointing at this lab; returns CompletedProcess (text)
    lab.clear_faults(host=None)    `mctl lab fault clear` on one or every host

A test that injects a fault must clear it (try/finally with lab.clear_faults)
because the lab is shared by the session.

Three more fixtures (registered in tests/conftest.py like `lab`):

    own_lab            own_lab(state_dir, trays=N, racks=1, label=..., **up_options): a lab of the module's own, as a
                       context manager (the slow tier); for what the shared lab must keep
    slurm_lab          the shared lab with Slurm deployed by `mctl deploy slurm` once per session (module
                       scope: each module gets it as deployed, see SlurmLab)
    slurm_deployed     the session's one deploy behind slurm_lab
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

TRAYS_ENV = "MCTL_TEST_TRAYS"
KEEP_ENV = "MCTL_TEST_KEEP_LAB"          # leave the session's lab up after the run (debugging)


@dataclass
class LabHandle:
    dir: Path
    state_dir: Path
    inventory: Path
    rack: str
    trays: list[str]
    head: str
    addresses: dict[str, str]
    net: int
    _env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def hosts(self) -> list[str]:
        return [self.head, *self.trays]

    def ssh_argv(self, host: str, *, connect_timeout: float = 5) -> list[str]:
        from mctl.lab import control

        argv = control.ssh_argv(self.dir, host, [], tty=False)
        return [a if not a.startswith("ConnectTimeout=") else f"ConnectTimeout={int(connect_timeout)}" for a in argv]

    def run(self, host: str, cmd: str, *, timeout: float = 60, check: bool = True,
            connect_timeout: float = 5) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.ssh_argv(host, connect_timeout=connect_timeout) + [cmd], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {host} {cmd!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def mctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mctl", *args], capture_output=True, text=True,
                              timeout=timeout, env=self._env, stdin=subprocess.DEVNULL)

    def kern_log_sizes(self) -> dict[str, int]:
        """Each tray's kernel log size now (see restore_kern_logs)."""
        from mctl.lab import hosts

        paths = {t: hosts.host_path(self.dir, t, hosts.KERN_LOG) for t in self.trays}
        return {t: (p.stat().st_size if p.exists() else 0) for t, p in paths.items()}

    def restore_kern_logs(self, sizes: dict[str, int]) -> list[str]:
        """Cut every tray's kernel log back to `sizes` (XID lines a test wrote must not count in a later
        test's sweeps or in the node check slurmd runs); the trays whose log was cut, and their drains
        by the node check ("mctl: ..." reasons) lifted."""
        from mctl.lab import hosts

        cut = []
        for t, size in sizes.items():
            p = hosts.host_path(self.dir, t, hosts.KERN_LOG)
            if p.exists() and p.stat().st_size > size:
                with open(p, "r+b") as fh:
                    fh.truncate(size)
                cut.append(t)
        if cut:
            out = self.run(self.head, "sinfo -h -N -o '%N|%T|%E' 2>/dev/null", check=False).stdout
            for line in out.splitlines():
                node, state, reason = (line.split("|", 2) + ["", ""])[:3]
                if node in cut and "drain" in state and reason.startswith("mctl:"):
                    sys.stderr.write(f"[lab] {node} was drained by the node check ({reason}): resumed\n")
                    self.run(self.head, f"scontrol update NodeName={node} State=RESUME", check=False)
        return cut

    def host_marks(self) -> dict[str, int]:
        """Each host's lab folder's change time (ns), read without a process: a freeze records its pids there
        (hosts/<name>/frozen.json) and the clear removes them, so a host frozen since has another mark."""
        from mctl.lab import hosts

        return {h: hosts.HostPaths(self.dir, h).dir.stat().st_mtime_ns for h in self.hosts}

    def resync_clocks(self, marks: dict[str, int], timeout: float = 60) -> list[str]:
        """Time synchronised again on each host whose mark changed since *marks* (see host_marks) and whose
        chronyd provisioning configured: those it had to resync.

        A frozen host's chronyd, continued, sees its clock jump and drops its source; it then takes a sample
        only at its next poll (minutes: 130 s were not enough, measured on the lab), and every provisioning
        run meanwhile waits time_sync_timeout (60 s) for it and fails ("chronyd selected no time source").
        The test that froze the host puts it back as found: `chronyc burst 4/4` (four samples now, as
        iburst does at start), then a bounded wait for a selected source. A host without a running chronyd
        (rebooted: the lab's boot does not start it, the next provisioning does) is left alone."""
        from tests.helpers import wait_for

        from mctl.lab import hosts

        def tracking(host: str) -> str:
            return self.run(host, "chronyc -n tracking", check=False, timeout=30).stdout

        def synced(host: str) -> bool:
            out = tracking(host)
            return "Reference ID" in out and "Reference ID    : 00000000" not in out

        now, resynced = self.host_marks(), []
        for host in [h for h in self.hosts if now[h] != marks.get(h)]:
            try:
                conf = hosts.host_path(self.dir, host, "/etc/chrony/chrony.conf").read_text()
            except (OSError, ValueError):
                continue
            if "Written by mctl provisioning" not in conf:
                continue
            out = tracking(host)
            if "Reference ID" not in out or "Reference ID    : 00000000" not in out:
                continue        # synchronised, or no chronyd (a rebooted lab host: provisioning starts it)
            self.run(host, "chronyc burst 4/4", check=False, timeout=30)
            wait_for(f"{host}'s chronyd to select a time source after its burst", lambda: synced(host), timeout,
                     every=1)
            resynced.append(host)
        return resynced

    def settle_slurm(self, timeout: float = 120) -> None:
        """No job left and every tray idle in Slurm (nothing to do where the lab runs no Slurm yet).

        Jobs an earlier test left are cancelled; one Slurm still counts as running on a tray that lost
        power (the tray's new slurmd knows nothing of it) is given up the way an operator does it, node
        DOWN then RESUME; drains with an mctl reason (the node check's, a health test's) and DOWN nodes
        are resumed; then a bounded wait."""
        import time

        def rows() -> list[list[str]]:
            out = self.run(self.head, "sinfo -h -N -o '%N|%T|%E' 2>/dev/null", check=False).stdout
            return [(line.split("|", 2) + ["", ""])[:3] for line in out.splitlines() if line.strip()]

        def jobs() -> list[str]:
            out = self.run(self.head, "squeue -h -o '%i %T %N' 2>/dev/null", check=False).stdout
            return [line for line in out.splitlines() if line.strip()]

        def resume() -> None:
            for node, state, reason in rows():
                if ("drain" in state and reason.startswith("mctl:")) or state.startswith("down"):
                    self.run(self.head, f"scontrol update NodeName={node} State=RESUME", check=False)

        if not rows():
            return                          # no Slurm on the lab (yet)
        self.run(self.head, "scancel --user=root 2>/dev/null; true", check=False)
        resume()
        start = time.monotonic()
        forced = False
        last_resume = time.monotonic()
        while True:
            left, states = jobs(), {node: state for node, state, _ in rows()}
            if not left and states and all(st == "idle" for st in states.values()):
                return
            if time.monotonic() - last_resume > 5:
                # slurmd's node check may drain a tray again while it settles (IMEX coming back after a
                # reboot); once it is healthy its drain is lifted here again
                resume()
                last_resume = time.monotonic()
            if left and not forced and time.monotonic() - start > 30:
                stuck = sorted({n for line in left for n in line.split()[2:]})
                for node in stuck:
                    self.run(self.head, f"scontrol update NodeName={node} State=DOWN Reason='test: settle'; "
                                        f"scontrol update NodeName={node} State=RESUME", check=False)
                self.run(self.head, "scancel --user=root 2>/dev/null; true", check=False)
                forced = True
            if time.monotonic() - start > timeout:
                raise AssertionError(f"Slurm not settled within {timeout:g} s: jobs {left}, trays {states}")
            time.sleep(1)

    def clear_budget(self) -> list[str]:
        """The site's safety budget as a new test expects it: not tripped, and no grant left for a tray that is
        back in service (a test resumes trays with plain scontrol, as an operator may; the watch gives such a
        grant back only once it is 10 s old). The reservations deleted."""
        if not self.run(self.head, "test -e /etc/slurm/slurm.conf", check=False).returncode == 0:
            return []
        script = ("drained=$(sinfo -h -N -o '%N %T %E' 2>/dev/null | awk '$2 ~ /drain|down|fail/ && $3 ~ /^mctl:/ "
                  "{print $1}'); for r in $(scontrol show reservation -o 2>/dev/null | "
                  "grep -o 'ReservationName=mctl_budget_[^ ]*' | cut -d= -f2); do t=${r#mctl_budget_}; "
                  "case \" $(echo $drained) \" in *\" $t \"*) continue;; esac; "
                  "scontrol delete reservation=$r >/dev/null 2>&1 && echo $r; done; true")
        return self.run(self.head, script, check=False).stdout.split()

    @contextlib.contextmanager
    def budget_caps(self, site_dir: Path) -> Iterator[dict[str, int]]:
        """slurmctld enforcing the safety budget of the inventory in *site_dir* for the block, then the caps it
        had again: the `Licenses=` line `mctl deploy slurm` renders for that inventory, written into every
        host's slurm.conf and applied with `scontrol reconfigure` (what a redeploy changes for a budget, without
        the rest of a deploy). Yields the caps (license -> count) once slurmctld shows them."""
        import time

        from mctl.inventory.loader import load_site
        from mctl.sched.slurm.budget import parse_licenses, site_caps, site_licenses

        conf = "/etc/slurm/slurm.conf"
        before = self.run(self.head, f"sed -n 's/^Licenses=//p' {conf}").stdout.strip()
        assert before, f"no Licenses= line in the head's {conf}: is Slurm deployed?"

        def apply(value: str) -> dict[str, int]:
            want = {n: int(c) for n, _, c in (p.rpartition(":") for p in value.split(",")) if n.startswith("mctl_")}
            for host in [self.head, *self.trays]:
                self.run(host, f"sed -i 's/^Licenses=.*/Licenses={value}/' {conf}")
            self.run(self.head, "scontrol reconfigure")
            deadline = time.monotonic() + 60
            while parse_licenses(self.run(self.head, "scontrol show license -o", check=False).stdout) != want:
                if time.monotonic() > deadline:
                    raise AssertionError(f"slurmctld did not take the budget's caps {want}")
                time.sleep(0.5)
            return want

        site = load_site(site_dir)
        assert apply(site_licenses(site)) == site_caps(site)
        try:
            yield site_caps(site)
        finally:
            apply(before)

    def clear_faults(self, host: str | None = None) -> None:
        from mctl.lab import control
        from mctl.lab.faults import FaultRequest

        for name in [host] if host else self.hosts:
            control.fault(self.dir, name, FaultRequest(clear=True))


def _free_net() -> int:
    """A second octet with nothing listening on any 127.N.x.x address."""
    from mctl.lab.procs import listening_tcp

    used = {int(addr.split(".")[1]) for addr, _port in listening_tcp() if addr.startswith("127.")}
    free = [net for net in range(201, 255) if net not in used]
    if not free:
        pytest.skip("no free 127.N.0.0/16 block for a test lab")
    # Random, so two test sessions starting together rarely pick the same block
    # (and `lab up` refuses a taken one under its machine-wide address lock).
    return random.choice(free)


def lab_skip_reason() -> str | None:
    """Why this machine cannot run a lab, or None."""
    from mctl.lab import image, prereq
    from mctl.lab.site import IMAGE_NAME, REPO_IMAGES

    spec = image.load_spec(REPO_IMAGES / f"{IMAGE_NAME}.yml")
    gaps = prereq.missing(need_build=not image.is_built(spec))
    return ("the virtual lab needs " + "; ".join(gaps)) if gaps else None


@contextlib.contextmanager
def _own_lab(state_dir: Path, *, trays: int, label: str = "lab", racks: int = 1,
             **up_options) -> Iterator[LabHandle]:
    """A lab of its own in *state_dir* (*racks* racks of *trays*, default one), on a free address block, taken
    down after; `lab.trays` are the first rack's, `lab.addresses` every host's.

    For modules that change what the shared session lab must keep (its partitions, its software):
    *up_options* go to `mctl.lab.control.up`. Its trays are pre-tooled (the GPU tools' packages already
    installed, as in an image that carries them) unless os_only=True: the OS image only, as trays arrive
    (the `mctl lab up` default); most tests read the GPUs before they provision anything."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    from mctl.errors import UsageError
    from mctl.lab import control

    for attempt in range(3):
        net = _free_net()
        try:
            result = control.up(state_dir / "lab", racks=racks, trays=trays, net=net,
                                progress=lambda m: sys.stderr.write(f"[{label}] {m}\n"),
                                **{"os_only": False, **up_options})
            break
        except UsageError as exc:          # another session took the block meanwhile
            if "already in use" not in exc.message or attempt == 2:
                raise
    layout = result.layout
    env = dict(os.environ, MCTL_STATE_DIR=str(state_dir), MCTL_INVENTORY=str(result.dir), NO_COLOR="1")
    handle = LabHandle(
        dir=result.dir, state_dir=state_dir, inventory=result.inventory, rack="lab-r1",
        trays=[h.name for h in layout.trays_of("lab-r1")], head="lab-r1-head",
        addresses={h.name: h.address for h in layout.hosts()}, net=layout.net, _env=env)
    try:
        yield handle
    finally:
        if os.environ.get(KEEP_ENV):
            sys.stderr.write(f"[{label}] kept for debugging ({KEEP_ENV}): mctl lab down --dir {result.dir}\n")
        else:
            control.down(result.dir)


#: The shared lab's safety budget (mctl.model.settings.BudgetSettings): half of its 4 trays, for the rack and
#: the site, so tests that drain two trays (the breaker's, a frozen and a faulted tray) test what they name;
#: the budget's own test narrows it for its duration (LabHandle.budget_caps). Every site a test derives from
#: lab.inventory, and every Slurm deploy from it, carries it (slurmctld enforces the caps it was deployed with).
LAB_BUDGET = {"rack_share": 0.5, "site_share": 0.5}


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> LabHandle:
    import yaml

    with _own_lab(tmp_path_factory.mktemp("mctl-state"), trays=int(os.environ.get(TRAYS_ENV) or 4)) as handle:
        doc = yaml.safe_load(handle.inventory.read_text())
        doc.setdefault("safety", {})["budget"] = dict(LAB_BUDGET)
        handle.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield handle


@pytest.fixture(scope="session")
def own_lab(processes):
    """own_lab(state_dir, trays=N, label=..., **up_options): a lab of the requesting module's own, a context
    manager (up on entry, down on exit). Requesting it puts the module's tests in the slow tier."""
    return _own_lab


# ------------------------------------------------------------------ Slurm deployed on the shared lab

#: What a deploy writes on every host, read back to tell whether an earlier module changed it.
SLURM_FILES = ("/etc/slurm/slurm.conf", "/etc/slurm/topology.conf", "/etc/slurm/gres.conf", "/etc/slurm/cgroup.conf",
               "/etc/munge/munge.key")
TOPOLOGY = "/etc/slurm/topology.conf"
#: Each time slurm_lab deployed again in this session, what it found changed (the tier summary lists them).
REDEPLOYS: list[str] = []


@dataclass
class SlurmLab:
    """The shared lab with Slurm deployed by `mctl deploy slurm` from `site`: the lab's own inventory with
    the partitions an operator records for it (tests.helpers.PARTITIONS: p0 = trays 1-2, p1 = trays 3-4).

    Deployed once per session (`dry` and `first` are that first deploy's --dry-run and result, on the lab
    as it came up). A module gets it through the module-scoped `slurm_lab` fixture, which hands it over as
    deployed: Slurm's files on every host as the deploy wrote them (a module that deployed other ones, or
    another topology, has them put back by one more deploy here), every tray registered, no job, no mctl
    drain, every tray idle. A module that changes the deploy on purpose may call restore() when it ends."""

    lab: LabHandle
    site: Path
    dry: dict
    first: dict
    files: dict[str, str] = field(default_factory=dict)      # host -> deployed_files() after the first deploy

    def deployed_files(self) -> dict[str, str]:
        """host -> the sha256 sums of SLURM_FILES there, one line a file (an error text where a host or a
        file is missing)."""
        cmd = "sha256sum " + " ".join(SLURM_FILES) + " 2>&1"
        return {h: self.lab.run(h, cmd, check=False, timeout=60).stdout for h in self.lab.hosts}

    def _changed(self) -> set[str]:
        """The SLURM_FILES that are not the deploy's on some host ("?" for what sha256sum could not read)."""
        now = self.deployed_files()
        if now == self.files:
            return set()
        changed = set()
        for host, text in now.items():
            for line in set(text.splitlines()) ^ set(self.files.get(host, "?").splitlines()):
                path = line.split()[-1] if line.split() else "?"
                changed.add(path if path in SLURM_FILES else "?")
        return changed

    def registered(self) -> bool:
        out = self.lab.run(self.lab.head, "sinfo -h -N -o '%N|%T' 2>/dev/null", check=False).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        return sorted(states) == sorted(self.lab.trays) and not any(
            s.startswith(("unk", "future")) for s in states.values())

    def restore(self, *, topology_only: bool = False, why: str = "a module put it back") -> None:
        """Deploy `site` again (a deploy changes only what differs; `--topology-only` when only the topology
        was changed) and wait for every tray idle. The files must then be the first deploy's again."""
        from tests.helpers import deploy_slurm

        REDEPLOYS.append(f"{why} ({'--topology-only' if topology_only else 'a full deploy'})")
        proc, _ = deploy_slurm(self.lab, self.site, *(["--topology-only"] if topology_only else []))
        assert proc.returncode == 0, f"deploy slurm (restore) failed ({proc.returncode}): {proc.stderr}\n" \
                                     f"{proc.stdout[-3000:]}"
        changed = self._changed()
        assert not changed, f"after deploying {self.site} again, {sorted(changed)} still differ from the first deploy"
        self.lab.settle_slurm()

    def ensure(self) -> "SlurmLab":
        """The lab as deployed (see the class), deploying again only when its Slurm files or registrations
        are not the deploy's any more."""
        changed = self._changed()
        if changed or not self.registered():
            what = ", ".join(sorted(changed)) or "the trays' registrations"
            sys.stderr.write(f"[slurm_lab] {what} not as deployed on the lab: deploying it again\n")
            self.restore(topology_only=changed == {TOPOLOGY} and self.registered(), why=f"{what} changed")
        else:
            self.lab.settle_slurm()
        return self


@pytest.fixture(scope="session")
def slurm_deployed(lab, tmp_path_factory) -> SlurmLab:
    """The session's one `mctl deploy slurm` on the shared lab (a --dry-run first), for slurm_lab."""
    from tests.helpers import PARTITIONS, deploy_slurm, write_site

    if len(lab.trays) < 4:
        pytest.skip(f"needs a lab with 4 trays ({TRAYS_ENV})")
    site = write_site(lab, tmp_path_factory.mktemp("slurm-site"), PARTITIONS)
    proc, dry = deploy_slurm(lab, site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    proc, first = deploy_slurm(lab, site)
    assert proc.returncode == 0, f"deploy slurm failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-3000:]}"
    deployed = SlurmLab(lab, site, dry, first)
    deployed.files = deployed.deployed_files()
    lab.settle_slurm()          # drains the node check made while the deploy brought slurmd up are lifted
    return deployed


@pytest.fixture(scope="module")
def slurm_lab(slurm_deployed) -> SlurmLab:
    """The shared lab with Slurm as the session deployed it, checked (and put back if needed) per module."""
    return slurm_deployed.ensure()
