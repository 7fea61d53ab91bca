#!/usr/bin/env python3
"""How soon the watch's BMC reader sees a leak through the BMC's event (issue 29.3), with a long leak poll.

On a running lab (full or fleet; its BMCs offer EventService): a BmcWatch as `mctl health watch` makes it with
health.bmc_events on (receiver on 127.0.0.1) and the subscribed BMCs' leak poll at --poll seconds, for the first
--trays compute trays; once every BMC is subscribed, each round sets a critical leak on one tray
(`mctl lab fault bmc`, through mctl.lab.bmc_faults) and times the fault to the reader's view saying Critical, then
clears it and waits for the view to say so. Also: the leak reads begun between rounds (none are due: the poll is
--poll seconds apart) and the receiver's counts.

    sudo .venv/bin/python bench/bmc_events_bench.py --lab /tmp/cpu-lab1 --trays 18 --rounds 5 --poll 600
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", type=Path, required=True)
    ap.add_argument("--trays", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--poll", type=float, default=600.0, help="a subscribed BMC's leak poll (seconds)")
    args = ap.parse_args()
    import yaml

    from mctl.health import oob
    from mctl.inventory import load_site
    from mctl.lab import bmc_faults
    from mctl.model.settings import BmcEventSettings

    work = Path(tempfile.mkdtemp(prefix="mctl-events-bench-"))
    doc = yaml.safe_load((args.lab / "mctl.yml").read_text())
    (work / "mctl.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    site = load_site(str(work))
    settings, problem = oob.settings_of(site)
    if settings is None:
        sys.stderr.write(f"the lab's inventory has no usable bmc section: {problem}\n")
        return 2
    hosts = [h for r in site.racks.values() for h in r.compute][:args.trays]
    load = [os.getloadavg()[0]]
    w = oob.BmcWatch(hosts, settings, interval=1.0, power_interval=args.poll, stale_after=3.0, deadline=10.0,
                     events=BmcEventSettings(listen="127.0.0.1"), subscribed_interval=args.poll).start()
    out: dict = {"trays": len(hosts), "poll_s": args.poll}
    try:
        until = time.monotonic() + 120
        while time.monotonic() < until and not all(s.sub for s in w.reader.slots.values()):
            time.sleep(0.2)
        out["subscribed"] = sum(1 for s in w.reader.slots.values() if s.sub)
        seen, cleared, quiet = [], [], []
        for i in range(args.rounds):
            tray = hosts[i % len(hosts)].name
            before = sum(s.seq for s in w.reader.slots.values())
            time.sleep(2.0)
            quiet.append(sum(s.seq for s in w.reader.slots.values()) - before)     # reads in 2 s without an event
            t0 = time.monotonic()
            bmc_faults.apply(args.lab, tray, leak="critical")

            def state() -> set:
                v = w.views()[tray]
                return {d.state for d in (v.detectors or ())}

            while "Critical" not in state() and time.monotonic() - t0 < 30:
                time.sleep(0.02)
            seen.append(round(time.monotonic() - t0, 3) if "Critical" in state() else None)
            t1 = time.monotonic()
            bmc_faults.apply(args.lab, tray, clear=True)
            while "Critical" in state() and time.monotonic() - t1 < 30:
                time.sleep(0.02)
            cleared.append(round(time.monotonic() - t1, 3) if "Critical" not in state() else None)
        got = [s for s in seen if s is not None]
        out.update(seen_s=seen, cleared_s=cleared, reads_in_2s_without_event=quiet,
                   median_seen_s=statistics.median(got) if got else None, events_taken=w.events_seen,
                   receiver=w.receiver.counts() if w.receiver else None)
    finally:
        w.close()
        load.append(os.getloadavg()[0])
        out["loadavg_1m"] = {"start": load[0], "end": load[-1]}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
