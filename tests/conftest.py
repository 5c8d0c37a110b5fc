"""Shared fixtures: a valid base spec to mutate, and a site folder per test (the helpers behind
them are in tests/support/sites.py); and how the suite splits into a parallel and a serial pass
(scripts/test.sh, docs/testing.md)."""

from pathlib import Path

import pytest

from tests.support.sites import REPO, base_site, spec_in_folder


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-tests", choices=("skip", "only"), default=None,
        help="skip: leave out the tests marked serial (the parallel pass of scripts/test.sh); "
             "only: run just those (its serial pass, alone on the machine)")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--serial-tests picks a pass; and every e2e test without an xdist_group of its own joins
    its module's, so under `--dist loadgroup` a module runs on one worker, in order, and builds
    its module-scoped stack once (a test may name a group of its own to run beside it)."""
    choice = config.getoption("serial_tests")
    if choice is not None:
        wanted = choice == "only"
        kept = [item for item in items if (item.get_closest_marker("serial") is not None) == wanted]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """Each test's site locks (kit/site_lock.py) in a folder of its own, inherited by the kit
    processes it starts: tests never wait on each other, nor on an operator's kit."""
    folder = tmp_path_factory.mktemp("locks")
    monkeypatch.setenv("KIT_LOCK_DIR", str(folder))
    return folder


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site folder with a valid spec; models_root holds llama-8b/config.json."""
    return base_site(tmp_path)


@pytest.fixture
def example_site(tmp_path: Path) -> Path:
    """A copy of the bundled example spec in an empty folder."""
    return spec_in_folder(REPO / "site.yaml", tmp_path / "example")
