"""Clock-event (throttle) reasons: a tray healthy by every other check can run at a fraction of its speed.

nvidia-smi -q -x says per GPU why its clocks are held down (<clocks_event_reasons> since R535,
<clocks_throttle_reasons> before; mctl.facts.nvidia_smi reads both). NVIDIA's NVML documentation
(nvmlClocksEventReasons): HW slowdown is the hardware's own protection (temperature, power brake
assertion by the system, the power supply), HW power brake is the external power-brake signal (on
GB200: the rack's power shelf), thermal slowdown and SW power cap are the driver keeping the GPU
within its limits. So: HW slowdown and HW power brake active for `health.clock_event_sweeps`
sweeps in a row (3) are critical (one sweep warns: a transient brake is normal); thermal slowdown
(HW or SW) and the SW power cap warn; idle, application clocks, sync boost and display clocks are
normal operation and not reported. A driver that prints no reasons is "not reported" (not judged).
"""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

CHECK = "gpu.clocks"

CRITICAL_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
WARN_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap")
WORDS = {"hw_slowdown": "HW slowdown", "hw_power_brake_slowdown": "HW power brake",
         "hw_thermal_slowdown": "HW thermal slowdown", "sw_thermal_slowdown": "SW thermal slowdown",
         "sw_power_cap": "SW power cap"}


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    host = facts.host
    gpus = facts.gpus.gpus
    if not any(g.clock_events.known for g in gpus):
        return [finding(Severity.WARN, host, CHECK, "clock-event reasons not reported by nvidia-smi -q -x "
                        "(neither clocks_event_reasons nor clocks_throttle_reasons): not judged",
                        "check the driver branch (nvidia-smi -q -d PERFORMANCE)", short="clock reasons not reported",
                        reported=False)]
    streaks = {(g, r): n for g, r, n in facts.clock_streaks or ()}
    need = settings.clock_event_sweeps
    crit, warn = [], []
    for g in gpus:
        for reason in g.clock_events.active:
            if reason in CRITICAL_REASONS:
                n = streaks.get((g.index, reason), 1)
                text = f"gpu{g.index} {WORDS[reason]} ({n} sweep{'s' if n != 1 else ''})"
                (crit if n >= need else warn).append((g.index, reason, text))
            elif reason in WARN_REASONS:
                warn.append((g.index, reason, f"gpu{g.index} {WORDS[reason]}"))
    out: list[Finding] = []
    if crit:
        i, reason, _ = crit[0]
        out.append(fail(host, CHECK, "GPU clocks held down by hardware: " + ", ".join(t for *_, t in crit)
                        + f" (critical after {need} sweeps)",
                        "check the power shelf and the tray's power and cooling in the BMC; the GPUs run slow",
                        short=f"gpu{i} {WORDS[reason].lower()}", reasons=[f"gpu{g}:{r}" for g, r, _ in crit]))
    if warn:
        out.append(finding(Severity.WARN, host, CHECK, "GPU clocks held down: " + ", ".join(t for *_, t in warn),
                           "check cooling and power limits (nvidia-smi -q -d PERFORMANCE)",
                           reasons=[f"gpu{g}:{r}" for g, r, _ in warn]))
    if not out:
        out.append(ok(host, CHECK, "no clock-event reason holds the GPU clocks down"))
    return out
