"""The sha256 of model files, hashed in parallel and cached by what stat says of each file: the
one definition of the hash cache's format and rules, for kit's own check of a pinned folder
(kit.weights.verify: `<site>/.kit/weights-hashes.json`) and for kit's fetcher on a GPU server
(kit/dataplane/fetcher/weights_fetch.py, copied into its container beside it: the cache lives in the
site's `kit-weights-hashes` volume there, docs/weights.md), so both trust and write it alike.

Also the one rule for symbolic links in what a container reads (`link_out_of`): kit verifies
on the host a tree the container sees mounted elsewhere (models_root at /models, hf_cache at its
own mount), so a link is followed only if the container would reach the same file through it:
its target relative and staying inside that tree. An absolute target, or one that climbs out
with `..`, reads another file on the host than in the container (where it dangles, or names
what the container has there), and is refused naming the link. Hugging Face cache snapshots
(`snapshots/<commit>/<file>` → `../../blobs/<sha256>`) stay inside and pass.

Standard library only: it runs with the python3 of the vLLM image.

The cache maps a file's path to its stat (size, mtime, ctime, inode) and sha256. An entry is
used only when all four still match: a write changes the mtime and the ctime, a write with the
mtime set back (`touch -d`) still changes the ctime, a file renamed or copied in place has
another inode or ctime. A cache that cannot be read, parsed or written, or an entry of the
wrong shape, only costs reading the file again: it never passes a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

CHUNK = 8 << 20  # large reads: the hash, not the system calls, sets the pace
CACHE_VERSION = 1
SHA256 = re.compile(r"[0-9a-f]{64}")
StrPath = TypeVar("StrPath", bound="str | os.PathLike[str]")  # str in the fetcher, Path in kit


MAX_LINKS = 40  # as Linux: more links on one path is a loop


def link_out_of(root: str | os.PathLike[str], relative: str) -> str | None:
    """The first symbolic link on the way from `root` to `root/relative` that a container
    mounting `root` elsewhere would not follow to the same file (an absolute target, one that
    leaves `root`, a loop), as its host path; None when the whole way stays inside `root`."""
    pending = [part for part in relative.split("/") if part not in ("", ".")]
    inside: list[str] = []  # the components resolved so far, none of them a link
    followed = 0
    link = None
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not inside:
                return link or os.path.join(root, relative)
            inside.pop()
            continue
        here = os.path.join(root, *inside, part)
        if not os.path.islink(here):
            inside.append(part)
            continue
        followed += 1
        target = os.readlink(here)
        if followed > MAX_LINKS or os.path.isabs(target):
            return here
        link = here
        pending = [p for p in target.split("/") if p not in ("", ".")] + pending
    return None


def hash_workers() -> int:
    """Threads that hash at once: one per CPU, at least two (reads overlap the hashing)."""
    return max(2, min(16, os.cpu_count() or 2))


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as stream:
        while count := stream.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


class HashCache:
    """sha256 of files by what stat says of them (the module's docstring has the rules); it
    counts what it spared and what was read (`reused`, `hashed`, `hashed_bytes`)."""

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.changed = False
        self.reused = self.hashed = self.hashed_bytes = 0
        if path is not None:
            try:
                with open(path, "rb") as stream:
                    document = json.loads(stream.read())
                files = document.get("files") if document.get("version") == CACHE_VERSION \
                    else None
                if isinstance(files, dict):
                    self.entries = {str(p): e for p, e in files.items() if isinstance(e, list)}
            except (OSError, ValueError, AttributeError):
                self.entries = {}  # a cache only: a broken one is rebuilt by hashing

    @staticmethod
    def _key(stat: os.stat_result) -> list:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]

    def get(self, path: str | os.PathLike[str], stat: os.stat_result) -> str | None:
        entry = self.entries.get(os.fspath(path))
        if entry and entry[:-1] == self._key(stat) and isinstance(entry[-1], str) \
                and SHA256.fullmatch(entry[-1]):
            return entry[-1]
        return None

    def put(self, path: str | os.PathLike[str], stat: os.stat_result, sha256: str) -> None:
        self.entries[os.fspath(path)] = [*self._key(stat), sha256]
        self.changed = True

    def moved(self, old: str | os.PathLike[str], new: str | os.PathLike[str]) -> None:
        """A folder renamed: its files keep their stat, so their hashes carry over."""
        prefix = f"{os.fspath(old)}{os.sep}"
        for path in [p for p in self.entries if p.startswith(prefix)]:
            self.entries[f"{os.fspath(new)}{os.sep}{path[len(prefix):]}"] = self.entries.pop(path)
            self.changed = True

    def save(self) -> None:
        """Written whole or not at all (a staged file renamed over it), only when something
        changed; a folder kit cannot write only costs a re-hash next time."""
        if self.path is None or not self.changed:
            return
        target = os.fspath(self.path)
        folder = os.path.dirname(target) or "."
        body = json.dumps({"version": CACHE_VERSION, "files": self.entries},
                          sort_keys=True).encode()
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            descriptor, staged = tempfile.mkstemp(dir=folder, prefix=".weights-hashes.")
            try:
                with os.fdopen(descriptor, "wb") as stream:  # mkstemp: mode 0600
                    stream.write(body)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.replace(staged, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
                raise
            folder_descriptor = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(folder_descriptor)
            finally:
                os.close(folder_descriptor)
            self.changed = False
        except OSError:
            pass


def hash_files(paths: Iterable[StrPath], cache: HashCache) -> dict[StrPath, str]:
    """sha256 of each file, from the cache when its stat is unchanged, else read in parallel."""
    result: dict[StrPath, str] = {}
    todo: list[tuple[StrPath, os.stat_result]] = []
    for path in paths:
        stat = os.stat(path)
        cached = cache.get(path, stat)
        if cached is None:
            todo.append((path, stat))
        else:
            result[path] = cached
            cache.reused += 1
    # the largest first, so one big file does not start last and set the wall time
    todo.sort(key=lambda item: -item[1].st_size)
    with ThreadPoolExecutor(hash_workers()) as pool:
        for (path, stat), sha in zip(todo, pool.map(lambda item: file_sha256(item[0]), todo),
                                     strict=True):
            result[path] = sha
            cache.hashed += 1
            cache.hashed_bytes += stat.st_size
            if os.stat(path).st_mtime_ns == stat.st_mtime_ns:  # not changed while read
                cache.put(path, stat, sha)
    return result
