"""The hash cache's rules (kit/dataplane/fetcher/weights_hashes.py), the one definition kit's own
check and the fetcher on a GPU server share: an entry is trusted only while the file's stat (size,
mtime, ctime, inode) is the one it was hashed with and the entry has the right shape; anything else
costs reading the file again, never a pass. The file is written whole or not at all."""

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.dataplane.fetcher.weights_hashes import HashCache, hash_files


def cached_file(tmp_path: Path) -> tuple[Path, Path, str]:
    """A file hashed once and its cache saved: (the file, the cache, its sha256)."""
    shard = tmp_path / "model" / "shard.safetensors"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(os.urandom(4096))
    cache_file = tmp_path / "state" / "weights-hashes.json"
    cache = HashCache(cache_file)
    sha = hash_files([shard], cache)[shard]
    cache.save()
    time.sleep(0.05)  # a later clock tick: what the test does next moves the ctime
    return shard, cache_file, sha


def read_again(shard: Path, cache_file: Path, sha: str) -> int:
    """Files read to hash `shard` with the saved cache (the sha256 must be right either way)."""
    cache = HashCache(cache_file)
    assert hash_files([str(shard)], cache) == {str(shard): sha}  # the fetcher passes str
    return cache.hashed


BROKEN: dict[str, Callable[[list], object]] = {
    "another version": lambda entry: {"version": 2, "files": {"P": entry}},
    "files not a mapping": lambda entry: {"version": 1, "files": [entry]},
    "an entry not a list": lambda entry: {"version": 1, "files": {"P": {"sha256": entry[-1]}}},
    "an entry too short": lambda entry: {"version": 1, "files": {"P": entry[1:]}},
    "the stat as text": lambda entry: {"version": 1, "files": {"P": [str(v) for v in entry]}},
    "a sha256 not hex": lambda entry: {"version": 1, "files": {"P": [*entry[:-1], "Z" * 64]}},
    "a sha256 cut short": lambda entry: {"version": 1, "files": {"P": [*entry[:-1], "ab"]}},
}


@pytest.mark.parametrize("kind", [*BROKEN, "not JSON", "a list", "empty"])
def test_a_cache_it_cannot_trust_is_read_as_empty(tmp_path: Path, kind: str) -> None:
    shard, cache_file, sha = cached_file(tmp_path)
    assert read_again(shard, cache_file, sha) == 0
    entry = json.loads(cache_file.read_text())["files"][str(shard)]
    if kind in BROKEN:
        text = json.dumps(BROKEN[kind](entry)).replace('"P"', json.dumps(str(shard)))
        cache_file.write_text(text)
    else:
        cache_file.write_bytes({"not JSON": b"{not json", "a list": b"[]", "empty": b""}[kind])
    assert read_again(shard, cache_file, sha) == 1


def test_any_change_of_the_stat_is_read_again(tmp_path: Path) -> None:
    shard, cache_file, sha = cached_file(tmp_path)
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # the mtime
    assert read_again(shard, cache_file, sha) == 1
    shard, cache_file, sha = cached_file(tmp_path / "b")
    stat = shard.stat()
    shard.write_bytes(shard.read_bytes())  # rewritten, then `touch -d` sets the mtime back:
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the ctime still moved
    assert shard.stat().st_mtime_ns == stat.st_mtime_ns
    assert read_again(shard, cache_file, sha) == 1
    shard, cache_file, sha = cached_file(tmp_path / "c")
    copy = shard.with_name("copy")
    shutil.copy2(shard, copy)  # the same size and mtime, another inode
    os.replace(copy, shard)
    assert read_again(shard, cache_file, sha) == 1


def test_the_cache_is_written_whole_only_when_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard, cache_file, sha = cached_file(tmp_path)
    written = cache_file.read_bytes()
    cache = HashCache(cache_file)
    hash_files([shard], cache)
    cache_file.unlink()
    cache.save()  # nothing new: nothing written
    assert not cache_file.exists()
    cache_file.write_bytes(written)
    os.utime(shard)  # a new stat: the entry changes
    cache = HashCache(cache_file)
    hash_files([shard], cache)

    def refused(*args: object) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(os, "replace", refused)
    cache.save()  # a cache it cannot write costs a re-hash next time, never an error
    assert cache_file.read_bytes() == written
    assert sorted(p.name for p in cache_file.parent.iterdir()) == [cache_file.name]
    monkeypatch.undo()
    cache.save()
    assert cache_file.read_bytes() != written
    assert oct(cache_file.stat().st_mode & 0o777) == "0o600"
    blocked = HashCache(tmp_path / "a-file" / "weights-hashes.json")
    (tmp_path / "a-file").write_text("")
    hash_files([shard], blocked)
    blocked.save()  # its folder is a file: nothing written, no error
    assert (tmp_path / "a-file").read_text() == ""
