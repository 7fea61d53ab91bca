"""health: the health gate (`mctl health check`'s service); every finding refuses unless accepted (--accept)."""

from __future__ import annotations

import fnmatch

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, finding_line
from mctl.errors import EXIT_FINDINGS
from mctl.model.site import fold


def accepted(finding, patterns) -> bool:
    """CHECK, HOST:CHECK, or shell patterns of either (imex.*, lab-r1-tray03:*)."""
    for pat in patterns:
        host, sep, check = pat.rpartition(":")
        if sep:
            if fnmatch.fnmatchcase(finding.host or "", host) and fnmatch.fnmatchcase(finding.check, check):
                return True
        elif fnmatch.fnmatchcase(finding.check, pat):
            return True
    return False


def plan(ctx: Context) -> list[str]:
    accept = ", ".join(ctx.options.accept) or "none"
    return [f"run the health checks on {len(ctx.trays)} trays; the gate passes when every check passes "
            f"(accepted exceptions: {accept})"]


NOTED_ONLY = frozenset({"tray.boot"})     # findings the gate reports but does not refuse on


def run(ctx: Context) -> Outcome:
    from mctl.health.service import run_check
    from mctl.model.findings import Severity

    sweep = run_check(ctx.site, ctx.rack.name, ctx.state_dir)
    bad = [f for f in sweep.findings if f.severity is not Severity.OK]
    passed = len(sweep.findings) - len(bad)
    # A reboot seen since an earlier sweep (provisioning's own, an operator's, a power cycle) is not a
    # reason to refuse: the tray it left behind is judged by every other check of the same sweep. Noted.
    noted = [f for f in bad if f.check in NOTED_ONLY]
    ok_list = [f for f in bad if f not in noted and accepted(f, ctx.options.accept)]
    refused = [f for f in bad if f not in ok_list and f not in noted]
    artifacts = {"checks_passed": passed, "findings": [f.to_dict() for f in bad if f not in noted],
                 "accepted": [f"{f.host}:{f.check}" for f in ok_list], "noted": [f.to_dict() for f in noted]}
    if refused:
        raise PhaseFailed(f"health gate: {len(refused)} finding{'s' if len(refused) > 1 else ''} on "
                          f"{fold(sorted({f.host for f in refused if f.host}))}",
                          hint="fix them and --resume, or accept named exceptions with --accept CHECK "
                               "(or HOST:CHECK) --resume", exit_code=EXIT_FINDINGS,
                          details=[finding_line(f) for f in refused]
                          + [f"accepted: {finding_line(f)}" for f in ok_list]
                          + [f"noted: {finding_line(f)}" for f in noted],
                          artifacts=artifacts)
    text = f"{passed} checks passed on {len(ctx.trays)} trays"
    if ok_list:
        text += f"; {len(ok_list)} accepted exception{'s' if len(ok_list) > 1 else ''}"
    return Outcome("done", text, details=[f"accepted: {finding_line(f)}" for f in ok_list]
                   + [f"noted: {finding_line(f)}" for f in noted], artifacts=artifacts)


PHASE = Phase("health", plan, run)
