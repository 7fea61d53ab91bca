"""The lab's apt repository: the image's components as real Debian packages, served over HTTP.

`mctl lab up` builds, once per lab, under ``<lab>/aptrepo/``, one flat repository per repository
name the image definitions use (``cuda``, ``doca``, ``site``; flat, as NVIDIA's CUDA network
repository is laid out: ``deb [signed-by=KEY] URL /``). Every package an image's component names
with ``delivery: repository`` (images/*.yml, ``name=version``) is built with ``dpkg-deb``, indexed
with ``dpkg-scanpackages`` and listed in a ``Release`` file that is signed (``InRelease`` and
``Release.gpg``) with ``gpg`` using a key made for this lab; the trays trust that key only because
provisioning installs it and names it in ``signed-by``, as a site does with NVIDIA's key.

A package's files are the lab's emulators where the lab has one (``HostFile`` entries of
mctl/lab/services.py tagged with the package, e.g. nvidia-smi in ``nvidia-utils-<branch>``, the
IMEX daemon, its ctl and unit in ``nvidia-imex-<branch>``), else one placeholder file under
/usr/share/doc/<package>/ saying so. No program is ever a placeholder: a tool the lab does not
emulate is absent, as it is on a tray without it.

Each rack's service address serves the repositories (``serve``, a plain HTTP file server in the
rack's own PID namespace, stopped by `lab down`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

import yaml

from mctl.errors import EnvironmentProblem

APT_PORT = 8080
KEY_NAME = "mctl-lab-archive.asc"
BUILDER_VERSION = 2
# A tray's own reason for a package's post-installation script to fail (`postinst_fails`): one file per
# package, read by that package's real postinst under dpkg, so apt reports the failure as on hardware
# (a driver's DKMS build failing on one tray's kernel, a daemon's setup failing on a full disk).
POSTINST_FAULTS_IN_HOST = "/var/lib/mctl-lab/postinst-fails"
_POSTINST = """#!/bin/sh
# {name} {version}: post-installation script of the mctl virtual lab's package (mctl/lab/aptrepo.py).
# It fails, as a broken one does, on a tray where `postinst_fails` left a reason for it.
set -e
reason={faults}/{name}
if [ "$1" = configure ] && [ -e "$reason" ]; then
    echo "{name} post-installation script: $(head -c 300 "$reason")" >&2
    exit 1
fi
{driver}exit 0
"""
# The driver's metapackage (nvidia-driver-<branch>[-open]) stands in for the kernel module it brings: the
# lab's GPUs (gpus.json, read by the nvidia-smi and IMEX emulators) report its version once it is
# configured. On hardware the new module answers after the reboot (or module reload) that follows.
_DRIVER_POSTINST = """if [ "$1" = configure ] && [ -f /var/lib/mctl-lab/gpus.json ]; then
    /usr/bin/python3 -I - <<'PY'
import json, os
path = "/var/lib/mctl-lab/gpus.json"
with open(path) as fh:
    state = json.load(fh)
state["driver_version"] = "{upstream}"
{cuda}if "driver_branch" in state:
    state["driver_branch"] = "{branch}"
with open(path + ".mctl-new", "w") as fh:
    json.dump(state, fh, indent=2)
os.replace(path + ".mctl-new", path)
PY
fi
"""
DRIVER_PACKAGE = re.compile(r"^nvidia-driver-([0-9]{3})(-open)?$")
PROGRAMS = {"dpkg-deb": "dpkg", "dpkg-scanpackages": "dpkg-dev", "gpg": "gpg", "gpgconf": "gpgconf"}
_PKG = re.compile(r"^([a-z0-9][a-z0-9+.-]+)=([0-9][A-Za-z0-9.+~:-]*)$")


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    component: str            # the image's component key (nvidia_driver, imex, ...)
    repository: str
    depends: tuple[str, ...] = ()     # "name (= version)"

    @property
    def filename(self) -> str:
        # the epoch is not part of a .deb's file name (as in the CUDA repository: ..._4.3.1-1_arm64.deb)
        return f"{self.name}_{re.sub(r'^[0-9]+:', '', self.version)}"

    @property
    def tag(self) -> str:
        """The emulator-file tag: the name without its driver branch (nvidia-utils-570 -> nvidia-utils)."""
        return re.sub(r"-[0-9]{3}$", "", self.name)


def packages_of(images_dir: Path, only: str | None = None) -> list[Package]:
    """Every repository-delivered package of every image definition in *images_dir* (or of image *only*), once each."""
    seen: dict[tuple[str, str], Package] = {}
    for path in sorted(images_dir.glob("*.yml") if only is None else [images_dir / f"{only}.yml"]):
        doc = yaml.safe_load(path.read_text()) or {}
        for comp_name, comp in (doc.get("components") or {}).items():
            if not isinstance(comp, dict) or comp.get("delivery", "repository") != "repository":
                continue
            repo = comp.get("repository")
            pkgs = [_PKG.match(str(p)) for p in comp.get("packages") or []]
            if not repo or not pkgs or not all(pkgs):
                continue        # provisioning fails such a component by name; nothing to serve
            pairs = [(m.group(1), m.group(2)) for m in pkgs if m]
            for i, (name, version) in enumerate(pairs):
                # the component's first package stands for it (a metapackage): it depends on the others
                deps = tuple(f"{n} (= {v})" for n, v in pairs[1:]) if i == 0 else ()
                seen.setdefault((name, version), Package(name, version, comp_name, str(repo), deps))
    return list(seen.values())


def repo_dir(lab_dir: Path) -> Path:
    return Path(lab_dir) / "aptrepo"


def key_file(lab_dir: Path) -> Path:
    return repo_dir(lab_dir) / KEY_NAME


def signing_key_file(lab_dir: Path) -> Path:
    """The lab's secret signing key (0600, outside the served folder; `lab down` removes it)."""
    return Path(lab_dir) / "aptrepo-signing.key"


def repositories(packages: list[Package]) -> list[str]:
    return sorted({p.repository for p in packages})


def inventory_vars(lab_dir: Path, address: str, repos: list[str]) -> dict:
    """`apt_repositories` as a site defines it, for the rack whose service address is *address*."""
    return {name: {"url": f"http://{address}:{APT_PORT}/{name}/", "suite": "/", "key_file": str(key_file(lab_dir))}
            for name in repos}


def missing_programs() -> list[str]:
    return [f"'{p}' (Debian package {pkg})" for p, pkg in PROGRAMS.items() if shutil.which(p) is None]


def _run(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    # stderr apart: dpkg-scanpackages writes its index to stdout and its "Wrote N entries" to stderr
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          timeout=120, **kw)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"lab apt repository: {what} failed (exit {proc.returncode}): "
                                 f"{(proc.stderr + proc.stdout).decode(errors='replace').strip()[-400:]}")
    return proc


def arch() -> str:
    """dpkg's architecture on this machine (the lab's trays share it)."""
    return _arch()


def _arch() -> str:
    return _run(["dpkg", "--print-architecture"], "dpkg --print-architecture").stdout.decode().strip()


def _control(p: Package, arch: str, emulated: bool) -> str:
    lines = [f"Package: {p.name}", f"Version: {p.version}", f"Architecture: {arch}",
             "Maintainer: mctl virtual lab <lab@mctl.invalid>", "Section: misc", "Priority: optional"]
    if p.depends:
        lines.append("Depends: " + ", ".join(p.depends))
    what = "the lab's emulator of it" if emulated else "a placeholder file (the lab does not emulate it)"
    lines.append(f"Description: {p.component} {p.version} for the mctl virtual lab")
    lines.append(f" Built by `mctl lab up` (mctl/lab/aptrepo.py); holds {what}.")
    return "\n".join(lines) + "\n"


def _package_files(p: Package, ctx) -> list[tuple[str, bytes, int]]:
    from mctl.lab import services

    out = []
    for f in services.HOST_FILES:
        if f.package == p.tag:
            data = f.content(ctx)
            if data is None:
                raise EnvironmentProblem(f"lab apt repository: the emulator file {f.dest} of {p.name} is missing")
            out.append((f.dest, data if isinstance(data, bytes) else data.encode(), f.mode))
    return out


def _driver_postinst(p: Package) -> str:
    from mctl.lab.emulators.nvidia_smi import BRANCHES

    m = DRIVER_PACKAGE.match(p.name)
    if not m:
        return ""
    upstream = re.sub(r"^[0-9]+:", "", p.version).rsplit("-", 1)[0]
    cuda = BRANCHES.get(m.group(1), (None, None))[1]
    return _DRIVER_POSTINST.format(upstream=upstream, branch=m.group(1),
                                   cuda=f'state["cuda_version"] = "{cuda}"\n' if cuda else "")


def contents(p: Package, ctx) -> list[tuple[str, bytes, int]]:
    """The files package *p* installs: its emulators, else a placeholder README."""
    files = _package_files(p, ctx)
    if not files:
        files = [(f"/usr/share/doc/{p.name}/README.mctl-lab",
                  f"{p.name} {p.version} ({p.component}): a placeholder from the mctl virtual lab, which does "
                  "not emulate this component.\n".encode(), 0o644)]
    return files


def preinstalled(p: Package, arch: str, ctx) -> tuple[str, list[tuple[str, bytes, int]]]:
    """Package *p* as a pre-tooled tray holds it (`lab up --pre-tooled`, an image with the GPU tools in it):
    its dpkg status stanza (installed) and its files, so dpkg-query, apt and the audit see it installed,
    exactly as if its .deb had been installed."""
    control = _control(p, arch, emulated=bool(_package_files(p, ctx))).replace(
        f"Package: {p.name}\n", f"Package: {p.name}\nStatus: install ok installed\n", 1)
    return control, contents(p, ctx)


def build_deb(p: Package, arch: str, dest_dir: Path, work: Path, ctx) -> Path:
    root = work / p.filename
    (root / "DEBIAN").mkdir(parents=True)
    files = contents(p, ctx)
    for dest, data, mode in files:
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    (root / "DEBIAN/control").write_text(_control(p, arch, emulated=bool(_package_files(p, ctx))))
    postinst = root / "DEBIAN/postinst"
    postinst.write_text(_POSTINST.format(name=p.name, version=p.version, faults=POSTINST_FAULTS_IN_HOST,
                                         driver=_driver_postinst(p)))
    postinst.chmod(0o755)
    out = dest_dir / f"{p.filename}_{arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out)], f"dpkg-deb {p.name}")
    return out


def _release(repo: Path, name: str, arch: str) -> str:
    lines = [f"Origin: mctl-lab", f"Label: mctl lab {name}", f"Suite: {name}", f"Codename: {name}",
             f"Date: {formatdate(time.time(), usegmt=True)}", f"Architectures: {arch}",
             f"Description: the mctl virtual lab's {name} repository (mctl/lab/aptrepo.py)"]
    for algo, field in (("md5", "MD5Sum"), ("sha256", "SHA256")):
        lines.append(f"{field}:")
        for idx in ("Packages", "Packages.gz"):
            data = (repo / idx).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {idx}")
    return "\n".join(lines) + "\n"


class _Gpg:
    """A throw-away GnuPG home holding the lab's signing key (its agent ended on close)."""

    def __init__(self) -> None:
        # short path: the agent's socket path must fit a sockaddr_un
        self.home = Path(tempfile.mkdtemp(prefix="mctl-gpg-", dir="/tmp"))
        self.env = dict(os.environ, GNUPGHOME=str(self.home), LC_ALL="C")

    def __enter__(self) -> "_Gpg":
        return self

    def gpg(self, *args: str) -> bytes:
        return _run(["gpg", "--batch", "--no-tty", "--quiet", *args], "gpg " + args[0], env=self.env).stdout

    def __exit__(self, *_exc) -> None:
        subprocess.run(["gpgconf", "--kill", "all"], env=self.env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


def _index(g: "_Gpg", d: Path, name: str, arch: str, withheld: set[str]) -> None:
    """Packages (less the withheld "name=version"s), Release, and both signatures of repository *d*."""
    index = _run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], f"dpkg-scanpackages {name}",
                 cwd=d).stdout.decode()
    kept = []
    for stanza in index.strip().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if f"{fields.get('Package')}={fields.get('Version')}" not in withheld:
            kept.append(stanza)
    data = ("\n\n".join(kept) + "\n").encode() if kept else b""
    (d / "Packages").write_bytes(data)
    (d / "Packages.gz").write_bytes(gzip.compress(data, mtime=0))
    (d / "Release").write_text(_release(d, name, arch))
    g.gpg("--yes", "--digest-algo", "SHA512", "--clearsign", "-o", str(d / "InRelease"), str(d / "Release"))
    g.gpg("--yes", "--digest-algo", "SHA512", "--armor", "--detach-sign", "-o", str(d / "Release.gpg"),
          str(d / "Release"))


def withhold(lab_dir: Path, repository: str, packages: set[str]) -> None:
    """Re-index and re-sign *repository* without the given "name=version"s (their .deb files stay):
    to apt on every tray the version is then missing, as when a repository drops it. An empty set
    restores the full index."""
    root = repo_dir(lab_dir)
    d = root / repository
    if not (root / ".built").is_file() or not d.is_dir():
        raise EnvironmentProblem(f"the lab has no apt repository {repository!r} (is the lab up?)")
    with _Gpg() as g:
        g.gpg("--import", str(signing_key_file(lab_dir)))
        _index(g, d, repository, _arch(), set(packages))


def postinst_fails(lab_dir: Path, tray: str, package: str, reason: str | None) -> None:
    """Make *package*'s post-installation script fail on *tray* with *reason* (None: no longer fail).

    The script is the package's own (every lab package has one); dpkg runs it when apt installs or
    configures the package, so the tray sees a package whose postinst fails, in apt's and dpkg's words."""
    from mctl.lab import hosts

    if not re.match(r"^[a-z0-9][a-z0-9+.-]+$", package):
        raise EnvironmentProblem(f"{package!r} is not a package name")
    path = hosts.host_path(lab_dir, tray, f"{POSTINST_FAULTS_IN_HOST}/{package}")
    if reason is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason.replace("\n", " ")[:300] + "\n")


def build(lab_dir: Path, images_dir: Path, ctx) -> Path:
    """Build the lab's repositories under <lab>/aptrepo (once; a complete build has its `.built`)."""
    root = repo_dir(lab_dir)
    if (root / ".built").is_file():
        return root
    gaps = missing_programs()      # prereq.require checked these at `lab up`; a direct caller gets them named
    if gaps:
        raise EnvironmentProblem("the lab's apt repository cannot be built here: missing " + "; ".join(gaps),
                                 hint="apt-get install dpkg-dev gpg")
    if root.exists():
        shutil.rmtree(root)
    tmp = Path(tempfile.mkdtemp(prefix=".aptrepo-", dir=lab_dir))
    try:
        arch = _arch()
        pkgs = packages_of(images_dir)
        work = tmp / "work"
        for p in pkgs:
            d = tmp / p.repository
            d.mkdir(exist_ok=True)
            build_deb(p, arch, d, work, ctx)
        shutil.rmtree(work, ignore_errors=True)
        with _Gpg() as g:
            g.gpg("--passphrase", "", "--quick-gen-key", f"mctl lab archive ({Path(lab_dir).name}) <lab@mctl.invalid>",
                  "ed25519", "sign", "never")
            (tmp / KEY_NAME).write_bytes(g.gpg("--armor", "--export"))
            secret = signing_key_file(lab_dir)
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(g.gpg("--pinentry-mode", "loopback", "--passphrase", "", "--armor", "--export-secret-keys"))
            for name in repositories(pkgs):
                _index(g, tmp / name, name, arch, set())
        (tmp / ".built").write_text(f"builder {BUILDER_VERSION}\n")
        os.chmod(tmp, 0o755)
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


class _Handler(http.server.SimpleHTTPRequestHandler):
    log_file = None

    def log_message(self, format: str, *args) -> None:   # noqa: A002 (the base class's name)
        if self.log_file is not None:
            self.log_file.write(f"{self.address_string()} - [{self.log_date_time_string()}] {format % args}\n")
            self.log_file.flush()


def serve(root: Path, address: str, port: int, log: Path | None) -> int:
    handler = _Handler
    if log is not None:
        handler.log_file = open(log, "a")
    server = http.server.ThreadingHTTPServer((address, port), lambda *a: handler(*a, directory=str(root)))
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mctl.lab.aptrepo")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the lab's repositories over HTTP")
    s.add_argument("--root", type=Path, required=True)
    s.add_argument("--address", required=True)
    s.add_argument("--port", type=int, default=APT_PORT)
    s.add_argument("--log-file", type=Path)
    args = ap.parse_args(argv)
    return serve(args.root, args.address, args.port, args.log_file)


if __name__ == "__main__":
    sys.exit(main())
