"""Symbolic links in what kit checks (issue 42, item 12): kit verifies exactly what vLLM's container
reads. The container mounts models_root at /models (hf_cache at its own mount), so a link is
followed only when its target is relative and stays inside that tree; one that leaves it (absolute,
or `..` above the root) reads a file on the host the container never sees, and is refused naming the
link — by kit's own check of a pinned folder (`kit validate`, `up`), by the fetcher's check on a GPU
server (kit/dataplane/fetcher/weights_fetch.py: the same rule, shared through
kit/dataplane/fetcher/weights_hashes.py), and for a LoRA adapter (`kit validate`, `kit adapters
add`). Links that stay inside pass: a pinned file linked to a copy elsewhere under models_root, and
a Hugging Face cache snapshot (`snapshots/<commit>/<file>` → `../../blobs/<sha256>`)."""

import os
import shutil
from pathlib import Path

import pytest

import kit.commands.adapters
from kit.dataplane.fetcher.weights_fetch import differences
from kit.dataplane.fetcher.weights_hashes import HashCache, link_out_of
from kit.site import Site
from tests.support.adapters import write_adapter
from tests.support.cli import run_kit
from tests.support.fake_stack import up
from tests.support.hub_standin import HubStandin
from tests.support.lora_engine import LoraEngine
from tests.support.pinned_site import MODEL, locked_and_pulled, pulled_folder
from tests.support.sites import base_site, write_site

SHARD = "model-00001-of-00002.safetensors"


def test_the_rule(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (tmp_path / "outside").write_text("x")
    links = {"in": "a/b/f", "up-and-back": "a/../a/b/f", "dir": "a/b", "abs": str(root / "a"),
             "out": "../outside", "deep-out": "a/../../outside", "loop": "loop",
             "via-in-out": "in-out", "in-out": "out"}
    for name, target in links.items():
        (root / name).symlink_to(target)
    inside = ["in", "up-and-back", "dir/f", "a/b/f", "missing/file"]
    assert {path: link_out_of(root, path) for path in inside} == dict.fromkeys(inside)
    assert link_out_of(root, "abs/b/f") == str(root / "abs")  # absolute: another root there
    assert link_out_of(root, "out") == str(root / "out")
    assert link_out_of(root, "deep-out") == str(root / "deep-out")
    assert link_out_of(root, "loop") == str(root / "loop")
    assert link_out_of(root, "via-in-out") == str(root / "out")  # the link that leaves


def linked_out(folder: Path, outside: Path, relative: bool) -> Path:
    """A pulled shard replaced by a link to an identical copy outside models_root."""
    outside.mkdir(exist_ok=True)
    copy = outside / SHARD
    shutil.copy(folder / SHARD, copy)
    (folder / SHARD).unlink()
    (folder / SHARD).symlink_to(os.path.relpath(copy, folder) if relative else copy)
    return folder / SHARD


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_pinned_file_linked_out_of_models_root_is_refused_and_pull_repairs_it(
        tmp_path: Path, hub: HubStandin, relative: bool) -> None:
    spec = locked_and_pulled(tmp_path)
    folder = pulled_folder(tmp_path)
    link = linked_out(folder, tmp_path / "elsewhere", relative)
    for verb in ("validate", "up"):  # kit up refuses before it reaches any engine
        result = run_kit(verb, spec, env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
        assert result.exit_code == 2, result.output
        assert f"{link} is reached through the link {link} (to " in result.output
        assert f"which leads out of {tmp_path / 'models'}" in result.output
        assert "run `kit pull tiny`" in result.output
    # the fetcher on a GPU server says the same of the same folder (its own root: /models)
    found = differences(str(tmp_path / "models"), f"{MODEL}@main",
                        {SHARD: {"size": 0, "sha256": ""}}, HashCache(None))
    assert {"path": SHARD, "kind": "link_out", "link": f"{MODEL}@main/{SHARD}",
            "target": os.readlink(link)} in found
    pulled = run_kit("pull", spec)
    assert pulled.exit_code == 0, pulled.output
    assert not link.is_symlink() and link.is_file()
    assert run_kit("validate", spec).exit_code == 0


def test_a_link_inside_models_root_is_what_the_container_reads(tmp_path: Path,
                                                               hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    folder = pulled_folder(tmp_path)
    shared = tmp_path / "models" / "shared"
    linked_out(folder, shared, relative=True)  # ../../shared/<shard>: inside models_root
    assert run_kit("validate", spec).exit_code == 0
    found = differences(str(tmp_path / "models"), f"{MODEL}@main",
                        {SHARD: {"size": (shared / SHARD).stat().st_size, "sha256": ""}},
                        HashCache(None))
    assert {d["path"]: d["kind"] for d in found}[SHARD] == "sha256"  # read through the link


def test_a_pinned_folder_that_is_a_link_out_is_refused(tmp_path: Path, hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    folder = pulled_folder(tmp_path)
    os.rename(folder, tmp_path / "moved")
    folder.symlink_to(tmp_path / "moved")
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and f"is reached through the link {folder}" in result.output
    assert differences(str(tmp_path / "models"), f"{MODEL}@main", {}, HashCache(None)) == [
        {"path": ".", "kind": "link_out", "link": f"{MODEL}@main",
         "target": str(tmp_path / "moved")}]


# ----------------------------------------------------------------------------- adapters


def adapter_site(root: Path) -> Path:
    """The two-service site with adapters written under models_root and one outside it."""
    spec = write_site(root)
    write_adapter(root / "models" / "adapters" / "support", base="qwen", rank=8)
    write_adapter(root / "outside" / "evil", base="qwen", rank=8)
    return spec


def declared(spec: Path, path: str) -> Path:
    spec.write_text(spec.read_text().replace(
        "    gpus: [1, 2]\n",
        f"    gpus: [1, 2]\n    adapters:\n      - {{name: x, path: {path}}}\n"))
    return spec


OUT_LINKS = {
    "an absolute link to a folder": ("adapters/evil", lambda r: r / "outside" / "evil"),
    "a relative link to a folder": ("adapters/evil", lambda r: Path("../../outside/evil")),
    "a weights file linked out": ("adapters/evil/adapter_model.safetensors",
                                  lambda r: r / "outside" / "evil" / "adapter_model.safetensors"),
}


def plant(root: Path, case: str) -> Path:
    link, target = OUT_LINKS[case]
    path = root / "models" / link
    if path.name == "adapter_model.safetensors":
        write_adapter(path.parent, base="qwen", rank=8)
        path.unlink()
    path.symlink_to(target(root))
    return path


@pytest.mark.parametrize("case", OUT_LINKS)
def test_an_adapter_reached_through_a_link_out_is_refused_in_the_spec(tmp_path: Path,
                                                                     case: str) -> None:
    spec = declared(adapter_site(tmp_path), "adapters/evil")
    link = plant(tmp_path, case)
    result = run_kit("validate", spec)
    assert result.exit_code == 2, result.output
    assert f"adapters[0]: adapter x: {link} is reached through the link {link}" in \
        result.output, result.output
    assert "which leads out of" in result.output and "copy the adapter's files" in result.output


@pytest.mark.parametrize("case", OUT_LINKS)
def test_kit_adapters_add_refuses_a_link_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             case: str) -> None:
    spec = adapter_site(tmp_path)
    spec.write_text(spec.read_text().replace(
        "    gpus: [1, 2]\n", "    gpus: [1, 2]\n    adapters:\n"
        "      - {name: support, path: adapters/support}\n"))
    engine = LoraEngine()
    monkeypatch.setattr(kit.commands.adapters, "connect", lambda _: engine)
    up(Site.load(spec), engine)
    link = plant(tmp_path, case)
    before = spec.read_bytes()
    result = run_kit("adapters", "add", spec, "beta", "evil", "--path", "adapters/evil")
    assert result.exit_code == 2, result.output
    assert f"is reached through the link {link}" in result.output, result.output
    assert engine.posts == [] and spec.read_bytes() == before


def test_links_inside_the_mounted_trees_pass(tmp_path: Path) -> None:
    """An adapter folder linked to another under models_root, and a Hub adapter as
    huggingface_hub lays out its cache: each snapshot file a link into blobs/."""
    spec = adapter_site(tmp_path)
    (tmp_path / "models" / "adapters" / "alias").symlink_to("support")
    cache = tmp_path / "hf"
    repo = cache / "hub" / "models--org--support"
    commit = "a" * 40
    write_adapter(repo / "blobs-staging", base="qwen", rank=8)
    (repo / "blobs").mkdir()
    (repo / "snapshots" / commit).mkdir(parents=True)
    for file in sorted((repo / "blobs-staging").iterdir()):
        blob = repo / "blobs" / f"{file.name}.blob"
        file.rename(blob)
        (repo / "snapshots" / commit / file.name).symlink_to(f"../../blobs/{blob.name}")
    (repo / "blobs-staging").rmdir()
    spec.write_text(f"hf_cache: {cache}\n" + spec.read_text().replace(
        "    gpus: [1, 2]\n", "    gpus: [1, 2]\n    adapters:\n"
        "      - {name: alias, path: adapters/alias}\n"
        f"      - {{name: hub, path: org/support, revision: {commit}}}\n"))
    result = run_kit("validate", spec)
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------------------- unpinned folders


@pytest.mark.parametrize("how", ["folder absolute", "folder relative", "a file"])
def test_an_unpinned_model_folder_linked_out_is_refused(tmp_path: Path, how: str) -> None:
    """vLLM reads a plain model folder under /models too: the same rule for it and its files."""
    site = base_site(tmp_path)
    folder = tmp_path / "models" / "llama-8b"
    assert run_kit("validate", site / "site.yaml").exit_code == 0
    if how == "a file":
        (tmp_path / "elsewhere").mkdir()
        os.rename(folder / "config.json", tmp_path / "elsewhere" / "config.json")
        link = folder / "config.json"
        link.symlink_to(tmp_path / "elsewhere" / "config.json")
    else:
        os.rename(folder, tmp_path / "elsewhere")
        link = folder
        link.symlink_to("../elsewhere" if how == "folder relative" else tmp_path / "elsewhere")
    result = run_kit("validate", site / "site.yaml")
    assert result.exit_code == 2, result.output
    assert f"services[0].model: {link} is reached through the link {link}" in result.output
    assert "move or copy the model into" in result.output
    link.unlink()  # a link that stays inside models_root is what the container reads
    os.rename(tmp_path / "elsewhere", tmp_path / "models" / "real")
    if how == "a file":
        link.symlink_to("../real/config.json")
    else:
        link.symlink_to("real")
    assert run_kit("validate", site / "site.yaml").exit_code == 0
