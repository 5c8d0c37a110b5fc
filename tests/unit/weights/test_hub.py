"""`kit lock` through huggingface_hub against the Hub stand-in: the commit a branch names, the
Hub's own LFS sha256, small files hashed at the commit; the Hub's refusals explained; HF_TOKEN
sent to the Hub and never to the storage host, and never written to a file."""

import hashlib
from pathlib import Path

import pytest

from kit.errors import BadInput
from kit.weights.hub import resolve
from tests.support.cli import run_kit
from tests.support.hub_standin import HubStandin, small_model
from tests.support.pinned_site import MODEL, pinned_spec, pulled_folder
from tests.support.sites import tree


def test_a_branch_resolves_to_its_commit_and_every_files_hash(hub: HubStandin) -> None:
    files = small_model(256 << 10)
    locked = resolve(MODEL, "main")
    assert locked.commit == hub.repos[MODEL].refs["main"]
    assert {f.path: (f.size, f.sha256) for f in locked.files} == {
        path: (len(content), hashlib.sha256(content).hexdigest())
        for path, content in files.items()}
    paths = [r.path for r in hub.requests]
    assert any("/revision/main" in p for p in paths)
    # small files were downloaded at the commit, LFS files never (the Hub's sha256 is used)
    assert not any(r.host.startswith("127.0.0.2") for r in hub.requests)
    assert any(f"/resolve/{locked.commit}/config.json" in p for p in paths)


@pytest.mark.parametrize(("model", "revision", "said"), [
    ("acme/nothing", "main", "no such model"),
    (MODEL, "no-such-branch", "the Hub has no such revision"),
])
def test_the_hubs_refusals_are_bad_input(hub: HubStandin, model: str, revision: str,
                                         said: str) -> None:
    with pytest.raises(BadInput) as caught:
        resolve(model, revision)
    assert said in caught.value.message and f"{model}@{revision}" in caught.value.message


def test_a_gated_model_asks_for_a_token(hub: HubStandin) -> None:
    hub.repos[MODEL].gated = True
    with pytest.raises(BadInput, match="gated") as caught:
        resolve(MODEL, "main")
    assert "HF_TOKEN" in (caught.value.fix or "")


def test_an_unreachable_hub_is_named(tmp_path: Path, hub: HubStandin,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    result = run_kit("lock", pinned_spec(tmp_path))
    assert result.exit_code == 1, result.output
    assert "cannot reach http://127.0.0.1:9" in result.output
    assert not (tmp_path / "site" / "site.lock").exists()


def test_hf_token_reaches_the_hub_only_and_no_file(tmp_path: Path, hub: HubStandin,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    token = "hf_standinSecret0123456789"
    hub.token = token
    spec = pinned_spec(tmp_path)
    refused = run_kit("lock", spec)
    assert refused.exit_code == 2 and "HF_TOKEN" in refused.output
    monkeypatch.setenv("HF_TOKEN", token)
    assert run_kit("lock", spec).exit_code == 0
    assert run_kit("pull", spec).exit_code == 0
    hub_side = [r for r in hub.requests if r.host.startswith("127.0.0.1")]
    storage = [r for r in hub.requests if r.host.startswith("127.0.0.2")]
    assert storage and hub_side
    assert all(r.headers.get("authorization") == f"Bearer {token}" for r in hub_side[-3:])
    assert not any("authorization" in r.headers for r in storage)
    for root in (tmp_path / "site", pulled_folder(tmp_path)):
        assert not [p for p, content in tree(root).items() if token.encode() in content]
