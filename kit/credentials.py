"""Credential material: bcrypt htpasswd, Bearer-key digests, the auth cache epoch, TLS.

Functions here compute file contents; writing them is files.py's job, so render, rotation and
`--dry-run` share one path. Secrets are never placed in rendered config, compose or labels.
"""

import datetime as dt
import hashlib
import ipaddress
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kit.errors import BadInput
from kit.files import Output
from kit.layout import PROBE_USER, SiteLayout

BCRYPT_COST = 12
MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_BYTES = 72  # bcrypt ignores everything past 72 bytes: refuse instead of truncating
USER_NAME = re.compile(r"[a-z][a-z0-9._-]{0,31}")  # matched whole: fullmatch, never match
SERVER_CERT_DAYS = 397
RENEW_WHEN_DAYS_LEFT = 30
CA_DAYS = 3650
SECRET = 0o600
NGINX_GID = 101  # the nginx group in the official image: its workers read htpasswd per request


def worker_readable() -> tuple[int, int | None]:
    """Mode and group for files nginx workers read: 0640 group nginx, or 0644 without root."""
    return (0o640, NGINX_GID) if os.geteuid() == 0 else (0o644, None)


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
    if not USER_NAME.fullmatch(user):
        raise BadInput(
            f"user name {user!r} is not allowed",
            fix=f"{NAME_RULE} (no ':' or whitespace: they would corrupt the htpasswd file)",
        )


def check_key_name(name: str) -> None:
    """Key names land in nginx's keys.map between quotes: the same whole-name rule."""
    if not USER_NAME.fullmatch(name):
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
        if not USER_NAME.fullmatch(name):
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


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TLSFiles:
    server_cert: bytes
    server_key: bytes
    ca_cert: bytes | None
    ca_key: bytes | None


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kit"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _san(domain: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(domain))
    except ValueError:
        return x509.DNSName(domain)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_ca(site: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"kit local CA for {site}")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_server_cert(domain: str, ca_cert_pem: bytes, ca_key_pem: bytes) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(domain))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(domain)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def cert_problems(cert_pem: bytes, key_pem: bytes, domain: str, source: str) -> list[str]:
    """Why this certificate/key pair cannot serve `domain` (empty when it can)."""
    try:
        certs = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as error:
        return [f"{source}: not a PEM certificate ({error})"]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        return [f"{source}: the key is not an unencrypted PEM private key ({error})"]
    leaf = certs[0]
    problems = []
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, pub) != leaf.public_key(
    ).public_bytes(serialization.Encoding.PEM, pub):
        problems.append(f"{source}: the key does not belong to the certificate")
    if leaf.not_valid_after_utc <= _now():
        problems.append(f"{source}: the certificate expired on {leaf.not_valid_after_utc:%Y-%m-%d}")
    if not _covers(leaf, domain):
        problems.append(f"{source}: the certificate does not name {domain} in its SAN")
    return problems


def _covers(cert: x509.Certificate, domain: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(domain) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    for name in san.get_values_for_type(x509.DNSName):
        name = name.lower()
        if name == domain or (
            name.startswith("*.") and domain.split(".", 1)[-1] == name[2:] and "." in domain
        ):
            return True
    return False


def days_left(cert_pem: bytes) -> float:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return (cert.not_valid_after_utc - _now()).total_seconds() / 86400


def signed_by(cert_pem: bytes, ca_cert_pem: bytes) -> bool:
    try:
        x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(
            x509.load_pem_x509_certificate(ca_cert_pem)
        )
        return True
    except (ValueError, TypeError, Exception):  # noqa: BLE001 - any failure means "not ours"
        return False


def self_signed_files(layout: SiteLayout, site: str, domain: str) -> TLSFiles:
    """Keep the CA and server cert when still good; make what is missing, expiring or stale."""
    ca_cert = read_if_present(layout.ca_cert)
    ca_key = read_if_present(layout.ca_key)
    if ca_cert is None or ca_key is None or days_left(ca_cert) < RENEW_WHEN_DAYS_LEFT:
        ca_cert, ca_key = new_ca(site)
    cert = read_if_present(layout.server_cert)
    key = read_if_present(layout.server_key)
    if (
        cert is None
        or key is None
        or cert_problems(cert, key, domain, "server cert")
        or days_left(cert) < RENEW_WHEN_DAYS_LEFT
        or not signed_by(cert, ca_cert)
    ):
        cert, key = new_server_cert(domain, ca_cert, ca_key)
    return TLSFiles(cert, key, ca_cert, ca_key)


def acme_files(layout: SiteLayout, site: str, domain: str) -> TLSFiles:
    """Keep the certificate certbot installed while it serves the domain; until certbot has
    one (first start) nginx needs something to start with: a kit-CA certificate."""
    cert, key = read_if_present(layout.server_cert), read_if_present(layout.server_key)
    if cert and key and not cert_problems(cert, key, domain, "server cert"):
        return TLSFiles(cert, key, read_if_present(layout.ca_cert), read_if_present(layout.ca_key))
    return self_signed_files(layout, site, domain)


def user_files(cert_path: Path, key_path: Path, domain: str) -> TLSFiles:
    cert, key = cert_path.read_bytes(), key_path.read_bytes()
    problems = cert_problems(cert, key, domain, str(cert_path))
    if problems:
        raise BadInput(
            "tls.cert/tls.key cannot be used:\n  - " + "\n  - ".join(problems),
            fix="point tls.cert and tls.key at a current certificate for the domain and its key",
        )
    return TLSFiles(cert, key, None, None)


def tls_outputs(layout: SiteLayout, files: TLSFiles) -> list[Output]:
    rel = layout.root
    outputs = [
        Output(layout.server_cert.relative_to(rel), files.server_cert, 0o644, generated=False),
        Output(layout.server_key.relative_to(rel), files.server_key, SECRET, generated=False),
    ]
    if files.ca_cert is not None and files.ca_key is not None:
        outputs += [
            Output(layout.ca_cert.relative_to(rel), files.ca_cert, 0o644, generated=False),
            Output(layout.ca_key.relative_to(rel), files.ca_key, SECRET, generated=False),
        ]
    return outputs


def read_if_present(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- the auth files


@dataclass(frozen=True)
class NewPassword:
    user: str
    password: str


def auth_outputs(layout: SiteLayout, users: list[str]) -> tuple[list[Output], list[NewPassword]]:
    """htpasswd with every spec user and the probe present, keys.map, auth-state.conf.

    Existing htpasswd entries are never touched; a missing user gets a generated password that
    the caller prints once. The probe's password is kept in .kit/ (0600) for `kit probe`.
    """
    rel = layout.root
    on_disk = read_if_present(layout.htpasswd) or b""
    htpasswd = on_disk.decode()
    present = parse_htpasswd(htpasswd, layout.htpasswd)
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
            htpasswd = htpasswd_with(htpasswd, user, hash_password(password))
            new_passwords.append(NewPassword(user, password))
    keys = keys_map(read_keys(layout)).encode()
    unchanged = (
        on_disk == htpasswd.encode() and read_if_present(layout.keys_map) == keys
    )
    epoch = read_if_present(layout.auth_state) if unchanged else None
    mode, group = worker_readable()
    outputs += [
        Output(layout.htpasswd.relative_to(rel), htpasswd.encode(), mode, False, group),
        Output(layout.keys_map.relative_to(rel), keys, SECRET, generated=False),
        Output(
            layout.auth_state.relative_to(rel), epoch or auth_state().encode(), SECRET,
            generated=False,
        ),
    ]
    return outputs, new_passwords
