"""The import graph of mctl/: no arrow from a lower layer to a higher one (issue 14), no arrow
between two layer-2 packages, and no import circle (issue 26).

Every module under mctl/ is parsed with `ast` (nothing is imported, so the test is cheap and
sees imports inside functions and under TYPE_CHECKING too: a lazy import is still a
dependency). The layers, lowest first; a package may import its own layer and any below:

  0  model, errors (and the `mctl` package itself, which only holds the version)
  1  inventory, facts, checks, transport, state, images, ansible
  2  fabric, sched, provision, bmc
  3  health, audit, bringup, rackinv, change, rollout
  4  cli (and `mctl.__main__`, which only starts it)

Packages the issue did not name, placed by what they are:
- state (lock files, atomic writes, snapshots) is storage every layer uses and imports only
  errors: layer 1 beside transport, which keeps its known_hosts with it.
- bmc (a Redfish client and the BMC inventory read) is a device service like fabric's NMX-M
  client: layer 2.
- images (the software image catalogue and the comparison of versions with it) loads and
  judges like the inventory and the checks: layer 1. Reading trays and BMCs to compare them
  with their image composes subsystems and is the audit's (mctl.audit.image_diff).
- ansible (the inventory plugin Ansible loads, and the ansible-runner adapter every service
  that runs a playbook uses) sits on the inventory and the state directory: layer 1.
- rackinv (one rack's inventory run: probe, validate, snapshot) composes facts, transport and
  state like health and audit do: layer 3.
- change (the partition change's conductor) and rollout (provisioning under the jobs rule, rolling
  changes) each compose several layer-2 subsystems with a journal: layer 3.

Layer 2 is one subsystem per package, and a subsystem does not reach into another: a layer-2
package imports its own package and layers 0-1 only. What two of them share goes down (a
vocabulary to model/, an adapter to layer 1); what composes two of them goes up, to layer 3.

No module imports itself back through others: the module graph has no strongly connected
component of more than one module (Tarjan), lab included. A circle means two modules are one
concept split in two, or one of them holds what both need.

`mctl.lab` is a separate tool (the virtual rack for tests and demos): it may import anything,
and nothing in product code may import it. Its command group `mctl.cli.lab` (`mctl lab ...`)
is the lab tool's entry point and counts as part of it.

`mctl.model` imports nothing of mctl but `mctl.errors` (and itself).

KNOWN_VIOLATIONS, KNOWN_CROSS_IMPORTS and KNOWN_CYCLES list what still breaks a rule, exactly.
The test fails on a break not listed, and on a listed one that no longer occurs, so each list
always says exactly what is left; they only shrink, to empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mctl

ROOT = Path(mctl.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "mctl": 0, "errors": 0, "model": 0,
    "inventory": 1, "facts": 1, "checks": 1, "transport": 1, "state": 1, "images": 1, "ansible": 1,
    "fabric": 2, "sched": 2, "provision": 2, "bmc": 2,
    "health": 3, "audit": 3, "bringup": 3, "rackinv": 3, "change": 3, "rollout": 3,
    "cli": 4, "__main__": 4,
}
LAB = "lab"
LAB_ENTRY = "mctl.cli.lab"          # the lab tool's command group

# (importer module, imported module): arrows still to be turned around. Keep it empty.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# (importer module, imported module): arrows between two layer-2 packages still to be turned
# around. Keep it empty: a layer-2 package imports only its own package and layers 0-1.
KNOWN_CROSS_IMPORTS: set[tuple[str, str]] = set()

# Import circles still there, each as the exact set of its modules (one strongly connected
# component); the product has none (health/'s went with issue 26's sweep, responders and actuator).
# The lab's one is the lab tool's own: the apt repository packs the files that the registry of lab
# services lists, and the registry starts the repository as a rack service.
KNOWN_CYCLES: set[frozenset[str]] = {
    frozenset({"mctl.lab.aptrepo", "mctl.lab.services"}),
}


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


def cross_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Arrows from one layer-2 package to another."""
    return {(importer, target) for importer, targets in graph.items() for target in targets
            if LAYERS.get(_package(importer)) == LAYERS.get(_package(target)) == 2
            and _package(importer) != _package(target)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm), each sorted;
    iterative, so a long chain of imports cannot exhaust Python's recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _shortest(graph: dict[str, set[str]], members: set[str], start: str, done: set[str]) -> list[str]:
    """The imports from *start* (breadth first, inside *members*) to the nearest module in *done*."""
    came_from: dict[str, str] = {}
    queue = [start]
    for node in queue:
        for target in sorted(graph[node] & members):
            if target in done:
                path = [target, node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1][1:]
            if target not in came_from and target != start:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{sorted(members)} is not strongly connected")


def circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """Every module of *component* in import order, from its first module back to it: each step
    follows real imports to the nearest module not named yet, the last one back to the first."""
    members = set(component)
    walk = [component[0]]
    while members - set(walk):
        walk += _shortest(graph, members, walk[-1], members - set(walk))
    return walk + _shortest(graph, members, walk[-1], {component[0]})


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()} - {LAB}
    assert packages <= set(LAYERS), f"put {sorted(packages - set(LAYERS))} in a layer (and say why above)"


def test_the_graph_is_read():
    graph = _graph()
    # A few arrows that must exist, so a broken parser cannot pass by finding nothing.
    assert "mctl.errors" in graph["mctl.inventory.loader"]
    assert "mctl.model.site" in graph["mctl.inventory.loader"]
    assert any(_package(t) == LAB for t in graph[LAB_ENTRY])


def _exactly_listed(found: set, known: set, *, new_says: str, gone_says: str, show=str, show_gone=str) -> None:
    """What a rule finds is exactly what its KNOWN_ list says: a break not listed fails, and so does a
    listed one that no longer occurs (the list is stale)."""
    new = sorted(show(x) for x in found - known)
    gone = sorted(show_gone(x) for x in known - found)
    assert not new, new_says + ": " + ", ".join(new)
    assert not gone, gone_says + ": " + ", ".join(gone)


def test_no_arrow_from_a_lower_layer_to_a_higher_one():
    _exactly_listed(violations(_graph()), KNOWN_VIOLATIONS, new_says="imports against the layers (importer, imported)",
                    gone_says="no longer violations, remove them from KNOWN_VIOLATIONS")


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


def test_no_layer_2_package_imports_another():
    """A subsystem (fabric, sched, provision, bmc) imports its own package and layers 0-1 only."""
    _exactly_listed(cross_imports(_graph()), KNOWN_CROSS_IMPORTS,
                    new_says="a layer-2 package imports another (importer, imported)",
                    gone_says="no longer imported, remove them from KNOWN_CROSS_IMPORTS")


def test_no_import_circle():
    graph = _graph()
    _exactly_listed({frozenset(c) for c in cycles(graph)}, KNOWN_CYCLES, new_says="import circles",
                    gone_says="no longer circles, remove them from KNOWN_CYCLES",
                    show=lambda c: " -> ".join(circle(graph, sorted(c))), show_gone=lambda c: str(sorted(c)))


def test_the_rules_catch_a_cross_import_and_a_circle():
    graph = {"mctl.fabric.a": {"mctl.sched.b", "mctl.fabric.c", "mctl.model.site", "mctl.transport.ssh"},
             "mctl.sched.b": {"mctl.fabric.c"}, "mctl.fabric.c": {"mctl.fabric.a"}, "mctl.model.site": set(),
             "mctl.transport.ssh": set(), "mctl.lab.x": {"mctl.sched.b"}, "mctl.health.y": {"mctl.sched.b"}}
    assert cross_imports(graph) == {("mctl.fabric.a", "mctl.sched.b"), ("mctl.sched.b", "mctl.fabric.c")}
    assert cycles(graph) == [["mctl.fabric.a", "mctl.fabric.c", "mctl.sched.b"]]
    assert circle(graph, cycles(graph)[0]) == ["mctl.fabric.a", "mctl.fabric.c", "mctl.fabric.a", "mctl.sched.b",
                                               "mctl.fabric.c", "mctl.fabric.a"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    two = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}}
    assert cycles(two) == [["a", "b"], ["c", "d", "e"]]
    assert circle(two, ["c", "d", "e"]) == ["c", "d", "e", "c"]


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


CLI_LIBRARY_LIMIT = 8       # a handful: the CLI parses, builds a request, calls a service and renders


def test_no_cli_module_imports_more_than_a_handful_of_library_modules():
    """A CLI module that needs many library modules is conducting a workflow itself; that belongs
    in a service (mctl.change, mctl.provision, mctl.health) the CLI calls once."""
    graph = _graph()
    wide = {name: sorted(t for t in targets if _package(t) != "cli")
            for name, targets in graph.items() if _package(name) == "cli" and not _is_lab(name)}
    assert not {n: ts for n, ts in wide.items() if len(ts) > CLI_LIBRARY_LIMIT}, wide
