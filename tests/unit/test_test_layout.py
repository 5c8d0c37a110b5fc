"""The test tree's layout: every folder under tests/ holding test modules is a package (so two
test files may share a basename, e.g. tests/unit/stack/test_up.py and tests/e2e/test_up.py),
no test module imports from another: shared helpers live in tests/support/ (fixtures in
conftest.py files), where every test can find them; and a unit test's name says which module
it tests (docs/testing.md: the naming rule); every test of the serial pass is in
docs/testing.md's table of why it runs alone."""

import ast
import re
from pathlib import Path

import pytest

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


# The repository's own rules, named after the rule they keep rather than a module.
REPO_RULES = {"test_architecture.py", "test_readme_claims.py", "test_test_layout.py",
              "test_wings.py"}


def mirrored_folder(relative: Path, repo: Path) -> Path:
    """The source folder a unit test's folder (relative to tests/unit/) mirrors: kit/'s wings
    (tests/unit/ itself: kit/'s ground modules), the stand-in's package, scripts/, or the
    suite's own helpers in tests/support/."""
    parts = relative.parent.parts
    roots = {"standin": repo / "tests" / "standin" / "vllm_standin",
             "scripts": repo / "scripts", "support": repo / "tests" / "support"}
    if parts and parts[0] in roots:
        return roots[parts[0]].joinpath(*parts[1:])
    return repo.joinpath("kit", *parts)


def module_names(folder: Path) -> set[str]:
    """What a test may be named after: the folder's Python, njs and shell modules by stem
    (a dash read as an underscore: scripts/try-without-gpu.sh is test_try_without_gpu.py)."""
    if not folder.is_dir():
        return set()
    return {path.stem.replace("-", "_") for path in folder.iterdir()
            if path.suffix in (".py", ".js", ".sh") and path.stem != "__init__"}


def misnamed_tests(repo: Path) -> list[str]:
    """Unit test files whose name is not test_<module>.py or test_<module>_<topic>.py for a
    module of the folder they mirror, and test files outside tests/unit/ and tests/e2e/ (the
    only place for behaviour names)."""
    tests, unit = repo / "tests", repo / "tests" / "unit"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        shown = path.relative_to(repo)
        if path.is_relative_to(tests / "e2e"):
            continue
        if not path.is_relative_to(unit):
            found.append(f"{shown}: not under tests/unit/ or tests/e2e/")
            continue
        relative = path.relative_to(unit)
        if str(relative) in REPO_RULES:
            continue
        folder, subject = mirrored_folder(relative, repo), path.stem.removeprefix("test_")
        if not any(subject == name or subject.startswith(name + "_")
                   for name in module_names(folder)):
            found.append(f"{shown}: names no module of {folder.relative_to(repo)}/")
    return found


def test_every_unit_test_is_named_after_the_module_it_tests() -> None:
    """tests/unit/<wing>/test_<module>.py (or test_<module>_<topic>.py) for kit/<wing>/<module>,
    kit/'s ground modules' tests in tests/unit/ itself, tests/unit/standin/ mirroring
    tests/standin/vllm_standin/, tests/unit/scripts/ mirroring scripts/, tests/unit/support/
    mirroring tests/support/; behaviour names only under tests/e2e/ (issue 44)."""
    misnamed = misnamed_tests(REPO)
    assert not misnamed, "name each after the module it tests (git mv):\n" + "\n".join(misnamed)


@pytest.mark.parametrize(("planted", "finding"), [
    ("tests/unit/spec/test_bad_inputs.py", "names no module of kit/spec/"),
    ("tests/unit/test_hostile.py", "names no module of kit/"),
    ("tests/unit/nowhere/test_model.py", "names no module of kit/nowhere/"),
    ("tests/unit/standin/test_timing.py", "names no module of tests/standin/vllm_standin/"),
    ("tests/unit/scripts/test_model.py", "names no module of scripts/"),
    ("tests/test_model.py", "not under tests/unit/ or tests/e2e/"),
])
def test_the_naming_rule_finds_a_planted_misnamed_file(tmp_path: Path, planted: str,
                                                       finding: str) -> None:
    for source in ["kit/state.py", "kit/spec/model.py", "tests/standin/vllm_standin/engine.py",
                   "scripts/try-without-gpu.sh", "tests/support/workers.py"]:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).touch()
    for test in ["tests/unit/test_state.py", "tests/unit/spec/test_model.py",
                 "tests/unit/spec/test_model_limits.py", "tests/unit/standin/test_engine.py",
                 "tests/unit/scripts/test_try_without_gpu.py", "tests/unit/support/test_workers.py",
                 "tests/unit/test_wings.py", "tests/e2e/test_anything_at_all.py", planted]:
        (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / test).touch()
    assert misnamed_tests(tmp_path) == [f"{planted}: {finding}"]


def serial_tests(tests: Path) -> set[str]:
    """The tests marked `serial` (tests/conftest.py's serial pass), by source: a module marked
    whole by its `pytestmark` as its path, a test function as path::name."""
    found = set()
    for path in sorted(tests.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        name = path.relative_to(tests.parent).as_posix()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(target, ast.Name) and target.id == "pytestmark"
                    for target in node.targets) and _marks_serial(node.value):
                found.add(name)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef) and any(
                    _marks_serial(decorator) for decorator in node.decorator_list):
                found.add(f"{name}::{node.name}")
            if isinstance(node, ast.ClassDef):
                found |= {f"{name}::{node.name}::{method.name}" for method in node.body
                          if isinstance(method, ast.FunctionDef)
                          and any(_marks_serial(d) for d in method.decorator_list)}
    return found


def _marks_serial(node: ast.AST) -> bool:
    return any(isinstance(part, ast.Attribute) and part.attr == "serial"
               and ast.unparse(part) == "pytest.mark.serial" for part in ast.walk(node))


def serial_table(testing_md: str) -> set[str]:
    """The first column of docs/testing.md's table under "## The serial tests"."""
    section = testing_md.split("## The serial tests", 1)[1].split("\n## ", 1)[0]
    return {row.group(1) for row in re.finditer(r"^\| `([^`]+)` \|", section, re.M)}


def test_every_serial_test_says_in_docs_why_it_runs_alone() -> None:
    """A test in the serial pass adds its time to the job's whole: docs/testing.md says of each
    why it cannot share the machine (issue 44), and names no test that is not serial."""
    marked = serial_tests(TESTS)
    listed = serial_table((REPO / "docs" / "testing.md").read_text())
    assert marked, "no serial test found: the search for the mark is broken"
    assert marked == listed, (f"marked serial, not in docs/testing.md: {sorted(marked - listed)}; "
                              f"in its table, not marked: {sorted(listed - marked)}")


def test_the_serial_search_finds_a_module_and_a_function(tmp_path: Path) -> None:
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "test_a.py").write_text(
        "import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.serial]\n")
    (tmp_path / "tests" / "e2e" / "test_b.py").write_text(
        "import pytest\npytestmark = pytest.mark.e2e\n\n\n@pytest.mark.serial\ndef test_x():\n"
        "    pass\n\n\n@pytest.mark.slow\ndef test_y():\n    pass\n")
    assert serial_tests(tmp_path / "tests") == {"tests/e2e/test_a.py",
                                                "tests/e2e/test_b.py::test_x"}
