#!/usr/bin/env python3
"""Benchmark `mctl rack inventory` against pdsh and clush on a lab rack.

Targets (issue 4), measured in the same run on the same trays:
  - wall time of `mctl rack inventory RACK` <= pdsh running `nvidia-smi -q -x` on the trays;
  - mctl's CPU time <= 0.3 x clush's for the same fan-out.

CPU time is user+system of the process and every descendant it waited for
(os.wait4), so pdsh's and clush's ssh client processes count towards them, as
the in-process SSH of mctl does towards mctl. The trays' side (sshd, nvidia-smi)
runs on the same machine in the lab and is not counted for anyone.

Rounds are interleaved (pdsh, clush, mctl in a rotating order) after one
warm-up round, and medians are reported. Each run's output is checked: pdsh and
clush must return one complete XML per tray, mctl must inventory every tray.

    sudo python3 bench/inventory_bench.py                  # starts an 18-tray lab, 7 rounds
    sudo python3 bench/inventory_bench.py --racks 2        # 2 x 18 trays, `rack inventory --all`
    sudo python3 bench/inventory_bench.py --inventory /var/lib/mctl/lab --rounds 5
    sudo python3 bench/inventory_bench.py --json

Exit 0 when both targets are met, 1 when one is missed, 2 on a setup problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CMD = "nvidia-smi -q -x"


@dataclass
class Sample:
    tool: str
    wall: float
    cpu: float


def measure(argv: list[str], env: dict, out_path: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process tree, exit status)."""
    with open(out_path, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def mctl_argv() -> list[str]:
    script = Path(sys.executable).parent / "mctl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mctl"]


def ssh_options(lab_dir: Path) -> list[str]:
    return ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={lab_dir / 'known_hosts'}", "-o", f"IdentityFile={lab_dir / 'ssh' / 'id_ed25519'}",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10"]


def start_lab(racks: int, trays: int, workdir: Path):
    from mctl.lab import control
    from mctl.lab.procs import listening_tcp

    used = {int(a.split(".")[1]) for a, _ in listening_tcp() if a.startswith("127.")}
    net = next((n for n in range(180, 255) if n not in used), None)
    if net is None:
        raise SystemExit("no free 127.N.0.0/16 block for a bench lab")
    result = control.up(workdir / "lab", racks=racks, trays=trays, net=net, os_only=False,
                        progress=lambda m: sys.stderr.write(f"[lab] {m}\n"))
    return result.dir, control


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inventory", help="an existing lab folder (default: start an 18-tray lab for the run)")
    ap.add_argument("--rack", default="lab-r1", help="the rack to inventory (one-rack runs)")
    ap.add_argument("--racks", type=int, default=1,
                    help="racks of the lab started for the run; more than one runs `rack inventory --all`")
    ap.add_argument("--all", action="store_true", help="every rack of --inventory (`rack inventory --all`)")
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    for tool in ("pdsh", "/usr/bin/clush"):
        if not shutil.which(tool):
            print(f"{tool} is missing (apt-get install pdsh clustershell)", file=sys.stderr)
            return 2

    workdir = Path(tempfile.mkdtemp(prefix="mctl-inv-bench."))
    control = None
    lab_dir = Path(args.inventory) if args.inventory else None
    try:
        if lab_dir is None:
            lab_dir, control = start_lab(args.racks, args.trays, workdir)
        from mctl.inventory import load_site

        site = load_site(lab_dir)
        every = args.all or (not args.inventory and args.racks > 1)
        racks = list(site.racks.values()) if every else [site.racks[args.rack]]
        addresses = [h.address for r in racks for h in r.compute]
        which = ["--all"] if every else [args.rack]
        from ClusterShell.NodeSet import NodeSet

        folded = str(NodeSet.fromlist(addresses))
        opts = ssh_options(lab_dir)
        base_env = dict(os.environ, NO_COLOR="1")
        pdsh_env = dict(base_env, PDSH_RCMD_TYPE="ssh", PDSH_SSH_ARGS=" ".join(opts + ["-l%u", "%h"]))
        state = workdir / "state"
        commands = {
            "pdsh": (["pdsh", "-R", "ssh", "-f", "64", "-l", "root", "-w", folded, CMD], pdsh_env),
            "clush": (["/usr/bin/clush", "-f", "64", "-l", "root", "-o", " ".join(opts), "-w", folded, CMD], base_env),
            "mctl": (mctl_argv() + ["-i", str(lab_dir), "--state-dir", str(state), "rack", "inventory", *which],
                     base_env),
        }
        floor_argv = mctl_argv() + ["--version"]

        def check(tool: str, out: Path, code: int) -> None:
            text = out.read_text(errors="replace")
            if tool == "mctl":
                want = f"{len(addresses)} trays, {len(addresses)} inventoried"  # the summary line
                if code != 0 or want not in text:
                    raise SystemExit(f"mctl run failed (exit {code}):\n{text[-2000:]}")
            elif code != 0 or text.count("</nvidia_smi_log>") != len(addresses):
                raise SystemExit(f"{tool} run failed (exit {code}, "
                                 f"{text.count('</nvidia_smi_log>')} complete XMLs):\n{text[-1500:]}")

        samples: list[Sample] = []
        floor: list[float] = []
        load_before = os.getloadavg()
        order = list(commands)
        for rnd in range(args.rounds + 1):
            for tool in order[rnd % 3:] + order[:rnd % 3]:
                argv, env = commands[tool]
                out = workdir / f"{tool}.out"
                wall, cpu, code = measure(argv, env, out)
                check(tool, out, code)
                if rnd > 0:  # round 0 warms caches (page cache, pyc, sshd) and is not counted
                    samples.append(Sample(tool, wall, cpu))
            _, fcpu, _ = measure(floor_argv, base_env, workdir / "floor.out")
            if rnd > 0:
                floor.append(fcpu)
        load_after = os.getloadavg()
    finally:
        if control is not None and lab_dir is not None:
            control.down(lab_dir)
        shutil.rmtree(workdir, ignore_errors=True)

    med = {t: {"wall": statistics.median(s.wall for s in samples if s.tool == t),
               "cpu": statistics.median(s.cpu for s in samples if s.tool == t)} for t in commands}
    wall_ratio = med["mctl"]["wall"] / med["pdsh"]["wall"]
    cpu_ratio = med["mctl"]["cpu"] / med["clush"]["cpu"]
    floor_cpu = statistics.median(floor)
    result = {
        "racks": len(racks), "trays": len(addresses), "rounds": args.rounds, "median": med,
        "mctl_cli_startup_cpu": floor_cpu,
        "wall_ratio_mctl_over_pdsh": wall_ratio, "cpu_ratio_mctl_over_clush": cpu_ratio,
        "targets": {"wall": wall_ratio <= 1.0, "cpu": cpu_ratio <= 0.3},
        "loadavg_before": load_before, "loadavg_after": load_after,
        "samples": [s.__dict__ for s in samples],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{len(racks)} rack(s), {len(addresses)} trays, {args.rounds} rounds (medians), "
              f"load {load_before[0]:.1f} -> {load_after[0]:.1f}")
        print(f"{'tool':6} {'wall s':>7} {'cpu s':>7}")
        for t in commands:
            print(f"{t:6} {med[t]['wall']:7.2f} {med[t]['cpu']:7.2f}")
        print(f"mctl --version CPU (CLI start-up floor): {floor_cpu:.2f} s")
        print(f"wall mctl/pdsh = {wall_ratio:.2f} (target <= 1.0: {'met' if wall_ratio <= 1 else 'MISSED'})")
        print(f"cpu  mctl/clush = {cpu_ratio:.2f} (target <= 0.3: {'met' if cpu_ratio <= 0.3 else 'MISSED'})")
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
