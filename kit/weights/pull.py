"""`kit pull`: each pinned model of the site fetched into its folder under models_root and
verified against the lock file.

The files go to a staging folder beside the final one (`<org>/.<name>@<revision>.partial`),
each into `.kit-partial/<path>` first, so an interrupted pull resumes where it stopped (the
bytes already there, then an HTTP Range request). A file joins the staging folder only when
its sha256 is the lock file's; the staging folder becomes the model's folder (one rename)
only when every locked file is there and nothing else. A pulled folder that no longer
matches is repaired the same way: moved back to staging, its changed, missing and extra files
fixed, renamed back.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kit.errors import BadInput, KitError
from kit.layout import SiteLayout
from kit.spec.model import Service, Spec
from kit.weights import hub
from kit.weights.lock import STAGING_NAME, LockedFile, LockedModel, locked_for, model_dir, read_lock
from kit.weights.verify import HashCache, check_folder, folder_files, hash_files, links_out

REPORT_SECONDS = 5.0  # a progress line this often when the output is no terminal


@dataclass
class PullResult:
    model: str
    folder: Path
    fetched: int = 0  # files fetched (in whole or resumed)
    kept: int = 0  # files already there and verified
    removed: list[str] = field(default_factory=list)  # extra files taken out
    downloaded: int = 0  # bytes that crossed the network in this run
    seconds: float = 0.0

    def summary(self) -> str:
        rate = _size(self.downloaded / self.seconds) + "/s" if self.seconds > 0 else "-"
        removed = f", removed {len(self.removed)} extra" if self.removed else ""
        return (f"{self.model}: {self.folder} verified against the lock file: {self.fetched} "
                f"file(s) fetched, {self.kept} kept{removed}; {_size(self.downloaded)} "
                f"downloaded in {self.seconds:.1f} s ({rate})")


def staging_folder(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}.partial")


def pull_model(locked: LockedModel, folder: Path, cache: HashCache, out: TextIO,
               root: Path) -> PullResult:
    """Make `folder` (under `root`, models_root) hold exactly the locked files; KitError naming
    the file when the Hub serves something else."""
    started = time.monotonic()
    result = PullResult(locked.key, folder)
    staging = staging_folder(folder)
    for where in (folder, staging):
        if outside := links_out(root, where):
            raise BadInput(outside, fix=f"replace the link with a folder under {root} (or "
                           "remove it), then run `kit pull` again")
    if folder.is_dir() and not check_folder(folder, locked, cache, root):
        result.kept = len(locked.files)
        result.seconds = time.monotonic() - started
        return result
    if folder.is_dir():
        if staging.exists():
            raise KitError(f"both {folder} and {staging} exist",
                           fix=f"remove the one you do not want (e.g. rm -r {staging}), then "
                           "run `kit pull` again")
        os.rename(folder, staging)  # repaired in staging, renamed back when verified
    staging.mkdir(parents=True, exist_ok=True)
    expected = {f.path: f for f in locked.files}
    for path, local in folder_files(staging).items():
        if path.split("/")[0] != STAGING_NAME and path not in expected:
            local.unlink()
            result.removed.append(path)
    present = {p: staging / p for p in expected if not links_out(root, staging / p)
               and (staging / p).is_file()
               and (staging / p).stat().st_size == expected[p].size}
    good = {Path(local) for local, sha in hash_files(present.values(), cache).items()
            if sha == expected[Path(local).relative_to(staging).as_posix()].sha256}
    result.kept = len(good)
    todo = [f for f in locked.files if staging / f.path not in good]
    for f in todo:
        (staging / f.path).unlink(missing_ok=True)
    partial_root = staging / STAGING_NAME
    start_bytes = sum(_size_of(partial_root / f.path) for f in todo)
    progress = Progress(locked.key, sum(f.size for f in todo), start_bytes,
                        lambda: sum(_size_of(partial_root / f.path) + _size_of(staging / f.path)
                                    for f in todo), out)
    with progress:
        _fetch_all(locked, todo, staging, partial_root, cache)
    result.fetched = len(todo)
    result.downloaded = max(0, progress.current() - start_bytes)
    shutil.rmtree(partial_root, ignore_errors=True)
    problems = check_folder(staging, locked, cache, root)
    if problems:
        raise KitError(f"{locked.key}: the pulled files do not match the lock file: "
                       + "; ".join(p.message for p in problems),
                       fix="run `kit pull` again; if it persists, run `kit lock` and review")
    os.rename(staging, folder)
    cache.moved(staging, folder)
    cache.save()
    result.seconds = time.monotonic() - started
    return result


def _fetch_all(locked: LockedModel, todo: list[LockedFile], staging: Path, partial_root: Path,
               cache: HashCache) -> None:
    """The files fetched one after another, the largest first (Ctrl-C stops at once and keeps
    the partial bytes); each checked, then moved in."""
    for f in sorted(todo, key=lambda f: -f.size):
        partial = partial_root / f.path
        sha = hub.fetch(locked, f, partial)
        if sha != f.sha256:
            partial.unlink(missing_ok=True)
            raise KitError(f"{locked.key}: the Hub served {f.path} with sha256 {sha[:12]}…, "
                           f"the lock file says {f.sha256[:12]}…",
                           fix="check HF_ENDPOINT (a mirror serving other bytes?); if the "
                           "repository changed, run `kit lock` and review the diff")
        target = staging / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
        cache.put(target, target.stat(), sha)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Progress:
    """One line of bytes, rate and ETA: rewritten in place on a terminal, else every few
    seconds. It reads the files' sizes, so it shows what is on disk whatever the client does."""

    def __init__(self, name: str, total: int, start: int, current: Callable[[], int],
                 out: TextIO):
        self.name, self.total, self.start, self.current, self.out = name, total, start, current, out
        self.began = time.monotonic()
        self.stop = threading.Event()
        self.tty = out.isatty()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._show(final=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5 if self.tty else REPORT_SECONDS):
            self._show()

    def line(self) -> str:
        done = min(self.current(), self.total)
        elapsed = max(time.monotonic() - self.began, 1e-6)
        rate = (done - self.start) / elapsed
        left = self.total - done
        eta = _clock(left / rate) if rate > 0 else "--:--"
        percent = 100 * done / self.total if self.total else 100.0
        return (f"{self.name}: {_size(done)} / {_size(self.total)} ({percent:.0f} %), "
                f"{_size(rate)}/s, ETA {eta}")

    def _show(self, final: bool = False) -> None:
        end = "\n" if final or not self.tty else ""
        self.out.write(("\r" if self.tty else "") + self.line() + end)
        self.out.flush()


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count:.2f} TB"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def models_to_pull(spec: Spec, layout: SiteLayout, service: str | None
                   ) -> dict[str, tuple[Service, LockedModel]]:
    """The pinned models of the spec (or of one service), each once by its lock key, with a
    service that pins it; BadInput for what kit pull refuses (nothing is fetched then)."""
    chosen = [s for s in spec.services if service in (None, s.name)]
    if service is not None and not chosen:
        raise BadInput(f"the spec has no service {service!r}",
                       fix=f"name one of: {', '.join(s.name for s in spec.services)}")
    pinned = [s for s in chosen if s.revision is not None]
    if spec.offline:
        raise BadInput("offline: true: kit pull would download from the Hub on this server",
                       fix="pull on a connected machine and copy the verified folders into "
                       "models_root here (docs/offline.md); kit up verifies them against "
                       "site.lock")
    if not pinned:
        raise BadInput("no pinned model to pull: no service has a revision",
                       fix="add `revision: <commit, branch or tag>` to a service with an org/name "
                       "model, run `kit lock`, then `kit pull` (docs/weights.md)")
    lock = read_lock(layout.lock_file)
    found: dict[str, tuple[Service, LockedModel]] = {}
    for s in pinned:
        locked = locked_for(lock, layout.lock_file, s)
        found.setdefault(locked.key, (s, locked))
    return found


def pull_site(spec: Spec, layout: SiteLayout, service: str | None,
              out: TextIO) -> list[PullResult]:
    """`kit pull` on this host: the pinned models of the spec (or of one service), each pulled
    once (through a remote engine: kit/supply/remote_pull.py)."""
    cache = HashCache(layout.weights_hashes)
    return [pull_model(locked, model_dir(spec.models_root, s), cache, out, spec.models_root)
            for s, locked in models_to_pull(spec, layout, service).values()]
