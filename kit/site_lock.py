"""One writer per site: the lock every verb that changes a site or its stack holds.

A site has two identities, and each is one lock: its folder (what render and the credential
verbs write; two names of one folder, e.g. through a symlink, are one folder) and its stack, the
pair (engine, site name): two folders with the same `site:` on the same engine drive one set of
containers. `kit up`, `kit down` and the live credential verbs hold both; `kit render`,
`bench --write-spec` and `--offline` credential changes hold the folder's (docs/operations.md
lists every verb).

Each lock is a flock(2) on a file in kit's lock folder (KIT_LOCK_DIR, else
$XDG_RUNTIME_DIR/kit-locks, else /tmp/kit-locks-<uid>; nothing is written into the site
folder). The kernel drops a flock when its process dies, even on kill -9, so a dead holder never
blocks anyone; the file also says who holds it (verb, pid, host, since when), for the message a
second command prints while it waits a bounded time and when it gives up (exit 1). A remote
engine's pair is locked on this machine only: two operators on two machines are not excluded.

A process that holds a lock may enter it again (the verb takes it, then render or the credential
change it calls); the lock is released when the outermost holder leaves.

A state file that runs add to rather than replace (`kit audit verify`'s usage anchors) has a
lock of its own, the same kind, held only while it is read and written back
(`state_file_lock`): two runs never lose each other's addition, and a long verb's site lock
never holds it up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kit.errors import KitError
from kit.files import write_failure

DEFAULT_WAIT_SECONDS = 60.0
POLL_SECONDS = 0.2
_held: dict[str, int] = {}  # lock file → how many times this process has entered it


@dataclass(frozen=True)
class LockKey:
    """What one lock protects, in words for the messages, and the file it is taken on."""

    what: str  # e.g. "site folder /srv/llm" or "stack test01 on unix:///run/docker.sock"
    identity: str


def folder_key(root: Path) -> LockKey:
    real = os.path.realpath(root)
    return LockKey(f"site folder {real}", f"folder\0{real}")


def stack_key(engine: str, site: str) -> LockKey:
    """One stack per (engine, site name): a local socket by its real path (two spellings of
    /var/run/docker.sock are one engine)."""
    if engine.startswith("unix://"):
        engine = "unix://" + os.path.realpath(engine.removeprefix("unix://"))
    return LockKey(f"stack {site} on {engine}", f"stack\0{engine}\0{site}")


def lock_dir() -> Path:
    """kit's lock folder, made private (0700) and refused when someone else owns it."""
    configured = os.environ.get("KIT_LOCK_DIR")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if configured:
        folder = Path(configured)
    elif runtime and Path(runtime).is_dir():
        folder = Path(runtime) / "kit-locks"
    else:
        folder = Path(tempfile.gettempdir()) / f"kit-locks-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.lstat()
    except OSError as error:
        raise KitError(f"kit's lock folder {folder}: {error.strerror or error}",
                       fix="set KIT_LOCK_DIR to a folder you can write") from None
    if not stat.S_ISDIR(status.st_mode) or (not configured and status.st_uid != os.getuid()):
        raise KitError(f"kit's lock folder {folder} is not a folder of yours (a symlink, or "
                       "another user's): another user could hold or fake its locks",
                       fix="remove it, or set KIT_LOCK_DIR to a folder you own")
    return folder


def state_file_key(path: Path) -> LockKey:
    """One of kit's state files, by its real path (two names of one file are one lock)."""
    real = os.path.realpath(path)
    return LockKey(f"kit's state file {real}", f"state-file\0{real}")


def _lock_file(key: LockKey) -> Path:
    digest = hashlib.sha256(key.identity.encode()).hexdigest()[:24]
    return lock_dir() / f"{digest}.lock"


@dataclass(frozen=True)
class Holder:
    verb: str
    pid: int
    host: str
    since: float  # epoch seconds

    def describe(self, now: float) -> str:
        started = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (f"`kit {self.verb}` (pid {self.pid} on {self.host}, since {started}, "
                f"{max(0.0, now - self.since):.0f} s ago)")


def read_holder(path: Path) -> Holder | None:
    """Who the lock file says holds it; None when it says nothing usable (being written)."""
    try:
        data = json.loads(path.read_text())
        return Holder(str(data["verb"]), int(data["pid"]), str(data["host"]),
                      float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holder_text(path: Path) -> str:
    holder = read_holder(path)
    return holder.describe(time.time()) if holder else "another kit process"


def _write_holder(descriptor: int, verb: str) -> None:
    record = {"verb": verb, "pid": os.getpid(), "host": socket.gethostname(),
              "since": time.time()}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)


@contextlib.contextmanager
def _one_lock(key: LockKey, verb: str, deadline: float, wait: float,
              report: Callable[[str], None]) -> Iterator[None]:
    path = _lock_file(key)
    name = str(path)
    if _held.get(name):  # this process holds it already (a verb, then its core call)
        _held[name] += 1
        try:
            yield
        finally:
            _held[name] -= 1
        return
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise write_failure(error, path) from None
    try:
        told = False
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise write_failure(error, path) from None
            if time.monotonic() >= deadline:
                raise KitError(
                    f"{key.what} is in use by {_holder_text(path)}"
                    + (f"; still after waiting {wait:g} s" if wait else ""),
                    fix="let it finish (or stop it), then run this again; --wait-lock SECONDS "
                    "waits longer for it")
            if not told:
                report(f"{key.what} is in use by {_holder_text(path)}: waiting up to "
                       f"{wait:g} s for it (--wait-lock)")
                told = True
            time.sleep(POLL_SECONDS)
        try:
            _write_holder(descriptor, verb)
        except OSError as error:
            raise write_failure(error, path) from None
        _held[name] = 1
        try:
            yield
        finally:
            del _held[name]
            with contextlib.suppress(OSError):  # who held it; the lock goes with the close
                os.ftruncate(descriptor, 0)
    finally:
        os.close(descriptor)  # releases the flock


@contextlib.contextmanager
def site_lock(root: Path, verb: str, *, stack: tuple[str, str] | None = None,
              wait: float = DEFAULT_WAIT_SECONDS,
              report: Callable[[str], None] = lambda _: None) -> Iterator[None]:
    """Hold the lock of the site folder `root` and, given (engine, site name) as `stack`, of
    that stack: waiting at most `wait` seconds for both, then KitError naming the holder."""
    deadline = time.monotonic() + wait
    keys = [folder_key(root)] + ([stack_key(*stack)] if stack else [])
    with contextlib.ExitStack() as held:
        for key in keys:  # always folder first, then stack: two verbs never wait on each other
            held.enter_context(_one_lock(key, verb, deadline, wait, report))
        yield


@contextlib.contextmanager
def state_file_lock(path: Path, verb: str, *, wait: float = DEFAULT_WAIT_SECONDS) -> Iterator[None]:
    """Hold the lock of kit's state file `path` for one read-change-write: read it again under
    the lock, then write it atomically; KitError naming the holder after `wait` seconds."""
    with _one_lock(state_file_key(path), verb, time.monotonic() + wait, wait, lambda _: None):
        yield
