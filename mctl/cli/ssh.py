"""mctl ssh trust: record SSH host keys in the inventory's known_hosts, on purpose."""

from __future__ import annotations

from typing import Annotated

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, JsonOpt, NodesArg
from mctl.errors import PartialFailure

app = typer.Typer(help="SSH host-key trust for the site's hosts.", no_args_is_help=True)


@app.command()
def trust(
    nodeset: NodesArg,
    replace: Annotated[bool, typer.Option("--replace",
                                          help="Replace a recorded key that changed (after you verified why).")] = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Fetch each host's SSH host key, show its fingerprint and record it in known_hosts.

    Keys are recorded in the known_hosts file named by the inventory (ssh.known_hosts), which
    every mctl command checks strictly. A key that differs from the recorded one is refused
    (exit 3) unless --replace is given: a changed key means a reinstalled host or an
    intercepted connection, and only you can tell which.

    Example: mctl -i inventories/lab ssh trust @all
    """
    from mctl.transport import SSHConfig, resolve_hosts, targets_for
    from mctl.transport.trust import REFUSED, trust_hosts

    opts = options()
    site = opts.site()
    hosts = resolve_hosts(site, nodeset)
    config = SSHConfig.from_site(site)
    outcomes = trust_hosts(config, targets_for(site, hosts), replace=replace, dry_run=dry_run,
                           lock_path=None if dry_run else opts.state_dir / "locks" / "known_hosts.lock")
    out = render.output(json_)
    out.result({"known_hosts": str(config.known_hosts), "dry_run": dry_run, "hosts": [o.to_dict() for o in outcomes]},
               lambda: _print(out, outcomes, str(config.known_hosts), dry_run))
    refused = [o for o in outcomes if o.action == REFUSED]
    failed = [o for o in outcomes if not o.trusted and o.action != REFUSED]
    if refused or failed:
        from mctl.model.site import fold

        parts = []
        if refused:
            parts.append(f"host key CHANGED, not replaced: {fold(o.host for o in refused)}")
        if failed:
            parts.append(f"no key fetched: {fold(o.host for o in failed)}")
        raise PartialFailure("; ".join(parts),
                             hint="verify a changed key out of band (console, BMC) before --replace"
                             if refused else "check that sshd runs on those hosts")


def _print(out: render.Output, outcomes, known_hosts: str, dry_run: bool) -> None:
    verb = {"added": "would add" if dry_run else "added", "replaced": "would replace" if dry_run else "replaced",
            "unchanged": "already trusted", "refused-changed": "CHANGED - refused", "unreachable": "unreachable"}
    rows = [(o.host, o.address if o.port == 22 else f"{o.address}:{o.port}",
             o.key.key_type if o.key else "-", o.key.fingerprint if o.key else "-",
             verb.get(o.action, o.action) + (f" ({o.error})" if o.action == "unreachable" and o.error else ""))
            for o in outcomes]
    out.table(f"host keys ({known_hosts}){' - dry run, nothing written' if dry_run else ''}",
              ("host", "address", "key", "fingerprint", "result"), rows, boxed=True)
    for o in outcomes:
        if o.action == "refused-changed":
            out.line(f"WARNING: {o.host}: {o.error}")
        elif o.action == "replaced" and o.previous:
            out.line(f"{o.host}: replaced {', '.join(k.describe() for k in o.previous)}")
