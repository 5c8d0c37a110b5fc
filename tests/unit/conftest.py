"""Unit tests hash passwords at bcrypt's minimum cost (4) to stay fast; tests that check the
production cost say so with @pytest.mark.real_bcrypt_cost."""

import pytest

import kit.credentials.material


@pytest.fixture(autouse=True)
def fast_bcrypt(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("real_bcrypt_cost") is None:
        monkeypatch.setattr(kit.credentials.material, "BCRYPT_COST", 4)
