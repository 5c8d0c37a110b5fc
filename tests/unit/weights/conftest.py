"""The Hub stand-in, reached through HF_ENDPOINT, with the small model at a commit."""

from collections.abc import Iterator

import pytest

from tests.support.hub_standin import HubStandin, small_model
from tests.support.pinned_site import MODEL


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
