"""No test module imports another test module (issue 26): what tests share lives in tests/helpers.py.

Every .py file under tests/ is parsed with `ast` (nothing is imported; imports inside functions count
too). A test module is a file named test_*.py; nothing under tests/, test module, conftest or helper
module, may import one, by any spelling: `from tests.unit.test_x import f`, `import tests.unit.test_x`,
`from tests.unit import test_x`, or relatively (`from .test_x import f`). Importing one runs its
module-level code and its fixtures a second time and ties the two files together; a helper either
belongs to one module or to tests/helpers.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _package_of(path: Path) -> list[str]:
    return ["tests", *path.parent.relative_to(TESTS).parts]


def _is_test_module(dotted: str) -> bool:
    return dotted.split(".")[-1].startswith("test_")


def imported_test_modules(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, the test module named) for every import in the file *path* (or in *text* read as that file)
    that names a test module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if any(map(_is_test_module, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path)[: len(_package_of(path)) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            if any(map(_is_test_module, base.split("."))):
                found.append((node.lineno, base))
            else:
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names if _is_test_module(a.name)]
    return found


def test_no_module_under_tests_imports_a_test_module():
    offenders = [f"{path.relative_to(TESTS.parent)}:{line} imports {name}"
                 for path in sorted(TESTS.rglob("*.py")) for line, name in imported_test_modules(path)]
    assert offenders == [], ("a test module is imported; move what it shares to tests/helpers.py "
                             "(fixtures to a conftest):\n  " + "\n  ".join(offenders))


def test_every_spelling_of_such_an_import_is_caught():
    spellings = ["from tests.unit.test_health import sinfo", "import tests.integration.test_lab_bmcs",
                 "from tests.unit import test_leaks", "from .test_gpu_emulator import contract_state",
                 "from . import test_slurm_render", "def f():\n    from tests.e2e.test_bringup import phase"]
    allowed = ["from tests.helpers import wait_for", "from tests.unit.cli_helpers import run_cli",
               "from tests.lab_fixture import LabHandle", "import tests.kube_apiserver", "from . import conftest"]
    as_if = TESTS / "unit" / "test_fake.py"          # relative imports resolve as they would there
    for text in spellings + allowed:
        found = imported_test_modules(as_if, text + "\n")
        assert bool(found) == (text in spellings), (text, found)
