"""mctl node: commands that run on a compute tray itself, and installing them there."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, JsonOpt, NodesArg, PassedOpt
from mctl.errors import EXIT_FINDINGS, UsageError

app = typer.Typer(help="Commands for a compute tray itself (the node check, Slurm's HealthCheckProgram).",
                  no_args_is_help=True)


@app.command()
def check(
    config: Annotated[Optional[str], typer.Option("--config", help="Node-check config (default "
                                                                   "/etc/mctl/node-check.json, else built-in "
                                                                   "defaults).")] = None,
    node: Annotated[Optional[str], typer.Option("--node", help="Slurm node name (default: from the config, else "
                                                               "the short hostname).")] = None,
    no_drain: Annotated[bool, typer.Option("--no-drain", help="Report only; never drain or resume.")] = False,
    no_nvml: Annotated[bool, typer.Option("--no-nvml", help="Read GPUs with nvidia-smi even when NVML loads.")
                       ] = False,
    passed: PassedOpt = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Run the health checks on this tray and drain it in Slurm if one is critical.

    The same checks as 'mctl health check', through NVML (nvidia-ml-py) when the library loads,
    else nvidia-smi -q -x. Drains carry the reason 'mctl: ...'; the tray is resumed after
    health.resume_after_healthy_sweeps healthy runs, only if mctl drained it. Finishes well inside
    Slurm's 60 s limit. The standalone copy installed by 'mctl node install-check' runs the same
    code as /usr/local/sbin/mctl-node-check. Exit 0 ok, 1 critical findings, 2 bad config.

    Example: mctl node check --no-drain --passed
    """
    from mctl.health import node_check

    try:
        cfg = node_check.load_config(config, node)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"node-check config: {exc}", hint="see docs/health.md for its format") from None
    result = node_check.run(cfg, drain=False if no_drain else None, dry_run=dry_run, use_nvml=not no_nvml)
    out = render.output(json_)
    out.result(result.to_dict(), lambda: out.block(node_check.render_text(result, verbose=passed)))
    if result.worst.value == "critical":
        raise typer.Exit(EXIT_FINDINGS)


@app.command("install-check")
def install_check(
    target: NodesArg,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Install the node check on trays (playbook site.yml, tag health): the modules it needs under
    /usr/local/lib/mctl-node-check, /etc/mctl/node-check.json from the inventory, and
    /usr/local/sbin/mctl-node-check (on the compute trays of NODESET). 'mctl provision' and 'mctl deploy slurm' install it too;
    slurm.conf names it as HealthCheckProgram unless scheduler.slurm.node_check is false.

    Example: mctl -i inventories/lab node install-check lab-r1
    """
    from mctl.health.site_view import resolve_scope
    from mctl.ansible.runner import PlaybookRequest, run_playbook

    opts = options()
    site = opts.site()
    scope = resolve_scope(site, target)
    from mctl.cli.locking import hold_racks
    from mctl.transport.identity import check_identity_file

    check_identity_file(site.identity_file)       # Ansible's check mode connects too
    # --dry-run is Ansible's check mode: it changes nothing, so it takes no lock (held racks are named).
    hold_racks([h.rack for h in scope.hosts if h.rack], "node install-check", dry_run=dry_run)
    req = PlaybookRequest(playbook="site", inventory=str(site.file), limit=scope.names, tags=["health"],
                          check=dry_run, diff=dry_run, forks=max(5, min(100, len(scope.names))),
                          connect_timeout=site.ssh.connect_timeout)
    result = run_playbook(req, opts.state_dir)
    ok = result.status == "successful" and not result.failed_hosts
    out = render.output(json_)
    out.result({"dry_run": dry_run, "trays": scope.names, "ok": ok, "run": result.to_dict()}, lambda: out.lines(
        [f"  {host}: {recap.status} (changed {recap.changed})"
         + (f": {recap.failed_task}: {recap.message}" if recap.failed_task else "")
         for host, recap in sorted(result.hosts.items())]
        + [f"{'checked' if dry_run else 'installed'} the node check on {len(scope.names)} tray(s): "
           f"{'ok' if ok else 'FAILED'} (run folder {result.run_dir})"]))
    if not ok:
        raise typer.Exit(3)
