"""`kit load` checks what a bundle would do before it does any of it (issue 42, items 4 and 11):
an image archive that would tag anything but the image the manifest names, declared sizes the
archive cannot hold, weights that do not fit on the disk, a manifest or lock nested 100,000 deep
are refused (exit 2 naming the member, nothing written, no image loaded); models the spec does
not pin are skipped (hashed with the rest, never unpacked, no lock entry)."""

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import kit.commands.bundle
import kit.commands.load
import kit.supply.bundle
from kit.spec.model import Images
from kit.supply.bundle import Manifest, Member
from tests.support.bundles import (
    IMAGES,
    bundle_for,
    fake_wheelhouse,
    members,
    server_site,
    tree_of,
    write_tar,
)
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine, saved_image
from tests.support.pinned_site import MODEL

VLLM, NGINX = Images().vllm, Images().nginx
VICTIM = {NGINX: "sha256:" + "9" * 64}  # what the server's engine already runs as nginx
NGINX_TAGS = json.dumps([{"Config": "x.json", "RepoTags": [NGINX], "Layers": []}]).encode()


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeEngine]:
    """The connected machine's engine (all images) and the server's (its own nginx)."""
    found = {"connected": FakeEngine(dict(IMAGES)), "server": FakeEngine(dict(VICTIM))}
    monkeypatch.setattr(kit.commands.bundle, "build_wheelhouse", fake_wheelhouse)
    monkeypatch.setattr(kit.commands.bundle, "connect", lambda _: found["connected"])
    monkeypatch.setattr(kit.commands.load, "connect", lambda _: found["server"])
    return found


def forged(bundle: Path, out: Path, member: str, data: bytes) -> Path:
    """`bundle` with `member` replaced by `data` and the manifest rewritten to agree (what a
    forger does; only --manifest-sha256 would catch the manifest itself)."""
    files = dict(members(bundle))
    files[member] = data
    manifest = json.loads(files["manifest.json"])
    for entry in manifest["members"]:
        if entry["name"] == member:
            entry["size"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    return write_tar(out, files)


def linked_image(links: dict[str, str], files: dict[str, bytes]) -> bytes:
    """An image archive holding symbolic links (name → target) and then regular files."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, target in links.items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


def global_header_image() -> bytes:
    """An image archive opened by a PAX global header (docker save never writes one)."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "x"}) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(NGINX_TAGS)
        tar.addfile(info, io.BytesIO(NGINX_TAGS))
    return archive.getvalue()


VLLM_ID = IMAGES[VLLM]
RETAGGING: dict[str, tuple[bytes, str]] = {
    "RepoTags adds another image's tag": (saved_image(VLLM_ID, [VLLM, NGINX]),
                                          f"would tag {NGINX} on the engine"),
    "RepoTags in the engine's full form": (
        saved_image(VLLM_ID, ["docker.io/library/nginx:1.27-alpine"]),
        "would tag docker.io/library/nginx:1.27-alpine"),
    "the legacy repositories file": (
        saved_image(VLLM_ID, [VLLM], {"repositories": b'{"nginx": {"1.27-alpine": "x"}}'}),
        f"would tag {NGINX}"),
    "an OCI index.json annotation": (
        saved_image(VLLM_ID, [VLLM], {"index.json": json.dumps({"manifests": [{"annotations": {
            "io.containerd.image.name": "docker.io/library/nginx:1.27-alpine"}}]}).encode()}),
        "would tag docker.io/library/nginx:1.27-alpine"),
    "manifest.json a link to a file naming another": (
        linked_image({"manifest.json": "other.json"}, {"other.json": NGINX_TAGS}),
        "manifest.json is not a regular file of at most 16 MB"),
    "manifest.json written through a linked folder": (
        linked_image({"up": "."}, {"up/manifest.json": NGINX_TAGS}),
        "up/manifest.json is written through a link"),
    "not an image archive": (b"\x00" * 700 + b"junk", "is not an image archive kit can check"),
    "a PAX global header (Python and Go read the names after it differently)": (
        global_header_image(), "it holds a PAX global header"),
    "a second archive after the end": (saved_image(VLLM_ID, [VLLM]) + saved_image(VLLM_ID, [NGINX]),
                                       "it holds data after its end"),
}


@pytest.mark.parametrize("case", RETAGGING)
def test_an_image_that_would_tag_another_is_refused_before_loading(
        tmp_path: Path, engines: dict[str, FakeEngine], case: str) -> None:
    bundle = bundle_for(tmp_path)
    assert dict(members(bundle))["images/00.tar"] == saved_image(VLLM_ID, [VLLM])  # vLLM's
    data, says = RETAGGING[case]
    bad = forged(bundle, tmp_path / "bad.tar", "images/00.tar", data)
    spec = server_site(tmp_path)
    before = tree_of(tmp_path / "server")
    refused = run_kit("load", bad, spec)
    assert refused.exit_code == 2, refused.output
    assert "images/00.tar" in refused.output and says in refused.output, refused.output
    assert "nothing was loaded" in refused.output
    assert engines["server"].images == VICTIM  # its nginx still the one it ran
    assert "load_images" not in [call[0] for call in engines["server"].calls]
    assert tree_of(tmp_path / "server") == before


def test_an_image_under_its_own_name_in_any_form_loads(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    """The engine's full form of the manifest's own reference is that reference."""
    bundle = bundle_for(tmp_path)
    full = saved_image(VLLM_ID, [VLLM], {"index.json": json.dumps({"manifests": [
        {"annotations": {"io.containerd.image.name": f"docker.io/{VLLM}",
                         "org.opencontainers.image.ref.name": "v0.33.0"}}]}).encode()})
    good = forged(bundle, tmp_path / "good.tar", "images/00.tar", full)
    loaded = run_kit("load", good, server_site(tmp_path))
    assert loaded.exit_code == 0, loaded.output
    assert engines["server"].images == {**VICTIM, **IMAGES}


def sparse_bundle(root: Path, declared: int) -> Path:
    """A bundle of a few KB whose manifest declares a weights member of `declared` bytes,
    stored as a GNU sparse member (a hole: the tar holds almost nothing of it)."""
    work = root / "sparse"
    shard = work / f"weights/{MODEL}@main/model.safetensors"
    shard.parent.mkdir(parents=True)
    with shard.open("wb") as stream:
        stream.truncate(declared)
    lock = (f"version: 1\nmodels:\n  {MODEL}@main:\n    model: {MODEL}\n    revision: main\n"
            f"    commit: {'c' * 40}\n    files:\n    - path: model.safetensors\n"
            f"      size: {declared}\n      sha256: {'0' * 64}\n").encode()
    (work / "site.lock").write_bytes(lock)
    manifest = Manifest("pin01", "0", (
        Member("site.lock", len(lock), hashlib.sha256(lock).hexdigest()),
        Member(f"weights/{MODEL}@main/model.safetensors", declared, "0" * 64)), (), (
        f"{MODEL}@main",))
    (work / "manifest.json").write_bytes(manifest.text())
    out = root / "sparse.tar"
    subprocess.run(["tar", "--format=gnu", "--sparse", "-cf", out, "-C", work, "manifest.json",
                    "site.lock", f"weights/{MODEL}@main/model.safetensors"], check=True)
    return out


def test_declared_sizes_the_archive_cannot_hold_are_refused_before_writing(
        tmp_path: Path, engines: dict[str, FakeEngine]) -> None:
    bundle = sparse_bundle(tmp_path, 256 << 20)
    assert bundle.stat().st_size < 64 << 10
    spec = server_site(tmp_path)
    before = tree_of(tmp_path / "server")
    refused = run_kit("load", bundle, spec)
    assert refused.exit_code == 2, refused.output
    assert "manifest.json declares 268,4" in refused.output  # 256 MiB and two headers
    assert f"the archive is {bundle.stat().st_size:,} bytes" in refused.output
    assert tree_of(tmp_path / "server") == before


def test_weights_that_do_not_fit_the_disk_are_refused_before_writing(
        tmp_path: Path, engines: dict[str, FakeEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = bundle_for(tmp_path)
    spec = server_site(tmp_path)
    before = tree_of(tmp_path / "server")
    small = shutil._ntuple_diskusage(10 << 30, 10 << 30, 1000)  # type: ignore[attr-defined]
    monkeypatch.setattr(kit.supply.bundle.shutil, "disk_usage", lambda _: small)
    refused = run_kit("load", bundle, spec)
    assert refused.exit_code == 2, refused.output
    assert f"under {tmp_path / 'server' / 'models'}, which has 1,000 free" in refused.output
    assert "nothing was loaded" in refused.output and "free space" in refused.output
    assert tree_of(tmp_path / "server") == before
    assert engines["server"].images == VICTIM


def test_models_the_spec_does_not_pin_are_skipped(tmp_path: Path,
                                                  engines: dict[str, FakeEngine]) -> None:
    bundle = bundle_for(tmp_path)
    spec = server_site(tmp_path)
    spec.write_text(spec.read_text().replace("    revision: main\n", "").replace(
        f"model: {MODEL}", "model: tiny"))
    (tmp_path / "server" / "models" / "tiny").mkdir()
    loaded = run_kit("load", bundle, spec)
    assert loaded.exit_code == 0, loaded.output
    assert f"skipped {MODEL}@main (the spec does not pin it" in loaded.output
    assert sorted(p.name for p in (tmp_path / "server" / "models").iterdir()) == ["tiny"]
    assert not (spec.parent / "site.lock").exists()
    assert engines["server"].images == {**VICTIM, **IMAGES}


def deep(_: bytes) -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


def conflicted(lock: bytes) -> bytes:
    return b"<<<<<<< HEAD\n" + lock + b"=======\n>>>>>>> theirs\n"


NESTED: dict[str, tuple[str, Callable[[bytes], bytes], str]] = {
    "a manifest 100,000 levels deep": ("manifest.json", deep, "manifest.json is not a kit "
                                       "bundle manifest (nested deeper than Python reads)"),
    "a lock 100,000 levels deep": ("site.lock", deep, "site.lock:1:17: invalid YAML: nested "
                                   "deeper than 16 levels"),
    "a lock with a merge conflict": ("site.lock", conflicted, "site.lock:1:1: a git merge "
                                     "conflict marker"),
    "a lock with a python tag": ("site.lock", lambda t: b"x: !!python/name:os.system ''\n" + t,
                                 "site.lock:1:4: invalid YAML: could not determine a "
                                 "constructor"),
}


@pytest.mark.parametrize("case", NESTED)
def test_a_hostile_manifest_or_lock_is_refused_naming_it(
        tmp_path: Path, engines: dict[str, FakeEngine], case: str) -> None:
    bundle = bundle_for(tmp_path)
    member, change, says = NESTED[case]
    files = dict(members(bundle))
    if member == "manifest.json":
        bad = write_tar(tmp_path / "bad.tar", {**files, member: change(files[member])})
    else:
        bad = forged(bundle, tmp_path / "bad.tar", member, change(files[member]))
    spec = server_site(tmp_path)
    before = tree_of(tmp_path / "server")
    refused = run_kit("load", bad, spec)
    assert refused.exit_code == 2, refused.output
    assert f"{bad}: {says}" in refused.output, refused.output
    assert "nothing was loaded" in refused.output
    assert tree_of(tmp_path / "server") == before
    assert engines["server"].images == VICTIM
