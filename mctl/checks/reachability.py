"""Did the tray answer at all? An unreachable tray is not an unhealthy one: the policy
counts misses and drains only after several in a row."""

from __future__ import annotations

from mctl.checks._base import fail, ok
from mctl.model.findings import Finding

CHECK = "tray.reachable"


def check(facts, expect, settings) -> list[Finding]:
    if facts.reached:
        return [ok(facts.host, CHECK, "answered over SSH" if facts.address else "ran on the tray")]
    what = {"timeout": "hung: the session opened but the probe never finished",
            "host-key-mismatch": "refused: its SSH host key does not match known_hosts"}.get(facts.reach, "unreachable")
    action = ("verify the key out of band, then 'mctl ssh trust HOST --replace'" if facts.reach == "host-key-mismatch"
              else "check power, network and sshd on the tray (BMC console)")
    return [fail(facts.host, CHECK, f"{what}: {facts.error}" if facts.error else what, action,
                 short="unreachable", reach=facts.reach)]
