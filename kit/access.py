"""Changing who may get in: Basic-auth users, Bearer keys, password rotation.

Every change is computed as new file contents, written atomically under an exclusive lock (two
racing commands serialise instead of merging), with the previous credential files kept as 0600
backups, so the file on disk is always either the old or the new one.
"""

import datetime as dt
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kit.credentials import (
    SECRET,
    auth_state,
    check_password,
    check_user_name,
    generate_api_key,
    hash_password,
    htpasswd_with,
    htpasswd_without,
    key_digest,
    keys_map,
    parse_htpasswd,
    read_if_present,
    read_keys,
    worker_readable,
)
from kit.errors import BadInput
from kit.files import atomic_write
from kit.layout import PROBE_USER, SiteLayout


@dataclass(frozen=True)
class Snapshot:
    """The credential files as they are now: what a failed change is rolled back to."""

    htpasswd: bytes
    keys_db: bytes
    keys_map: bytes


def _read(path: Path) -> bytes:
    return read_if_present(path) or b""


def snapshot(layout: SiteLayout) -> Snapshot:
    return Snapshot(_read(layout.htpasswd), _read(layout.keys_db), _read(layout.keys_map))


def require_rendered(layout: SiteLayout) -> None:
    if not layout.htpasswd.exists() or not layout.auth_state.exists():
        raise BadInput(
            f"{layout.root} has no credential files yet",
            fix="run `kit render` on the spec first",
        )


@contextmanager
def credential_lock(layout: SiteLayout) -> Iterator[None]:
    """One credential change at a time per site: flock on the state folder itself (no lock
    file to leave behind; the kernel releases it even on kill -9)."""
    descriptor = os.open(layout.state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def write(layout: SiteLayout, htpasswd: bytes, keys: dict[str, dict]) -> Snapshot:
    """Install new credential files; return the snapshot of what they replaced."""
    before = snapshot(layout)
    backups = layout.state_dir / "backup"
    backups.mkdir(mode=0o700, exist_ok=True)
    atomic_write(backups / "htpasswd", before.htpasswd, SECRET)
    atomic_write(backups / "keys.json", before.keys_db, SECRET)
    keys_db = (json.dumps(keys, indent=1, sort_keys=True) + "\n").encode()
    restore(layout, Snapshot(htpasswd, keys_db, keys_map(keys).encode()))
    return before


def restore(layout: SiteLayout, files: Snapshot) -> None:
    """Write a full set of credential files, with a new auth epoch (cached verdicts expire)."""
    mode, group = worker_readable()
    atomic_write(layout.keys_db, files.keys_db, SECRET)
    atomic_write(layout.keys_map, files.keys_map, SECRET)
    atomic_write(layout.htpasswd, files.htpasswd, mode, group)
    atomic_write(layout.auth_state, auth_state().encode(), SECRET)


def users(layout: SiteLayout) -> dict[str, str]:
    return parse_htpasswd(_read(layout.htpasswd).decode(), layout.htpasswd)


def set_password(layout: SiteLayout, user: str, password: str, *, must_exist: bool) -> Snapshot:
    check_user_name(user)
    check_password(password)
    present = users(layout)
    if must_exist and user not in present:
        raise BadInput(f"there is no user {user!r}", fix=f"add it with `kit users add {user}`")
    if not must_exist and user in present:
        raise BadInput(
            f"user {user!r} exists already", fix=f"change its password: kit rotate-password {user}"
        )
    content = htpasswd_with(_read(layout.htpasswd).decode(), user, hash_password(password))
    return write(layout, content.encode(), read_keys(layout))


def remove_user(layout: SiteLayout, user: str, spec_users: list[str]) -> Snapshot:
    check_user_name(user)
    if user == PROBE_USER:
        raise BadInput(f"{PROBE_USER} is kit's probe identity", fix="it cannot be removed")
    if user in spec_users:
        raise BadInput(
            f"{user!r} is listed in the spec's auth.users (render would add it back)",
            fix="remove it from auth.users first, then run this again",
        )
    if user not in users(layout):
        raise BadInput(f"there is no user {user!r}", fix="see `kit users list`")
    content = htpasswd_without(_read(layout.htpasswd).decode(), user)
    return write(layout, content.encode(), read_keys(layout))


def add_key(layout: SiteLayout, name: str) -> tuple[str, Snapshot]:
    check_key_name(name)
    keys = read_keys(layout)
    if name in keys:
        raise BadInput(f"a key named {name!r} exists", fix="revoke it first or choose another name")
    key = generate_api_key()
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    keys[name] = {"sha256": key_digest(key), "created": created}
    return key, write(layout, _read(layout.htpasswd), keys)


def revoke_key(layout: SiteLayout, name: str) -> Snapshot:
    check_key_name(name)
    keys = read_keys(layout)
    if name not in keys:
        raise BadInput(f"there is no key named {name!r}", fix="see `kit keys list`")
    del keys[name]
    return write(layout, _read(layout.htpasswd), keys)


def check_key_name(name: str) -> None:
    try:
        check_user_name(name)
    except BadInput:
        raise BadInput(
            f"key name {name!r} is not allowed",
            fix="use lower-case letters, digits, '.', '_' and '-', starting with a letter",
        ) from None
