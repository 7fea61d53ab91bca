"""The shape of bringup/phases/: one module per phase, and no phase runs a remote command itself."""

from __future__ import annotations

import ast
from pathlib import Path

from mctl.bringup.context import PHASES

PACKAGE = Path(__file__).resolve().parents[2] / "mctl" / "bringup" / "phases"
# What opens SSH connections or runs commands over them: a phase asks a service for that instead.
REMOTE = {"run_sync", "run_in_pool", "SSHPool", "SSHConfig", "targets_for", "trust_hosts", "NMXClient"}


def _imported_names(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out |= {a.name for a in node.names}
            out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_one_module_per_phase_in_the_registry_in_order():
    from mctl.bringup.phases import REGISTRY

    assert list(REGISTRY) == list(PHASES)
    for name, phase in REGISTRY.items():
        assert phase.name == name
        module = phase.run.__module__
        assert module == phase.plan.__module__ == f"mctl.bringup.phases.{name.replace('-', '_')}"
        assert (PACKAGE / f"{module.rsplit('.', 1)[1]}.py").is_file()


def test_no_phase_runs_remote_commands_itself():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) == len(PHASES) + 2                  # the phases, base.py and __init__.py
    for path in modules:
        found = _imported_names(path) & (REMOTE | {"mctl.transport", "mctl.transport.ssh"})
        assert not found, f"{path.name} imports {sorted(found)}: call a service function instead"
