"""Build and cache the lab's root filesystem from an image definition.

The root filesystem is the read-only lower layer of every lab host, so it is
built once per definition and shared by every lab and test run on the machine:
the cache key is a hash of the definition's `build:` section (plus this
builder's version), the build happens in a temporary folder that is renamed into
place only when complete, and a lock keeps two concurrent builds apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from mctl.errors import EnvironmentProblem, UsageError

BUILDER_VERSION = 1
DEFAULT_CACHE = "/var/cache/mctl/images"
MANIFEST = ".mctl-image.json"
# Packages whose versions are recorded in the manifest (and shown by `lab status`).
RECORDED = ("slurmctld", "slurmd", "slurm-client", "munge", "openssh-server", "python3")


def cache_root() -> Path:
    return Path(os.environ.get("MCTL_IMAGE_CACHE") or DEFAULT_CACHE)


@dataclass(frozen=True)
class ImageSpec:
    name: str
    build: dict
    source: Path

    @property
    def key(self) -> str:
        canon = json.dumps({"builder": BUILDER_VERSION, "build": self.build}, sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.key}"


def load_spec(path: Path) -> ImageSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read image definition {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    build = doc.get("build") if isinstance(doc, dict) else None
    if not isinstance(build, dict):
        raise UsageError(f"{path}: no 'build:' section", hint="see images/lab-debian13.yml")
    if build.get("tool") != "debootstrap":
        raise UsageError(f"{path}: build.tool must be 'debootstrap' (got {build.get('tool')!r})")
    for key in ("suite", "variant"):
        if not isinstance(build.get(key), str) or not re.fullmatch(r"[a-z0-9.-]+", build[key]):
            raise UsageError(f"{path}: build.{key} must be a plain name (got {build.get(key)!r})")
    pkgs = build.get("packages") or []
    if not all(isinstance(p, str) and re.fullmatch(r"[a-z0-9][a-z0-9+.:=-]*", p) for p in pkgs):
        raise UsageError(f"{path}: build.packages must be Debian package names")
    return ImageSpec(name=str(doc.get("name") or path.stem), build=build, source=path)


def is_built(spec: ImageSpec) -> bool:
    return (spec.cache_dir / MANIFEST).is_file()


def read_manifest(image_dir: Path) -> dict | None:
    """What a built image holds (name, key, recorded package versions), or None if absent."""
    try:
        return json.loads((Path(image_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def host_mirror(etc: Path = Path("/etc")) -> str | None:
    """The Debian mirror this machine's apt already uses, so no mirror is hard-coded.

    MCTL_DEBIAN_MIRROR wins; else the first non-security Debian source; else
    None (debootstrap's own default).
    """
    env = os.environ.get("MCTL_DEBIAN_MIRROR")
    if env:
        return env
    uris: list[str] = []
    paths = [etc / "apt/sources.list"] + sorted((etc / "apt/sources.list.d").glob("*"))
    for p in paths:
        try:
            text = p.read_text()
        except OSError:
            continue
        if p.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                suites = fields.get("Suites", "").split()
                if fields.get("URIs") and suites and not any("security" in s for s in suites):
                    uris.extend(fields["URIs"].split())
        elif p.name == "sources.list" or p.suffix == ".list":
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and "security" not in m.group(2):
                    uris.append(m.group(1))
    for uri in uris:
        if "security" not in uri and "/debian" in uri and uri.startswith(("http://", "https://", "file:")):
            return uri
    return None


def _wheel_files(build: dict, workdir: Path, log) -> list[tuple[bytes, list[str]]]:
    """Fetch each wheel with pip (its ordinary client) and pull out the named files."""
    out: list[tuple[bytes, list[str]]] = []
    for item in build.get("wheel_files") or []:
        req = f"{item['project']}=={item['version']}"
        dest = workdir / "wheels"
        dest.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-d", str(dest), req], stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise EnvironmentProblem(f"could not download {req} from PyPI (pip exit {proc.returncode})",
                                     hint="check that pip can reach the package index; see the build log")
        norm = item["project"].replace("-", "_")
        wheels = sorted(dest.glob(f"{norm}-{item['version']}-*.whl"))
        if not wheels:
            raise EnvironmentProblem(f"pip did not produce a wheel for {req}")
        with zipfile.ZipFile(wheels[0]) as zf:
            for member, targets in (item.get("files") or {}).items():
                out.append((zf.read(member), list(targets)))
    return out


_CHROOT_SCRIPT = r"""
set -eu
R="$1"
mount -t proc proc "$R/proc"
mount -t sysfs -o ro sysfs "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
chroot "$R" dpkg-divert --local --rename --add /usr/bin/systemctl >/dev/null
chroot "$R" dpkg-divert --local --rename --add /usr/bin/journalctl >/dev/null
chroot "$R" apt-get update -q
chroot "$R" apt-get install -y -q --no-install-recommends {packages}
chroot "$R" apt-get clean
chroot "$R" dpkg-query -W -f '${{Package}}\t${{Version}}\n' > "$R/.mctl-packages.tsv"
"""


def build(spec: ImageSpec, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """Return the cached root filesystem for *spec*, building it first if needed."""
    final = spec.cache_dir
    if is_built(spec):
        return final
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{spec.name}-{spec.key}.lock", "w") as lockf:
        if not _try_lock(lockf):
            progress(f"waiting for another build of image {spec.name} to finish")
            fcntl.flock(lockf, fcntl.LOCK_EX)
        if is_built(spec):
            return final
        if final.exists():  # a leftover without a manifest: never complete
            shutil.rmtree(final)
        log_path = root / f"{spec.name}-{spec.key}.log"
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{spec.name}-", dir=root))
        started = time.monotonic()
        try:
            with open(log_path, "w") as log:
                _build_into(spec, tmp, log, progress)
            os.chmod(tmp, 0o755)        # mkdtemp made it private; the image is world-readable
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        progress(f"image {spec.name} built in {time.monotonic() - started:.0f} s ({final})")
        return final


def _try_lock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _run(argv: list[str], log, what: str, log_path: str) -> None:
    log.write(f"\n$ {' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}\n")
    log.flush()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"image build failed while {what} (exit {proc.returncode})",
                                 hint=f"see the build log {log_path}")


def _build_into(spec: ImageSpec, tmp: Path, log, progress: Callable[[str], None]) -> None:
    b = spec.build
    rootfs = tmp / "rootfs"
    mirror = host_mirror()
    progress(f"building image {spec.name} ({b['suite']}, {b['variant']}) with debootstrap; this takes a few minutes")
    argv = ["debootstrap", f"--variant={b['variant']}", b["suite"], str(rootfs)]
    if mirror:
        argv.append(mirror)
    _run(argv, log, "running debootstrap", log.name)

    if b.get("disable_service_autostart", True):
        (rootfs / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\n# mctl lab image: services start only when the playbooks start them\nexit 101\n")
        (rootfs / "usr/sbin/policy-rc.d").chmod(0o755)
    packages = " ".join(b.get("packages") or [])
    script = _CHROOT_SCRIPT.format(packages=packages)
    progress(f"installing {len(b.get('packages') or [])} packages into the image")
    # A private mount namespace: the chroot's /proc, /dev and tmpfs mounts vanish
    # with the process even if the build is interrupted.
    _run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(rootfs)],
         log, "installing packages in the chroot", log.name)

    for data, targets in _wheel_files(b, tmp, log):
        for target in targets:
            dest = rootfs / target.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = data.decode()
            if text.startswith("#!"):
                text = "#!/usr/bin/python3" + text[text.index("\n"):]
            dest.write_text(text)
            dest.chmod(0o755)

    for pattern in b.get("remove") or []:
        for p in rootfs.glob(pattern.lstrip("/")):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    # Every host gets its own machine id at `lab up`.
    (rootfs / "etc/machine-id").write_text("")

    versions = {}
    tsv = rootfs / ".mctl-packages.tsv"
    for line in tsv.read_text().splitlines():
        name, _, version = line.partition("\t")
        if name in RECORDED:
            versions[name] = version
    tsv.unlink()
    meta = {"name": spec.name, "key": spec.key, "suite": b["suite"], "built_at": time.time(),
            "source": str(spec.source), "mirror": mirror, "packages": versions,
            "rootfs": "rootfs"}
    (tmp / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n")
