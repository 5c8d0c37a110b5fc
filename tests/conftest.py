"""Shared fixtures: a valid base spec to mutate, and a site folder per test (the helpers behind
them are in tests/support/sites.py)."""

from pathlib import Path

import pytest

from tests.support.sites import REPO, base_site, spec_in_folder


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
