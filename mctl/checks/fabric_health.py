"""Fabric health flags (bandwidth, route recovery, route unhealthy, access timeout,
incorrect configuration, health summary). Each flag's severity is a setting:
real GB200 trays on driver 570 report route_unhealthy True while Completed/Success."""

from __future__ import annotations

from mctl.checks._base import finding, gpu_list, ok
from mctl.model.findings import Finding, Severity, worst

CHECK = "fabric.health"


def _flags(health) -> list[tuple[str, str]]:
    out = []
    if health.degraded_bandwidth:
        out.append(("degraded_bandwidth", "bandwidth degraded"))
    if health.route_recovery_in_progress:
        out.append(("route_recovery_in_progress", "route recovery in progress"))
    if health.route_unhealthy:
        out.append(("route_unhealthy", "route unhealthy"))
    if health.access_timeout_recovery:
        out.append(("access_timeout_recovery", "access timeout recovery"))
    bad_config = health.incorrect_configuration
    if bad_config and bad_config.lower() not in ("none", "n/a"):
        out.append(("incorrect_configuration", f"incorrect configuration: {bad_config}"))
    summary = (health.summary or "").lower()
    if summary == "unhealthy":
        out.append(("summary_unhealthy", "health summary Unhealthy"))
    elif summary == "limited capacity":
        out.append(("summary_limited_capacity", "health summary Limited Capacity"))
    return out


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    per_flag: dict[tuple[str, str], list[int]] = {}
    for g in facts.gpus.gpus:
        for flag in _flags(g.fabric.health):
            per_flag.setdefault(flag, []).append(g.index)
    if not per_flag:
        return [ok(facts.host, CHECK, "no fabric health flags set")]
    out = []
    for (flag, words), gpus in sorted(per_flag.items()):
        severity = settings.flag_severity(flag)
        out.append(finding(severity, facts.host, CHECK, f"{words} on {gpu_list(gpus)}",
                           None if severity is Severity.OK else
                           "watch whether it persists; route and bandwidth problems need NVLink service "
                           "(check NMX-M and the switch trays)",
                           short=f"fabric {words.split(':')[0]}", flag=flag, gpus=gpus))
    if worst(out) is Severity.OK:
        return [ok(facts.host, CHECK, "; ".join(f.message for f in out) + " (not counted, by policy)")]
    return out
