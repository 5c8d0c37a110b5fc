"""Unit tests hash passwords at bcrypt's minimum cost (4) to stay fast; tests that check the
production cost say so with @pytest.mark.real_bcrypt_cost. The Hub stand-in (`hub`), reached
through HF_ENDPOINT with the small model at a commit, serves the weights and supply tests."""

from collections.abc import Iterator

import pytest

import kit.credentials.material
from tests.support.hub_standin import HubStandin, small_model
from tests.support.pinned_site import MODEL


@pytest.fixture(autouse=True)
def fast_bcrypt(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("real_bcrypt_cost") is None:
        monkeypatch.setattr(kit.credentials.material, "BCRYPT_COST", 4)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    standin = HubStandin()
    standin.add(MODEL, small_model(256 << 10))
    standin.start()
    monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield standin
    standin.stop()
