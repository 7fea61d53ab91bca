"""GPU temperature against the site's limit, and power draw against the enforced power limit."""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

TEMPERATURE = "gpu.temperature"
POWER = "gpu.power"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    host = facts.host
    out: list[Finding] = []
    temps = [(g.index, g.temperature_c) for g in facts.gpus.gpus if g.temperature_c is not None]
    hot = [(i, t) for i, t in temps if t >= settings.max_gpu_temp_c]
    warm = [(i, t) for i, t in temps if settings.temp_warn_c <= t < settings.max_gpu_temp_c]
    if hot:
        out.append(fail(host, TEMPERATURE,
                        ", ".join(f"gpu{i} {t:g} C" for i, t in hot) + f" (limit {settings.max_gpu_temp_c:g} C)",
                        "check the tray's liquid cooling (flow, inlet temperature) and fans in the BMC",
                        short=f"gpu{hot[0][0]} temp {hot[0][1]:g}C"))
    if warm:
        out.append(finding(Severity.WARN, host, TEMPERATURE,
                           ", ".join(f"gpu{i} {t:g} C" for i, t in warm) + f" (warning at {settings.temp_warn_c:g} C)",
                           "watch the cooling"))
    if not hot and not warm:
        top = max((t for _, t in temps), default=None)
        out.append(ok(host, TEMPERATURE, f"hottest GPU {top:g} C" if top is not None else "no temperature reported"))
    over = []
    for g in facts.gpus.gpus:
        if g.power_draw_w is not None and g.power_limit_w:
            if g.power_draw_w > g.power_limit_w * (1 + settings.max_power_overshoot_pct / 100.0):
                over.append((g.index, g.power_draw_w, g.power_limit_w))
    if over:
        out.append(fail(host, POWER, ", ".join(
            f"gpu{i} draws {d:.0f} W over its {lim:.0f} W limit" for i, d, lim in over),
            "check the power-brake and power-capping settings (nvidia-smi -q -d POWER)"))
    else:
        reported = sum(1 for g in facts.gpus.gpus if g.power_draw_w is not None and g.power_limit_w)
        if facts.gpus.gpus and not reported:
            out.append(fail(host, POWER, "no GPU reports its power draw and limit: the power "
                            "check could not run", "check nvidia-smi -q -d POWER on the tray"))
        else:
            out.append(ok(host, POWER, f"power draw within limits ({reported} of {len(facts.gpus.gpus)} GPUs "
                                       "report it)"))
    return out
