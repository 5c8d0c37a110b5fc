"""The credential files of a site: who may get in (Basic-auth users, Bearer keys).

Every change is first computed as new file contents (all checks before anything is written),
then written atomically under the site's lock (kit/site_lock.py: two racing commands serialise
instead of merging), with the previous credential files kept as 0600 backups, so the file on disk is
always either the old or the new one. Making a change live is
kit/front_door/credential_change.py's job.
"""

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from kit.credentials.material import (
    SECRET,
    auth_state,
    check_key_name,
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
    verify_password,
    worker_readable,
)
from kit.credentials.policy import (
    PolicyChange,
    check_policy_target,
    door_policy,
    policies_db,
    present_principals,
    principal,
    read_policies,
)
from kit.errors import BadInput
from kit.files import atomic_write
from kit.layout import PROBE_USER, SiteLayout
from kit.spec.model import Spec


@dataclass(frozen=True)
class Snapshot:
    """The credential files as they are now: what a failed change is rolled back to."""

    htpasswd: bytes
    keys_db: bytes
    keys_map: bytes
    policy_db: bytes
    door_policy: bytes


def _read(path: Path) -> bytes:
    return read_if_present(path) or b""


def snapshot(layout: SiteLayout) -> Snapshot:
    return Snapshot(_read(layout.htpasswd), _read(layout.keys_db), _read(layout.keys_map),
                    _read(layout.policy_db), _read(layout.door_policy))


def require_rendered(layout: SiteLayout) -> None:
    if not layout.htpasswd.exists() or not layout.auth_state.exists():
        raise BadInput(
            f"{layout.root} has no credential files yet",
            fix="run `kit render` on the spec first",
        )


@dataclass(frozen=True)
class Credentials:
    """New contents of the credential files, computed before anything is written."""

    htpasswd: bytes
    keys: dict[str, dict]
    policies: dict[str, dict] | None = None  # None: as they are


def write(layout: SiteLayout, new: Credentials) -> None:
    """Install new credential files, keeping the ones they replace in .kit/backup/ (0600)."""
    before = snapshot(layout)
    backups = layout.state_dir / "backup"
    backups.mkdir(mode=0o700, exist_ok=True)
    atomic_write(backups / "htpasswd", before.htpasswd, SECRET)
    atomic_write(backups / "keys.json", before.keys_db, SECRET)
    atomic_write(backups / "policy.json", before.policy_db, SECRET)
    keys_db = (json.dumps(new.keys, indent=1, sort_keys=True) + "\n").encode()
    policies = read_policies(layout) if new.policies is None else new.policies
    present = present_principals(parse_htpasswd(new.htpasswd.decode(), layout.htpasswd), new.keys)
    restore(layout, Snapshot(new.htpasswd, keys_db, keys_map(new.keys).encode(),
                             policies_db(policies), door_policy(policies, present)))


def restore(layout: SiteLayout, files: Snapshot) -> None:
    """Write a full set of credential files, with a new auth epoch (cached verdicts expire)."""
    mode, group = worker_readable()
    _write_or_remove(layout.keys_db, files.keys_db)
    atomic_write(layout.keys_map, files.keys_map, SECRET)
    _write_or_remove(layout.policy_db, files.policy_db)
    atomic_write(layout.door_policy, files.door_policy or door_policy({}, set()), SECRET)
    atomic_write(layout.htpasswd, files.htpasswd, mode, group)
    atomic_write(layout.auth_state, auth_state().encode(), SECRET)


def _write_or_remove(path: Path, content: bytes) -> None:
    """A JSON state file (0600), or none when there was none: an empty file would read as a
    corrupt one (a failed change on a site without keys put back an empty keys.json)."""
    if content:
        atomic_write(path, content, SECRET)
    else:
        path.unlink(missing_ok=True)


def users(layout: SiteLayout) -> dict[str, str]:
    return parse_htpasswd(_read(layout.htpasswd).decode(), layout.htpasswd)


def listed_users(spec: Spec, layout: SiteLayout) -> list[tuple[str, str]]:
    """(user, where it comes from) for every user in the password file, sorted."""
    require_rendered(layout)
    origins = {PROBE_USER: "kit probe"} | dict.fromkeys(spec.auth.users, "spec")
    return [(user, origins.get(user, "added")) for user in sorted(users(layout))]


def with_password(layout: SiteLayout, user: str, password: str, *, must_exist: bool) -> Credentials:
    """The files with `user`'s password set (a new user unless `must_exist`)."""
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
    return Credentials(content.encode(), read_keys(layout))


def check_current(layout: SiteLayout, user: str, current: str | None, new: str) -> None:
    """Refuse a rotation whose stated current password is wrong or equal to the new one."""
    known = users(layout)
    if current is not None and user in known and not verify_password(current, known[user]):
        raise BadInput(f"the current password of {user} is wrong", fix="nothing was changed")
    if current == new:
        raise BadInput("the new password is the current one", fix="choose a new password")


def without_user(layout: SiteLayout, user: str, spec_users: list[str]) -> Credentials:
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
    return Credentials(content.encode(), read_keys(layout),
                       _policies_without(layout, principal("user", user)))


def with_new_key(layout: SiteLayout, name: str) -> tuple[str, Credentials]:
    """A new random key named `name` and the files that accept it (only its digest stored)."""
    check_key_name(name)
    keys = read_keys(layout)
    if name in keys:
        raise BadInput(f"a key named {name!r} exists", fix="revoke it first or choose another name")
    key = generate_api_key()
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    keys[name] = {"sha256": key_digest(key), "created": created}
    return key, Credentials(_read(layout.htpasswd), keys)


def without_key(layout: SiteLayout, name: str) -> Credentials:
    check_key_name(name)
    keys = read_keys(layout)
    if name not in keys:
        raise BadInput(f"there is no key named {name!r}", fix="see `kit keys list`")
    del keys[name]
    return Credentials(_read(layout.htpasswd), keys,
                       _policies_without(layout, principal("key", name)))


def _policies_without(layout: SiteLayout, who: str) -> dict[str, dict]:
    return {other: entry for other, entry in read_policies(layout).items() if other != who}


def with_policy(layout: SiteLayout, new: Credentials, kind: str, name: str, change: PolicyChange,
                *, fresh: bool) -> Credentials:
    """`new` with the policy of `kind:name` changed (`fresh`: a new credential, no earlier
    policy of that name kept)."""
    check_policy_target(kind, name)
    policies = read_policies(layout)
    who = principal(kind, name)
    policies[who] = change.applied({} if fresh else policies.get(who, {}))
    return Credentials(new.htpasswd, new.keys, policies)


def existing(layout: SiteLayout, kind: str, name: str) -> Credentials:
    """The files as they are, once `kind:name` is known to exist (`kit keys|users set`)."""
    keys = read_keys(layout)
    names = keys if kind == "key" else users(layout)
    if name not in names:
        raise BadInput(f"there is no {kind} named {name!r}", fix=f"see `kit {kind}s list`")
    return Credentials(_read(layout.htpasswd), keys)
