"""The test tree's layout: every folder under tests/ holding test modules is a package (so two
test files may share a basename, e.g. tests/unit/stack/test_up.py and tests/e2e/test_up.py),
and no test module imports from another: shared helpers live in tests/support/ (fixtures in
conftest.py files), where every test can find them."""

import ast
from pathlib import Path

from tests.support.sites import REPO

TESTS = REPO / "tests"


def modules_of_tests() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_unit_and_e2e_test_files_have_different_names() -> None:
    """Every folder from tests/ down to a test module is a package: pytest then imports each
    test module by its dotted path, and the same basename in two folders does not collide."""
    missing = sorted({
        str(folder.relative_to(REPO))
        for module in modules_of_tests()
        for folder in [module.parent, *module.parent.parents]
        if folder.is_relative_to(TESTS) and not (folder / "__init__.py").exists()
    })
    assert not missing, f"add an empty __init__.py to: {missing}"


def test_no_test_module_imports_another_test_module() -> None:
    """Helpers shared between test modules live in tests/support/ (or are fixtures in a
    conftest.py), never in a test module or a conftest that others import."""
    reaching = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in [*modules_of_tests(), *sorted((TESTS / "support").rglob("*.py"))]
        for line, target in imported(path) if is_a_test_module(target)
    ]
    assert not reaching, "move the helpers to tests/support/:\n" + "\n".join(reaching)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module and name a file imports, relative ones as `.name`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [(node.lineno, module)]
            found += [(node.lineno, f"{module.rstrip('.')}.{alias.name}") for alias in node.names]
    return found


def is_a_test_module(dotted: str) -> bool:
    """tests.unit.…, tests.e2e.…, a conftest or a test_ module: what only pytest imports."""
    parts = dotted.lstrip(".").split(".")
    return (parts[0] == "tests" and parts[1:2] in (["unit"], ["e2e"])) or any(
        part == "conftest" or part.startswith("test_") for part in parts)
