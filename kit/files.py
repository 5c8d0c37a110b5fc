"""Writing the site folder safely: all-or-nothing renders, and no silent loss of hand edits.

A render is one transaction over every file it changes. Each new file is first written and
fsynced beside its target (a `.tmp` file) while the old one is hard-linked to a backup; then the
journal (`.kit/render-journal.json`) is written: the commit point. Only then are the staged files
renamed over their targets, the manifest last, and the journal removed. A failure before the
commit point discards the staged files (the site is untouched); a failure while swapping puts
the backups back (the journal is first renamed to `render-rollback.json`, so a kill during the
rollback is finished by the next run). A render killed after the commit point is finished by the
next `kit render` (`recover`), which rolls forward. So the manifest, which records the digest of
each generated file as kit last wrote it, is always true once `recover` has run: a file whose
content no longer matches was edited by hand and is only overwritten with --force.
"""

import contextlib
import difflib
import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from kit.errors import BadInput, KitError

FORWARD = "render-journal.json"  # in the state folder: a committed render to finish
ROLLBACK = "render-rollback.json"  # a render being undone: put the backups back
PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}
IN_THE_WAY = {errno.ENOTDIR, errno.EISDIR, errno.EEXIST}


@dataclass(frozen=True)
class Output:
    """One file a command wants on disk."""

    path: Path  # relative to the site folder
    content: bytes
    mode: int = 0o644
    generated: bool = True  # tracked in the manifest (hand-edit protection, golden files)
    group: int | None = None  # numeric group to give the file (only when running as root)
    secret: bool = False  # its content is never shown (diffs, hand-edit reports)


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def write_failure(error: OSError, path: Path | str | None = None) -> KitError:
    """An OSError while writing the site → what failed, where, and what to do (no traceback).

    Permissions and files in the way are the operator's to fix (exit 2); a full disk or an I/O
    error is the host failing the command (exit 1). Either way the caller has changed nothing.
    """
    where = path or error.filename or "the site folder"
    reason = error.strerror or str(error)
    message = f"cannot write {where}: {reason}; nothing was changed"
    if error.errno in PERMISSION:
        return BadInput(
            message,
            fix="make the site folder and its files writable for the user running kit "
            "(ls -ld; chown/chmod, or remount read-write), or render elsewhere with --out",
        )
    if error.errno in IN_THE_WAY:
        return BadInput(message, fix="something else is in the way at that path: move it away")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return KitError(message, fix="free space on that file system (df -h), then run kit again")
    return KitError(message, fix="fix the file system problem, then run kit again")


def _write_fd(descriptor: int, content: bytes | Iterable[bytes]) -> None:
    for chunk in (content,) if isinstance(content, bytes) else content:
        view = memoryview(chunk)
        while view:
            view = view[os.write(descriptor, view):]
    os.fsync(descriptor)


def _fsync_dir(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _staged_file(path: Path, content: bytes | Iterable[bytes], mode: int, group: int | None,
                 owner: int | None = None) -> Path:
    """`content` (or its chunks, as they come) in a fsynced temp file beside `path`, with its
    mode, group and owner (0600 from creation until then): ready to rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if group is not None or owner is not None:
            os.fchown(descriptor, -1 if owner is None else owner, -1 if group is None else group)
        os.fchmod(descriptor, mode)
        _write_fd(descriptor, content)
    except BaseException:
        os.close(descriptor)
        Path(name).unlink(missing_ok=True)
        raise
    os.close(descriptor)
    return Path(name)


def atomic_write(path: Path, content: bytes | Iterable[bytes], mode: int = 0o644,
                 group: int | None = None, owner: int | None = None) -> None:
    """`path` holds `content` whole or is as it was. `content` may be chunks made while it is
    written (an export larger than memory): a failure making them leaves nothing behind."""
    staged = _staged_file(path, content, mode, group, owner)
    try:
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def rewrite_in_place(path: Path, content: bytes) -> Path:
    """An operator's file (site.yaml) replaced atomically by kit's edit of it: through a
    symlink, the file it points at, keeping its mode and owner. Returns the file written."""
    target = Path(os.path.realpath(path))
    status = target.stat()
    try:
        atomic_write(target, content, mode=status.st_mode & 0o7777,
                     group=status.st_gid if status.st_gid != os.getegid() else None,
                     owner=status.st_uid if status.st_uid != os.geteuid() else None)
    except OSError as error:
        raise write_failure(error, target) from None
    return target


def read_manifest(path: Path, *, force: bool = False) -> dict[str, str]:
    """path → digest as kit last wrote it; with `force` an unusable manifest counts as empty
    (the render that follows rewrites it)."""
    try:
        files = json.loads(path.read_text()).get("files")
        if isinstance(files, dict) and all(
            isinstance(key, str) and isinstance(value, str) for key, value in files.items()
        ):
            return files
        problem = "it has no 'files' mapping of path to digest"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as error:
        problem = str(error)
    if force:
        return {}
    raise BadInput(
        f"{path} (kit's record of the files it wrote) is unusable: {problem}",
        fix="check the rendered files for hand edits (kit render --dry-run shows the diff), "
        "then run `kit render --force`, which rewrites it",
    )


def manifest_content(files: dict[str, str]) -> bytes:
    return (json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n").encode()


@dataclass(frozen=True)
class Change:
    output: Output
    old: bytes | None  # None: the file does not exist yet

    @property
    def diff(self) -> str:
        name = str(self.output.path)
        if self.output.secret:
            return f"{name}: secret values, not shown (compare it with the spec)\n"
        old = (self.old or b"").decode(errors="replace").splitlines(keepends=True)
        new = self.output.content.decode(errors="replace").splitlines(keepends=True)
        return "".join(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}"))


def read_existing(path: Path) -> bytes | None:
    """The file's bytes, None when absent; unreadable is the operator's to fix (exit 2)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise BadInput(
            f"cannot read {path}: {error.strerror or error}",
            fix="something else is in the way at that path: move it away"
            if error.errno in IN_THE_WAY
            else "run kit as the user that owns the site folder, or fix the file's permissions",
        ) from None


def pending_changes(root: Path, outputs: list[Output]) -> list[Change]:
    """The outputs whose content or mode differs from what is on disk."""
    changes = []
    for output in outputs:
        target = root / output.path
        old = read_existing(target)
        same_mode = old is not None and (target.stat().st_mode & 0o777) == output.mode
        if old != output.content or not same_mode:
            changes.append(Change(output, old))
    return changes


def hand_edits(root: Path, changes: list[Change], manifest: dict[str, str]) -> list[Change]:
    """Generated files about to be replaced whose content is not what kit last wrote."""
    edited = []
    for change in changes:
        key = str(change.output.path)
        if change.old == change.output.content:
            continue  # only the mode differs (a git checkout drops 0600): nothing to lose
        if change.output.generated and change.old is not None and key in manifest:
            if digest(change.old) != manifest[key]:
                edited.append(change)
        elif change.output.generated and change.old is not None and key not in manifest:
            edited.append(change)  # a file kit never wrote is in the way
    return edited


def remove_stale_temps(folders: set[Path]) -> None:
    """Delete temp files and backups that a killed command left beside our targets (only once
    no journal refers to them)."""
    for folder in folders:
        for stale in folder.glob(".*.tmp"):
            stale.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the transaction


@dataclass(frozen=True)
class Entry:
    """One file of a render transaction (paths relative to the site folder)."""

    path: str
    staged: str  # the new content, fsynced, until renamed over `path`
    backup: str | None  # a hard link to the old file (None: there was no old file)
    old: str | None  # digest of the old content
    new: str  # digest of the new content

    def backup_path(self, root: Path) -> Path | None:
        return None if self.backup is None else root / self.backup


def _journal(state_dir: Path, name: str) -> Path:
    return state_dir / name


def _current(path: Path) -> str | None:
    content = read_existing(path)
    return None if content is None else digest(content)


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Give an OSError the path it concerns (an error without one is useless to the operator)."""
    try:
        yield
    except OSError as error:
        if error.filename is None or str(error.filename).endswith(".tmp"):
            error.filename = str(path)
        raise


def _stage(root: Path, output: Output, old: bytes | None) -> Entry:
    target = root / output.path
    with _naming(target):
        staged = _staged_file(target, output.content, output.mode, output.group)
        backup = None
        if old is not None:
            backup = staged.with_name(staged.name.removesuffix(".tmp") + ".old.tmp")
            try:
                os.link(target, backup)
            except BaseException:
                staged.unlink(missing_ok=True)
                raise
    return Entry(
        str(output.path), str(output.path.with_name(staged.name)),
        None if backup is None else str(output.path.with_name(backup.name)),
        None if old is None else digest(old), digest(output.content),
    )


def _discard(root: Path, entries: list[Entry]) -> None:
    for entry in entries:
        (root / entry.staged).unlink(missing_ok=True)
        backup = entry.backup_path(root)
        if backup is not None:
            backup.unlink(missing_ok=True)


def _journal_content(entries: list[Entry]) -> bytes:
    return (json.dumps({"entries": [vars(e) for e in entries]}, indent=1) + "\n").encode()


def _sync_folders(root: Path, entries: list[Entry]) -> None:
    for folder in sorted({(root / entry.path).parent for entry in entries}):
        with _naming(folder):
            _fsync_dir(folder)


def commit(root: Path, state_dir: Path, changes: list[Change], manifest: bytes | None) -> None:
    """Write every change and then `manifest` (when given) as one transaction; KitError naming
    the file when it cannot be done, with the site left as it was."""
    outputs = [(change.output, change.old) for change in changes]
    if manifest is not None:
        path = (state_dir / "manifest.json").relative_to(root)
        outputs.append((Output(path, manifest, 0o600, generated=False),
                        read_existing(root / path)))
    if not outputs:
        return  # nothing to write: a read-only site renders "no change"
    entries: list[Entry] = []
    journal = _journal(state_dir, FORWARD)
    try:
        with _naming(state_dir):
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for output, old in outputs:
            entries.append(_stage(root, output, old))
        with _naming(journal):
            atomic_write(journal, _journal_content(entries), 0o600)
    except OSError as error:
        with contextlib.suppress(OSError):
            journal.unlink(missing_ok=True)  # renamed in place, but its fsync failed
        if journal.exists():
            raise _unfinished(write_failure(error), state_dir) from None
        _discard(root, entries)
        raise write_failure(error) from None
    done = 0
    try:
        for entry in entries:
            with _naming(root / entry.path):
                os.replace(root / entry.staged, root / entry.path)
            done += 1
        _sync_folders(root, entries)
    except OSError as error:
        raise _roll_back(root, state_dir, entries[:done], entries[done:], error) from None
    _finish(root, journal, entries)


def _finish(root: Path, journal: Path, entries: list[Entry]) -> None:
    """The render is complete: drop the journal and the backups (a failure here loses nothing;
    the next render's `recover` retries it)."""
    with contextlib.suppress(OSError):
        journal.unlink(missing_ok=True)
        _fsync_dir(journal.parent)
        _discard(root, entries)


def _roll_back(
    root: Path, state_dir: Path, swapped: list[Entry], pending: list[Entry], error: OSError
) -> KitError:
    """Put the old files back after a failed swap; the error to raise."""
    failure = write_failure(error)
    try:
        os.replace(_journal(state_dir, FORWARD), _journal(state_dir, ROLLBACK))
        _undo(root, swapped)
        _discard(root, pending)
        _finish(root, _journal(state_dir, ROLLBACK), [])
    except OSError as second:
        failure.message = (
            f"{failure.message.removesuffix('; nothing was changed')}; putting the old files "
            f"back failed too ({second.strerror or second})"
        )
        return _unfinished(failure, state_dir)
    return failure


def _unfinished(failure: KitError, state_dir: Path) -> KitError:
    """The failure, saying that the site is mid-render until the next render finishes it."""
    failure.message = failure.message.removesuffix("; nothing was changed")
    failure.fix = (f"{failure.fix}; the next `kit render` first finishes the interrupted one "
                   f"(journal in {state_dir})")
    return failure


def _undo(root: Path, entries: list[Entry]) -> None:
    """Entries whose new file is in place get their old one back (or lose the new one)."""
    for entry in reversed(entries):
        target, backup = root / entry.path, entry.backup_path(root)
        if backup is not None and backup.exists():
            os.replace(backup, target)
        elif entry.old is None and _current(target) == entry.new:
            target.unlink()
        (root / entry.staged).unlink(missing_ok=True)
    _sync_folders(root, entries)


def interrupted(state_dir: Path) -> Path | None:
    """The journal of a render that did not finish, if any (`recover` finishes it)."""
    return next((journal for journal in (_journal(state_dir, ROLLBACK),
                                         _journal(state_dir, FORWARD)) if journal.exists()), None)


def recover(root: Path, state_dir: Path) -> str | None:
    """Finish a render that was interrupted (killed, or its rollback failed): roll a committed
    one forward, complete a rollback. What was done, for the operator; None when nothing was."""
    journal = interrupted(state_dir)
    if journal is None:
        return None
    try:
        text = journal.read_text()
    except OSError as error:
        raise BadInput(
            f"cannot read {journal}: {error.strerror}",
            fix="run kit as the user that owns the site folder",
        ) from None
    try:
        entries = [_entry(raw) for raw in json.loads(text)["entries"]]
    except (ValueError, TypeError, KeyError) as error:
        raise BadInput(
            f"{journal} (an interrupted render's journal) is unusable: {error}",
            fix="delete it, check the site with `kit render --dry-run`, then `kit render "
            "--force`",
        ) from None
    try:
        if journal.name == ROLLBACK:
            _undo(root, entries)
            done = "undone"
        else:
            _redo(root, entries)
            done = "finished"
    except OSError as error:
        raise _unfinished(write_failure(error), state_dir) from None
    _finish(root, journal, entries)
    return f"an interrupted render was {done} ({len(entries)} file(s))"


def _entry(raw: dict) -> Entry:
    """A journal entry, refused unless it names files inside the site folder."""
    entry = Entry(**raw)
    for name in (entry.path, entry.staged, entry.backup):
        if name is not None and (
            not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts
        ):
            raise ValueError(f"{name!r} is not a path inside the site folder")
    if not isinstance(entry.new, str) or not isinstance(entry.old, str | None):
        raise ValueError("a digest is not a string")
    return entry


def _redo(root: Path, entries: list[Entry]) -> None:
    """Rename each staged file that is still waiting over its target, unless the target changed
    since the render was committed (another command wrote it: its content wins)."""
    for entry in entries:
        staged, target = root / entry.staged, root / entry.path
        if staged.exists() and _current(target) in (entry.old, entry.new):
            with _naming(target):
                os.replace(staged, target)
    _sync_folders(root, entries)


def generated_yaml(document: dict) -> str:
    """YAML written by the dumper, so no value can break the file's structure."""
    return ("# Generated by kit — change the spec and run `kit render`, not this file.\n"
            + yaml.safe_dump(document, sort_keys=False, width=1000))
