"""The import graph of mctl/ has no arrow from a lower layer to a higher one (issue 14).

Every module under mctl/ is parsed with `ast` (nothing is imported, so the test is cheap and
sees imports inside functions and under TYPE_CHECKING too: a lazy import is still a
dependency). The layers, lowest first; a package may import its own layer and any below:

  0  model, errors (and the `mctl` package itself, which only holds the version)
  1  inventory, facts, transport, state
  2  fabric, sched, provision, bmc, images, ansible
  3  health, audit, bringup, rackinv
  4  cli (and `mctl.__main__`, which only starts it)

Packages the issue did not name, placed by what they are today:
- state (lock files, atomic writes, snapshots) is storage every layer uses and imports only
  errors: layer 1 beside transport, which keeps its known_hosts with it.
- bmc (a Redfish client and the BMC inventory read) is a device service like fabric's NMX-M
  client: layer 2. images (software image catalogue, drift) and ansible (the inventory plugin
  Ansible loads) are services over the inventory: layer 2.
- rackinv (one rack's inventory run: probe, validate, snapshot) composes facts, transport and
  state like health and audit do: layer 3.

`mctl.lab` is a separate tool (the virtual rack for tests and demos): it may import anything,
and nothing in product code may import it. Its command group `mctl.cli.lab` (`mctl lab ...`)
is the lab tool's entry point and counts as part of it.

`mctl.model` imports nothing of mctl but `mctl.errors` (and itself).

KNOWN_VIOLATIONS lists the arrows that still point the wrong way (issue 14 emptied it). The
test fails on a violation not listed, and on a listed one that no longer occurs, so the list
always says exactly what is left; keep it empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mctl

ROOT = Path(mctl.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "mctl": 0, "errors": 0, "model": 0,
    "inventory": 1, "facts": 1, "checks": 1, "transport": 1, "state": 1,
    "fabric": 2, "sched": 2, "provision": 2, "bmc": 2, "images": 2, "ansible": 2,
    "health": 3, "audit": 3, "bringup": 3, "rackinv": 3, "change": 3,
    "cli": 4, "__main__": 4,
}
LAB = "lab"
LAB_ENTRY = "mctl.cli.lab"          # the lab tool's command group

# (importer module, imported module): arrows still to be turned around. Keep it empty.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The mctl modules *name* imports; `from pkg import mod` counts as pkg.mod when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "mctl")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mctl":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_lab(module: str) -> bool:
    return _package(module) == LAB or module == LAB_ENTRY or module.startswith(LAB_ENTRY + ".")


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    out = set()
    for importer, targets in graph.items():
        if _is_lab(importer):
            continue                                # the lab tool may import anything
        for target in targets:
            if _is_lab(target):
                out.add((importer, target))         # product code never imports the lab
            elif LAYERS[_package(target)] > LAYERS[_package(importer)]:
                out.add((importer, target))
            elif _package(importer) == "model" and _package(target) not in ("model", "errors"):
                out.add((importer, target))         # model/ sits on nothing but errors
    return out


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()} - {LAB}
    assert packages <= set(LAYERS), f"put {sorted(packages - set(LAYERS))} in a layer (and say why above)"


def test_the_graph_is_read():
    graph = _graph()
    # A few arrows that must exist, so a broken parser cannot pass by finding nothing.
    assert "mctl.errors" in graph["mctl.inventory.loader"]
    assert "mctl.model.site" in graph["mctl.inventory.loader"]
    assert any(_package(t) == LAB for t in graph[LAB_ENTRY])


def test_no_arrow_from_a_lower_layer_to_a_higher_one():
    found = violations(_graph())
    new = sorted(found - KNOWN_VIOLATIONS)
    gone = sorted(KNOWN_VIOLATIONS - found)
    assert not new, "imports against the layers (importer, imported): " + ", ".join(map(str, new))
    assert not gone, "no longer violations, remove them from KNOWN_VIOLATIONS: " + ", ".join(map(str, gone))


def test_model_imports_nothing_of_mctl_but_errors():
    graph = _graph()
    for module, targets in graph.items():
        if _package(module) != "model":
            continue
        bad = {t for t in targets if _package(t) not in ("model", "errors")} - {t for m, t in KNOWN_VIOLATIONS
                                                                                  if m == module}
        assert not bad, f"{module} imports {sorted(bad)}"


def test_the_rules_catch_a_wrong_arrow():
    graph = {"mctl.model.site": {"mctl.inventory.schema"}, "mctl.sched.x": {"mctl.health.policy"},
             "mctl.health.y": {"mctl.lab.faults", "mctl.sched.x"}, "mctl.lab.z": {"mctl.cli.main"},
             "mctl.cli.lab": {"mctl.lab.control"}, "mctl.cli.main": {"mctl.health.y"}}
    assert violations(graph) == {("mctl.model.site", "mctl.inventory.schema"), ("mctl.sched.x", "mctl.health.policy"),
                                 ("mctl.health.y", "mctl.lab.faults")}


def test_every_import_of_mctl_names_a_module_that_exists():
    """A moved module leaves no import behind, not even one only a type checker or a rare path reads."""
    graph = _graph()
    known = set(graph)
    missing = {(importer, target) for importer, targets in graph.items() for target in targets if target not in known}
    assert not missing, sorted(missing)


def test_only_the_cli_draws():
    """rich (the terminal drawing library) is the CLI's: services return results, they never draw."""
    drawing = []
    for name, path in _modules().items():
        if _package(name) in ("cli", LAB):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            drawing += [name for n in names if n.split(".")[0] == "rich"]
    assert not drawing, sorted(set(drawing))
