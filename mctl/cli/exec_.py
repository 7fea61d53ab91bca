"""mctl exec NODESET -- CMD: run a command on many hosts, output grouped like clush -b."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import JsonOpt, NodesArg, TimeoutOpt
from mctl.errors import PartialFailure, UsageError

COMMAND_SETTINGS: dict = {}


def command(
    nodeset: NodesArg,
    cmd: Annotated[Optional[List[str]], typer.Argument(help="The command, after '--'.", show_default=False)] = None,
    timeout: TimeoutOpt = None,
    fanout: Annotated[Optional[int], typer.Option("--fanout", "-f", min=1,
                                                  help="Hosts at a time (default: ssh.concurrency).")] = None,
    json_: JsonOpt = False,
) -> None:
    """Run CMD on every host of NODESET over SSH and print each distinct output once.

    The words after '--' are joined with spaces and run by the remote login shell, as
    ssh does. --timeout: how long the command may run on each host (default:
    ssh.command_timeout); connecting and opening the session get ssh.connect_timeout each.
    Exit 0 when every host succeeded, 3 when some failed or could not be reached (they are
    listed), 2 for bad input.

    Example: mctl -i inventories/lab exec lab-r1 -- uname -r
    """
    from mctl.transport import SSHConfig, group_by_output, resolve_hosts, run_sync, targets_for

    words = list(cmd or [])
    if not words or not " ".join(words).strip():
        raise UsageError("no command given", hint="put the command after '--': mctl exec lab-r1 -- uname -r")
    site = options().site()
    hosts = resolve_hosts(site, nodeset)
    command_text = " ".join(words)
    config = SSHConfig.from_site(site, concurrency=fanout)
    results = run_sync(config, targets_for(site, hosts), command_text, timeout=timeout)
    groups = group_by_output(results)
    bad = [r for r in results if not r.ok]

    out = render.output(json_)
    out.result({"command": command_text, "nodeset": nodeset, "hosts": [r.to_dict() for r in results],
                "groups": [g.to_dict() for g in groups],
                "summary": {"total": len(results), "ok": len(results) - len(bad), "not_ok": len(bad)}},
               lambda: _print_groups(out, groups))
    if bad:
        from mctl.model.site import fold

        per_status: dict[str, list[str]] = {}
        for r in bad:
            per_status.setdefault(r.status.value, []).append(r.host)
        detail = "; ".join(f"{status}: {fold(names)}" for status, names in per_status.items())
        hints = []
        if "host-key-mismatch" in per_status:
            hints.append(f"host keys: verify them, then 'mctl ssh trust {fold(per_status['host-key-mismatch'])}'")
        if "unreachable" in per_status or "timeout" in per_status:
            hints.append("unreachable/timeout: check power, network and sshd of those hosts")
        raise PartialFailure(f"{len(bad)} of {len(results)} hosts did not succeed ({detail})",
                             hint="; ".join(hints) or None)


def _print_groups(out: render.Output, groups) -> None:
    for g in groups:
        state = "" if g.status.value == "ok" else (
            f" exit {g.exit_code}" if g.status.value == "failed" and g.exit_code is not None
            else f" {g.status.value}" + (f": {g.error}" if g.error else ""))
        title = f"{g.nodes} ({g.count}){state}"
        rule = "-" * min(max(len(title), 15), 100)
        out.line(f"{rule}\n{title}\n{rule}", style="bold")
        text = g.stdout + (g.stderr if g.stderr else "")
        if text:
            out.verbatim(text.rstrip("\n"))
