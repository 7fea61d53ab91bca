"""preflight: the inventory is valid, every host answers over SSH with a trusted key, NMX-M answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mctl.bringup.context import Context, Outcome, PhaseFailed
from mctl.bringup.phases.base import Phase, controller, names, slurm
from mctl.model.site import fold

if TYPE_CHECKING:
    from mctl.model.site import Host


def _reach(ctx: Context, hosts: list["Host"], *, trust: bool) -> tuple[list[str], list[str]]:
    """(problems, notes) after one SSH round trip to every host; new host keys trusted when asked."""
    from mctl.transport.reach import reach

    res = reach(ctx.site, hosts, trust=trust, lock_path=ctx.state_dir / "locks" / "known_hosts.lock")
    notes: list[str] = []
    if res.trusted is not None:
        notes.append(f"trusted new host keys of {fold(res.trusted)} (--trust-new-keys)" if res.trusted else
                     "no new host key could be fetched")
    problems = []
    for h in hosts:
        if h.name in res.untrusted:
            problems.append(f"{h.name}: host key not trusted yet ({res.untrusted[h.name]}); "
                            f"check it, then 'mctl ssh trust {h.name}' or --trust-new-keys")
        elif h.name in res.failed:
            problems.append(f"{h.name}: {res.failed[h.name]}")
    return problems, notes


def _hosts(ctx: Context) -> list["Host"]:
    hosts = ctx.managed
    if slurm(ctx):
        c = controller(ctx)
        if c.name not in names(hosts):
            hosts.append(c)
    return hosts


def _static_checks(ctx: Context) -> list[str]:
    """What the inventory alone can refuse (UsageError, nothing touched)."""
    from mctl.errors import UsageError
    from mctl.fabric.partitions import desired_from_rack, validate_desired

    rack = ctx.rack
    if not rack.compute:
        raise UsageError(f"rack {rack.name} has no compute trays in the inventory")
    notes = [f"inventory {ctx.site.file}: rack {rack.name}, {rack.model}, {len(rack.compute)} of "
             f"{rack.compute_trays} compute trays, head {rack.head.name if rack.head else 'none'}"]
    if rack.partitions:
        for w in validate_desired(rack, desired_from_rack(rack), site=ctx.site):
            notes.append(f"warning: {w}")
        if rack.nmx is None:
            raise UsageError(f"rack {rack.name} declares partitions but has no NMX-Manager endpoint",
                             hint=f"add racks.{rack.name}.nmx (url, credentials_file) to the inventory")
    if slurm(ctx):
        notes.append(f"scheduler: Slurm, controller {controller(ctx).name}")
    return notes


def _nmx_check(ctx: Context) -> str | None:
    from mctl.fabric.discovery import discover_rack

    if ctx.rack.nmx is None:
        return None
    state = discover_rack(ctx.site, ctx.rack)
    return (f"NMX-M {ctx.rack.nmx.url} answers: {len(state.nodes)} compute nodes, "
            f"{sum(1 for p in state.partitions if not p.is_default)} user partitions")


def run(ctx: Context) -> Outcome:
    details = _static_checks(ctx)
    hosts = _hosts(ctx)
    problems, notes = _reach(ctx, hosts, trust=ctx.options.trust_new_keys)
    details += notes
    if problems:
        raise PhaseFailed(f"{len(problems)} of {len(hosts)} hosts cannot be used over SSH",
                          hint="fix reachability or host keys, then 'mctl rack bring-up "
                               f"{ctx.rack.name} --resume'", details=details + problems)
    nmx = _nmx_check(ctx)
    if nmx:
        details.append(nmx)
    return Outcome("done", f"{len(hosts)} hosts answer over SSH with trusted keys"
                   + ("; NMX-M answers" if nmx else ""), details=details)


def plan(ctx: Context) -> list[str]:
    lines = _static_checks(ctx)
    hosts = _hosts(ctx)
    problems, _ = _reach(ctx, hosts, trust=False)
    lines.append(f"SSH to {len(hosts)} hosts: " + ("all answer" if not problems else f"{len(problems)} problems"))
    lines += [f"  {p}" for p in problems]
    if ctx.options.trust_new_keys:
        lines.append("new host keys would be trusted (--trust-new-keys)")
    nmx = _nmx_check(ctx)
    if nmx:
        lines.append(nmx)
    return lines


PHASE = Phase("preflight", plan, run)
