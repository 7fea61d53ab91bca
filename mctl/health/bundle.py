"""What `mctl node check` needs on a tray: a subset of mctl's source tree, its configuration, a wrapper.

Trays carry no pydantic, typer or asyncssh, so the node check is built from
modules that need only the standard library. This module names them, stages
them as one reproducible tar the node_check role copies and unpacks into
/usr/local/lib/mctl-node-check/ (one file transfer per tray, not fifty), and renders each tray's
/etc/mctl/node-check.json from the inventory (expectations, health settings,
the rack's trays for the breaker).

Two things are not plain copies:
- package __init__ files that import far more than the node check needs
  (mctl.sched.slurm pulls in deploy and pydantic) are replaced by a docstring;
- ClusterShell's node-set modules (pure Python) are copied from the machine
  running mctl, because mctl.model.fabric imports them at module level;
- nvidia-ml-py's `pynvml` (one pure-Python file over ctypes, a dependency of
  mctl) is copied the same way, so the node check's NVML path needs no pip and
  no network on the tray. It loads the driver's libnvidia-ml.so.1 at run time;
  where that library is missing the node check says so and reads nvidia-smi.

Run on the operator's machine: `python -m mctl.health.bundle stage --dest DIR
--inventory mctl.yml` prints the per-tray configs as JSON (the role reads it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mctl.model.site import Site

LIB_DIR = "/usr/local/lib/mctl-node-check"
WRAPPER = "/usr/local/sbin/mctl-node-check"
CONFIG = "/etc/mctl/node-check.json"
TARBALL = "mctl-node-check.tar"

# Every module the node check imports, eagerly or inside a function (nvml, IMEX and log parsers).
MODULES = (
    "mctl", "mctl.errors",
    "mctl.model", "mctl.model.findings", "mctl.model.gpu", "mctl.model.xid", "mctl.model.fabric",
    "mctl.model.inventory_snapshot", "mctl.model.tray", "mctl.model.drain",
    "mctl.facts", "mctl.facts.probe", "mctl.facts.shell", "mctl.facts.kernel_log", "mctl.facts.nvidia_smi",
    "mctl.facts.services", "mctl.facts.imex", "mctl.facts.os_release",
    "mctl.state", "mctl.state.files", "mctl.state.lock", "mctl.state.snapshots",
    "mctl.sched", "mctl.sched.slurm", "mctl.sched.slurm.facts", "mctl.sched.slurm.drain", "mctl.sched.slurm.budget",
    "mctl.model.budget",
    "mctl.health", "mctl.model.settings", "mctl.health.policy", "mctl.health.record",
    "mctl.health.breaker", "mctl.health.hysteresis", "mctl.health.store", "mctl.health.nvml",
    "mctl.health.node_check",
    "mctl.checks", "mctl.checks._base", "mctl.checks.catalogue", "mctl.checks.reachability",
    "mctl.checks.gpu_count", "mctl.checks.driver", "mctl.checks.fabric_state",
    "mctl.checks.fabric_health", "mctl.checks.fabric_identity", "mctl.checks.xid",
    "mctl.checks.ecc", "mctl.checks.nvlink", "mctl.checks.thermal",
    "mctl.checks.imex", "mctl.checks.slurmd", "mctl.checks.resources",
    "mctl.checks.boot", "mctl.checks.leak", "mctl.health.leaks",
    "mctl.checks.clocks", "mctl.checks.nvlink_errors", "mctl.checks.dcgm", "mctl.facts.dcgm", "mctl.facts.packages",
    "mctl.facts.slurm_version",
)
# Packages whose real __init__ imports what the node check must not need.
STUB_PACKAGES = {
    "mctl.sched.slurm": '"""Slurm (node-check subset: only facts.py and drain.py, the scontrol parsers and scripts)."""\n',
}
THIRD_PARTY = ("ClusterShell", "ClusterShell.Defaults", "ClusterShell.NodeSet", "ClusterShell.NodeUtils",
               "ClusterShell.RangeSet", "pynvml")
# The distribution each third-party module comes from (named when it is missing here).
DISTRIBUTIONS = {"pynvml": "nvidia-ml-py", "ClusterShell": "ClusterShell"}
# Modules the node check reaches lazily (function-level imports); the bundle test imports them all.
LAZY = ("mctl.health.nvml", "mctl.health.hysteresis", "mctl.health.leaks", "mctl.facts.imex", "mctl.model.fabric", "mctl.facts.kernel_log",
        "mctl.facts.nvidia_smi", "mctl.facts.services", "mctl.facts.dcgm")


def _source(module: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        dist = DISTRIBUTIONS.get(module.split(".")[0])
        raise RuntimeError(f"cannot find module {module}" + (
            f": install {dist} where mctl runs (it is one of mctl's dependencies); the node check ships it "
            "to the trays" if dist else ""))
    return Path(spec.origin)


def _relative(module: str, path: Path) -> Path:
    parts = module.split(".")
    if path.name == "__init__.py":
        return Path(*parts) / "__init__.py"
    return Path(*parts[:-1]) / path.name


def files() -> list[tuple[Path | None, Path, str | None]]:
    """(source file or None, path in the bundle, replacement text or None), sorted by bundle path."""
    out = []
    for module in MODULES + THIRD_PARTY:
        src = _source(module)
        rel = _relative(module, src)
        stub = STUB_PACKAGES.get(module)
        out.append((None if stub else src, rel, stub))
    return sorted(out, key=lambda f: str(f[1]))


def tarball() -> bytes:
    """The bundle as one uncompressed tar with fixed owners, modes and times: the same source
    gives the same bytes, so Ansible's copy reports no change on a re-run."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        dirs: set[Path] = set()
        for src, rel, text in files():
            for parent in reversed(rel.parents[:-1]):
                if parent not in dirs:
                    dirs.add(parent)
                    info = tarfile.TarInfo(str(parent))
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            data = text.encode() if text is not None else src.read_bytes()
            info = tarfile.TarInfo(str(rel))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stage(dest: Path) -> Path:
    """Write DEST/mctl-node-check-<sha256 prefix>.tar (only when no file has that content yet) and return its path.

    Content-addressed: two stagings into one folder at once (two mctl checkouts or versions provisioning sites of
    the same name from one machine) each get their own bytes, never the other's half-replaced file; the same
    content is written once. The temporary file is private to this call (mkstemp)."""
    import tempfile

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    data = tarball()
    stem, _, ext = TARBALL.rpartition(".")
    target = dest / f"{stem}-{hashlib.sha256(data).hexdigest()[:16]}.{ext}"
    if not target.exists() or target.read_bytes() != data:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=dest)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def wrapper(python: str = "/usr/bin/python3", lib_dir: str = LIB_DIR) -> str:
    """/usr/local/sbin/mctl-node-check. -I: no PYTHON* variables or user site from slurmd's
    environment. The bundle comes first on sys.path, so its pynvml is the one used."""
    code = (f"import sys; sys.path.insert(0, {json.dumps(lib_dir)}); "
            "from mctl.health.node_check import main; sys.exit(main())")
    return ("#!/bin/sh\n"
            "# mctl node check: mctl's health checks on this tray; drains it in Slurm with an mctl: reason.\n"
            "# Installed by mctl's node_check role (playbooks/roles/node_check); Slurm runs it as HealthCheckProgram.\n"
            f"exec {python} -I -c '{code}' \"$@\"\n")


def node_configs(site: "Site", state_dir: str = "/var/lib/mctl-node-check") -> dict[str, dict[str, Any]]:
    """Each compute tray's /etc/mctl/node-check.json, from the inventory."""
    from mctl.health.node_check import NodeCheckConfig
    from mctl.health.site_view import expectations, settings_of

    # The node check emits no events (docs/events.md): the sinks' URLs and secret files stay off the trays.
    settings = replace(settings_of(site), events=())
    trays = site.compute_trays()
    expect = expectations(site, trays)
    scheduler = site.scheduler.type if site.scheduler else None
    out = {}
    for h in trays:
        rack = site.racks[h.rack] if h.rack else None
        out[h.name] = NodeCheckConfig(node=h.name, expect=expect[h.name], settings=settings,
                                      rack_nodes=tuple(t.name for t in rack.compute) if rack else (),
                                      state_dir=state_dir, drain=scheduler == "slurm", scheduler=scheduler).to_dict()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mctl.health.bundle",
                                     description="Stage mctl's node check for the node_check role. "
                                                 "Example: python -m mctl.health.bundle stage --dest /tmp/nc "
                                                 "--inventory inventories/lab/mctl.yml")
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stage", help="write the module tree and print the per-tray configs (JSON)")
    st.add_argument("--dest", required=True)
    st.add_argument("--inventory", required=True)
    args = parser.parse_args(argv)
    from mctl.errors import MctlError
    from mctl.inventory import load_site

    try:
        site = load_site(args.inventory)
    except MctlError as exc:
        sys.stderr.write(f"mctl: error: {exc.message}\n")
        return 2
    path = stage(Path(args.dest))
    json.dump({"tarball": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
               "files": [str(rel) for _, rel, _ in files()], "wrapper": wrapper(),
               "configs": node_configs(site)}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
