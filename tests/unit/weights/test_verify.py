"""A pinned model's folder checked against the lock file before anything starts: the
corruption table (each refused with exit 2 by `kit validate` and by `kit up` before the engine
is reached, the file named, `kit pull` as the fix), and the hash cache that spares a re-up."""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import kit.dataplane.fetcher.weights_hashes
from kit.layout import SiteLayout
from kit.plan.host import load_spec
from kit.spec.problems import SpecError
from kit.weights.lock import read_lock
from kit.weights.verify import HashCache, check_folder
from tests.support.cli import run_kit
from tests.support.hub_standin import HubStandin, small_model, write_files
from tests.support.pinned_site import MODEL, locked_and_pulled, pulled_folder

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
POINTER = ("version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 262208\n")


def truncate(folder: Path) -> str:
    half = (folder / SHARD1).stat().st_size // 2
    with (folder / SHARD1).open("r+b") as shard:
        shard.truncate(half)
    return f"{SHARD1} has {half} bytes, truncated"


def flip_byte(folder: Path) -> str:
    shard = folder / SHARD2
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the mtime set back: still caught
    return f"{SHARD2} has sha256"


def missing_shard(folder: Path) -> str:
    (folder / SHARD2).unlink()
    return f"{SHARD2} is missing"


def extra_shard(folder: Path) -> str:
    shutil.copy(folder / SHARD2, folder / "model-00003-of-00003.safetensors")
    return "model-00003-of-00003.safetensors is not in the lock file"


def swapped(folder: Path) -> str:
    os.rename(folder / SHARD1, folder / "x")
    os.rename(folder / SHARD2, folder / SHARD1)
    os.rename(folder / "x", folder / SHARD2)
    return f"{SHARD1} has sha256"


def other_revision(folder: Path) -> str:
    write_files(folder, small_model(256 << 10, seed=7))  # another commit's files, same names
    return f"{SHARD1} has sha256"


def missing_index(folder: Path) -> str:
    (folder / INDEX).unlink()
    return f"{INDEX} is missing"


def lfs_pointer(folder: Path) -> str:
    (folder / SHARD1).write_text(POINTER.format("0" * 64))
    return f"{SHARD1} is a Git LFS pointer file"


CORRUPTIONS: list[Callable[[Path], str]] = [truncate, flip_byte, missing_shard, extra_shard,
                                            swapped, other_revision, missing_index, lfs_pointer]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda c: c.__name__)
def test_each_corruption_is_refused_naming_the_file(tmp_path: Path, hub: HubStandin,
                                                    corrupt: Callable[[Path], str]) -> None:
    spec = locked_and_pulled(tmp_path)
    assert run_kit("validate", spec).exit_code == 0
    expected = corrupt(pulled_folder(tmp_path))
    for verb in ("validate", "up"):  # kit up refuses before it reaches any engine
        result = run_kit(verb, spec, env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
        assert result.exit_code == 2, result.output
        assert expected in result.output and "services[0].model" in result.output
        assert "run `kit pull tiny`" in result.output
    assert not (spec.parent / "compose").exists()  # nothing rendered
    print(f"{corrupt.__name__}: {expected}")


def test_the_swap_is_named_as_one(tmp_path: Path, hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    swapped(pulled_folder(tmp_path))
    output = run_kit("validate", spec).output
    assert f"it holds {SHARD2}'s content: swapped files" in output


def test_a_revision_the_lock_does_not_pin_is_refused(tmp_path: Path, hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    commit = hub.add(MODEL, small_model(256 << 10, seed=9), branch="v2")
    spec.write_text(spec.read_text().replace("revision: main", f"revision: {commit}"))
    result = run_kit("validate", spec)
    assert result.exit_code == 2
    assert f"no entry for {MODEL}@{commit}" in result.output
    assert "services[0].revision" in result.output and "kit lock" in result.output


def test_a_pinned_model_not_pulled_yet_says_pull(tmp_path: Path, hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    shutil.rmtree(pulled_folder(tmp_path))
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert "does not exist (the model is not pulled)" in str(caught.value)


def test_a_reup_reads_no_file_again(tmp_path: Path, hub: HubStandin,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    spec = locked_and_pulled(tmp_path)
    layout = SiteLayout(spec.parent)
    reads: list[Path] = []
    real = kit.dataplane.fetcher.weights_hashes.file_sha256
    monkeypatch.setattr(kit.dataplane.fetcher.weights_hashes, "file_sha256",
                        lambda path: reads.append(path) or real(path))
    load_spec(spec)  # kit pull left the hashes in the cache
    assert reads == []
    layout.weights_hashes.unlink()
    load_spec(spec)
    assert len(reads) == 9  # cold: every file read once
    load_spec(spec)
    assert len(reads) == 9  # warm: none again
    shard = pulled_folder(tmp_path) / SHARD1
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    load_spec(spec)
    assert reads[9:] == [shard]  # only the file whose stat changed


def test_a_broken_cache_is_rebuilt(tmp_path: Path, hub: HubStandin) -> None:
    spec = locked_and_pulled(tmp_path)
    layout = SiteLayout(spec.parent)
    layout.weights_hashes.write_text("{not json")
    lock = read_lock(layout.lock_file)
    assert lock is not None
    folder = pulled_folder(tmp_path)
    assert check_folder(folder, lock[f"{MODEL}@main"], HashCache(layout.weights_hashes),
                        tmp_path / "models") == []
    assert json.loads(layout.weights_hashes.read_text())["version"] == 1
    assert oct(layout.weights_hashes.stat().st_mode & 0o777) == "0o600"
