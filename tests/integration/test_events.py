"""Events out on the lab (docs/events.md): `mctl health check --remediate` with a file sink and a webhook
sink; a GPU fault drains a tray, and the finding change and the drain arrive in both as schema-valid
lines, then the resume by hand. The webhook is a real HTTP server in this test; the faults are cleared
and the tray resumed in a finally."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from mctl.health.events import schema_problems
from tests.helpers import HEALTH, Watch, fault, sinfo, wait_for, write_health_site


@pytest.fixture
def hook(sockets):
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/events", got
    finally:
        server.shutdown()
        server.server_close()


def _site(lab, tmp_path, url):
    (tmp_path / "site").mkdir()
    (tmp_path / "hook.headers").write_text("Authorization: Bearer lab-token\n")
    return write_health_site(lab, tmp_path / "site", {**HEALTH, "events": [
        {"type": "file", "path": str(tmp_path / "events.jsonl")},
        {"type": "webhook", "url": url, "timeout": "5s", "retries": 2, "headers_file": str(tmp_path / "hook.headers"),
         "kinds": ["finding", "action"]}]})


def _restore(lab, tray):
    fault(lab, tray, clear=True)
    if "drain" in sinfo(lab)[tray][0]:
        lab.run(lab.head, f"scontrol update NodeName={tray} State=RESUME", check=False)
    wait_for(f"{tray} idle again", lambda: sinfo(lab)[tray][0].rstrip("*") in ("idle", "allocated", "mixed"), 60)


def test_a_gpu_fault_reaches_the_file_and_the_webhook_as_a_finding_change_and_a_drain(slurm_lab, tmp_path, hook):
    lab = slurm_lab.lab
    url, got = hook
    out = tmp_path / "events.jsonl"
    site = _site(lab, tmp_path, url)
    state = tmp_path / "state"

    def mctl(*args):
        return lab.mctl("-i", str(site), "--state-dir", str(state), *args, timeout=180)

    tray = lab.trays[1]
    try:
        fault(lab, tray, nvlink_down="2:7")
        proc = mctl("health", "check", "--remediate", tray)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        wait_for(f"{tray} drained", lambda: "drain" in sinfo(lab)[tray][0], 30)
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert lines and all(schema_problems(e) == [] for e in lines), lines
        assert all(schema_problems(e) == [] for e in got)
        for seen in (lines, got):                 # the check flushed the webhook before it returned
            finding = [e for e in seen if e["kind"] == "finding" and e["tray"] == tray]
            drain = [e for e in seen if e["kind"] == "action" and e["action"] == "drain"]
            assert len(finding) == 1 and finding[0]["status"] == "critical" and finding[0]["status_before"] is None
            assert any(f["check"].startswith("nvlink") for f in finding[0]["added"]), finding
            assert [(e["tray"], e["result"], e["ok"]) for e in drain] == [(tray, "ok", True)]
            assert drain[0]["reason"].startswith("mctl:") and drain[0]["site"] == yaml.safe_load(
                (site / "mctl.yml").read_text())["site"]
        assert {e["id"] for e in lines} == {e["id"] for e in got}
        # the same sweep again: nothing changed, no new finding event
        assert mctl("health", "check", "--remediate", tray).returncode == 1
        assert not [e for e in map(json.loads, out.read_text().splitlines()[len(lines):]) if e["kind"] == "finding"]
        fault(lab, tray, clear=True)
        proc = mctl("health", "resume", tray)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        resumed = [e for e in got if e["kind"] == "action" and e["action"] == "resume"]
        assert [(e["tray"], e["ok"], e["details"].get("manual")) for e in resumed] == [(tray, True, True)]
    finally:
        _restore(lab, tray)


def test_the_watch_tells_each_change_once_and_flushes_when_it_stops(slurm_lab, tmp_path, hook):
    lab = slurm_lab.lab
    url, got = hook
    out = tmp_path / "events.jsonl"
    site = _site(lab, tmp_path, url)
    tray = lab.trays[2]
    watch = Watch(lab, site, tmp_path / "state", "--interval", "1")
    try:
        wait_for("the first sweep", lambda: watch.sweeps() >= 1, 60)
        fault(lab, tray, nvlink_down="1:4")
        wait_for("the drain event in the file", lambda: out.exists() and any(
            json.loads(x).get("action") == "drain" for x in out.read_text().splitlines()), 60)
        fault(lab, tray, clear=True)
        wait_for("the watch's own resume in the webhook", lambda: any(
            e.get("action") == "resume" and e["tray"] == tray for e in got), 90)
        wait_for("the fabric mark cleared, if one was made", lambda: [e.get("action") for e in got if e["tray"] == tray
                                                                     ].count("fabric-mark") <= [
            e.get("action") for e in got if e["tray"] == tray].count("fabric-clear"), 90)
        swept = watch.sweeps()
    finally:
        code = watch.stop()
        _restore(lab, tray)
    assert code == 0, watch.proc.stderr.read()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(schema_problems(e) == [] for e in lines + got)
    assert {e["id"] for e in lines} == {e["id"] for e in got}          # the watch flushed both before it ended
    mine = [e for e in lines if e["tray"] == tray]
    changes = [(e["status_before"], e["status"]) for e in mine if e["kind"] == "finding"]
    # once each, over many sweeps: a chain of changes from ok through critical back to ok, no change told twice (the
    # switch side's warning of the degraded partition may come a sweep before the tray's own critical finding)
    assert changes and changes[0][0] == "ok" and changes[-1][1] == "ok" and ("critical" in {b for _, b in changes})
    assert all(a != b for a, b in changes) and all(changes[i][1] == changes[i + 1][0] for i in range(len(changes) - 1))
    assert len(changes) <= 4, (changes, swept)
    acted = [e["action"] for e in mine if e["kind"] == "action"]
    # the link down degrades the tray's partition in NMX-M too: the switch side marks the partition's trays and
    # clears the mark when it is healthy again (issue 30.5); the tray's own actions are its drain and resume
    assert [a for a in acted if a not in ("fabric-mark", "fabric-clear")] == ["drain", "resume"], acted
    # every mark made is cleared (a mark an earlier test left on the shared lab is cleared too: one more clear)
    assert acted.count("fabric-mark") <= acted.count("fabric-clear"), acted
    assert all(e["ok"] and "health watch" in e["who"] for e in mine if e["kind"] == "action")
