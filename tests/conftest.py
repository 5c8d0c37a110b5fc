"""Shared fixtures: a valid base spec to mutate, and a site folder per test (the helpers behind
them are in tests/support/sites.py); and how the suite splits into a parallel and a serial pass
(scripts/test.sh, docs/testing.md)."""

import signal
from pathlib import Path

import pytest

from tests.support.sites import REPO, base_site, spec_in_folder
from tests.support.workers import group_by_module, select_pass


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-tests", choices=("skip", "only"), default=None,
        help="skip: leave out the tests marked serial (the parallel pass of scripts/test.sh); "
             "only: run just those (its serial pass, alone on the machine)")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes tests start even when the suite itself was started in the
    background: a non-interactive shell starts `cmd &` with SIGINT ignored, every child inherits
    that, and an ignored SIGINT stays ignored across exec (Python then installs no
    KeyboardInterrupt), so a test's Ctrl-C of `kit pull` was lost and the pull ran to its end."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    left_out = select_pass(items, config.getoption("serial_tests"))
    if left_out:
        config.hook.pytest_deselected(items=left_out)
    group_by_module(items)


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
