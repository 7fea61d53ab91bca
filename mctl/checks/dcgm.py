"""DCGM health: what DCGM's health watches say of the tray (`dcgmi health -c -j`), where DCGM runs.

DCGM's overall Failure is critical, Warning warns, each with its incidents (entity, system, message;
dcgmi prints no error code in this report). `health.dcgm`: `auto` (the default) judges trays that have
dcgmi and says nothing of the others; `required` warns on a tray without it; `off` asks nothing (the probe
runs no dcgmi). DCGM installed but giving no readable report (the host engine not answering, a hang
killed at the section's deadline, garbage, truncated JSON, a result that is none of DCGM's words) warns
on its own: never healthy, never critical by accident.
"""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity
from mctl.model.tray import DCGM_FAILURE, DCGM_HEALTHY, DCGM_WARNING

HEALTH = "dcgm.health"
SHOWN = 4                   # incidents named in the message (all of them are in the details)


def check(facts, expect, settings) -> list[Finding]:
    mode = getattr(settings, "dcgm", "auto")
    obs = facts.dcgm
    if mode == "off" or obs is None:
        return []
    host = facts.host
    if not obs.installed:
        if mode == "required":
            return [finding(Severity.WARN, host, HEALTH, "DCGM is not installed (no dcgmi; health.dcgm: required)",
                            "install DCGM (datacenter-gpu-manager-4) and start nvidia-dcgm on the tray",
                            short="dcgm not installed")]
        return []
    if obs.error:
        return [finding(Severity.WARN, host, HEALTH, f"DCGM health not reported: {obs.error}",
                        "systemctl status nvidia-dcgm on the tray (nv-hostengine); dcgmi health -c by hand",
                        short="dcgm not reporting")]
    if obs.overall == DCGM_HEALTHY:
        note = " (watches just set by this probe)" if obs.watches_set else ""
        return [ok(host, HEALTH, f"DCGM health watches: Healthy{note}")]
    shown = "; ".join(f"{i.label} {i.system or 'entity'} {i.health}" + (f": {i.message}" if i.message else "")
                      for i in obs.incidents[:SHOWN])
    more = f" (+{len(obs.incidents) - SHOWN} more)" if len(obs.incidents) > SHOWN else ""
    incidents = [i.to_dict() for i in obs.incidents]
    first = next((i for i in obs.incidents if i.health == obs.overall), obs.incidents[0] if obs.incidents else None)
    what = f" {first.label} {first.system.removesuffix(' system').lower()}".rstrip() if first else ""
    message = f"DCGM health {obs.overall}" + (f": {shown}{more}" if shown else "")
    action = "dcgmi health -c on the tray; dcgmi diag -r 2 to confirm; see DCGM's recommended action"
    if obs.overall == DCGM_FAILURE:
        return [fail(host, HEALTH, message, action, short=f"dcgm{what} failure", incidents=incidents)]
    if obs.overall == DCGM_WARNING:
        return [finding(Severity.WARN, host, HEALTH, message, action, short=f"dcgm{what} warning",
                        incidents=incidents)]
    return [finding(Severity.WARN, host, HEALTH, f"DCGM health not reported: overall {obs.overall!r}",
                    "dcgmi health -c by hand", short="dcgm not reporting")]
