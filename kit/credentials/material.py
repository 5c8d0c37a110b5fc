"""Credential material: bcrypt htpasswd, Bearer-key digests, the auth cache epoch.

Functions here compute file contents; writing them is files.py's job, so render, rotation and
`--dry-run` share one path. Secrets are never placed in rendered config, compose or labels.
"""

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from kit.credentials.policy import door_policy, present_principals, read_policies
from kit.engine.envfile import env_file_text
from kit.errors import BadInput
from kit.files import Output, generated_yaml
from kit.files import read_existing as read_if_present
from kit.layout import PROBE_USER, SiteLayout
from kit.names import USER_NAME, is_name
from kit.state import read_state

BCRYPT_COST = 12
MIN_PASSWORD_LENGTH = 12
PROMETHEUS_USER = "kit"  # the one account of Prometheus's API (Grafana, kit status, healthcheck)
PROMETHEUS_PASSWORD_ENV = "KIT_PROMETHEUS_PASSWORD"  # its secret, in Prometheus's and Grafana's env
MAX_PASSWORD_BYTES = 72  # bcrypt ignores everything past 72 bytes: refuse instead of truncating
SECRET = 0o600
NGINX_GID = 101  # the nginx group in the official image: its workers read htpasswd per request
PROMETHEUS_GID = 65534  # Prometheus's image runs as nobody:nogroup; it reads web.yml
PROMETHEUS_BCRYPT_COST = 10  # a 144-bit random secret: cost only slows each uncached check

# What the verifier checks a name htpasswd does not hold against, so an unknown name costs one
# bcrypt check of BCRYPT_COST as a known one does (no timing tells them apart). The name cannot be
# a user's (USER_NAME starts with a letter); the hash's password was random and thrown away, and
# the verifier refuses this name even if it matched (templates/verifier.conf.j2).
UNKNOWN_USER = "_unknown"
UNKNOWN_USER_HASH = "$2b$12$6aGmvK.P.r96CJ9ynCve7O0YiLheQyoQVL6r8LgxNd8NdKHAIWuXO"


def unknown_user_file() -> bytes:
    """The verifier's one-line htpasswd for names htpasswd does not hold."""
    return f"{UNKNOWN_USER}:{UNKNOWN_USER_HASH}\n".encode()


def worker_readable(gid: int = NGINX_GID) -> tuple[int, int | None]:
    """Mode and group for files a container's user reads (nginx workers by default): 0640 with
    that group, or 0644 without root."""
    return (0o640, gid) if os.geteuid() == 0 else (0o644, None)


def secret_readable(gid: int) -> tuple[int, int | None]:
    """Mode and group for a secret a container's user reads: 0640 with that group as root; else
    0600, which only a container running as kit's own user could read (docs/observability.md)."""
    return (0o640, gid) if os.geteuid() == 0 else (SECRET, None)


# --------------------------------------------------------------------------- passwords (people)


def generate_password() -> str:
    return secrets.token_urlsafe(18)


def check_password(password: str) -> None:
    if "\n" in password or "\r" in password or "\0" in password:
        raise BadInput("the password contains a newline or NUL", fix="choose another password")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise BadInput(
            f"the password has {len(password)} characters; at least {MIN_PASSWORD_LENGTH} needed",
            fix="choose a longer password, or use --generate",
        )
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise BadInput(
            f"the password is longer than {MAX_PASSWORD_BYTES} bytes, which bcrypt cannot verify",
            fix="choose a shorter password (a passphrase of 5-8 words fits)",
        )
    if len(set(password)) < 5:
        raise BadInput("the password repeats too few characters", fix="use --generate")


NAME_RULE = "use lower-case letters, digits, '.', '_' and '-', starting with a letter"


def check_user_name(user: str) -> None:
    if not is_name(USER_NAME, user):
        raise BadInput(
            f"user name {user!r} is not allowed",
            fix=f"{NAME_RULE} (no ':' or whitespace: they would corrupt the htpasswd file)",
        )


def check_key_name(name: str) -> None:
    """Key names land in nginx's keys.map between quotes: the same whole-name rule."""
    if not is_name(USER_NAME, name):
        raise BadInput(f"key name {name!r} is not allowed", fix=NAME_RULE)


def hash_password(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()


def verify_password(password: str, hashed: str) -> bool:
    return bcrypt.checkpw(password.encode(), hashed.encode())


def parse_htpasswd(content: str, source: Path) -> dict[str, str]:
    """user → hash, refusing lines nginx would misread."""
    entries: dict[str, str] = {}
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not hashed or user in entries:
            raise BadInput(
                f"{source}:{number}: not a 'user:hash' line or a duplicate user",
                fix=f"edit {source} and fix or delete line {number} (kit never rewrites other "
                "users' lines); a deleted user is added back with a new password by `kit render` "
                "when the spec lists it, or with `kit users add`",
            )
        entries[user] = hashed
    return entries


def htpasswd_with(content: str, user: str, hashed: str) -> str:
    """The file with `user` set to `hashed`; every other line kept byte for byte."""
    lines = content.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new_line = f"{user}:{hashed}\n"
    for index, line in enumerate(lines):
        if line.partition(":")[0] == user:
            lines[index] = new_line
            return "".join(lines)
    return "".join(lines) + new_line


def htpasswd_without(content: str, user: str) -> str:
    return "".join(
        line for line in content.splitlines(keepends=True) if line.partition(":")[0] != user
    )


# --------------------------------------------------------------------------- Bearer keys (programs)

KEY_PREFIX = "sk-kit-"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """SHA-256 of a 256-bit random key: irreversible, and cheap enough for nginx per request."""
    return hashlib.sha256(key.encode()).hexdigest()


def keys_map(keys: dict[str, dict]) -> str:
    """nginx `map` entries: key digest → key name (names are validated user-style names)."""
    lines = ["# Generated by kit: SHA-256 digests of Bearer keys. Manage with `kit keys`.\n"]
    lines += [f'"{entry["sha256"]}" "{name}";\n' for name, entry in sorted(keys.items())]
    return "".join(lines)


KEY_DIGEST = re.compile(r"[0-9a-f]{64}")


def read_keys(layout: SiteLayout) -> dict[str, dict]:
    """name → {sha256, created}; a file nginx's keys.map could not safely be made from is
    refused with its path and the way out."""
    path = layout.keys_db
    try:
        keys = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise _corrupt_keys(path, str(error)) from None
    if not isinstance(keys, dict):
        raise _corrupt_keys(path, "it is not a JSON object of keys")
    for name, entry in keys.items():
        if not is_name(USER_NAME, name):
            raise _corrupt_keys(path, f"key name {name!r} is not allowed")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str) and KEY_DIGEST.fullmatch(entry["sha256"])
            and isinstance(entry.get("created"), str)
        ):
            raise _corrupt_keys(path, f"key {name!r} lacks a SHA-256 digest or creation time")
    return keys


def _corrupt_keys(path: Path, problem: str) -> BadInput:
    backup = path.parent / "backup" / path.name
    return BadInput(
        f"{path} is unreadable: {problem}",
        fix=f"restore the previous version (cp {backup} {path}), or delete it, which revokes "
        "every Bearer key at the next `kit render` or credential change (`kit keys add` makes new "
        "ones)",
    )


# --------------------------------------------------------------------------- auth cache epoch


def auth_state() -> str:
    """nginx include defining $kit_auth_epoch: the HMAC key of the verified-credential cache.

    A fresh random value with every credential change (never derived from the files, so going
    back to earlier contents never brings back earlier cached verdicts): after the reload every
    cached verdict is unreachable, and a rotated password stops working on the next request.
    """
    return (
        "# Generated by kit: a new random value with every credential change (auth cache key).\n"
        f'map $host $kit_auth_epoch {{ default "{secrets.token_hex(32)}"; }}\n'
    )


# What kit's gate sends (header GATE_HEADER) on the requests it makes to be refused (no or a
# wrong credential, closed paths): an HMAC of GATE_MESSAGE under $kit_auth_epoch, which only kit
# and the door hold. The door records such a request as claimed by GATE_CLAIM
# (kit/dataplane/door/auth.js `claimed`), so `kit usage` tells kit's own checks from refusals a
# person caused.
GATE_HEADER = "X-Kit-Gate"
GATE_MESSAGE = b"kit-gate"
GATE_CLAIM = "kit:gate"
_EPOCH = re.compile(r'default "([0-9a-f]{64})";')


def gate_mark(layout: SiteLayout) -> str | None:
    """The gate's mark under the site's current auth epoch; None before the first render."""
    text = read_if_present(layout.auth_state)
    found = _EPOCH.search(text.decode("ascii", "replace")) if text else None
    if found is None:
        return None
    return hmac.new(found[1].encode(), GATE_MESSAGE, hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------- the auth files


@dataclass(frozen=True)
class NewPassword:
    user: str
    password: str
    hashed: str  # what htpasswd holds for it: a saved password is shown only while it matches


@dataclass(frozen=True)
class AuthFiles:
    outputs: list[Output]
    new_passwords: list[NewPassword]
    removed: list[str]  # in auth.users at the last render, not now: taken out of htpasswd
    unlisted: list[str]  # in htpasswd but never in auth.users (`kit users add`): kept


def _spec_users(layout: SiteLayout) -> set[str] | None:
    """auth.users of the last render; None before the first render that recorded them."""
    return read_state(
        layout.spec_users, _user_names,
        fix="delete it: render then keeps every htpasswd user and lists those not in the spec",
    )


def _user_names(text: str) -> set[str]:
    """The JSON list of user names a render recorded."""
    users = json.loads(text)
    if not (isinstance(users, list) and all(isinstance(user, str) for user in users)):
        raise ValueError("expected a JSON list of user names")
    return set(users)


def auth_outputs(layout: SiteLayout, users: list[str]) -> AuthFiles:
    """htpasswd with every spec user and the probe present, keys.map, door-policy.json,
    auth-state.conf.

    The spec owns the users it lists: a missing one gets a generated password that the caller
    prints once; one dropped from auth.users since the last render is removed (with a new auth
    epoch, so it is refused as soon as nginx reloads). Users added with `kit users add` were
    never in the spec and are kept. Every other htpasswd line is kept byte for byte. The probe's
    password is kept in .kit/ (0600) for `kit probe`.
    """
    rel = layout.root
    on_disk = read_if_present(layout.htpasswd) or b""
    htpasswd = on_disk.decode()
    present = parse_htpasswd(htpasswd, layout.htpasswd)
    owned = _spec_users(layout)
    removed = sorted(user for user in (owned or set()) - set(users) if user in present)
    for user in removed:
        htpasswd = htpasswd_without(htpasswd, user)
    unlisted = sorted(set(present) - set(users) - set(removed) - {PROBE_USER})
    new_passwords = []
    outputs = []
    installed = (read_if_present(layout.probe_hash) or b"").decode().strip()
    probe_ready = read_if_present(layout.probe_password) and present.get(PROBE_USER) == installed
    if not (installed and probe_ready):
        probe_password = generate_password()
        probe_hash = hash_password(probe_password)
        htpasswd = htpasswd_with(htpasswd, PROBE_USER, probe_hash)
        outputs += [
            Output(layout.probe_password.relative_to(rel), probe_password.encode() + b"\n",
                   SECRET, generated=False),
            Output(layout.probe_hash.relative_to(rel), probe_hash.encode() + b"\n", SECRET,
                   generated=False),
        ]
    for user in users:
        if user not in present:
            password = generate_password()
            hashed = hash_password(password)
            htpasswd = htpasswd_with(htpasswd, user, hashed)
            new_passwords.append(NewPassword(user, password, hashed))
    keys_db = read_keys(layout)
    keys = keys_map(keys_db).encode()
    principals = present_principals(parse_htpasswd(htpasswd, layout.htpasswd), keys_db)
    unchanged = (
        on_disk == htpasswd.encode() and read_if_present(layout.keys_map) == keys
    )
    epoch = read_if_present(layout.auth_state) if unchanged else None
    mode, group = worker_readable()
    outputs += [
        Output(layout.htpasswd.relative_to(rel), htpasswd.encode(), mode, False, group),
        Output(layout.keys_map.relative_to(rel), keys, SECRET, generated=False),
        Output(layout.door_policy.relative_to(rel), door_policy(read_policies(layout), principals),
               SECRET, generated=False),
        Output(
            layout.auth_state.relative_to(rel), epoch or auth_state().encode(), SECRET,
            generated=False,
        ),
        Output(layout.spec_users.relative_to(rel), (json.dumps(sorted(users)) + "\n").encode(),
               SECRET, generated=False),
    ]
    return AuthFiles(outputs, new_passwords, removed, unlisted)


def unshown_passwords(layout: SiteLayout) -> list[NewPassword]:
    """Passwords an earlier render generated but did not get to print, while htpasswd still
    holds them (a later `kit rotate-password` or `kit users remove` makes them void)."""
    saved = read_state(
        layout.new_passwords,
        lambda text: [NewPassword(**entry) for entry in json.loads(text)],
        fix="delete it and set new passwords with `kit rotate-password USER`",
    ) or []
    current = parse_htpasswd((read_if_present(layout.htpasswd) or b"").decode(), layout.htpasswd)
    return [entry for entry in saved if current.get(entry.user) == entry.hashed]


def unshown_passwords_output(layout: SiteLayout, passwords: list[NewPassword]) -> Output:
    content = json.dumps([vars(entry) for entry in passwords], indent=1) + "\n"
    return Output(layout.new_passwords.relative_to(layout.root), content.encode(), SECRET,
                  generated=False, secret=True)


def forget_shown_passwords(layout: SiteLayout) -> None:
    """The passwords were printed: drop the saved copy (if that fails, the next render shows
    them again, which loses nothing)."""
    with contextlib.suppress(OSError):
        layout.new_passwords.unlink(missing_ok=True)


# --------------------------------------------------------------------------- Prometheus's API


def prometheus_auth_outputs(layout: SiteLayout, alerting: bool = False) -> list[Output]:
    """Prometheus's API secret: generated once and kept in .kit/ (0600); its bcrypt hash in
    web.yml, kept while it matches (so a second render changes nothing); and the 0600 env file
    that hands it to Prometheus (its healthcheck, kit status's queries) and to Grafana (its
    data source). A new secret: delete .kit/prometheus.password and run kit up. With
    `alerting` (observability.alerts) the same account guards Alertmanager's API: its web.yml
    is Prometheus's, the env file is its too, and Prometheus reads the secret from a file
    only its user's group reads to post alerts there."""
    rel = layout.root
    password = (read_if_present(layout.prometheus_password) or b"").decode().strip()
    hashed = _web_config_hash(layout) if password else None
    if not password:
        password = generate_password()
    if hashed is None or not verify_password(password, hashed):
        hashed = bcrypt.hashpw(password.encode(),
                               bcrypt.gensalt(rounds=PROMETHEUS_BCRYPT_COST)).decode()
    mode, group = worker_readable(PROMETHEUS_GID)
    env = env_file_text({PROMETHEUS_PASSWORD_ENV: password}, "the secret in .kit/")
    return [
        Output(layout.prometheus_password.relative_to(rel), password.encode() + b"\n", SECRET,
               generated=False, secret=True),
        Output(layout.prometheus_web_config.relative_to(rel), web_config(hashed).encode(),
               mode, False, group),
        Output(layout.prometheus_auth_env.relative_to(rel), env.encode(), SECRET,
               generated=False, secret=True),
        *(alerting_auth_outputs(layout, password, web_config(hashed)) if alerting else []),
    ]


def alerting_auth_outputs(layout: SiteLayout, password: str, web: str) -> list[Output]:
    """Alertmanager's web.yml (Prometheus's) and the secret Prometheus sends it."""
    rel = layout.root
    mode, group = worker_readable(PROMETHEUS_GID)
    secret_mode, secret_group = secret_readable(PROMETHEUS_GID)
    return [
        Output(layout.alertmanager_web_config.relative_to(rel), web.encode(), mode, False, group),
        Output(layout.prometheus_alertmanager_secret.relative_to(rel), password.encode(),
               secret_mode, False, secret_group, secret=True),
    ]


def _web_config_hash(layout: SiteLayout) -> str | None:
    """The hash web.yml holds for kit's account, None when unreadable (a new one is made)."""
    try:
        users = yaml.safe_load(read_if_present(layout.prometheus_web_config) or b"")
        hashed = users["basic_auth_users"][PROMETHEUS_USER]
    except (yaml.YAMLError, TypeError, KeyError):
        return None
    return hashed if isinstance(hashed, str) and hashed.startswith("$2") else None


def web_config(password_hash: str) -> str:
    """web.yml (`--web.config.file`): every path of Prometheus's API asks for Basic credentials,
    whatever the network lets through (an engine run with --iptables=false forwards between all
    its bridges). Valid for Prometheus 2.24 and later, 3 included."""
    return generated_yaml({"basic_auth_users": {PROMETHEUS_USER: password_hash}})
