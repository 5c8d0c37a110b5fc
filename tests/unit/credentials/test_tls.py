"""TLS material an operator brings (files mode): refused with the key and the fix, never a
traceback, when it cannot be read or does not serve the domain."""

import re
from pathlib import Path

import pytest

from kit.credentials.tls import new_ca, new_server_cert, user_files
from kit.errors import BadInput
from tests.support.cli import run_kit


def render(site: Path):
    return run_kit("render", site / "site.yaml")


def files_mode(site: Path, cert: Path, key: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(re.sub(r"(?m)^tls: .*$", f"tls: {{mode: files, cert: {cert}, key: {key}}}",
                           spec.read_text()))


@pytest.fixture
def own_certificate(tmp_path: Path) -> tuple[Path, Path]:
    ca_cert, ca_key = new_ca("test")
    cert, key = new_server_cert("llm.test.internal", ca_cert, ca_key)
    (tmp_path / "server.crt").write_bytes(cert)
    (tmp_path / "server.key").write_bytes(key)
    return tmp_path / "server.crt", tmp_path / "server.key"


def test_an_operators_certificate_is_used(site: Path, own_certificate) -> None:
    files_mode(site, *own_certificate)
    assert render(site).exit_code == 0
    assert (site / "nginx" / "tls" / "server.crt").read_bytes() == own_certificate[0].read_bytes()
    files_mode(site, own_certificate[1], own_certificate[0])  # swapped: not a certificate
    result = render(site)
    assert result.exit_code == 2 and "tls.cert/tls.key cannot be used" in result.output


def test_an_unreadable_key_is_bad_input_naming_it(own_certificate, tmp_path: Path) -> None:
    """The spec checks the path is a file; reading it can still fail (permissions, I/O)."""
    unreadable = tmp_path / "key-is-a-folder"
    unreadable.mkdir()
    with pytest.raises(BadInput) as refused:
        user_files(own_certificate[0], unreadable, "llm.test.internal")
    assert f"tls.key: cannot read {unreadable}: Is a directory" in refused.value.message
    assert "readable" in refused.value.fix
