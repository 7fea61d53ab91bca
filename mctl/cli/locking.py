"""The rack locks of mutating commands, taken before the command prints or does anything.

A mutating command calls hold_racks() as soon as it knows its racks (after its arguments and the
inventory are checked, before the first line of output). The locks are held until the command
ends (click closes them with the command's context, also on an error or Ctrl-C). With --dry-run
nothing is locked (a dry run changes nothing and must stay possible while a bring-up runs); a rack
someone holds is named in a warning, because the plan shown may be out of date when they finish.
See docs/decisions.md (D-lock).
"""

from __future__ import annotations

from typing import Iterable

from mctl.cli import render
from mctl.cli.context import options


def hold_racks(racks: Iterable[str], purpose: str, *, dry_run: bool = False) -> list[str]:
    """Take every rack's lock for the rest of the command (or, for a dry run, warn about held ones)."""
    from mctl.state.lock import describe_holder, lock_holder, rack_lock_path, rack_locks

    state_dir = options().state_dir
    names = sorted(set(racks))
    if dry_run:
        for name in names:
            holder = lock_holder(rack_lock_path(state_dir, name))
            if holder:
                render.Output().warn(f"rack {name} is locked {describe_holder(holder)}; this dry run shows the state "
                            "before that command finishes")
        return names
    ctx = _current_context()
    ctx.with_resource(rack_locks(state_dir, names, purpose=f"mctl {purpose}"))
    return names


def _current_context():
    try:  # typer >= 0.22 carries its own copy of click
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - older typer on click
        from click import get_current_context
    return get_current_context()
