"""Evidence before repair on the lab (`mctl health evidence`, mctl/health/evidence.py; the lab's
nvidia-bug-report.sh is mctl/lab/emulators/bug_report.py).

1. A tray with an XID: its bundle holds the bug report (gzip, with the XID line and nvidia-smi -q), the
   kernel log's tail with the XID, tray.txt, findings.json, bundle.json; the index and the action log
   name it.
2. In the same run, a tray whose nvidia-bug-report.sh hangs is cut at the deadline (killed on the tray,
   nothing left running) and its bundle says so, with the logs all the same; a frozen tray gets a
   bundle saying nothing came from it. The command exits 1 and finishes within its deadline.
"""

from __future__ import annotations

import gzip
import json
import time

from tests.helpers import fault, ssh_ok, wait_for


def test_bundles_for_an_xid_a_hanging_bug_report_and_a_frozen_tray(lab, tmp_path):
    xid, hangs, frozen = lab.trays[:3]
    state = tmp_path / "state"
    try:
        fault(lab, xid, xid=79, gpu=0)
        fault(lab, hangs, tool_fault="nvidia-bug-report.sh:hang")
        fault(lab, frozen, unreachable=True)
        t0 = time.monotonic()
        res = lab.mctl("--state-dir", str(state), "health", "evidence", f"{xid},{hangs},{frozen}",
                       "--reason", "xid 79 on gpu0", "--timeout", "25", "--json", timeout=120)
        took = time.monotonic() - t0
        assert res.returncode == 1, res.stdout + res.stderr
        doc = json.loads(res.stdout)
        by = {b["tray"]: b for b in doc["bundles"]}
        assert took < 25 + 30, took

        ok = by[xid]
        assert not ok["problems"] and ok["reached"], ok
        folder = state / ok["path"]
        assert folder.name.endswith("-xid-79-on-gpu0")
        report = gzip.decompress((folder / "nvidia-bug-report.log.gz").read_bytes()).decode()
        assert "Start of NVIDIA bug report log file" in report and "/usr/bin/nvidia-smi -q" in report
        assert "Xid (PCI:" in report and "Xid (PCI:" in (folder / "kernel.log").read_text()
        assert "boot_id" in (folder / "tray.txt").read_text()
        assert json.loads((folder / "bundle.json").read_text())["path"] == ok["path"]
        assert "recent_actions" in json.loads((folder / "findings.json").read_text())

        cut = by[hangs]
        assert any("did not finish within its deadline (killed)" in p for p in cut["problems"]), cut
        assert "boot_id" in (state / cut["path"] / "tray.txt").read_text()      # the rest came all the same
        assert {f["name"]: f["status"] for f in cut["files"]}["nvidia-bug-report.log.gz"] == "failed"
        wait_for("no bug report left running", lambda: lab.run(
            hangs, "pgrep -f nvidia-bug-report", check=False).returncode == 1, 30)

        assert not by[frozen]["reached"] and by[frozen]["problems"][0].startswith("nothing from the tray")

        index = [json.loads(line) for line in (state / "evidence" / "index.jsonl").read_text().splitlines()]
        assert sorted(e["tray"] for e in index) == sorted([xid, hangs, frozen])
        log = [json.loads(line) for line in (state / "health" / "actions.jsonl").read_text().splitlines()]
        named = {e["tray"]: e for e in log if e["action"] == "evidence"}
        assert named[xid]["evidence"] == ok["path"] and named[xid]["result"] == "ok"
        assert named[hangs]["result"].startswith("noted:")
        print(f"\nevidence for 3 trays (one bug report hung, one tray frozen) in {took:.1f}s; {ok['bytes']} bytes "
              f"for {xid}")
    finally:
        lab.clear_faults(frozen)
        wait_for(f"SSH on {frozen}", lambda: ssh_ok(lab, frozen), 60)
        lab.clear_faults(xid)
        lab.clear_faults(hangs)


def test_dry_run_and_bad_input(lab, tmp_path):
    state = tmp_path / "state"
    res = lab.mctl("--state-dir", str(state), "health", "evidence", lab.trays[0], "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    (plan,) = json.loads(res.stdout)["bundles"]
    assert plan["tray"] == lab.trays[0] and "nvidia-bug-report.log.gz" in plan["files"]
    assert not (state / "evidence").exists()
    for args, said in ((["--max-size", "lots"], "not a size"), (["--reason", "a\tb"], "not a short line"),
                       (["--timeout", "1"], "--timeout 120")):
        res = lab.mctl("--state-dir", str(state), "health", "evidence", lab.trays[0], *args)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr)
