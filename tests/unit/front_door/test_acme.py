"""kit/front_door/acme.py without Docker: certbot's outcome file, the causes named from its output,
the placeholder/issued decision the gate follows, the TLS facts of `kit status`, and `kit up`'s wait
for the first certificate (the fake engine; certbot's runs written by hand)."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from kit.credentials.tls import Installed, installed, new_ca, new_server_cert
from kit.front_door.acme import (
    AcmeStatus,
    LastRun,
    acme_status,
    await_certificate,
    classify,
    parse_last_run,
)
from kit.front_door.client import target_for
from kit.plan.build import AcmePlan
from kit.render.site_files import render_site
from kit.site import Site
from kit.stack.up import up_site
from kit.views.status import gather, render_text
from tests.support.fake_engine import HealthyEngine
from tests.support.sites import write_site

DOMAIN = "llm.test.internal"
# What Debian's certbot 2.1 printed against pebble in tests/e2e/test_acme.py (shortened), and
# Let's Encrypt's own words for the cases pebble cannot produce.
CHALLENGE = """Certbot failed to authenticate some domains (authenticator: webroot). \
The Certificate Authority reported these problems:
  Domain: llm.test.internal
  Type:   {type}
  Detail: {detail}
"""
OUTPUTS = {
    "ca-unreachable": "An unexpected error occurred:\nValueError: Requesting 10.77.0.1/dir: "
                      "Connection refused\nAsk for help or search for solutions",
    "http-port-unreachable": CHALLENGE.format(
        type="connection", detail='Get "http://llm.test.internal/.well-known/acme-challenge/x": '
        "dial tcp 10.77.0.1:37255: connect: connection refused"),
    "dns-not-here": CHALLENGE.format(
        type="connection", detail='could not resolve URL "http://llm.test.internal/x"'),
    "rate-limited": "An unexpected error occurred:\nError creating new order :: too many "
                    "certificates (5) already issued for this exact set of domains in the last "
                    "168 hours: llm.test.internal, retry after 2026-12-01T00:00:00Z",
    "ca-untrusted": "An unexpected error occurred:\nrequests.exceptions.SSLError: "
                    "HTTPSConnectionPool(host='10.77.0.1', port=14000): Max retries exceeded "
                    "with url: /dir (Caused by SSLError(SSLCertVerificationError(1, '[SSL: "
                    "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local "
                    "issuer certificate (_ssl.c:992)')))",
    "certbot-failed": "Some challenges have failed.\nPermissionError: [Errno 13] Permission "
                      "denied: '/kit-tls/.server.key.new'",
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_each_failure_is_named_with_the_cas_words_and_a_fix(name: str) -> None:
    cause = classify(OUTPUTS[name], DOMAIN, "https://acme.test/dir")
    assert cause.name == name
    assert cause.fix and cause.message
    if name == "ca-untrusted":
        assert "tls.ca_bundle" in cause.fix
    if name != "ca-unreachable":
        assert OUTPUTS[name].strip().splitlines()[-1].split("Detail: ")[-1][:30] in cause.message


def test_a_name_pointing_elsewhere_is_a_dns_cause_as_lets_encrypt_words_it() -> None:
    for output in (CHALLENGE.format(type="dns", detail="DNS problem: NXDOMAIN looking up A"),
                   CHALLENGE.format(type="unauthorized", detail="203.0.113.9: Invalid response "
                                    "from http://llm.test.internal/.well-known/x: 404")):
        assert classify(output, DOMAIN, "x").name == "dns-not-here"


def test_the_outcome_file_is_read_and_anything_else_is_unknown() -> None:
    run = parse_last_run("exit=1 at=1700000000\nsome output\n")
    assert run == LastRun(1, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC), "some output\n")
    assert not run.ok
    assert parse_last_run("garbage\n") is None and parse_last_run("") is None


def acme_site(tmp_path: Path, more_tls: str = "") -> Site:
    spec = write_site(tmp_path)
    spec.write_text(spec.read_text() + f"tls: {{mode: acme, email: ops@test.example{more_tls}}}\n")
    site = Site.load(spec)
    render_site(site)
    return site


def issue_foreign(site: Site, days: int = 90) -> None:
    """What certbot's install step does: a certificate from another CA into nginx/tls."""
    ca, ca_key = new_ca("public-ca")
    cert, key = new_server_cert(DOMAIN, ca, ca_key)
    site.layout.server_cert.write_bytes(cert)
    site.layout.server_key.write_bytes(key)


def write_run(site: Site, code: int, output: str, at: int = 1_800_000_000) -> None:
    site.layout.acme_last_run.write_text(f"exit={code} at={at}\n{output}")


def test_the_gate_trusts_the_kit_ca_only_until_certbot_installed_one(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    cert = installed(site.layout)
    assert cert is not None and cert.placeholder and cert.issuer == "kit local CA for unit01"
    assert target_for(site.spec, site.layout, None, 5).ca_file == site.layout.ca_cert
    issue_foreign(site)
    assert not installed(site.layout).placeholder
    assert target_for(site.spec, site.layout, None, 5).ca_file is None  # the system store


def test_status_facts_issuer_expiry_next_renewal_last_result(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    waiting = acme_status(site)
    assert waiting.waiting and waiting.last_run is None and waiting.next_renewal is None
    assert waiting.lines()[0].startswith("tls: waiting for the first certificate from Let's "
                                         "Encrypt: serving a kit-CA certificate")
    write_run(site, 1, OUTPUTS["http-port-unreachable"])
    failed = acme_status(site)
    assert failed.cause is not None and failed.cause.name == "http-port-unreachable"
    assert "FAILED at 2027-01-15 08:00:00Z (http-port-unreachable)" in failed.lines()[1]
    assert failed.to_json()["last_run"]["cause"] == "http-port-unreachable"
    issue_foreign(site)
    write_run(site, 0, "Successfully received certificate.\n")
    issued = acme_status(site)
    facts = issued.to_json()
    assert facts["issuer"] == "kit local CA for public-ca"
    assert not facts["waiting_for_first_certificate"]
    assert facts["last_run"] == {"ok": True, "at": "2027-01-15T08:00:00+00:00", "exit_code": 0,
                                 "cause": None, "message": None}
    assert "last certbot run succeeded at 2027-01-15 08:00:00Z" in issued.lines()[1]


def test_next_renewal_is_certbots_first_12_hourly_run_from_the_due_date() -> None:
    at = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    cert = Installed(b"", "CA", at + dt.timedelta(days=90), placeholder=False)
    status = AcmeStatus("x", cert, LastRun(0, at, ""), None, 60)
    assert status.renewal_due == at + dt.timedelta(days=60)
    assert status.next_renewal == at + dt.timedelta(days=60)  # a whole number of 12 h runs
    late = AcmeStatus("x", cert, LastRun(0, at + dt.timedelta(hours=1), ""), None, 60)
    assert late.next_renewal == at + dt.timedelta(days=60, hours=1)
    due_now = AcmeStatus("x", Installed(b"", "CA", at, False), LastRun(0, at, ""), None,
                         60)
    assert due_now.next_renewal == at + dt.timedelta(hours=12)  # the next run renews


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_up_waits_for_certbots_first_run_and_says_when_none_came(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    clock, reported = Clock(), []
    status = await_certificate(site, reported.append, timeout=30, sleep=clock.sleep, clock=clock)
    assert clock.now >= 30 and status.waiting and status.cause is None
    assert reported == ["tls: waiting up to 30s for certbot's first certificate from "
                        "Let's Encrypt"]


def test_up_stops_waiting_at_a_failed_run_and_names_it(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    write_run(site, 1, OUTPUTS["dns-not-here"])
    clock = Clock()
    status = await_certificate(site, lambda _: None, timeout=30, sleep=clock.sleep, clock=clock)
    assert clock.now == 0 and status.cause is not None and status.cause.name == "dns-not-here"


def test_up_waits_until_nginx_serves_an_installed_certificate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = acme_site(tmp_path)
    issue_foreign(site)
    clock, served = Clock(), iter([None, b"old", None])

    def serving(_site: Site) -> bytes | None:
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding

        new = x509.load_pem_x509_certificate(site.layout.server_cert.read_bytes())
        return next(served, new.public_bytes(Encoding.DER))

    monkeypatch.setattr("kit.front_door.acme.served_certificate", serving)
    reported: list[str] = []
    status = await_certificate(site, reported.append, timeout=30, sleep=clock.sleep, clock=clock)
    assert not status.waiting and clock.now == 0.75  # three answers before the new certificate
    assert reported[-1].startswith("tls: nginx serves the installed certificate (installed ")
    clock.now = 0.0
    monkeypatch.setattr("kit.front_door.acme.served_certificate", lambda _site: b"old")
    await_certificate(site, reported.append, timeout=30, sleep=clock.sleep, clock=clock)
    assert reported[-1].startswith("tls: nginx still serves another certificate")


def test_kit_up_and_status_report_the_waiting_state_and_its_cause(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    write_run(site, 1, OUTPUTS["ca-unreachable"])
    engine = HealthyEngine(local=False)
    for image in ("vllm/vllm-openai:v0.33.0", "nginx:1.27-alpine", "certbot/certbot:v3.1.0"):
        engine.images[image] = f"sha256:{len(engine.images)}"
    reported: list[str] = []
    result = up_site(site, timeout=5, probe=False, report=reported.append,
                     warn=reported.append, connect=lambda: engine)
    assert result.acme is not None and result.acme.cause.name == "ca-unreachable"
    assert any(line.startswith("tls: waiting for the first certificate") for line in reported)
    assert any("FAILED" in line and "(ca-unreachable)" in line for line in reported)
    status = gather(Site.load(site.spec_path), engine)
    assert status.to_json(dt.datetime.now(dt.UTC))["tls"]["last_run"]["cause"] == "ca-unreachable"
    assert "(ca-unreachable): the ACME CA is unreachable" in render_text(
        status, dt.datetime.now(dt.UTC))


def test_an_outcome_older_than_the_certbot_container_is_not_waited_on(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    write_run(site, 1, OUTPUTS["dns-not-here"], at=1_700_000_000)  # a former container's
    clock = Clock()
    since = dt.datetime.fromtimestamp(1_700_000_060, dt.UTC)
    status = await_certificate(site, lambda _: None, since=since, timeout=10, sleep=clock.sleep,
                               clock=clock)
    assert clock.now >= 10 and status.last_run is None and status.cause is None
    write_run(site, 1, OUTPUTS["dns-not-here"], at=1_700_000_059)  # within the start's second
    assert await_certificate(site, lambda _: None, since=since, timeout=10).cause is not None


# What Debian's certbot 2.1 (Python 3.11) printed when the rate limiter of tests/e2e/test_acme.py
# refused its order, and the CA's problem the certbot loop added from certbot's log.
CERTBOT_21_RATE_LIMITED = """Saving debug log to /var/log/letsencrypt/letsencrypt.log
Account registered.
Requesting a certificate for llm.test
An unexpected error occurred:
AttributeError: can't set attribute
Ask for help or search for solutions at https://community.letsencrypt.org. See the logfile \
/var/log/letsencrypt/letsencrypt.log or re-run Certbot with -v for more details.
acme.messages.Error: urn:ietf:params:acme:error:rateLimited :: There were too many requests of \
a given type :: too many certificates (1) already issued for this exact set of identifiers in \
the last 1m0s, retry after 2026-11-30 21:52:17 UTC: see \
https://letsencrypt.org/docs/rate-limits/#new-certificates-per-exact-set-of-identifiers
"""


def test_a_rate_limit_hidden_by_certbot_21_is_named_from_the_cas_problem() -> None:
    cause = classify(CERTBOT_21_RATE_LIMITED, DOMAIN, "https://acme.test/dir")
    assert cause.name == "rate-limited"
    assert cause.message == (
        "the ACME CA rate-limits this account or name: too many certificates (1) already issued "
        "for this exact set of identifiers in the last 1m0s, retry after 2026-11-30 21:52:17 "
        "UTC: see https://letsencrypt.org/docs/rate-limits/"
        "#new-certificates-per-exact-set-of-identifiers")


def test_a_failed_run_says_when_certbot_tries_again(tmp_path: Path) -> None:
    site = acme_site(tmp_path)
    site.layout.acme_last_run.write_text(f"exit=1 at=1800000000 next=120\n"
                                         f"{CERTBOT_21_RATE_LIMITED}")
    failed = acme_status(site)
    assert failed.last_run is not None and failed.last_run.next_in == 120
    assert failed.lines()[3] == ("  next attempt: certbot runs again at 2027-01-15 08:02:00Z "
                                 "(120s after this run; after a failed run it waits 60s, "
                                 "doubling up to 3600s, or until the time the CA named)")
    assert failed.to_json()["next_attempt"] == "2027-01-15T08:02:00+00:00"
    write_run(site, 1, CERTBOT_21_RATE_LIMITED)  # a file without next=: no time to give
    assert acme_status(site).lines()[3] == "  certbot retries within minutes"
    assert acme_status(site).to_json()["next_attempt"] is None


def test_tls_acme_retry_s_sets_the_first_retry_of_the_loop_and_of_status(tmp_path: Path) -> None:
    """A private CA may be retried sooner than certbot's default minute: the rendered loop
    starts its backoff there, and `kit status` says so."""
    site = acme_site(tmp_path, ", acme_retry_s: 20")
    compose = site.layout.compose_file.read_text()
    assert "delay=20; while :" in compose and "delay=60" not in compose
    site.layout.acme_last_run.write_text(f"exit=1 at=1800000000 next=20\n"
                                         f"{CERTBOT_21_RATE_LIMITED}")
    assert "after a failed run it waits 20s, doubling up to 3600s" in acme_status(site).lines()[3]


def run_certbot_loop(tmp_path: Path, ca_problem: str, retry_first: int = 60) -> tuple[int, str]:
    """The rendered certbot loop (first retry after `retry_first` s) under /bin/sh for one
    failed run: `certbot` fails and logs `ca_problem` as certbot does, `sleep` records how long
    the loop waits and ends it."""
    tls, stubs = tmp_path / "tls", tmp_path / "bin"
    tls.mkdir(parents=True)
    stubs.mkdir()
    log = tmp_path / "letsencrypt.log"
    (stubs / "certbot").write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(ca_problem)} > {log}"
                                   "\necho \"AttributeError: can't set attribute\"\nexit 1\n")
    (stubs / "sleep").write_text(f"#!/bin/sh\necho $1 > {tmp_path}/slept\nkill -TERM $PPID\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    plan = AcmePlan("certbot", "ops@test.example", DOMAIN, None, False, retry_first,
                    tls_mount=str(tls), certbot_log=str(log))
    subprocess.run(["/bin/sh", "-c", plan.loop], env={**os.environ, "PATH": f"{stubs}:"
                   f"{os.environ['PATH']}"}, timeout=20, check=False)
    return int((tmp_path / "slept").read_text()), (tls / "acme-last-run").read_text()


def test_a_failed_run_waits_until_the_time_the_ca_names(tmp_path: Path) -> None:
    """Let's Encrypt's rate-limit problem names when to retry: asking earlier is refused again,
    so the loop waits at least that long (and says so in its run record)."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)
    problem = ("acme.messages.Error: urn:ietf:params:acme:error:rateLimited :: There were too "
               "many requests of a given type :: too many certificates (5) already issued for "
               f"this exact set of identifiers in the last 168h0m0s, retry after "
               f"{later:%Y-%m-%d %H:%M:%S} UTC: see https://letsencrypt.org/docs/rate-limits/")
    slept, record = run_certbot_loop(tmp_path / "limited", problem)
    assert 3 * 3600 - 5 <= slept <= 3 * 3600 + 2, slept
    assert record.startswith("exit=1 ") and f" next={slept}\n" in record.splitlines()[0] + "\n"
    assert problem in record
    other = "acme.messages.Error: urn:ietf:params:acme:error:connection :: Timeout"
    slept, _ = run_certbot_loop(tmp_path / "other", other, retry_first=25)
    assert slept == 25  # no time named: the loop's own backoff (tls.acme_retry_s)
