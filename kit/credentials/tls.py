"""TLS material of the front door: the kit CA and server certificate (self-signed mode), the
placeholder acme mode starts with, and the checks an operator's own certificate must pass.

Functions here compute file contents; writing them is files.py's job (through render).
"""

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    CertificateIssuerPublicKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kit.credentials.material import SECRET, read_if_present
from kit.errors import BadInput
from kit.files import Output
from kit.layout import SiteLayout

SERVER_CERT_DAYS = 397
RENEW_WHEN_DAYS_LEFT = 30
CA_DAYS = 3650


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
    # a key that cannot sign certificates fails in sign(), as cryptography checks at run time
    ca_key = cast(CertificateIssuerPrivateKeyTypes,
                  serialization.load_pem_private_key(ca_key_pem, password=None))
    ca_public_key = cast(CertificateIssuerPublicKeyTypes, ca_cert.public_key())
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
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public_key), critical=False
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


PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


def ca_bundle_problems(pem: bytes) -> list[str]:
    """Why a file cannot be tls.ca_bundle (empty when it can): PEM CA certificates and nothing
    else; a private key in it would be copied into the site and mounted into certbot."""
    kinds = {kind.decode() for kind in PEM_BLOCK.findall(pem)}
    if kinds - {"CERTIFICATE"}:
        private = " (a private key: never hand it to kit)" if any(
            "PRIVATE KEY" in kind for kind in kinds) else ""
        return [f"holds {', '.join(sorted(kinds - {'CERTIFICATE'}))} blocks{private}; "
                "only CERTIFICATE blocks belong in a CA bundle"]
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as error:
        return [f"not PEM certificates ({error})"]
    problems = []
    for cert in certs:
        subject = cert.subject.rfc4514_string() or "(no subject)"
        try:
            ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            ca = False
        if not ca:
            problems.append(f"{subject} is not a CA certificate (no basicConstraints CA:TRUE): "
                            "the bundle holds the CA that signs, not a server's certificate")
        if cert.not_valid_after_utc <= _now():
            problems.append(f"{subject} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
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
    cert, key = _read_user_file(cert_path, "tls.cert"), _read_user_file(key_path, "tls.key")
    problems = cert_problems(cert, key, domain, str(cert_path))
    if problems:
        raise BadInput(
            "tls.cert/tls.key cannot be used:\n  - " + "\n  - ".join(problems),
            fix="point tls.cert and tls.key at a current certificate for the domain and its key",
        )
    return TLSFiles(cert, key, None, None)


def _read_user_file(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise BadInput(
            f"{key}: cannot read {path}: {error.strerror}",
            fix=f"make {path} readable by the user running kit (it is copied into the site "
            f"with mode 0600), or point {key} at a readable copy",
        ) from None


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


@dataclass(frozen=True)
class Installed:
    """The certificate in nginx/tls, the one nginx serves after its next reload."""

    pem: bytes
    issuer: str
    not_after: dt.datetime
    placeholder: bool  # kit's own CA signed it: certbot has not installed one yet


def installed(layout: SiteLayout) -> Installed | None:
    pem = read_if_present(layout.server_cert)
    if pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    issuer = str(names[0].value) if names else cert.issuer.rfc4514_string()
    ca = read_if_present(layout.ca_cert)
    return Installed(pem, issuer, cert.not_valid_after_utc, ca is not None and signed_by(pem, ca))
