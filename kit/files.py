"""Writing the site folder safely: atomic replacement, and no silent loss of hand edits.

Every file is written to a temporary file beside its target, flushed, given its mode and renamed
over the target, so a reader (or a render killed midway) sees the old file or the new one, never
a mix. `.kit/manifest.json` records the digest of each generated file as kit last wrote it; a
file whose content no longer matches was edited by hand and is only overwritten with --force.
"""

import difflib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kit.errors import BadInput


@dataclass(frozen=True)
class Output:
    """One file a command wants on disk."""

    path: Path  # relative to the site folder
    content: bytes
    mode: int = 0o644
    generated: bool = True  # tracked in the manifest (hand-edit protection, golden files)
    group: int | None = None  # numeric group to give the file (only when running as root)


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def atomic_write(path: Path, content: bytes, mode: int = 0o644, group: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            if group is not None:
                os.fchown(handle.fileno(), -1, group)
            os.fchmod(handle.fileno(), mode)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_manifest(path: Path) -> dict[str, str]:
    try:
        return json.loads(path.read_text()).get("files", {})
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise BadInput(
            f"{path} is unreadable ({error})",
            fix="delete it and render with --force (kit then treats every file as its own)",
        ) from None


def manifest_content(files: dict[str, str]) -> bytes:
    return (json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n").encode()


@dataclass(frozen=True)
class Change:
    output: Output
    old: bytes | None  # None: the file does not exist yet

    @property
    def diff(self) -> str:
        old = (self.old or b"").decode(errors="replace").splitlines(keepends=True)
        new = self.output.content.decode(errors="replace").splitlines(keepends=True)
        name = str(self.output.path)
        return "".join(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}"))


def pending_changes(root: Path, outputs: list[Output]) -> list[Change]:
    """The outputs whose content or mode differs from what is on disk."""
    changes = []
    for output in outputs:
        target = root / output.path
        try:
            old = target.read_bytes()
            same_mode = (target.stat().st_mode & 0o777) == output.mode
        except FileNotFoundError:
            old, same_mode = None, False
        if old != output.content or not same_mode:
            changes.append(Change(output, old))
    return changes


def hand_edits(root: Path, changes: list[Change], manifest: dict[str, str]) -> list[Change]:
    """Generated files about to be replaced whose content is not what kit last wrote."""
    edited = []
    for change in changes:
        key = str(change.output.path)
        if change.output.generated and change.old is not None and key in manifest:
            if digest(change.old) != manifest[key]:
                edited.append(change)
        elif change.output.generated and change.old is not None and key not in manifest:
            edited.append(change)  # a file kit never wrote is in the way
    return edited


def remove_stale_temps(root: Path, outputs: list[Output]) -> None:
    """Delete temp files that a write killed before its rename left beside our targets."""
    for folder in {(root / output.path).parent for output in outputs}:
        for stale in folder.glob(".*.tmp"):
            stale.unlink()


def apply_changes(root: Path, changes: list[Change], manifest_path: Path) -> None:
    """Write every change atomically, the manifest last (it vouches for what is on disk)."""
    manifest = read_manifest(manifest_path)
    before = manifest_content(manifest)
    for change in changes:
        output = change.output
        atomic_write(root / output.path, output.content, output.mode, output.group)
        if output.generated:
            manifest[str(output.path)] = digest(output.content)
    if manifest_content(manifest) != before or not manifest_path.exists():
        manifest_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(manifest_path, manifest_content(manifest), 0o600)
