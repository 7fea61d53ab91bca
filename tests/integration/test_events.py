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
from tests.helpers import HEALTH, fault, sinfo, wait_for, write_health_site


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


def test_a_gpu_fault_reaches_the_file_and_the_webhook_as_a_finding_change_and_a_drain(slurm_lab, tmp_path, hook):
    lab = slurm_lab.lab
    url, got = hook
    out = tmp_path / "events.jsonl"
    (tmp_path / "site").mkdir()
    (tmp_path / "hook.headers").write_text("Authorization: Bearer lab-token\n")
    site = write_health_site(lab, tmp_path / "site", {**HEALTH, "events": [
        {"type": "file", "path": str(out)},
        {"type": "webhook", "url": url, "timeout": "5s", "retries": 2, "headers_file": str(tmp_path / "hook.headers"),
         "kinds": ["finding", "action"]}]})
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
        fault(lab, tray, clear=True)
        if "drain" in sinfo(lab)[tray][0]:
            lab.run(lab.head, f"scontrol update NodeName={tray} State=RESUME", check=False)
        wait_for(f"{tray} idle again", lambda: sinfo(lab)[tray][0].rstrip("*") in ("idle", "allocated", "mixed"), 60)
