"""IMEX: the daemon on the tray is READY and its domain UP.

With `imex: auto` (the default) only trays that have an IMEX configuration are
judged; `required` makes a missing configuration critical, `ignore` skips the
check (Kubernetes sites, where the DRA driver runs IMEX inside pods). A domain
that is not UP is a warning on every member: the tray whose own daemon is not
READY is the one that gets the critical finding.
"""

from __future__ import annotations

from mctl.checks._base import fail, ok
from mctl.model.findings import Finding

DAEMON = "imex.daemon"
DOMAIN = "imex.domain"


def check(facts, expect, settings) -> list[Finding]:
    mode = settings.imex
    obs = facts.imex
    if mode == "ignore" or obs is None:
        return []
    host = facts.host
    if not obs.configured:
        if mode == "required":
            return [fail(host, DAEMON, "no IMEX configuration (/etc/nvidia-imex/config.cfg)",
                         "provision IMEX: mctl provision TRAY --tags imex; mctl imex apply RACK",
                         short="imex not configured")]
        return [ok(host, DAEMON, "IMEX not configured on this tray (not checked)")]
    out: list[Finding] = []
    if obs.daemon_state != "READY":
        said = obs.daemon_state or obs.error or "no answer"
        out.append(fail(host, DAEMON, f"IMEX daemon is not READY: {said}",
                        "systemctl restart nvidia-imex on the tray; see /var/log/nvidia-imex.log; "
                        "mctl imex status RACK", short="imex not ready"))
    else:
        out.append(ok(host, DAEMON, "IMEX daemon READY"))
    if obs.domain_state is not None and obs.domain_state != "UP":
        problems = "; ".join(obs.link_problems[:4]) or "no detail"
        more = f" (+{len(obs.link_problems) - 4} more)" if len(obs.link_problems) > 4 else ""
        out.append(fail(host, DOMAIN, f"IMEX domain {obs.domain_state}: {problems}{more}",
                        "mctl imex status RACK names the trays at fault", short=f"imex {obs.domain_state.lower()}"))
    elif obs.domain_state == "UP":
        out.append(ok(host, DOMAIN, "IMEX domain UP"))
    return out
