"""NVLink error counters judged as rates over a window (`nvidia-smi nvlink -e`, read every sweep).

A link can be up at full speed and still be degrading: its error counters grow. The counters are
cumulative since the driver loaded, so a single reading says nothing; the health engine keeps the
earlier sweeps' readings (mctl.health.signals) and puts on the facts how much each counter of each
link grew over the window (`health.nvlink_error_window`, default 10 min). The thresholds are DCGM's
health watch (NVIDIA/DCGM, DcgmHealthWatch.cpp, dcgm_gpu_hardware_limits: DCGM_LIMIT_MAX_NVLINK_ERROR 1,
DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100/s):

- replay and recovery errors (Hopper and earlier), failed link recoveries (NVLink5): any growth fails;
- CRC errors, and on NVLink5 the packet and symbol errors, tx discards: growth warns, and a rate of
  `health.nvlink_error_rate_critical` (100) a second or more fails;
- successful link recoveries (NVLink5): growth warns (DCGM's health watch warns on them on Blackwell).

A counter that went backwards (driver reload, reset, reboot, wrap) restarts its baseline: never a
negative or a huge rate. A counter the driver does not print is not judged; a tray whose driver
prints none is said so ("not reported"), never passed as healthy.
"""

from __future__ import annotations

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity

CHECK = "nvlink.errors"

# counter name -> kind: "any" (any growth fails), "rate" (growth warns, the critical rate fails), "warn"
KINDS = {
    "Replay Errors": "any", "Recovery Errors": "any", "Link recovery failed events": "any",
    "CRC Errors": "rate", "Malformed packet Errors": "rate", "Buffer overrun Errors": "rate", "Rx Errors": "rate",
    "Rx remote Errors": "rate", "Rx General Errors": "rate", "Local link integrity Errors": "rate",
    "Tx discards": "rate", "Effective Errors": "rate", "Symbol Errors": "rate",
    "Link recovery successful events": "warn",
    # "Total link recovery events" is the sum of the two recovery counters: not judged twice
}


def judged(name: str) -> bool:
    return name in KINDS


# host -> (the counters object last judged, the judged counter names it holds): a tray whose `nvlink -e` printed the
# same as last sweep has the same object (mctl.facts.probe.LastParse), so its ~1,800 counters are not walked again
_NAMES: dict[str, tuple[object, frozenset[str]]] = {}


def judged_names(host: str, counters) -> frozenset[str]:
    """The judged counter names present in *counters* (remembered per host for the same object)."""
    last = _NAMES.get(host)
    if last is not None and last[0] is counters:
        return last[1]
    names = frozenset(n for g in counters for values in g.links.values() for n in values if n in KINDS)
    _NAMES[host] = (counters, names)
    return names


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None:
        return []
    host = facts.host
    if facts.nvlink_counters is None:
        if facts.nvlink_counters_error:
            return [finding(Severity.WARN, host, CHECK, f"NVLink error counters not read: {facts.nvlink_counters_error}",
                            "run 'nvidia-smi nvlink -e' on the tray", short="nvlink counters unreadable")]
        return []
    names = judged_names(host, facts.nvlink_counters)
    if not names:
        return [finding(Severity.WARN, host, CHECK, "NVLink error counters not reported: 'nvidia-smi nvlink -e' "
                        "printed no counter mctl judges (rates not judged)",
                        "check the driver branch; the counters mctl reads are listed in docs/health.md",
                        short="nvlink counters not reported", reported=False)]
    window = facts.nvlink_window
    if window is None or window.baseline:
        return [ok(host, CHECK, f"NVLink error counters read ({len(names)} kinds); rates from the next sweep "
                                "(no earlier reading in the window)", baseline=True)]
    crit_rate = settings.nvlink_error_rate_critical
    bad, warn = [], []
    for r in window.rates:
        kind = KINDS.get(r.counter)
        if kind is None or r.delta <= 0:
            continue
        text = f"gpu{r.gpu} link{r.link} {r.counter} +{r.delta} in {r.seconds:.0f}s ({r.per_s:.3g}/s)"
        if kind == "any" or (kind == "rate" and r.per_s >= crit_rate):
            bad.append((r, text))
        else:
            warn.append((r, text))
    out: list[Finding] = []
    if bad:
        r = bad[0][0]
        out.append(fail(host, CHECK, "NVLink errors growing: " + ", ".join(t for _, t in bad),
                        "drain; reset the GPU, and if the counters keep growing after it, service the link "
                        "(NVIDIA: replay/recovery errors or a CRC rate of 100/s mean a failing link)",
                        short=f"nvlink gpu{r.gpu} link{r.link} errors", links=[f"gpu{x.gpu}:{x.link}" for x, _ in bad]))
    if warn:
        out.append(finding(Severity.WARN, host, CHECK, "NVLink errors counted: " + ", ".join(t for _, t in warn)
                           + f" (critical at {crit_rate:g}/s)", "watch the link; a growing rate fails it",
                           links=[f"gpu{x.gpu}:{x.link}" for x, _ in warn]))
    if not out:
        reset = f"; {len(window.resets)} counters restarted (reset or driver reload)" if window.resets else ""
        out.append(ok(host, CHECK, f"no NVLink error counted in {window.seconds:.0f}s{reset}"))
    return out
