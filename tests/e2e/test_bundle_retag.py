"""`kit load` on a real engine cannot re-point a tag the bundle's manifest does not name (issue
42, item 4): the vLLM image member of a real bundle is the engine's own `docker save` with one
more entry in its `RepoTags` — another image's tag on this engine, made for the test — and the
manifest is rewritten to agree (no `--manifest-sha256`, as a forger would hope). `docker load`
would move that tag; kit refuses before loading anything and the tag still names its image."""

import hashlib
import io
import json
import secrets
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.support.live_stack import LiveSite, checked, kit

pytestmark = pytest.mark.e2e


def with_extra_tag(image: Path, out: Path, tag: str) -> None:
    """The `docker save` archive `image` with `tag` added to its manifest.json's RepoTags."""
    with tarfile.open(image) as source, tarfile.open(out, "w") as target:
        for info in source:
            data = source.extractfile(info) if info.isreg() else None
            if info.name == "manifest.json":
                manifest = json.load(data)  # type: ignore[arg-type]
                manifest[0]["RepoTags"].append(tag)
                text = json.dumps(manifest).encode()
                info.size = len(text)
                data = io.BytesIO(text)
            target.addfile(info, data)


def forged(bundle: Path, work: Path, member: str, tag: str) -> Path:
    """`bundle` with `member` re-tagging `tag`, its manifest entry rewritten to agree."""
    work.mkdir()
    with tarfile.open(bundle) as tar:
        tar.extractall(work, filter="data")
    with_extra_tag(work / member, work / "changed.tar", tag)
    shutil.move(work / "changed.tar", work / member)
    manifest = json.loads((work / "manifest.json").read_text())
    for entry in manifest["members"]:
        if entry["name"] == member:
            data = (work / member).read_bytes()
            entry["size"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (work / "manifest.json").write_text(json.dumps(manifest))
    out = work.parent / "forged.tar"
    with tarfile.open(out, "w") as tar:  # the manifest first, the members in its order
        tar.add(work / "manifest.json", "manifest.json")
        for entry in manifest["members"]:
            tar.add(work / entry["name"], entry["name"])
    return out


def test_a_bundle_cannot_retag_another_image_on_the_engine(
        tmp_path: Path, docker_client, test_images, free_port) -> None:
    victim = f"kit-test/retag-victim-{secrets.token_hex(3)}:v1"
    docker_client.images.get(test_images["nginx_debian"]).tag(victim)
    victim_id = docker_client.images.get(victim).id
    try:
        site = LiveSite.create(tmp_path / "site", docker_client, free_port(), free_port())
        bundle = tmp_path / "bundle.tar"
        checked(kit("bundle", str(site.spec_path), "--out", str(bundle), "--without-kit",
                    timeout=600))
        with tarfile.open(bundle) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        vllm = next(i for i in manifest["images"] if i["ref"] == test_images["vllm"])
        bad = forged(bundle, tmp_path / "work", vllm["member"], victim)
        refused = kit("load", str(bad), str(site.spec_path))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        said = refused.stdout + refused.stderr
        assert f"{vllm['member']} would tag {victim} on the engine" in said, said
        assert "nothing was loaded" in said
        assert docker_client.images.get(victim).id == victim_id  # still its own image
    finally:
        docker_client.images.remove(victim, noprune=True)  # only the tag this test made
