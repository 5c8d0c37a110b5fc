"""A pinned model's folder checked against the lock file: every locked file there with its size
and sha256, nothing else. Files are hashed in parallel (hashlib releases the GIL while it
hashes) and each result is cached by (path, size, mtime, ctime, inode) in the site's state
folder, so a re-up stats the files instead of reading them again (docs/weights.md has figures).
The hashing and the cache's rules are kit.dataplane.fetcher.weights_hashes', which kit's fetcher
on a GPU server shares (kit/dataplane/fetcher/weights_fetch.py); this module hands them on to
the weights wing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kit.dataplane.fetcher.weights_hashes import (
    CHUNK,
    HashCache,
    file_sha256,
    hash_files,
    hash_workers,
    link_out_of,
)
from kit.weights.lock import LockedFile, LockedModel

__all__ = ["CHUNK", "FileProblem", "HashCache", "check_folder", "file_sha256", "folder_files",
           "hash_files", "hash_workers", "link_out_of", "link_problem", "links_out",
           "tree_links_out"]
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
MAX_POINTER_BYTES = 1024


@dataclass(frozen=True)
class FileProblem:
    path: str  # relative to the model's folder
    message: str


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


def links_out(root: Path, path: Path) -> str | None:
    """A problem when `path` (under `root`, the tree a container mounts) is reached through a
    link the container would not follow to the same file (kit.dataplane.fetcher.weights_hashes'
    rule, which kit's fetcher applies on a GPU server too); None when it is not."""
    link = link_out_of(root, path.relative_to(root).as_posix())
    return None if link is None else link_problem(path, link, os.readlink(link), root)


def tree_links_out(root: Path, folder: Path) -> str | None:
    """`links_out` of `folder` and of everything under it (a linked folder is listed, not
    walked): the first path vLLM's container, which mounts `root`, would not read as kit does
    here; None when there is none."""
    if problem := links_out(root, folder):
        return problem
    for current, folders, files in os.walk(folder):
        for name in sorted(files + folders):
            if problem := links_out(root, Path(current, name)):
                return problem
    return None


def link_problem(path: object, link: object, target: str, root: object) -> str:
    """A file reached through a link out of the tree its container mounts, in words."""
    return (f"{path} is reached through the link {link} (to {target}), which leads out of "
            f"{root}: vLLM's container sees only what is inside it, so it would not read the "
            "file kit checks here")


def check_folder(folder: Path, locked: LockedModel, cache: HashCache,
                 root: Path) -> list[FileProblem]:
    """What differs between `folder` (under `root`, models_root) and the lock entry, one
    problem per file, by path; a file reached through a link out of `root` is one."""
    if outside := links_out(root, folder):
        return [FileProblem(".", outside)]
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
        if outside := links_out(root, local):
            problems.append(FileProblem(path, outside))
            continue
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
