"""TLS files an operator brings, written into a site folder by the spec tests' cases: a
files-mode certificate and key, and tls.ca_bundle's file (each a `prepare(site)` step)."""

import datetime as dt
from pathlib import Path
from unittest import mock

from kit.credentials.tls import new_ca, new_server_cert


def certificate(domain: str, *, issued_days_ago: int = 0, other_key: bool = False):
    """A files-mode certificate (and key) in the site folder."""

    def prepare(site: Path) -> None:
        issued = dt.datetime.now(dt.UTC) - dt.timedelta(days=issued_days_ago)
        with mock.patch("kit.credentials.tls._now", return_value=issued):
            ca_cert, ca_key = new_ca("test")
            cert, key = new_server_cert(domain, ca_cert, ca_key)
            if other_key:
                key = new_server_cert(domain, ca_cert, ca_key)[1]
        (site / "server.pem").write_bytes(cert)
        (site / "server.key").write_bytes(key)

    return prepare


def ca_bundle(content: str):
    """tls.ca_bundle's file in the site folder: `ca`, `key`, `server` (a leaf), `junk`."""

    def prepare(site: Path) -> None:
        ca_cert, ca_key = new_ca("test")
        pems = {"ca": ca_cert, "key": ca_key, "junk": b"not a certificate\n",
                "server": new_server_cert("llm.test.internal", ca_cert, ca_key)[0]}
        (site / "ca.pem").write_bytes(b"".join(pems[part] for part in content.split("+")))

    return prepare
