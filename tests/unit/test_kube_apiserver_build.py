"""scripts/build-kube-apiserver's failure path and the Kubernetes tier's skip reason (no build, no network).

apt-get is replaced on PATH by one that fails, as the archive being unreachable would; the
script must say at which step and where the log is, leave nothing half-built, and the test
fixture must then skip with that reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.kube_apiserver import CACHE, binaries

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-kube-apiserver"


def test_a_failed_build_says_why_and_the_tier_is_skipped_with_it(tmp_path, processes):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho 'E: simulated: the archive cannot be reached' >&2\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(os.environ, MCTL_KUBE_CACHE=str(cache), PATH=f"{fake}:{os.environ['PATH']}")
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    failed = (cache / "FAILED").read_text()
    assert "failed at step: apt-get update (private state)" in failed
    assert f"log: {cache / 'build.log'}" in failed and "simulated: the archive cannot be reached" in failed
    assert "kube-apiserver build failed at step" in proc.stderr
    assert not (cache / "current").exists() and not list(cache.glob("1.*"))
    reason = binaries(cache)
    assert isinstance(reason, str) and "apt-get update" in reason and str(cache / "build.log") in reason


def test_not_built_names_the_command(tmp_path):
    reason = binaries(tmp_path)
    assert isinstance(reason, str) and "scripts/install" in reason and "scripts/build-kube-apiserver" in reason


@pytest.mark.skipif(not (CACHE / "current").exists(), reason="kube-apiserver not built here")
def test_a_cached_build_is_reused_without_apt(tmp_path, processes):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "kube-apiserver cached" in proc.stdout


def fake_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    bindir = cache / "1.20.5+really1.20.2-1.1+deb12u1" / "bin"
    bindir.mkdir(parents=True)
    for name in ("kube-apiserver", "etcd"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    (cache / "current").symlink_to("1.20.5+really1.20.2-1.1+deb12u1")
    return cache


def test_concurrent_installs_share_one_cache(tmp_path, processes):
    cache = fake_cache(tmp_path)
    env = dict(os.environ, MCTL_KUBE_CACHE=str(cache))
    procs = [subprocess.Popen([str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert all("kube-apiserver cached: 1.20.5+really1.20.2-1.1+deb12u1" in out for out, _err in outs)


def test_a_build_in_progress_is_waited_for_with_a_deadline(tmp_path, processes):
    cache = fake_cache(tmp_path)
    holder = subprocess.Popen(["flock", str(cache / ".lock"), "sleep", "30"])
    try:
        deadline = time.monotonic() + 30
        # until the holder has it: a non-blocking try fails (exit 1)
        while subprocess.run(["flock", "-n", str(cache / ".lock"), "true"]).returncode == 0:
            assert time.monotonic() < deadline, "the lock holder did not take the lock"
            time.sleep(0.05)
        env = dict(os.environ, MCTL_KUBE_CACHE=str(cache), MCTL_KUBE_BUILD_LOCK_WAIT="1")
        proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 1 and "another build still holds" in proc.stderr
    finally:
        holder.kill()
        holder.wait(10)


def test_the_fixture_waits_for_a_build_running_now_and_then_finds_its_binaries(tmp_path, processes):
    """scripts/test builds a missing kube-apiserver beside the tests: the fixture waits while the build holds
    the cache's lock (a stand-in build here: flock for two seconds, then the binaries in place)."""
    from tests.kube_apiserver import building, built

    cache = tmp_path / "cache"
    bindir = cache / "1.0" / "bin"
    bindir.mkdir(parents=True)
    script = (f"flock {cache / '.lock'} sh -c 'sleep 2; for b in kube-apiserver etcd; do "
              f"printf \"#!/bin/sh\\n\" > {bindir}/$b; chmod 755 {bindir}/$b; done; ln -s 1.0 {cache / 'current'}'")
    holder = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not building(cache) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert building(cache) and isinstance(binaries(cache), str)
        found = built(cache, wait=30)
        assert found == (cache / "current" / "bin" / "kube-apiserver", cache / "current" / "bin" / "etcd")
        assert not building(cache)
    finally:
        holder.kill()
        holder.wait(10)
    assert isinstance(built(tmp_path / "nothing", wait=30), str)         # no build running: no wait at all
