"""`mctl exec` against the lab: fan-out, clush -b style grouping, exit codes."""

from __future__ import annotations

import json


def test_identical_output_is_shown_once_with_folded_node_set(lab):
    proc = lab.mctl("exec", lab.rack, "--", "uname", "-s")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Linux") == 1
    assert f"lab-r1-tray[01-{len(lab.trays):02d}] ({len(lab.trays)})" in proc.stdout


def test_distinct_outputs_make_distinct_groups(lab):
    proc = lab.mctl("exec", "@all", "--", "hostname")
    assert proc.returncode == 0, proc.stderr
    for host in lab.hosts:
        assert f"{host} (1)" in proc.stdout


def test_failure_on_some_hosts_exits_3_and_names_them(lab):
    bad = lab.trays[1]
    proc = lab.mctl("exec", lab.rack, "--", f"test $(hostname) != {bad}")
    assert proc.returncode == 3
    assert f"{bad} (1) exit 1" in proc.stdout
    assert f"1 of {len(lab.trays)} hosts did not succeed (failed: {bad})" in proc.stderr


def test_json(lab):
    proc = lab.mctl("exec", "--json", lab.trays[0], "--", "echo", "hello")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["command"] == "echo hello"
    assert data["hosts"][0] == {**data["hosts"][0], "host": lab.trays[0], "status": "ok", "exit_code": 0,
                                "stdout": "hello\n"}
    assert data["groups"][0]["nodes"] == lab.trays[0] and data["summary"] == {"total": 1, "ok": 1, "not_ok": 0}


def test_timeout_is_reported_per_host(lab):
    proc = lab.mctl("exec", "--timeout", "1", lab.trays[0], "--", "sleep", "5")
    assert proc.returncode == 3
    assert "timeout: command did not finish within 1s" in proc.stdout


def test_bad_input_exits_2(lab):
    assert lab.mctl("exec", "lab-r9-tray01", "--", "true").returncode == 2
    assert lab.mctl("exec", lab.rack).returncode == 2
