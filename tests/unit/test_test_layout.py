"""pytest imports test modules by basename (rootdir-relative packages aside): a unit test file and
an e2e test file of the same name make collection of the whole suite fail."""

from tests.support.sites import REPO


def test_unit_and_e2e_test_files_have_different_names() -> None:
    unit = {path.name for path in (REPO / "tests" / "unit").glob("test_*.py")}
    e2e = {path.name for path in (REPO / "tests" / "e2e").glob("test_*.py")}
    assert not unit & e2e, f"rename one side: {sorted(unit & e2e)}"
