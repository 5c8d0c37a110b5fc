"""The verbs' engine: `connect` answers with the fake engine a test put at an address."""

from collections.abc import Callable

import pytest

from kit.engine import docker_api
from kit.errors import KitError
from tests.support.fake_engine import FakeEngine


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str | None, FakeEngine]:
    """address → fake engine; `connect(url)` of an address not in it fails as a dead socket."""
    found: dict[str | None, FakeEngine] = {}

    def connect(url: str | None = None) -> FakeEngine:
        if url in found:
            return found[url]
        if None in found and len(found) == 1:
            return found[None]
        raise KitError(f"cannot reach the Docker engine at {url}")

    replacement: Callable = connect
    monkeypatch.setattr(docker_api, "connect", replacement)
    return found
