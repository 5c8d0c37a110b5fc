"""`kit pull`: each pinned model of the site fetched into its folder under models_root and
verified against the lock file.

The files go to a staging folder beside the final one (`<org>/.<name>@<revision>.partial`),
each into `.kit-partial/<path>` first, so an interrupted pull resumes where it stopped (the
bytes already there, then an HTTP Range request). A file joins the staging folder only when
its sha256 is the lock file's; the staging folder becomes the model's folder (one rename)
only when every locked file is there and nothing else. A pulled folder that no longer
matches is repaired the same way: moved back to staging, its changed, missing and extra files
fixed, renamed back.

Those mechanics are the fetcher's (kit/dataplane/fetcher/weights_fetch.py), run here in process
as the remote pull runs them on a server: one implementation. kit pull hands it kit's Hub
client for each file, reads its events into the progress line, and says its refusals in its
own words.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TextIO

from kit.dataplane.fetcher import weights_fetch
from kit.errors import BadInput, KitError
from kit.layout import SiteLayout
from kit.spec.model import Service, Spec
from kit.weights import hub
from kit.weights.lock import STAGING_NAME, LockedModel, locked_for, model_dir, read_lock
from kit.weights.verify import HashCache, check_folder, links_out

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


def fetch_job(locked: LockedModel, folder: PurePosixPath, staging: PurePosixPath,
              hub_endpoint: str) -> dict:
    """What the fetcher does (kit/dataplane/fetcher/weights_fetch.py, here or on a server),
    decided here: paths relative to models_root."""
    return {"endpoint": hub_endpoint, "model": locked.model, "commit": locked.commit,
            "folder": folder.as_posix(), "staging": staging.as_posix(),
            "partial": STAGING_NAME,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                      for f in locked.files]}


def pull_model(locked: LockedModel, folder: Path, cache: HashCache, out: TextIO,
               root: Path) -> PullResult:
    """Make `folder` (under `root`, models_root) hold exactly the locked files; KitError naming
    the file when the Hub serves something else. The staging, resume, per-file check and
    rename are the fetcher's (the remote pull runs the same code on the server), each file
    fetched by kit's Hub client (kit.weights.hub.fetch)."""
    started = time.monotonic()
    staging = staging_folder(folder)
    for where in (folder, staging):
        if outside := links_out(root, where):
            raise BadInput(outside, fix=f"replace the link with a folder under {root} (or "
                           "remove it), then run `kit pull` again")
    if folder.is_dir() and not check_folder(folder, locked, cache, root):
        return PullResult(locked.key, folder, kept=len(locked.files),
                          seconds=time.monotonic() - started)
    locked_files = {f.path: f for f in locked.files}
    job = fetch_job(locked, PurePosixPath(folder.relative_to(root).as_posix()),
                    PurePosixPath(staging.relative_to(root).as_posix()), hub.endpoint())
    events = FetchProgress(locked.key, out)
    try:
        with events:
            outcome = weights_fetch.pull(
                job, str(root), None, cache, tell=events.tell,
                fetch_file=lambda _job, item, partial, _token: hub.fetch(
                    locked, locked_files[item["path"]], Path(partial)))
    except weights_fetch.Refused as refused:
        raise _refusal(refused, locked, folder, cache, root) from None
    cache.save()
    return PullResult(locked.key, folder, fetched=outcome["fetched"], kept=outcome["kept"],
                      removed=outcome["removed"], downloaded=outcome["downloaded"],
                      seconds=time.monotonic() - started)


def _refusal(refused: weights_fetch.Refused, locked: LockedModel, folder: Path,
             cache: HashCache, root: Path) -> KitError:
    """What the fetcher refused, in kit pull's words."""
    staging = staging_folder(folder)
    if refused.served:
        lock_sha = {f.path: f.sha256 for f in locked.files}[refused.path]
        return KitError(f"{locked.key}: the Hub served {refused.path} with sha256 "
                        f"{refused.served[:12]}…, the lock file says {lock_sha[:12]}…",
                        fix="check HF_ENDPOINT (a mirror serving other bytes?); if the "
                        "repository changed, run `kit lock` and review the diff")
    if refused.kind == "conflict":
        return KitError(f"both {folder} and {staging} exist",
                        fix=f"remove the one you do not want (e.g. rm -r {staging}), then "
                        "run `kit pull` again")
    problems = check_folder(staging, locked, cache, root)
    return KitError(f"{locked.key}: the pulled files do not match the lock file: "
                    + "; ".join(p.message for p in problems),
                    fix="run `kit pull` again; if it persists, run `kit lock` and review")


class FetchProgress:
    """kit pull's progress line driven by the fetcher's events (`tell`)."""

    def __init__(self, name: str, out: TextIO):
        self.name, self.out, self.done = name, out, 0
        self.progress: Progress | None = None

    def __enter__(self) -> FetchProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def tell(self, event: str, **fields: int) -> None:
        if event == "start" and self.progress is None:
            self.done = fields["start"]
            self.progress = Progress(self.name, fields["total"], fields["start"],
                                     lambda: self.done, self.out)
            self.progress.__enter__()
        elif event == "progress":
            self.done = fields["done"]


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
