"""tls.mode acme end to end against a real ACME server: Debian's pebble
(tests/support/acme_ca.py) as tls.acme_server and Debian's certbot as the spec's certbot image
(tests/images/build.sh).

`kit up` on a first deployment: certbot answers HTTP-01 through kit's nginx, the certificate is
installed, nginx reloads in place, and the gate verifies the chain against pebble's root, which
only the site trusts (tls.ca_bundle: pebble's root and the CA of its directory's HTTPS
certificate, for the gate and for certbot; --ca for the load client). Then a
renewal under 50 streams, a site re-created with its letsencrypt volume kept, and each way the
first certificate can fail, provoked for real and named by `kit up` and `kit status` (a rate
limit by a real rate limiter in front of pebble, which has none: tests/support/acme_limiter).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from kit.plan.build import AcmePlan
from tests.support.acme_ca import ACME_ADDRESS, Pebble, RateLimiter, add_acme_address, directory
from tests.support.docker_engine import pick_free_port, remove_project
from tests.support.live_stack import DOMAIN, LiveSite, checked, finished, kit, write_spec

pytestmark = pytest.mark.e2e

SHORT_LIVED_S = 900  # pebble's certificates: far below certbot's 30 days, so every run renews
LIKE_LETS_ENCRYPT_S = 90 * 86400  # certbot's run finds such a certificate not yet due
STREAMS = 50
STREAM_TOKENS = 750
RETRIED_PORT = 14100  # the CA-unreachable case: pebble comes up there after kit up
# tls.acme_retry_s of the CA-unreachable and rate-limited cases: certbot's first retry comes
# this soon, not after the minute it waits by default
RETRY_S = 10
LIMITED_PORT = 14040  # the rate-limited case: the limiter in front of its pebble
UNTRUSTED_PORT = 14050  # the case of a tls.ca_bundle without the directory's CA
PROMPT_S = AcmePlan.watch_every + 2  # a new certificate is served this soon after installation


def served(port: int) -> x509.Certificate:
    """The leaf nginx serves now (unverified: which certificate, not whether trusted)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), 5) as raw, \
            context.wrap_socket(raw, server_hostname=DOMAIN) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def verifies(port: int, cafile: Path | None) -> bool:
    """A client trusting only `cafile` (None: the system store) accepts the served chain."""
    context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    try:
        with socket.create_connection(("127.0.0.1", port), 5) as raw, \
                context.wrap_socket(raw, server_hostname=DOMAIN):
            return True
    except ssl.SSLCertVerificationError:
        return False


def issuer(cert: x509.Certificate) -> str:
    return cert.issuer.rfc4514_string()


TRUST = "private-acme-ca.pem"  # tls.ca_bundle, beside the spec


def acme_site(root: Path, client, server: str, http_port: int,
              trust: bytes | None = None, retry_s: int | None = None) -> LiveSite:
    """A site of the ACME CA at `server`; `trust`: its tls.ca_bundle (None: none, so the gate
    trusts the system store and certbot its image's, which has the test CA of pebble's HTTPS);
    `retry_s`: its tls.acme_retry_s (None: certbot's default)."""
    tls = {"mode": "acme", "email": "ops@acme.test", "acme_server": server}
    if retry_s is not None:
        tls["acme_retry_s"] = retry_s
    if trust is not None:
        root.mkdir(parents=True)
        (root / TRUST).write_bytes(trust)
        tls["ca_bundle"] = TRUST
    return LiveSite.create(root, client, pick_free_port(), http_port, prefix="acme",
                           proxy={"bind": "0.0.0.0"},  # pebble reaches it on ACME_ADDRESS
                           tls=tls)


def up(site: LiveSite) -> tuple[object, float]:
    """`kit up` with the system's trust store alone; (result, seconds)."""
    started = time.monotonic()
    result = kit("up", str(site.spec_path))
    return result, time.monotonic() - started


def status(site: LiveSite) -> tuple[str, dict]:
    text = checked(site.kit("status")).stdout
    return text, json.loads(checked(site.kit("status", "--json")).stdout)["tls"]


@pytest.fixture(scope="module")
def pebble(docker_client, test_images, tmp_path_factory) -> Iterator[Pebble]:
    add_acme_address()
    ca = Pebble(docker_client, tmp_path_factory.mktemp("pebble"), http_port=pick_free_port(),
                validity_s=SHORT_LIVED_S)
    yield ca
    ca.remove()


@pytest.fixture(scope="module")
def issued(pebble, docker_client, tmp_path_factory) -> Iterator[tuple]:
    """A first deployment through `kit up`: (site, kit up's result, its seconds, pebble's root)."""
    root_pem = tmp_path_factory.mktemp("trust") / "pebble-root.pem"
    root_pem.write_bytes(pebble.root())
    site = acme_site(tmp_path_factory.mktemp("acme") / "site", docker_client, pebble.directory,
                     pebble.http_port, trust=pebble.trust())
    try:
        result, seconds = up(site)
        yield site, result, seconds, root_pem
    finally:
        remove_project(docker_client, site.name)


def test_first_deployment_is_issued_installed_and_passes_the_gate(issued) -> None:
    site, result, seconds, root_pem = issued
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "tls: certificate from Pebble Intermediate CA" in out, out
    assert f"verified against tls.ca_bundle ({site.layout.ca_bundle})" in out, out
    assert "all checks passed" in out, out
    # certbot reached the directory trusting tls.ca_bundle alone (read-only in its container)
    certbot = site.container("certbot").attrs
    assert "REQUESTS_CA_BUNDLE=/kit-trust/ca-bundle.pem" in certbot["Config"]["Env"]
    assert any(m["Destination"] == "/kit-trust" and not m["RW"] for m in certbot["Mounts"])
    # served promptly: nginx's watcher saw the new file and reloaded (kit up checked it)
    prompt = re.search(r"tls: nginx serves the installed certificate \(installed ([\d.]+)s ago",
                       out)
    assert prompt and float(prompt[1]) <= PROMPT_S, out
    leaf = served(site.https_port)
    assert "Pebble Intermediate CA" in issuer(leaf)
    assert verifies(site.https_port, root_pem)  # the chain, against pebble's root only
    assert not verifies(site.https_port, None)  # which nothing but the test trusts
    # the challenge came to kit's nginx on the HTTP port, from pebble, and was answered
    log = site.nginx.logs().decode(errors="replace")
    assert any("GET /.well-known/acme-challenge/" in line and '" 200 ' in line
               for line in log.splitlines()), log
    print(f"\nfirst deployment in acme mode: kit up {seconds:.1f}s, served {prompt[1]}s after "
          f"certbot installed it, serial {leaf.serial_number}")


def test_status_shows_issuer_expiry_next_renewal_and_last_result(issued) -> None:
    site, *_ = issued
    text, tls = status(site)
    assert "tls: certificate from Pebble Intermediate CA" in text, text
    assert "next renewal" in text and "last certbot run succeeded" in text, text
    assert tls["waiting_for_first_certificate"] is False
    assert tls["issuer"].startswith("Pebble Intermediate CA") and tls["expires"]
    assert tls["renewal_due"] and tls["last_run"]["ok"] is True, tls


def test_without_tls_ca_bundle_the_gate_names_it(issued) -> None:
    """The same site seen through a spec without tls.ca_bundle (same folder, so the same
    stack): pebble's root is in no system store, and the gate's error says what to set."""
    site, *_ = issued
    spec = yaml.safe_load(site.spec_path.read_text())
    del spec["tls"]["ca_bundle"]
    bare = site.root / "site-without-bundle.yaml"
    write_spec(bare, spec)
    result = kit("probe", str(bare))
    assert result.returncode == 1, result.stdout + result.stderr
    tls = next(line for line in result.stdout.splitlines() if line.startswith("tls "))
    assert "not trusted by the system CA store" in tls, result.stdout
    assert "set tls.ca_bundle to its PEM certificate" in tls, result.stdout
    print(f"\nwithout tls.ca_bundle: {tls}")


def test_certbot_trusts_tls_ca_bundle_alone_for_the_directory(
        docker_client, test_images, tmp_path) -> None:
    """A bundle with pebble's root but not the CA of its directory's HTTPS certificate: certbot
    (whose image trusts that CA in its system store) must refuse the directory, so it reads the
    bundle, and only it; kit up names the cause and its fix."""
    add_acme_address()
    http_port = pick_free_port()
    ca = Pebble(docker_client, tmp_path / "pebble", http_port=http_port, port=UNTRUSTED_PORT,
                validity_s=SHORT_LIVED_S)
    site = acme_site(tmp_path / "site", docker_client, ca.directory, http_port, trust=ca.root())
    try:
        out, text, tls = named_by_up_and_status("ca-untrusted", site)
        assert "set tls.ca_bundle to the PEM certificate of the CA that signs the ACME server" \
            in out, out
        assert "CERTIFICATE_VERIFY_FAILED" in site.layout.acme_last_run.read_text()
    finally:
        remove_project(docker_client, site.name)
        ca.remove()


def test_renewal_under_50_streams_drops_nothing_and_is_served_promptly(issued) -> None:
    site, _, _, root_pem = issued
    before = served(site.https_port).serial_number
    installed_before = site.layout.server_cert.read_bytes()
    # 50 streams of 15 s each (20 ms a token) that all run across the renewal and the reload
    load_started = time.monotonic()
    load = site.loadgen(site.basic("ops"), streams=STREAMS, tokens=STREAM_TOKENS, timeout=90,
                        ca=root_pem, announce=True)
    assert load.stderr.readline() == "streaming\n"  # every stream has its first token
    renew_started = time.time()
    # certbot's loop runs at its start (then every 12 h): pebble's short-lived certificate has
    # less than 30 days left, so this run renews it
    site.container("certbot").restart(timeout=5)
    installed_at = served_at = None
    deadline = time.monotonic() + 60
    while served_at is None and time.monotonic() < deadline:
        if installed_at is None and site.layout.server_cert.read_bytes() != installed_before:
            installed_at = time.monotonic()
        if installed_at is not None and served(site.https_port).serial_number != before:
            served_at = time.monotonic()
        time.sleep(0.2)
    figures = finished(load, timeout=120)
    assert installed_at is not None, "certbot did not install a renewed certificate"
    assert served_at is not None, "nginx kept serving the old certificate"
    assert served_at - installed_at <= PROMPT_S, (served_at - installed_at)
    assert figures["failures"] == {} and figures["ok"] == STREAMS, figures  # 0 dropped or cut
    assert served_at < load_started + figures["wall_s"], "the streams ended before the reload"
    assert verifies(site.https_port, root_pem)
    _, tls = status(site)
    assert tls["last_run"]["ok"] and tls["last_run"]["at"] >= time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.gmtime(int(renew_started))), tls
    reloads = site.nginx.logs(since=int(renew_started)).decode(errors="replace")
    assert "signal process started" in reloads or "reconfiguring" in reloads, reloads
    print(f"\nrenewal under {STREAMS} streams: installed -> served "
          f"{served_at - installed_at:.1f}s, {figures['ok']} streams ok over "
          f"{figures['wall_s']:.1f}s, {figures['failed']} failed")


def test_recreated_site_with_kept_letsencrypt_volume_installs_its_certificate(
        docker_client, test_images, tmp_path) -> None:
    """certbot finds the kept certificate not yet due and renews nothing; it is installed anyway."""
    add_acme_address()
    http_port = pick_free_port()
    ca = Pebble(docker_client, tmp_path / "pebble", http_port=http_port, port=14010,
                validity_s=LIKE_LETS_ENCRYPT_S)
    first = acme_site(tmp_path / "first", docker_client, ca.directory, http_port,
                      trust=ca.trust())
    try:
        result, _ = up(first)
        assert result.returncode == 0, result.stdout + result.stderr
        serial = served(first.https_port).serial_number
        checked(first.kit("down"))  # keeps the volumes, letsencrypt among them
        again = LiveSite(tmp_path / "again", first.name, docker_client, first.https_port)
        again.root.mkdir()
        shutil.copy(first.spec_path, again.spec_path)
        shutil.copy(first.root / TRUST, again.root / TRUST)
        checked(again.kit("render"))  # a fresh nginx/tls: the kit-CA placeholder
        result, seconds = up(again)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        certbot = again.container("certbot").logs().decode(errors="replace")
        run = again.layout.acme_last_run.read_text()
        assert "not yet due for renewal" in run, run + certbot
        assert served(again.https_port).serial_number == serial  # the kept one, installed
        assert "all checks passed" in out and "verified against tls.ca_bundle" in out, out
        print(f"\nre-created site: kept certificate served, kit up {seconds:.1f}s")
    finally:
        remove_project(docker_client, first.name)
        ca.remove()


def named_by_up_and_status(case: str, site: LiveSite) -> tuple[str, str, dict]:
    """`kit up` on a first deployment whose certificate fails for `case`: it exits 1 naming the
    cause while the site serves the kit-CA certificate, and `kit status` names it too;
    (kit up's output, kit status's text, its tls facts)."""
    result, seconds = up(site)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"no certificate from the ACME CA yet ({case})" in out, out
    assert "tls: waiting for the first certificate" in out, out
    assert "verified against the kit CA" in out and "all checks passed" in out, out
    assert f"CN=kit local CA for {site.name}" in issuer(served(site.https_port))
    text, tls = status(site)
    assert "FAILED at" in text and f"({case})" in text, text
    assert tls["waiting_for_first_certificate"] and tls["last_run"]["cause"] == case, tls
    print(f"\n{case}: kit up named it after {seconds:.1f}s: "
          + next(line for line in out.splitlines() if "no certificate" in line))
    return out, text, tls


# The two tests that wait out certbot's retries run beside the module's others (own CA ports).
@pytest.mark.xdist_group("acme-failed-first")
@pytest.mark.parametrize("case", ["ca-unreachable", "http-port-unreachable", "dns-not-here"])
def test_a_failed_first_certificate_is_named_by_up_and_status(
        case, docker_client, test_images, tmp_path) -> None:
    add_acme_address()
    http_port = pick_free_port()
    ca = None
    if case == "ca-unreachable":
        server = directory(RETRIED_PORT)  # nothing listens there (yet)
    else:
        ca = Pebble(docker_client, tmp_path / "pebble", port=14020, validity_s=SHORT_LIVED_S,
                    # a port nobody publishes: the CA's connection is refused
                    http_port=pick_free_port() if case == "http-port-unreachable" else http_port,
                    dns_answer="" if case == "dns-not-here" else ACME_ADDRESS)
        server = ca.directory
    site = acme_site(tmp_path / "site", docker_client, server, http_port,
                     retry_s=RETRY_S if case == "ca-unreachable" else None)
    try:
        _, text, _ = named_by_up_and_status(case, site)
        if case == "ca-unreachable":  # no 12-hour silence: a CA that comes up is used at once
            assert f"after a failed run it waits {RETRY_S}s" in text, text
            ca = Pebble(docker_client, tmp_path / "pebble", port=RETRIED_PORT,
                        http_port=http_port, validity_s=SHORT_LIVED_S)
            came_up = time.monotonic()
            # at certbot's next retry: RETRY_S after the failure, or, had a run started just
            # before the CA listened, the doubled wait after that one; then certbot's run and
            # nginx's watcher (a few seconds each)
            while ("Pebble" not in issuer(served(site.https_port))
                   and time.monotonic() - came_up < 2 * RETRY_S + 30):
                time.sleep(1)
            assert "Pebble" in issuer(served(site.https_port)), status(site)[0]
            print(f"  served pebble's certificate {time.monotonic() - came_up:.0f}s after the CA "
                  f"came up (tls.acme_retry_s {RETRY_S}), without any operator action")
    finally:
        remove_project(docker_client, site.name)
        if ca:
            ca.remove()


@pytest.mark.xdist_group("acme-rate-limited")
def test_a_rate_limited_first_certificate_is_named_and_retried_without_hammering(
        docker_client, test_images, tmp_path) -> None:
    """The common way into Let's Encrypt's limits: a site re-created with its letsencrypt volume
    deleted orders the certificate it already got. The CA here grants one order a minute
    (tests/support/acme_limiter): the first deployment's order is granted, the re-created site's is
    refused with a real 429 whose Retry-After, as Let's Encrypt's, is when the limit allows
    again (the rest of the minute since the granted order, at least 20 s), and certbot's next
    run, at the time `kit status` gives, is granted. The site's own backoff (tls.acme_retry_s,
    10 s) is shorter, so the timing shows that certbot waits for the CA's time, not less."""
    add_acme_address()
    http_port = pick_free_port()
    ca = Pebble(docker_client, tmp_path / "pebble", http_port=http_port, port=14030,
                validity_s=SHORT_LIVED_S)
    limiter = RateLimiter(docker_client, tmp_path / "limiter", ca, port=LIMITED_PORT)
    first = acme_site(tmp_path / "first", docker_client, limiter.directory, http_port,
                      trust=ca.trust(), retry_s=RETRY_S)
    try:
        result, _ = up(first)
        assert result.returncode == 0, result.stdout + result.stderr
        checked(first.kit("down", "--volumes"))  # the letsencrypt volume (its certificate) too
        again = LiveSite(tmp_path / "again", first.name, docker_client, first.https_port)
        again.root.mkdir()
        shutil.copy(first.spec_path, again.spec_path)
        shutil.copy(first.root / TRUST, again.root / TRUST)
        out, text, tls = named_by_up_and_status("rate-limited", again)
        # certbot got the CA's problem (its log has it; Debian's certbot 2.1 prints only
        # "AttributeError: can't set attribute", certbot/certbot#9539)
        run = again.layout.acme_last_run.read_text()
        assert "acme.messages.Error: urn:ietf:params:acme:error:rateLimited" in run, run
        granted, refused = limiter.orders()
        assert granted.status == 201 and refused.status == 429, limiter.orders()
        # answered as Let's Encrypt answers, and certbot's output carried the CA's own words
        assert refused.content_type == "application/problem+json" and refused.retry_after
        assert "too many certificates (1) already issued for this exact set of identifiers" in out
        assert "tls.staging: true" in out and "--volumes" in out, out  # the fix
        run_at = dt.datetime.fromisoformat(tls["last_run"]["at"])
        next_at = dt.datetime.fromisoformat(tls["next_attempt"])
        # certbot waits for the time the CA named (the limiter's Retry-After: the rest of its
        # 62.5 s window, at least 20 s), at least for its own backoff (tls.acme_retry_s), which
        # must be the shorter wait for the timing to tell them apart
        named = dt.datetime.fromtimestamp(int(refused.at + int(refused.retry_after)), dt.UTC)
        assert int(refused.retry_after) > RETRY_S + 5, refused  # later than certbot's backoff
        assert next_at - run_at >= dt.timedelta(seconds=RETRY_S), tls
        assert named <= next_at <= named + dt.timedelta(seconds=3), (named, tls)
        shown = f"certbot runs again at {next_at:%Y-%m-%d %H:%M:%S}Z"
        assert shown in out and shown in text, text
        print("\n".join(line for line in text.splitlines()
                        if line.startswith(("tls:", "  fix:", "  next attempt:"))))
        # no hammering: nothing more reaches the CA until that moment, then exactly one order,
        # granted (the limit has refilled), and the certificate is installed and served
        deadline = time.monotonic() + int(refused.retry_after) + 30
        while "Pebble" not in issuer(served(again.https_port)) and time.monotonic() < deadline:
            time.sleep(1)
        assert "Pebble" in issuer(served(again.https_port)), status(again)[0]
        orders = limiter.orders()
        assert [o.status for o in orders] == [201, 429, 201], orders
        retried = dt.datetime.fromtimestamp(orders[2].at, dt.UTC)
        assert next_at <= retried < next_at + dt.timedelta(seconds=15), (next_at, retried)
        text, tls = status(again)
        assert "last certbot run succeeded" in text and tls["last_run"]["ok"], text
        print(f"  the CA saw {len(orders)} orders: granted, refused "
              f"{refused.at - granted.at:.1f}s later (Retry-After {refused.retry_after}), "
              f"granted {orders[2].at - refused.at:.1f}s after the refusal, at the announced "
              f"{next_at:%H:%M:%S}Z; served pebble's certificate without any operator action")
    finally:
        remove_project(docker_client, first.name)
        limiter.remove()
        ca.remove()
