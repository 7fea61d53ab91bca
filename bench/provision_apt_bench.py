#!/usr/bin/env python3
"""First provisioning of an OS-only lab rack, every component through apt: two playbook trees compared.

Targets (issue 21): the first provisioning of an 18-tray lab rack from the OS-only image
(`mctl lab up --os-only`), every component installed through apt from the lab's signed
repository, <= 6 min; the re-run with everything in place <= 60 s with zero changes.

With `--baseline DIR` (a playbooks/ folder of another tree, e.g. extracted with
`git archive <commit> playbooks | tar -x -C /tmp/old`), rounds alternate the two trees on the
same lab in the same minutes, so the machine's load falls on both: each round first returns
every tray to the OS image's packages (the image's repository packages purged, mctl's apt
sources, pins and keys removed, the repositories' index files dropped) and then provisions it
with one tree. The first round's first run is the true first provisioning of a fresh lab.

Usage: sudo python3 bench/provision_apt_bench.py [--trays 18] [--rounds 2] [--baseline DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIRST_TARGET_S = 360.0
RERUN_TARGET_S = 60.0

# Back to the OS image: every package of the lab repositories purged (holds released first), mctl's
# apt files and the repositories' index files removed. Run on each tray over ssh.
RESET = (
    "set -e; pkgs=$(dpkg-query -W -f '${Package} ${Maintainer}\\n' 2>/dev/null | "
    "awk '/mctl virtual lab/ {print $1}'); "
    "if [ -n \"$pkgs\" ]; then apt-mark unhold $pkgs >/dev/null; "
    "DEBIAN_FRONTEND=noninteractive dpkg --purge --force-remove-reinstreq $pkgs >/dev/null; fi; "
    "rm -f /etc/apt/sources.list.d/mctl-*.list /etc/apt/preferences.d/mctl-*.pref /etc/apt/keyrings/mctl-*.asc; "
    "find /var/lib/apt/lists -maxdepth 1 -name '127.*' -delete; rm -f /var/cache/apt/archives/*.deb"
)


def free_net() -> int:
    from mctl.lab.procs import listening_tcp

    used = {int(a.split(".")[1]) for a, _ in listening_tcp() if a.startswith("127.")}
    return random.choice([n for n in range(150, 200) if n not in used])


def provision(env: dict, playbooks: Path | None) -> dict:
    e = dict(env)
    if playbooks is not None:
        e["MCTL_PLAYBOOKS"] = str(playbooks)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mctl", "provision", "lab-r1", "--json"], env=e,
                          capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = {}
    changed = {h: r.get("changed") for h, r in (data.get("hosts") or {}).items()}
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "load": [round(load, 1), round(os.getloadavg()[0], 1)],
            "changed_total": sum(v or 0 for v in changed.values()), "failed_hosts": data.get("failed_hosts"),
            "stderr": proc.stderr[-1500:] if proc.returncode else ""}


def reset(lab, trays: list[str]) -> None:
    procs = [subprocess.Popen(lab.ssh_argv(t) + [RESET], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for t in trays]
    for t, p in zip(trays, procs):
        _o, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"reset of {t} failed: {err.decode()[-500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", type=Path, help="playbooks/ folder of the tree to compare with")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("provision_apt_bench: run as root (the lab needs namespaces)", file=sys.stderr)
        return 2
    from tests.lab_fixture import own_lab

    trees = {"new": None} if args.baseline is None else {"baseline": args.baseline.resolve(), "new": None}
    runs: list[dict] = []
    with own_lab(Path(tempfile.mkdtemp(prefix="mctl-aptbench-")), trays=args.trays, label="aptbench",
                 os_only=True) as lab:
        env = dict(lab._env)
        first = True
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for tree in order:
                if not first:
                    reset(lab, lab.trays)
                first = False
                res = provision(env, trees[tree])
                res.update(tree=tree, round=r, kind="first")
                runs.append(res)
                print(json.dumps(res), file=sys.stderr)
                re_run = provision(env, trees[tree])
                re_run.update(tree=tree, round=r, kind="re-run")
                runs.append(re_run)
                print(json.dumps(re_run), file=sys.stderr)
    report = {"trays": args.trays, "cores": os.cpu_count(), "runs": runs,
              "targets": {"first_s": FIRST_TARGET_S, "rerun_s": RERUN_TARGET_S}}
    for tree in trees:
        firsts = [x["wall_s"] for x in runs if x["tree"] == tree and x["kind"] == "first" and x["rc"] == 0]
        reruns = [x for x in runs if x["tree"] == tree and x["kind"] == "re-run" and x["rc"] == 0]
        report[tree] = {"first_s": firsts, "rerun_s": [x["wall_s"] for x in reruns],
                        "rerun_changed": [x["changed_total"] for x in reruns]}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for x in runs:
            print(f"round {x['round']} {x['tree']:<9} {x['kind']:<7} rc {x['rc']} {x['wall_s']:>7} s "
                  f"changed {x['changed_total']:>3} load {x['load'][0]}->{x['load'][1]}")
    new = report["new"]
    ok = (bool(new["first_s"]) and max(new["first_s"]) <= FIRST_TARGET_S and bool(new["rerun_s"])
          and max(new["rerun_s"]) <= RERUN_TARGET_S and not any(new["rerun_changed"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
