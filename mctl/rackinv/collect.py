"""Run the inventory probe on every compute tray over SSH, one round trip per tray.

The script and its parser are mctl.facts.probe's (purpose INVENTORY); this is
the I/O around them: one command per tray over the pool's reused connections,
each tray parsed as it answers while slower trays are still running.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Sequence

from mctl.facts.probe import INVENTORY, from_result, probe_command
from mctl.model.tray import TrayFacts, smi_timeout_for

if TYPE_CHECKING:
    from mctl.transport import HostResult, SSHPool, SSHTarget


async def collect_facts(pool: "SSHPool", targets: Sequence["SSHTarget"], *,
                        timeout: float | None = None, deadline: float | None = None) -> list[TrayFacts]:
    """Facts of every target, in target order, over the pool's (reused) connections.

    With *deadline* (seconds), each tray's whole work ends within it (SSHPool.run_one)."""
    command_timeout = pool.config.command_timeout if timeout is None else timeout
    if deadline is not None:
        command_timeout = min(command_timeout, deadline) if timeout is not None else deadline
    smi_timeout = smi_timeout_for(command_timeout)
    nonce = secrets.token_hex(8)
    script = probe_command(INVENTORY, nonce, smi_timeout=smi_timeout)
    facts: dict[str, TrayFacts] = {}

    def parse(result: "HostResult") -> None:
        # parse each tray as it answers, while slower trays are still running
        facts[result.host] = from_result(INVENTORY, result, nonce, smi_timeout=smi_timeout)

    await pool.run(targets, script, timeout=command_timeout if deadline is None else None, deadline=deadline,
                   on_result=parse)
    return [facts[t.name] for t in targets]
