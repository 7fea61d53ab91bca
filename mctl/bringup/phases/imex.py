"""imex: the IMEX domains that follow the partitions (`mctl imex apply`'s service), then waited for until UP."""

from __future__ import annotations

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase
from mctl.errors import EXIT_FINDINGS
from mctl.model.site import fold


def _k8s_imex(ctx: Context) -> bool:
    return ctx.site.scheduler is not None and ctx.site.scheduler.type == "k8s"


def plan(ctx: Context) -> list[str]:
    from mctl.fabric.imex import imex_domains
    from mctl.fabric.service import apply_imex

    if _k8s_imex(ctx):
        return ["skipped: on Kubernetes sites the DRA driver runs IMEX in pods ('mctl deploy k8s')"]
    doms = ", ".join(f"{d.name} ({fold(d.trays)})" for d in imex_domains(ctx.rack))
    res = apply_imex(ctx.site, ctx.rack, dry_run=True)
    lines = [f"IMEX domains: {doms}"]
    lines += [f"  write {', '.join(files)} on {t}" for t, files in res.changes.items()] or \
        ["  files on every reachable tray already match"]
    if res.restart:
        lines.append(f"  restart nvidia-imex on {fold(res.restart)}")
    if res.unreachable:
        lines.append(f"  cannot reach {fold(res.unreachable)}")
    return lines


def run(ctx: Context) -> Outcome:
    from mctl.fabric.service import apply_imex, wait_for_imex

    if _k8s_imex(ctx):
        return Outcome("skipped", "Kubernetes site: the DRA driver runs IMEX in pods ('mctl deploy k8s')")
    res = apply_imex(ctx.site, ctx.rack)
    if res.not_applied:
        raise PhaseFailed(f"IMEX files could not be applied on {fold(res.not_applied)}",
                          details=[f"{t}: unreachable" for t in res.unreachable]
                          + [f"{t}: {why}" for t, why in res.failed.items()], artifacts=res.to_dict())
    if res.restart:
        ctx.report.line(f"wrote IMEX files and restarted the daemon on {fold(res.restart)}")
    healths = wait_for_imex(ctx.site, [ctx.rack], wait=ctx.options.imex_wait)
    domains = [{"name": h.domain.name, "state": h.state, "trays": fold(h.domain.trays)} for h in healths]
    bad = [h for h in healths if h.state != "UP"]
    if bad:
        raise PhaseFailed(f"IMEX domain{'s' if len(bad) > 1 else ''} not UP after {ctx.options.imex_wait:.0f}s: "
                          + ", ".join(f"{h.domain.name} {h.state}" for h in bad),
                          hint=f"see 'mctl imex status {ctx.rack.name}'", exit_code=EXIT_FINDINGS,
                          details=[f"{h.domain.name}: {r.message}" for h in bad for r in h.reasons],
                          artifacts={"domains": domains})
    names = ", ".join(f"{d['name']} ({d['trays']})" for d in domains)
    return Outcome("done", f"{len(domains)} IMEX domain{'s' if len(domains) > 1 else ''} UP: {names}"
                   + (f"; files changed on {len(res.changes)} trays" if res.changes else "; files unchanged"),
                   changed=res.changed, artifacts={"domains": domains, "changes": res.changes})


PHASE = Phase("imex", plan, run)
