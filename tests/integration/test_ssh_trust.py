"""Host-key trust on the lab: a tray whose key changes is refused everywhere until replaced on purpose."""

from __future__ import annotations

import json


def test_lab_keys_are_already_trusted(lab):
    proc = lab.mctl("ssh", "trust", "@all", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {h["action"] for h in data["hosts"]} == {"unchanged"}
    assert all(h["fingerprint"].startswith("SHA256:") for h in data["hosts"])


def test_changed_host_key_is_refused_until_replaced(lab):
    tray = lab.trays[0]
    known_hosts = lab.dir / "known_hosts"
    before = known_hosts.read_text()
    # "Reinstall" the tray's SSH identity: new host key, sshd re-reads it on SIGHUP.
    lab.run(tray, "rm -f /etc/ssh/ssh_host_ed25519_key* && ssh-keygen -q -t ed25519 -N '' "
                  "-f /etc/ssh/ssh_host_ed25519_key && kill -HUP $(cat /run/sshd.pid)")
    try:
        new_fp = None
        for _ in range(20):  # sshd re-execs on SIGHUP; wait until it answers with the new key
            probe = lab.mctl("ssh", "trust", tray, "--dry-run", "--json")
            host = json.loads(probe.stdout)["hosts"][0]
            if host["action"] == "refused-changed":
                new_fp = host["fingerprint"]
                break
        assert new_fp, "the tray never presented its new key"

        # every command refuses it, naming the fingerprint it was shown
        inv = lab.mctl("rack", "inventory", lab.rack, "--json", "--no-save")
        assert inv.returncode == 3
        tray_facts = next(t for t in json.loads(inv.stdout)["racks"][0]["trays"] if t["host"] == tray)
        assert tray_facts["reach"] == "host-key-mismatch"
        assert new_fp in tray_facts["error"] and "HOST KEY CHANGED" in tray_facts["error"]
        ex = lab.mctl("exec", tray, "--", "true")
        assert ex.returncode == 3 and new_fp in ex.stdout

        # trust without --replace refuses and changes nothing
        refused = lab.mctl("ssh", "trust", tray)
        assert refused.returncode == 3
        assert f"WARNING: {tray}: host key changed" in refused.stdout and new_fp in refused.stdout
        assert known_hosts.read_text() == before

        replaced = lab.mctl("ssh", "trust", tray, "--replace", "--json")
        assert replaced.returncode == 0, replaced.stderr
        (done,) = json.loads(replaced.stdout)["hosts"]
        assert done["action"] == "replaced", done
        # what was recorded is what the tray presents now, by the JSON's fingerprint (the text table wraps a
        # fingerprint across lines at the width of a terminal-less run: it is no place to look for one)
        after = json.loads(lab.mctl("ssh", "trust", tray, "--dry-run", "--json").stdout)["hosts"][0]
        assert after["action"] == "unchanged" and after["fingerprint"] == done["fingerprint"], (after, done, new_fp)
        assert lab.mctl("exec", tray, "--", "true").returncode == 0
        # OpenSSH reads the same file: the lab's own ssh works with the new key
        assert lab.run(tray, "hostname").stdout.strip() == tray
    finally:
        lab.mctl("ssh", "trust", tray, "--replace")
