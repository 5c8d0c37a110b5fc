"""A pinned model's folder checked against the lock file: every locked file there with its size
and sha256, nothing else. Files are hashed in parallel (hashlib releases the GIL while it
hashes) and each result is cached by (path, size, mtime, ctime, inode) in the site's state
folder, so a re-up stats the files instead of reading them again (docs/weights.md has figures).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kit.files import atomic_write
from kit.weights.lock import LockedFile, LockedModel

CHUNK = 8 << 20  # large reads: the hash, not the system calls, sets the pace
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
MAX_POINTER_BYTES = 1024
CACHE_VERSION = 1


@dataclass(frozen=True)
class FileProblem:
    path: str  # relative to the model's folder
    message: str


def hash_workers() -> int:
    """Threads that hash at once: one per CPU, at least two (reads overlap the hashing)."""
    return max(2, min(16, os.cpu_count() or 2))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as stream:
        while count := stream.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


class HashCache:
    """sha256 of files by what stat says of them; any change of size, mtime, ctime (a rename,
    a chmod, a write with the mtime set back) or inode makes kit read the file again."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.changed = False
        if path is not None:
            try:
                document = json.loads(path.read_text())
                if document.get("version") == CACHE_VERSION:
                    self.entries = dict(document.get("files") or {})
            except (OSError, ValueError, AttributeError):
                self.entries = {}  # a cache only: a broken one is rebuilt by hashing

    @staticmethod
    def _key(stat: os.stat_result) -> list:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]

    def get(self, path: Path, stat: os.stat_result) -> str | None:
        entry = self.entries.get(str(path))
        if entry and entry[:-1] == self._key(stat):
            return str(entry[-1])
        return None

    def put(self, path: Path, stat: os.stat_result, sha256: str) -> None:
        self.entries[str(path)] = [*self._key(stat), sha256]
        self.changed = True

    def moved(self, old: Path, new: Path) -> None:
        """A folder renamed: its files keep their stat, so their hashes carry over."""
        prefix = f"{old}{os.sep}"
        for path in [p for p in self.entries if p.startswith(prefix)]:
            self.entries[f"{new}{os.sep}{path[len(prefix):]}"] = self.entries.pop(path)
            self.changed = True

    def save(self) -> None:
        """Kept when it can be: a state folder kit cannot write only costs a re-hash."""
        if self.path is None or not self.changed:
            return
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(
                {"version": CACHE_VERSION, "files": self.entries}, sort_keys=True).encode(),
                mode=0o600)
            self.changed = False
        except OSError:
            pass


def hash_files(paths: Iterable[Path], cache: HashCache) -> dict[Path, str]:
    """sha256 of each file, from the cache when its stat is unchanged, else read in parallel."""
    result: dict[Path, str] = {}
    todo: list[tuple[Path, os.stat_result]] = []
    for path in paths:
        stat = path.stat()
        cached = cache.get(path, stat)
        if cached is None:
            todo.append((path, stat))
        else:
            result[path] = cached
    # the largest first, so one big file does not start last and set the wall time
    todo.sort(key=lambda item: -item[1].st_size)
    with ThreadPoolExecutor(hash_workers()) as pool:
        for (path, stat), sha in zip(todo, pool.map(lambda item: file_sha256(item[0]), todo),
                                     strict=True):
            result[path] = sha
            if path.stat().st_mtime_ns == stat.st_mtime_ns:  # not changed while read
                cache.put(path, stat, sha)
    return result


def folder_files(folder: Path) -> dict[str, Path]:
    """Every file under `folder` by its '/'-separated relative path (symlinked folders are
    not walked: a model folder holds files)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files + [d for d in dirs if Path(root, d).is_symlink()]:
            path = Path(root, name)
            found[path.relative_to(folder).as_posix()] = path
    return found


def check_folder(folder: Path, locked: LockedModel, cache: HashCache) -> list[FileProblem]:
    """What differs between `folder` and the lock entry, one problem per file, by path."""
    if not folder.is_dir():
        return [FileProblem(".", f"{folder} does not exist (the model is not pulled)")]
    present = folder_files(folder)
    expected = {f.path: f for f in locked.files}
    problems = [FileProblem(path, f"{folder / path} is missing ({_expected(f)})")
                for path, f in expected.items() if path not in present]
    problems += [FileProblem(path, f"{folder / path} is not in the lock file (a stale or "
                             "foreign file; vLLM may load it)")
                 for path in present if path not in expected]
    to_hash = {}
    for path, f in expected.items():
        if path not in present:
            continue
        local = present[path]
        if not local.is_file():
            problems.append(FileProblem(path, f"{local} is not a regular file"))
            continue
        size = local.stat().st_size
        if size != f.size:
            problems.append(FileProblem(path, _size_problem(local, size, f)))
        else:
            to_hash[local] = f
    by_sha = {f.sha256: f.path for f in locked.files}
    for local, sha in hash_files(to_hash, cache).items():
        f = to_hash[local]
        if sha != f.sha256:
            other = by_sha.get(sha)
            what = f" (it holds {other}'s content: swapped files)" if other else ""
            problems.append(FileProblem(
                f.path, f"{local} has sha256 {sha[:12]}…, the lock file says {f.sha256[:12]}…"
                f"{what}"))
    cache.save()
    return sorted(problems, key=lambda p: p.path)


def _expected(f: LockedFile) -> str:
    return f"the lock file says {f.size} bytes, sha256 {f.sha256[:12]}…"


def _size_problem(local: Path, size: int, f: LockedFile) -> str:
    if size <= MAX_POINTER_BYTES:
        with local.open("rb") as stream:
            if stream.read(len(LFS_POINTER)) == LFS_POINTER:
                return (f"{local} is a Git LFS pointer file ({size} bytes), not the file "
                        f"({_expected(f)}): it was cloned without git-lfs")
    shape = "truncated" if size < f.size else "longer than locked"
    return f"{local} has {size} bytes, {shape} ({_expected(f)})"
