"""An outside TLS scanner (sslyze) against the running front door, as an auditor would run it.

The rendered nginx must accept nothing below TLS 1.2, only AEAD suites with forward secrecy in
TLS 1.2 (no NULL, EXPORT, anonymous, RC4, DES/3DES, CBC or MD5/SHA-1 MACs), TLS 1.3, and send
HSTS for at least a year. A second test weakens the running config by hand and checks that the
same judgement names each weakness, so the first one cannot pass by seeing nothing.
"""

from collections.abc import Iterator

import pytest
from sslyze import (
    ScanCommand,
    ScanCommandAttemptStatusEnum,
    Scanner,
    ServerNetworkLocation,
    ServerScanRequest,
    ServerScanResult,
    ServerScanStatusEnum,
)

from tests.support.live_stack import DOMAIN, LiveSite, running

pytestmark = pytest.mark.e2e

LEGACY = {  # what must be refused outright
    "SSL 2.0": ScanCommand.SSL_2_0_CIPHER_SUITES,
    "SSL 3.0": ScanCommand.SSL_3_0_CIPHER_SUITES,
    "TLS 1.0": ScanCommand.TLS_1_0_CIPHER_SUITES,
    "TLS 1.1": ScanCommand.TLS_1_1_CIPHER_SUITES,
}
WEAK_MARKS = ("NULL", "EXPORT", "anon", "RC4", "DES", "_CBC_", "MD5")
AEAD_MARKS = ("_GCM_", "_CHACHA20_POLY1305_", "_CCM")
FORWARD_SECRET = ("TLS_ECDHE_", "TLS_DHE_")
HSTS_MIN_AGE_S = 365 * 24 * 3600


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    """One front door for both scans: the weakening test puts nginx.conf back when it ends."""
    with running(tmp_path_factory.mktemp("tls") / "site", docker_client, prefix="tls") as site:
        yield site


def scan(site: LiveSite) -> ServerScanResult:
    """sslyze on 127.0.0.1 with the domain in SNI and Host (the certificate is not judged here:
    kit's own gate checks it against the kit CA)."""
    location = ServerNetworkLocation(hostname=DOMAIN, port=site.https_port, ip_address="127.0.0.1")
    commands = {*LEGACY.values(), ScanCommand.TLS_1_2_CIPHER_SUITES,
                ScanCommand.TLS_1_3_CIPHER_SUITES, ScanCommand.HTTP_HEADERS}
    scanner = Scanner()
    scanner.queue_scans([ServerScanRequest(server_location=location, scan_commands=commands)])
    (result,) = scanner.get_results()
    assert result.scan_status == ServerScanStatusEnum.COMPLETED, result.connectivity_error_trace
    return result


def weaknesses(result: ServerScanResult) -> list[str]:
    """Everything an auditor would flag, one line each; empty when the front door is sound."""
    found = []
    scans = result.scan_result
    for name, command in LEGACY.items():
        attempt = getattr(scans, command.value)
        assert attempt.status == ScanCommandAttemptStatusEnum.COMPLETED, attempt.error_trace
        if attempt.result.accepted_cipher_suites:
            found.append(f"{name} accepted")
    tls12 = scans.tls_1_2_cipher_suites.result.accepted_cipher_suites
    for accepted in tls12:
        name = accepted.cipher_suite.name
        if (any(mark in name for mark in WEAK_MARKS) or not name.startswith(FORWARD_SECRET)
                or not any(mark in name for mark in AEAD_MARKS) or name.endswith("_SHA")):
            found.append(f"weak TLS 1.2 suite {name}")
    if not tls12:
        found.append("TLS 1.2 refused: clients without TLS 1.3 cannot connect")
    if not scans.tls_1_3_cipher_suites.result.accepted_cipher_suites:
        found.append("TLS 1.3 refused")
    hsts = scans.http_headers.result.strict_transport_security_header
    if hsts is None:
        found.append("no Strict-Transport-Security header")
    elif (hsts.max_age or 0) < HSTS_MIN_AGE_S:
        found.append(f"HSTS max-age {hsts.max_age} is under a year")
    return found


def test_the_rendered_front_door_passes_a_tls_scan(site: LiveSite) -> None:
    result = scan(site)
    assert weaknesses(result) == []
    tls12 = {a.cipher_suite.name for a in result.scan_result.tls_1_2_cipher_suites.result
             .accepted_cipher_suites}
    assert "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" in tls12  # the site key is ECDSA P-256


def test_the_scan_names_each_weakness_of_a_weakened_front_door(site: LiveSite) -> None:
    rendered = site.layout.nginx_conf.read_text()
    try:
        site.load_nginx_conf(site.nginx_conf_with(
            ("ssl_protocols TLSv1.2 TLSv1.3;", "ssl_protocols TLSv1 TLSv1.2 TLSv1.3;"),
            ("ssl_ciphers ", "ssl_ciphers ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0:"),
            ('add_header Strict-Transport-Security "max-age=63072000; includeSubDomains" always;',
             ""),
        ))
        assert sorted(weaknesses(scan(site))) == [
            "TLS 1.0 accepted",
            "no Strict-Transport-Security header",
            "weak TLS 1.2 suite TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        ]
    finally:
        site.load_nginx_conf(rendered)  # the other scan meets the front door as rendered
