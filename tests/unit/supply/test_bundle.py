"""`kit bundle` and `kit load` on the fake engine: a site's images, its pinned model and its lock
file carried in one archive, verified whole before anything is used; every tampered, truncated
or hostile bundle refused (exit 2, the member named) with nothing written."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

import kit.commands.bundle
import kit.commands.load
from kit.supply.bundle import BundledImage, Manifest, Member, needed_images
from kit.weights.lock import read_lock
from tests.support.bundles import (
    IMAGES,
    bundle_for,
    fake_wheelhouse,
    members,
    rewrite,
    server_site,
    tree_of,
    write_tar,
)
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine
from tests.support.pinned_site import MODEL

SHARD = f"weights/{MODEL}@main/model-00001-of-00002.safetensors"


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeEngine]:
    """The connected machine's engine (all images) and the server's (none)."""
    found = {"connected": FakeEngine(dict(IMAGES)), "server": FakeEngine()}
    monkeypatch.setattr(kit.commands.bundle, "build_wheelhouse", fake_wheelhouse)
    monkeypatch.setattr(kit.commands.bundle, "connect", lambda _: found["connected"])
    monkeypatch.setattr(kit.commands.load, "connect", lambda _: found["server"])
    return found


def test_bundle_then_load_places_verified_weights_and_images(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    bundle = bundle_for(tmp_path)
    names = [name for name, _ in members(bundle)]
    assert names[0] == "manifest.json"
    assert {"site.lock", "wheels/kit-0.1.0-py3-none-any.whl", "wheels/requirements.txt",
            "images/00.tar", "images/01.tar", SHARD} <= set(names)
    manifest = json.loads(dict(members(bundle))["manifest.json"])
    assert {m["name"] for m in manifest["members"]} == set(names) - {"manifest.json"}
    for member in manifest["members"]:  # every sha256 is the member's
        assert hashlib.sha256(dict(members(bundle))[member["name"]]).hexdigest() == \
            member["sha256"]
    spec = server_site(tmp_path)
    loaded = run_kit("load", bundle, spec)
    assert loaded.exit_code == 0, loaded.output
    folder = tmp_path / "server" / "models" / f"{MODEL}@main"
    assert f"placed {MODEL}@main (verified against site.lock)" in loaded.output
    assert engines["server"].images == dict(IMAGES)
    assert read_lock(spec.parent / "site.lock") == read_lock(tmp_path / "site" / "site.lock")
    assert tree_of(folder) == tree_of(tmp_path / "models" / f"{MODEL}@main")
    assert "pip install --no-index --find-links" in loaded.output
    assert "--require-hashes" in loaded.output
    assert (spec.parent / "kit-wheels" / "kit-0.1.0-py3-none-any.whl").is_file()
    assert run_kit("validate", spec).exit_code == 0  # kit up's checks pass, from the cache
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny@main"]  # no staging left
    again = run_kit("load", bundle, spec)
    assert f"kept {MODEL}@main (already there and verified)" in again.output


def test_bundle_refuses_unverified_weights_and_missing_images(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    bundle_for(tmp_path)
    shard = tmp_path / "models" / f"{MODEL}@main" / "model-00001-of-00002.safetensors"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-1])
    refused = run_kit("bundle", tmp_path / "site" / "site.yaml", "--out", tmp_path / "b2.tar",
                      "--without-kit")
    assert refused.exit_code == 2
    assert "model-00001-of-00002.safetensors has" in refused.output and "kit pull" in \
        refused.output
    assert not (tmp_path / "b2.tar").exists()
    shard.write_bytes(whole)
    engines["connected"].images.pop("nginx:1.27-alpine")
    refused = run_kit("bundle", tmp_path / "site" / "site.yaml", "--out", tmp_path / "b2.tar")
    assert refused.exit_code == 2 and "nginx:1.27-alpine" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _flip(data: bytes) -> bytes:
    return data[:50] + bytes([data[50] ^ 1]) + data[51:]


TAMPERED = {
    "a flipped byte in a shard": (lambda m: {**m, SHARD: _flip(m[SHARD])}, SHARD),
    "a flipped byte in an image": (lambda m: {**m, "images/01.tar": _flip(m["images/01.tar"])},
                                   "images/01.tar"),
    "a changed wheel": (lambda m: {**m, "wheels/kit-0.1.0-py3-none-any.whl": b"evil"},
                        "wheels/kit-0.1.0-py3-none-any.whl"),
    "a member left out": (lambda m: {k: v for k, v in m.items() if k != SHARD}, SHARD),
    "a member added": (lambda m: {**m, "weights/acme/tiny@main/extra.py": b"x"},
                       "weights/acme/tiny@main/extra.py"),
    "the manifest not first": (lambda m: {"site.lock": m["site.lock"], **m}, "manifest.json"),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_bundle_is_refused_with_nothing_written(
        tmp_path: Path, engines: dict[str, FakeEngine], case: str) -> None:
    bundle = bundle_for(tmp_path)
    change, member = TAMPERED[case]
    bad = rewrite(bundle, tmp_path / "bad.tar", change)
    spec = server_site(tmp_path)
    before = tree_of(tmp_path / "server")
    refused = run_kit("load", bad, spec)
    assert refused.exit_code == 2, refused.output
    assert member in refused.output and "nothing was loaded" in refused.output
    assert tree_of(tmp_path / "server") == before
    assert engines["server"].images == {}


def test_a_manifest_that_agrees_with_changed_weights_is_caught_by_the_lock(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    """A forger who rewrites the manifest too: the weights must still match the bundle's lock
    (and the lock here, when the server has one), and --manifest-sha256 pins the manifest."""
    bundle = bundle_for(tmp_path)
    original = dict(members(bundle))

    def forge(files: dict[str, bytes]) -> dict[str, bytes]:
        files = {**files, SHARD: _flip(files[SHARD])}
        manifest = json.loads(files["manifest.json"])
        for entry in manifest["members"]:
            entry["sha256"] = hashlib.sha256(files[entry["name"]]).hexdigest()
        return {**files, "manifest.json": json.dumps(manifest).encode()}

    bad = rewrite(bundle, tmp_path / "bad.tar", forge)
    spec = server_site(tmp_path)
    refused = run_kit("load", bad, spec)
    assert refused.exit_code == 2 and f"weights/{MODEL}@main" in refused.output
    assert "site.lock entry" in refused.output
    good_sha = hashlib.sha256(original["manifest.json"]).hexdigest()
    refused = run_kit("load", bad, spec, "--manifest-sha256", good_sha)
    assert refused.exit_code == 2 and "--manifest-sha256" in refused.output
    assert run_kit("load", bundle, spec, "--manifest-sha256", good_sha).exit_code == 0


def test_a_lock_here_that_pins_other_files_wins(tmp_path: Path,
                                                engines: dict[str, FakeEngine]) -> None:
    bundle = bundle_for(tmp_path)
    spec = server_site(tmp_path)
    text = (tmp_path / "site" / "site.lock").read_text()
    (spec.parent / "site.lock").write_text(text.replace("commit: c", "commit: d", 1))
    refused = run_kit("load", bundle, spec)
    assert refused.exit_code == 2 and f"pins {MODEL}@main at commit d" in refused.output
    assert engines["server"].images == {}


HOSTILE = {
    "a path out of the folder": "weights/acme/tiny@main/../../../etc/passwd",
    "an absolute path": "/etc/passwd",
    "an unknown folder": "scripts/run.sh",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_member_name_is_refused(tmp_path: Path, engines: dict[str, FakeEngine],
                                          case: str) -> None:
    name = HOSTILE[case]
    manifest = Manifest("s", "0", (Member(name, 1, "0" * 64), Member("site.lock", 1, "0" * 64)),
                        (), ("acme/tiny@main",))
    bad = write_tar(tmp_path / "hostile.tar", {"manifest.json": manifest.text(), name: b"x"})
    spec = server_site(tmp_path)
    refused = run_kit("load", bad, spec)
    assert refused.exit_code == 2 and "not a name a kit bundle holds" in refused.output


def test_a_model_key_out_of_models_root_is_refused(tmp_path: Path,
                                                   engines: dict[str, FakeEngine]) -> None:
    name = "weights/../../outside@main/config.json"
    manifest = Manifest("s", "0", (Member(name, 1, "0" * 64), Member("site.lock", 1, "0" * 64)),
                        (), ("../../outside@main",))
    bad = write_tar(tmp_path / "hostile.tar", {"manifest.json": manifest.text(), name: b"x"})
    refused = run_kit("load", bad, server_site(tmp_path))
    assert refused.exit_code == 2 and "is not org/name@revision" in refused.output
    assert not (tmp_path / "outside@main").exists()


def test_a_link_member_is_refused(tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    name = "wheels/kit-0.1.0-py3-none-any.whl"
    manifest = Manifest("s", "0", (Member(name, 0, hashlib.sha256(b"").hexdigest()),), (), ())
    bad = tmp_path / "link.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest.text())
        tar.addfile(info, io.BytesIO(manifest.text()))
        link = tarfile.TarInfo(name)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
    refused = run_kit("load", bad, server_site(tmp_path))
    assert refused.exit_code == 2 and f"{name} is not a regular file" in refused.output


def test_weights_are_not_sent_through_a_remote_engine(tmp_path: Path,
                                                     engines: dict[str, FakeEngine]) -> None:
    bundle = bundle_for(tmp_path)
    engines["server"] = FakeEngine(local=False)
    refused = run_kit("load", bundle, server_site(tmp_path))
    assert refused.exit_code == 2 and "remote engine" in refused.output


def test_needed_images_follow_the_spec() -> None:
    from kit.spec.load import parse_spec
    from tests.support.sites import BASE_SPEC

    text = BASE_SPEC.format(models_root="/srv/models") + "observability: {enabled: true}\n"
    spec = parse_spec(text, Path("site.yaml"))
    assert needed_images(spec) == [spec.images.vllm, spec.images.nginx,
                                   spec.images.prometheus, spec.images.grafana]
    assert BundledImage("images/00.tar", "a", "b").ref == "a"


def test_a_bundle_without_weights_loads_its_images_through_a_remote_engine(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    """An unpinned site's bundle (images and kit's wheels): `kit load` on the operator's
    machine sends the images through the server's engine (`engine: ssh://…`)."""
    spec = server_site(tmp_path)
    spec.write_text(spec.read_text().replace("    revision: main\n", "").replace(
        f"model: {MODEL}", "model: tiny"))
    (tmp_path / "server" / "models" / "tiny").mkdir()
    bundle = tmp_path / "images.tar"
    made = run_kit("bundle", spec, "--out", bundle)
    assert made.exit_code == 0, made.output
    assert "0 pinned model(s)" in made.output
    assert "site.lock" not in [name for name, _ in members(bundle)]
    engines["server"] = FakeEngine(local=False)
    loaded = run_kit("load", bundle, spec)
    assert loaded.exit_code == 0, loaded.output
    assert engines["server"].images == dict(IMAGES)
    assert not (spec.parent / "site.lock").exists()
